"""MixedBatchNorm: the two exact settings, the mix and EMA arithmetic by hand, swapping, state."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import eatta
from conftest import nested_equal, tiny_cnn
from eatta.configure import configure_model
from eatta.normalization import (
    MixedBatchNorm,
    absorb_statistics,
    batch_statistics,
    mixed_norm_layers,
    set_mix_weight,
    use_mixed_norm,
)


def _trained_bn(channels: int = 4, seed: int = 0) -> nn.BatchNorm2d:
    """A BatchNorm2d with non-trivial running statistics and affine parameters."""
    g = torch.Generator().manual_seed(seed)
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(channels, generator=g))
        bn.running_var.copy_(torch.rand(channels, generator=g) + 0.5)
        bn.weight.copy_(torch.randn(channels, generator=g))
        bn.bias.copy_(torch.randn(channels, generator=g))
    return bn.eval()


def _x(n: int = 6, seed: int = 1, shift: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, 5, 5, generator=g) * 1.7 + shift


def _stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    var, mean = torch.var_mean(x, dim=[0, 2, 3], unbiased=False)
    return mean, var


def _by_hand(x: torch.Tensor, bn: nn.Module, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    s = (1, -1, 1, 1)
    return (x - mean.view(s)) / torch.sqrt(var.view(s) + bn.eps) * bn.weight.view(s) + bn.bias.view(
        s
    )


def test_batch_statistics_at_weight_one_are_exactly_configured_batchnorm() -> None:
    """(a) stats="batch", weight 1: outputs and gradients bit-identical to the BatchNorm that
    eatta.configure leaves (batch statistics, no running statistics)."""
    bn = _trained_bn()
    mixed = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn))
    ref = copy.deepcopy(bn)
    configure_model(ref)
    x1, x2 = _x().requires_grad_(True), _x().requires_grad_(True)
    out_ref, out_mixed = ref(x1), mixed(x2)
    assert torch.equal(out_ref, out_mixed)
    (out_ref**2).sum().backward()
    (out_mixed**2).sum().backward()
    assert torch.equal(x1.grad, x2.grad)
    assert torch.equal(ref.weight.grad, mixed.weight.grad)
    assert torch.equal(ref.bias.grad, mixed.bias.grad)


@pytest.mark.parametrize("stats", ["batch", "ema"])
def test_weight_zero_is_exactly_the_given_layer(stats: str) -> None:
    """(b) weight 0: bit-identical to the given layer in eval mode on its running statistics,
    whatever the test statistics are."""
    bn = _trained_bn()
    mixed = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn), stats=stats, weight=0.0)  # type: ignore[arg-type]
    if stats == "ema":
        with batch_statistics(absorb=True):
            mixed(_x(seed=5))  # test statistics exist and differ from the source
        assert int(mixed.test_batches) == 1
    x = _x()
    assert torch.equal(mixed(x), bn(x))


def test_ema_without_test_statistics_serves_the_source() -> None:
    bn = _trained_bn()
    mixed = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn), stats="ema")
    x = _x()
    assert torch.equal(mixed(x), bn(x))


def test_prior_mixes_by_sample_count() -> None:
    """Schneider et al.: w = n / (n + N) on the batch's statistics, the rest on the source."""
    bn = _trained_bn()
    mixed = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn), prior=18)
    x = _x(n=6)
    w = 6 / (6 + 18)
    assert mixed.weight_for(6) == pytest.approx(0.25)
    mean, var = _stats(x)
    want = _by_hand(x, bn, w * mean + (1 - w) * bn.running_mean, w * var + (1 - w) * bn.running_var)
    torch.testing.assert_close(mixed(x), want, rtol=1e-5, atol=1e-5)
    # the direction: more prior, closer to the source's output
    strong = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn), prior=600)
    far = (mixed(x) - bn(x)).abs().mean()
    near = (strong(x) - bn(x)).abs().mean()
    assert near < far


def test_explicit_weight_mixes_and_gradients_flow_through_the_batch() -> None:
    bn = _trained_bn()
    mixed = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn), weight=0.3)
    x = _x().requires_grad_(True)
    out = mixed(x)
    mean, var = _stats(x.detach())
    want = _by_hand(
        x.detach(), bn, 0.3 * mean + 0.7 * bn.running_mean, 0.3 * var + 0.7 * bn.running_var
    )
    torch.testing.assert_close(out.detach(), want, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    # through the batch statistics, the gradient of a sum differs from the constant-statistics one
    scale = bn.weight / torch.sqrt(0.3 * var + 0.7 * bn.running_var + bn.eps)
    const_grad = scale.view(1, -1, 1, 1).expand_as(x)
    assert not torch.allclose(x.grad, const_grad, atol=1e-4)


def test_ema_arithmetic_by_hand() -> None:
    """The k-th fold has rate max(α, 1/k): the first batches are averaged, then the EMA."""
    bn = _trained_bn()
    mixed = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn), stats="ema", momentum=0.25)
    batches = [_x(seed=s, shift=float(s)) for s in range(6)]
    want_mean = torch.zeros(4)
    want_var = torch.ones(4)
    for k, xb in enumerate(batches, start=1):
        with batch_statistics(absorb=True):
            mixed(xb)
        a = max(0.25, 1 / k)
        m, v = _stats(xb)
        want_mean, want_var = (1 - a) * want_mean + a * m, (1 - a) * want_var + a * v
        torch.testing.assert_close(mixed.test_mean, want_mean, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(mixed.test_var, want_var, rtol=1e-6, atol=1e-6)
    # after 3 folds (rates 1, 1/2, 1/3) the EMA was the plain mean of the three batches
    fresh = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn), stats="ema", momentum=0.25)
    for xb in batches[:3]:
        with batch_statistics(absorb=True):
            fresh(xb)
    torch.testing.assert_close(
        fresh.test_mean, torch.stack([_stats(b)[0] for b in batches[:3]]).mean(0)
    )
    # serving: the EMA statistics, whatever the batch (a batch of 1 included)
    x = _x(n=3, seed=9)
    full = mixed(x)
    torch.testing.assert_close(full, _by_hand(x, bn, want_mean, want_var), rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.cat([mixed(x[i : i + 1]) for i in range(3)]), full)


def test_ema_update_normalizes_with_the_folded_statistics() -> None:
    """RoTTA's robust BN: each batch is folded in, normalized with the result, its share
    carrying gradients."""
    bn = _trained_bn()
    mixed = MixedBatchNorm.from_batchnorm(copy.deepcopy(bn), stats="ema", update=True, momentum=0.5)
    x1, x2 = _x(seed=1), _x(seed=2, shift=-1.0).requires_grad_(True)
    mixed(x1)  # first fold: rate 1
    out = mixed(x2)  # second: rate max(0.5, 1/2)
    m1, v1 = _stats(x1)
    m2, v2 = _stats(x2.detach())
    want = _by_hand(x2.detach(), bn, 0.5 * m1 + 0.5 * m2, 0.5 * v1 + 0.5 * v2)
    torch.testing.assert_close(out.detach(), want, rtol=1e-5, atol=1e-5)
    assert out.requires_grad and int(mixed.test_batches) == 2


def test_bad_settings_name_the_value() -> None:
    bn = _trained_bn()
    with pytest.raises(ValueError, match=r"1\.5"):
        MixedBatchNorm.from_batchnorm(bn, weight=1.5)
    with pytest.raises(ValueError, match=r"-3"):
        MixedBatchNorm.from_batchnorm(bn, prior=-3)
    with pytest.raises(ValueError, match=r"0\.0"):
        MixedBatchNorm.from_batchnorm(bn, stats="ema", momentum=0.0)
    with pytest.raises(ValueError, match="'mean'"):
        MixedBatchNorm.from_batchnorm(bn, stats="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        MixedBatchNorm.from_batchnorm(bn, weight=0.5, prior=16)
    with pytest.raises(ValueError, match="stats='ema'"):
        MixedBatchNorm.from_batchnorm(bn, stats="ema", prior=16)
    layer = MixedBatchNorm.from_batchnorm(bn)
    with pytest.raises(ValueError, match=r"-0\.1"):
        layer.mix_weight = -0.1
    assert layer.mix_weight is None


def test_use_mixed_norm_swaps_in_place_sharing_parameters() -> None:
    model = tiny_cnn()
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 3, 8, 8))  # eval: statistics stay the initial ones
    weights = [model[1].weight, model[4].weight]
    optimizer = torch.optim.SGD([model[1].weight], lr=0.1)
    x = torch.randn(5, 3, 8, 8)
    before = model(x)
    names = use_mixed_norm(model, weight=0.0)
    assert names == ["1", "4"]
    assert [m.weight for m in mixed_norm_layers(model)] == weights  # the same Parameter objects
    assert torch.equal(model(x), before)  # weight 0: the source model, exactly
    assert optimizer.param_groups[0]["params"][0] is model[1].weight
    assert use_mixed_norm(model) == []  # already swapped: left as they are


def test_use_mixed_norm_after_configure_reads_the_running_statistics_configure_kept() -> None:
    """configure() keeps each BatchNorm's running statistics (it only stops using them), so the
    mixed layers start from them, with or without ``source=``."""
    given = tiny_cnn()
    with torch.no_grad():
        for m in given.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    x = torch.randn(3, 3, 8, 8)
    want = copy.deepcopy(given).eval()(x)
    for source in (None, given):
        model = copy.deepcopy(given)
        eatta.configure(model)
        use_mixed_norm(model, source=source, weight=0.0)
        assert torch.equal(model(x), want)


def test_a_window_on_batchnorm_without_running_statistics_is_refused_before_any_change() -> None:
    """``track_running_stats=False`` leaves nothing to serve between steps with: ``create(...,
    window=)`` names the cause and leaves the model as it was (the method needs no window to
    adapt such a model at full batches)."""
    model = tiny_cnn()
    model[1] = nn.BatchNorm2d(8, track_running_stats=False)
    state, kinds = copy.deepcopy(model.state_dict()), [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match=r"'1'.*track_running_stats=False"):
        eatta.create("eatta-safe", model, oracle=eatta.GroundTruthOracle(), window=64)
    assert [type(m) for m in model.modules()] == kinds and nested_equal(model.state_dict(), state)
    assert all(p.requires_grad for p in model.parameters())  # not configured either


def test_set_mix_weight_on_every_layer() -> None:
    model = tiny_cnn().eval()
    use_mixed_norm(model)
    assert set_mix_weight(model, 0.25) == 2
    assert [m.mix_weight for m in mixed_norm_layers(model)] == [0.25, 0.25]
    with pytest.raises(ValueError, match=r"2\.0"):
        set_mix_weight(model, 2.0)
    assert [m.mix_weight for m in mixed_norm_layers(model)] == [0.25, 0.25]
    with pytest.raises(ValueError, match="no MixedBatchNorm"):
        set_mix_weight(nn.Linear(2, 2), 0.5)
    set_mix_weight(model, None)
    assert all(m.mix_weight is None for m in mixed_norm_layers(model))


def test_state_dict_round_trip_and_reset() -> None:
    model = tiny_cnn().eval()
    use_mixed_norm(model, stats="ema", momentum=0.3)
    fresh = copy.deepcopy(model)
    for s in range(4):
        absorb_statistics(
            model, torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(s))
        )
    set_mix_weight(model, 0.6)
    state = copy.deepcopy(model.state_dict())
    assert {"1.source_mean", "1.test_mean", "1.test_batches", "1.test_weight"} <= set(state)
    fresh.load_state_dict(state)
    assert nested_equal(fresh.state_dict(), model.state_dict())
    assert [m.mix_weight for m in mixed_norm_layers(fresh)] == [0.6, 0.6]
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(fresh(x), model(x))
    layer = mixed_norm_layers(model)[0]
    layer.reset_statistics()
    assert int(layer.test_batches) == 0 and layer.mix_weight is None
    assert torch.equal(layer.test_mean, torch.zeros(8))


def test_copies_follow_the_batch_phase() -> None:
    """A copy of the model (a teacher) normalizes on batch statistics within the step too."""
    model = tiny_cnn().eval()
    use_mixed_norm(model, stats="ema")
    teacher = copy.deepcopy(model)
    plain = tiny_cnn().eval()
    configure_model(plain)
    x = torch.randn(6, 3, 8, 8)
    with batch_statistics():
        assert torch.equal(teacher(x), plain(x))
    assert int(mixed_norm_layers(teacher)[0].test_batches) == 0  # "batch" folds nothing
    assert F.mse_loss(teacher(x), plain(x)) > 0  # outside: the source statistics again
