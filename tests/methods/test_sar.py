"""SAR: SAM step on reliable entropy, second filter at the perturbed weights, model recovery."""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
from torch import nn

from conftest import BAD_BATCHES, check_rejects_without_change
from eatta import configure
from eatta.losses import entropy
from eatta.methods.registry import create
from eatta.methods.sar import SAM, SAR, sar_params

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

BN_PARAMS = ["1.weight", "1.bias", "4.weight", "4.bias"]


def build(make_confident_model, lr=0.1, momentum=0.9, rho=0.05, **kwargs) -> SAR:
    model = make_confident_model(seed=0)
    params = sar_params(model)
    opt = SAM(torch.optim.SGD(params, lr=lr, momentum=momentum), rho=rho)
    return SAR(model, opt, **kwargs)


def params_of(method) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in method.model.named_parameters()}


def test_only_norm_affine_parameters_change(make_confident_model, make_image_batches):
    sar = build(make_confident_model, reset_constant=0.0)
    before = params_of(sar)
    for x in make_image_batches(3):
        sar(x)
    changed = {k for k, v in params_of(sar).items() if not torch.equal(v, before[k])}
    assert changed == set(BN_PARAMS)


def test_sar_params_skip_the_last_stage_and_final_norm():
    resnet_like = nn.Sequential(
        OrderedDict(
            layer1=nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)),
            layer4=nn.Sequential(nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4)),
            pool=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc=nn.Linear(4, 3),
        )
    )
    params = sar_params(resnet_like)
    names = {n for n, p in resnet_like.named_parameters() if p.requires_grad}
    assert names == {"layer1.1.weight", "layer1.1.bias"}
    assert len(params) == 2

    class ViTLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.LayerNorm(4) for _ in range(12))
            self.norm = nn.LayerNorm(4)

    vit = ViTLike()
    sar_params(vit)
    trained = {n for n, p in vit.named_parameters() if p.requires_grad}
    assert trained == {f"blocks.{i}.{w}" for i in range(9) for w in ("weight", "bias")}


def test_second_gradient_is_taken_at_the_sam_perturbed_weights(
    make_confident_model, make_image_batches
):
    lr, rho = 0.5, 0.5
    sar = build(make_confident_model, lr=lr, momentum=0.0, rho=rho, reset_constant=0.0)
    (x,) = make_image_batches(1)
    ref = copy.deepcopy(sar.model)
    named = dict(ref.named_parameters())
    ps = [named[n] for n in BN_PARAMS]
    with torch.no_grad():
        h = entropy(ref(x))
    margin = float(h.quantile(0.75))  # a margin that keeps most but not all samples
    sar.entropy_margin = margin

    h1 = entropy(ref(x))
    r1 = h1.detach() < margin
    g1 = torch.autograd.grad(h1[r1].mean(), ps)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in g1]))
    theta = [p.detach().clone() for p in ps]
    with torch.no_grad():
        for p, g in zip(ps, g1, strict=True):
            p.add_(rho * g / (norm + 1e-12))
    h2 = entropy(ref(x))
    r2 = r1 & (h2.detach() < margin)
    g2 = torch.autograd.grad(h2[r2].mean(), ps)

    sar(x)
    step = sar.last_step
    assert torch.equal(step.reliable_first, r1) and torch.equal(step.reliable_second, r2)
    now = dict(sar.model.named_parameters())
    for n, t, a, b in zip(BN_PARAMS, theta, g1, g2, strict=True):
        want = t - lr * b
        torch.testing.assert_close(now[n].detach(), want)
        assert not torch.allclose(want, t - lr * a, atol=1e-5)  # not the plain gradient
    assert sar.ema == pytest.approx(float(h2[r2].mean().detach()))


def test_recovery_resets_model_and_optimizer_but_keeps_the_ema(
    make_confident_model, make_image_batches, assert_nested_equal
):
    sar = build(make_confident_model, reset_constant=10.0)  # any entropy EMA is below 10
    model0 = copy.deepcopy(sar.model.state_dict())
    opt0 = copy.deepcopy(sar.optimizer.state_dict())
    sar(make_image_batches(1)[0])
    assert sar.last_step.recovered and sar.num_recoveries == 1
    assert sar.ema is not None and sar.ema == float(sar.last_step.loss_second)
    assert_nested_equal(sar.model.state_dict(), model0)
    assert_nested_equal(sar.optimizer.state_dict(), opt0)


def test_no_recovery_above_the_constant_and_ema_update(make_confident_model, make_image_batches):
    sar = build(make_confident_model, reset_constant=0.0)
    before = params_of(sar)
    losses = []
    for x in make_image_batches(2):
        sar(x)
        losses.append(float(sar.last_step.loss_second))
        assert not sar.last_step.recovered
    assert sar.ema == pytest.approx(0.9 * losses[0] + 0.1 * losses[1])
    assert any(not torch.equal(v, before[k]) for k, v in params_of(sar).items())
    assert sar.num_recoveries == 0


def test_recovery_triggers_when_the_ema_drops_below_the_constant(
    make_confident_model, make_image_batches
):
    xs = make_image_batches(2)
    probe = build(make_confident_model, reset_constant=0.0)
    probe(xs[0])
    first = probe.ema
    # a constant just above the first loss: the first step recovers
    sar = build(make_confident_model, reset_constant=first + 1e-4)
    sar(xs[0])
    assert sar.last_step.recovered
    # a constant just below: no recovery
    sar = build(make_confident_model, reset_constant=first - 1e-4)
    sar(xs[0])
    assert not sar.last_step.recovered


def test_reset_restores_everything_exactly(
    make_confident_model, make_image_batches, assert_nested_equal
):
    sar = build(make_confident_model, reset_constant=0.0)
    model0 = copy.deepcopy(sar.model.state_dict())
    opt0 = copy.deepcopy(sar.optimizer.state_dict())
    xs = make_image_batches(3)
    first = sar(xs[0])
    sar(xs[1])
    assert sar.ema is not None and sar.optimizer.state_dict()["state"]
    sar.reset()
    assert_nested_equal(sar.model.state_dict(), model0)
    assert_nested_equal(sar.optimizer.state_dict(), opt0)
    assert sar.ema is None and sar.num_recoveries == 0
    assert torch.equal(sar(xs[0]), first)


def test_state_dict_round_trip_continues_identically(
    make_confident_model, make_image_batches, checkpoint_round_trip
):
    a = build(make_confident_model, reset_constant=0.0)
    xs = make_image_batches(5)
    for x in xs[:3]:
        a(x)
    b = build(make_confident_model, reset_constant=0.0)
    b.load_state_dict(checkpoint_round_trip(a.state_dict()))
    assert b.ema == a.ema
    for x in xs[3:]:
        assert torch.equal(a(x), b(x))
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert a.ema == b.ema


@pytest.mark.parametrize("bad", sorted(BAD_BATCHES))
def test_bad_input_raises_and_changes_nothing(make_confident_model, make_image_batches, bad):
    check_rejects_without_change(
        build(make_confident_model, reset_constant=0.0), make_image_batches(1)[0], bad
    )


def test_failed_second_pass_restores_the_weights(make_confident_model, make_image_batches):
    sar = build(make_confident_model, reset_constant=0.0)
    before = params_of(sar)
    calls = {"n": 0}

    def fail_second(module, args, output):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")

    handle = sar.model.register_forward_hook(fail_second)
    with pytest.raises(RuntimeError, match="boom"):
        sar(make_image_batches(1)[0])
    handle.remove()
    assert all(torch.equal(v, before[k]) for k, v in params_of(sar).items())
    assert sar.optimizer.state_dict()["state"] == {}


def test_sam_state_dict_is_the_base_optimizer_state(make_model):
    model = make_model()
    params = configure(model)
    sam = SAM(torch.optim.SGD(params, lr=0.1, momentum=0.9), rho=0.05)
    x = torch.rand(4, 3, 8, 8)
    loss = model(x).logsumexp(1).mean()
    for p, g in zip(params, torch.autograd.grad(loss, params), strict=True):
        p.grad = g
    sam.first_step(zero_grad=True)
    for p, g in zip(params, torch.autograd.grad(model(x).logsumexp(1).mean(), params), strict=True):
        p.grad = g
    sam.second_step(zero_grad=True)
    state = sam.state_dict()
    assert len(state["state"]) == len(params)  # momentum buffers saved
    fresh = SAM(torch.optim.SGD(params, lr=0.1, momentum=0.9))
    fresh.load_state_dict(copy.deepcopy(state))
    assert fresh.param_groups is fresh.base_optimizer.param_groups
    with pytest.raises(ValueError, match="closure"):
        sam.step()


def test_registry_defaults(make_model):
    sar = create("sar", make_model())
    assert isinstance(sar, SAR) and isinstance(sar.optimizer, SAM)
    base = sar.optimizer.base_optimizer
    assert isinstance(base, torch.optim.SGD)
    group = base.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (1e-3, 0.9, False)
    assert (sar.optimizer.rho, sar.reset_constant, sar.ema_momentum) == (0.05, 0.2, 0.9)
    names = {n for n, p in sar.model.named_parameters() if p.requires_grad}
    assert names == set(BN_PARAMS)
    pacs = create("sar", make_model(), dataset="pacs")
    assert isinstance(pacs.optimizer.base_optimizer, torch.optim.Adam)
    assert pacs.optimizer.param_groups[0]["lr"] == 1e-3


def test_a_plain_optimizer_is_wrapped_in_sam(make_model):
    model = make_model()
    sar = SAR(model, torch.optim.SGD(configure(model), lr=0.1), rho=0.2)
    assert isinstance(sar.optimizer, SAM) and sar.optimizer.rho == 0.2
    with pytest.raises(TypeError, match="optimizer"):
        SAR(make_model(), None)  # type: ignore[arg-type]
