"""The small-batch window: what a step sees, how often it comes, its labels, state, and the
errors and warnings around it."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import Tensor, nn

import eatta
from conftest import nested_equal, tiny_cnn
from eatta.methods.base import AdaptiveMethod, InvalidInputError
from eatta.normalization import mixed_norm_layers, use_mixed_norm
from eatta.window import SampleWindow, SmallBatchWarning


class Recorder(AdaptiveMethod):
    """Records each step's batch and the labels its oracle holds; adapts nothing."""

    def __init__(self, model: nn.Module, oracle: eatta.GroundTruthOracle, **parts) -> None:
        super().__init__(model, **parts)
        self.oracle = oracle
        self.seen: list[tuple[Tensor, Tensor | None]] = []

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        self.seen.append((x.clone(), self.oracle.batch_labels))
        return self.model(x)


def _requests(sizes: list[int], seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        out.append((torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)))
    return out


def _recorder(window: int, every: int | None = None) -> Recorder:
    model = tiny_cnn().eval()
    use_mixed_norm(model, stats="ema")  # swapped already: the window keeps these layers
    oracle = eatta.GroundTruthOracle()
    return Recorder(model, oracle, window=window, window_every=every, window_refresh=None)


def test_steps_every_n_samples_on_the_last_window_in_order() -> None:
    """Batches of 3, a window of 8 stepping every 8: a step at samples 9, 16 and 24 (the count
    carries over), each on the last 8 samples, oldest first, with their labels."""
    method = _recorder(8)
    reqs = _requests([3] * 10)
    xs, ys = torch.cat([x for x, _ in reqs]), torch.cat([y for _, y in reqs])
    for x, y in reqs:
        method(x, labels=y)
    assert method.window is not None
    assert method.window.steps == 3 == len(method.seen) == 30 // 8
    for (wx, wy), end in zip(method.seen, (9, 18, 24), strict=True):
        assert torch.equal(wx, xs[end - 8 : end])
        assert wy is not None and torch.equal(wy, ys[end - 8 : end])


def test_every_smaller_than_the_window_overlaps_and_a_batch_of_one_is_served() -> None:
    method = _recorder(6, every=2)
    reqs = _requests([1] * 9)
    xs = torch.cat([x for x, _ in reqs])
    for x, y in reqs:
        out = method(x, labels=y)
        assert out.shape == (1, 5)
    # steps at samples 2, 4, 6, 8: windows of min(seen, 6)
    assert [len(wx) for wx, _ in method.seen] == [2, 4, 6, 6]
    assert torch.equal(method.seen[-1][0], xs[2:8])


def test_unknown_labels_are_abstentions() -> None:
    method = _recorder(4)
    (x1, y1), (x2, _) = _requests([2, 2])
    method(x1, labels=y1)
    method(x2)  # no labels for these two
    wy = method.seen[0][1]
    assert wy is not None and wy.tolist() == [*y1.tolist(), eatta.ABSTAIN, eatta.ABSTAIN]


def test_served_predictions_do_not_depend_on_the_batch() -> None:
    method = _recorder(64)
    (x, y), (x2, y2) = _requests([16, 5])
    method(x, labels=y)  # no step yet: served on the source statistics
    method.window.every = 16  # type: ignore[union-attr]  # force a step on the next request
    method(x2, labels=y2)
    assert all(int(m.test_batches) == 1 for m in mixed_norm_layers(method.model))
    probe = torch.randn(4, 3, 8, 8)
    method.window.every = 10_000  # type: ignore[union-attr]
    together = method(probe)
    alone = torch.cat([method(probe[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-6)


def _tent(window: int | bool | None, seed: int = 0) -> AdaptiveMethod:
    return eatta.create("tent", tiny_cnn(seed=seed), window=window)


def test_a_batch_as_large_as_the_window_adapts_as_without_one() -> None:
    """The faithful path is untouched: at the window's size the method steps on the batch as
    given, exactly as the same method without a window."""
    plain, windowed = _tent(False), _tent(8)
    for x, _ in _requests([8, 8, 12]):
        assert torch.equal(plain(x), windowed(x))
    for p, q in zip(plain.params, windowed.params, strict=True):
        assert torch.equal(p, q)


def test_window_steps_adapt_like_batches_of_the_window() -> None:
    """Requests of 2 with a window of 8 take the same steps as batches of 8 of the same samples."""
    plain, windowed = _tent(False), _tent(8)
    reqs = _requests([2] * 8)
    for x, _ in reqs:
        windowed(x)
    xs = torch.cat([x for x, _ in reqs])
    for i in range(0, 16, 8):
        plain(xs[i : i + 8])
    for p, q in zip(plain.params, windowed.params, strict=True):
        assert torch.equal(p, q)


def test_budget_counts_window_steps() -> None:
    """One label per step of 8 samples: 24 samples in batches of 2 ask for 3 labels; with
    Budget(1, every=2) 2 (steps 1 and 3)."""
    for budget, want in ((1, 3), (eatta.Budget(1, every=2), 2)):
        method = eatta.create(
            "baseline", tiny_cnn(), oracle=eatta.GroundTruthOracle(), budget=budget, window=8
        )
        for x, y in _requests([2] * 12):
            method(x, labels=y)
        assert method.window is not None and method.window.steps == 3
        assert method.labels_used == want


def test_state_round_trip_resumes_bit_identically(checkpoint_round_trip) -> None:
    a, b = _tent(8), _tent(8)
    reqs = _requests([3] * 12)
    for x, _ in reqs[:5]:
        a(x)
    b.load_state_dict(checkpoint_round_trip(a.state_dict()))
    for x, _ in reqs[5:]:
        assert torch.equal(a(x), b(x))
    assert nested_equal(a.state_dict(), b.state_dict())
    with pytest.raises(ValueError, match="window"):  # a state with a window needs one
        _tent(None).load_state_dict(a.state_dict())


def test_reset_returns_to_creation() -> None:
    method = _tent(8)
    fresh = copy.deepcopy(method.state_dict())
    for x, _ in _requests([3] * 6):
        method(x)
    assert method.window is not None and method.window.steps == 2
    method.reset()
    assert method.window.steps == 0 and method.window.filled == 0
    assert nested_equal(method.state_dict(), fresh)


def test_bad_windows_name_the_value() -> None:
    model = tiny_cnn()
    kinds = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match="got 1"):
        eatta.create("tent", model, window=1)
    with pytest.raises(ValueError, match="got 0"):
        eatta.create("tent", model, window=8, window_every=0)
    with pytest.raises(TypeError, match="window=True"):
        eatta.create("tent", model, window=True)
    with pytest.raises(ValueError, match="does not adapt"):
        eatta.create("source", model, window=8)
    assert [type(m) for m in model.modules()] == kinds  # the failed builds swapped nothing back in
    with pytest.raises(ValueError, match="got -2"):
        SampleWindow(8, -2)


def test_a_window_swaps_the_batchnorm_layers_and_refuses_layers_that_cannot_serve() -> None:
    """A constructor given window= serves on EMA statistics: it swaps every BatchNorm for a
    MixedBatchNorm (the optimizer's parameters kept); a MixedBatchNorm on batch statistics
    cannot serve a request of one, and is refused by name before any state is taken."""
    from eatta.methods.tent import Tent

    model = tiny_cnn()
    params = eatta.configure(model)
    method = Tent(model, torch.optim.SGD(params, lr=0.1), window=8)
    layers = mixed_norm_layers(method.model)
    assert len(layers) == 2 and all(m.stats == "ema" and not m.update for m in layers)
    assert {id(p) for p in method.params} == {id(p) for p in params}
    batch_stats = tiny_cnn()
    use_mixed_norm(batch_stats, stats="batch")
    params = eatta.configure(batch_stats)
    with pytest.raises(ValueError, match=r"layer '1' is a MixedBatchNorm with stats='batch'"):
        Tent(batch_stats, torch.optim.SGD(params, lr=0.1), window=8)


def test_a_batch_of_one_without_a_window_is_an_error_saying_what_to_do() -> None:
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(InvalidInputError, match=r"window=False"):
        _tent(False)(x)
    with pytest.raises(InvalidInputError, match=r"window=64"):
        _tent(None)(x)
    assert _tent(8)(x).shape == (1, 5)


def test_a_stream_of_small_batches_warns_on_its_first_batch() -> None:
    method = _tent(None)
    with pytest.warns(SmallBatchWarning, match=r"batches of 4 samples") as record:
        method(torch.randn(4, 3, 8, 8))  # the first batch: a small-batch stream, told at once
    assert len([w for w in record if w.category is SmallBatchWarning]) == 1


def test_small_batches_warn_once_unless_decided() -> None:
    reqs = [x for x, _ in _requests([4] * 4)]
    method = _tent(None)
    with pytest.warns(SmallBatchWarning, match="window=64") as record:
        for x in reqs:
            method(x)
    assert len([w for w in record if w.category is SmallBatchWarning]) == 1
    for decided in (False, 8):
        method = _tent(decided)
        with warnings.catch_warnings():
            warnings.simplefilter("error", SmallBatchWarning)
            for x in reqs:
                method(x)


@pytest.mark.parametrize("model", ["batchnorm", "layernorm"])
def test_the_first_small_batch_warns_whatever_came_before(model: str) -> None:
    """Full batches first, then small ones: the first small one warns (issue 66: it used to wait
    for a second in a row), on a BatchNorm and a LayerNorm model alike, and only once."""
    if model == "batchnorm":
        method, full, small = _tent(None), 40, 4
    else:
        method, full, small = eatta.create("tent", _layernorm_mlp(), params="all"), 16, 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBatchWarning)
        for _ in range(3):
            method(torch.randn(full, 3, 8, 8))
    with pytest.warns(SmallBatchWarning, match=rf"batch(es)? of {small} samples"):
        method(torch.randn(small, 3, 8, 8))  # the first small batch
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBatchWarning)
        for n in (small, full, small):
            method(torch.randn(n, 3, 8, 8))


def _layernorm_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(192, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 5)
    )


def test_a_model_without_batchnorm_warns_only_on_requests_of_a_few_samples() -> None:
    """LayerNorm: batches of 8 or more adapt quietly (no statistics to spoil); a run of
    batches of 2 warns once, naming the window; window=False silences it."""
    method = eatta.create("tent", _layernorm_mlp(), params="all")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBatchWarning)
        for _ in range(3):
            method(torch.randn(8, 3, 8, 8))
    with pytest.warns(SmallBatchWarning, match=r"every batch of 2 samples.*window=64") as record:
        for _ in range(4):
            method(torch.randn(2, 3, 8, 8))
    assert len([w for w in record if w.category is SmallBatchWarning]) == 1
    quiet = eatta.create("tent", _layernorm_mlp(), params="all", window=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallBatchWarning)
        for _ in range(4):
            quiet(torch.randn(1, 3, 8, 8))


@pytest.mark.parametrize(
    "name", [n for n in eatta.available() if n not in ("source", "eatta-safe")]
)
def test_every_method_serves_single_samples_and_steps_on_the_window(name: str) -> None:
    """Any registered method: requests of 1 served, a step every 8 samples, one label a step
    for the active ones."""
    from eatta.methods.registry import get_spec

    active = get_spec(name).active
    kw: dict = {"oracle": eatta.GroundTruthOracle(), "budget": 1} if active else {}
    if name == "eata":
        kw["fisher_data"] = [torch.rand(8, 3, 8, 8)]
    method = eatta.create(name, tiny_cnn(), window=8, **kw)
    for x, y in _requests([1] * 20):
        out = method(x, labels=y) if active else method(x)
        assert out.shape == (1, 5) and bool(torch.isfinite(out).all())
    assert method.window is not None and method.window.steps == 2
    assert method.labels_used <= 2 if active else method.labels_used == 0  # one a step at most


def test_a_plain_oracle_is_asked_about_the_window_by_its_positions_in_the_window() -> None:
    """The documented contract: at a window's step a callable oracle gets the window's selected
    samples and their positions in the window (its last 8 samples), not in the last request."""
    asked: list[tuple[Tensor, Tensor]] = []
    requests = _requests([3] * 6)
    served = torch.cat([x for x, _ in requests])

    def oracle(inputs: Tensor, indices: Tensor) -> Tensor:
        asked.append((inputs.clone(), indices.clone()))
        return torch.zeros(len(indices), dtype=torch.long)

    method = eatta.create("eatta", tiny_cnn(), oracle=oracle, window=8)
    for x, _ in requests:
        method(x)
    assert method.window is not None and method.window.steps == 2 and len(asked) == 2
    for (inputs, indices), end in zip(asked, (9, 18), strict=True):  # at the requests' ends
        assert torch.equal(inputs, served[end - 8 : end][indices])  # random samples: no chance


def test_refresh_updates_the_served_statistics_between_steps() -> None:
    """window_refresh=4 with steps every 16: after 8 samples the statistics served are those of
    the window's 8 samples (EMA rate 1), with no step taken."""
    method = eatta.create("tent", tiny_cnn(), window=16, window_refresh=4)
    reqs = _requests([2] * 4)
    for x, _ in reqs:
        method(x)
    assert method.window is not None and method.window.steps == 0
    layer = mixed_norm_layers(method.model)[0]
    assert int(layer.test_batches) == 2  # refreshed at samples 4 and 8
    held = torch.cat([x for x, _ in reqs])
    with torch.no_grad():
        first = method.model[0](held)  # the first layer's input to the BatchNorm
    var, mean = torch.var_mean(first, dim=[0, 2, 3], unbiased=False)
    torch.testing.assert_close(layer.test_mean, mean)
    torch.testing.assert_close(layer.test_var, var)
    with pytest.raises(ValueError, match="got 0"):
        eatta.create("tent", tiny_cnn(), window=16, window_refresh=0)


def test_the_source_model_fallback_decides_at_the_windows_steps_and_serves_between() -> None:
    """eatta-safe with a window: requests under the window are served by the model the fallback
    serves (the given one before any evidence), and the fallback takes one step per window step
    (every 8 samples), not one per request."""
    method = eatta.create(
        "eatta-safe",
        tiny_cnn(),
        oracle=eatta.GroundTruthOracle(),
        window=8,
        fallback_start="source",
    )
    fallback = method.fallback
    assert fallback is not None
    for i, (x, y) in enumerate(_requests([2] * 8)):
        out = method(x, labels=y)
        torch.testing.assert_close(out, method.given_logits(x), rtol=0, atol=0)
        assert fallback.step == (i + 1) // 4  # a step every 4 requests of 2
    assert method.window is not None and method.window.steps == 2


def test_with_the_adapted_model_served_requests_between_steps_get_its_predictions() -> None:
    method = eatta.create(
        "eatta-safe",
        tiny_cnn(),
        oracle=eatta.GroundTruthOracle(),
        window=8,
        fallback_start="adapted",
    )
    for x, y in _requests([1, 3, 2]):
        with torch.no_grad():
            expected = method.model(x)
        torch.testing.assert_close(method(x, labels=y), expected, rtol=0, atol=0)


def test_eatta_safe_with_a_window_resumes_bit_identically(checkpoint_round_trip) -> None:
    """A state saved between window steps (requests of 3, a step every 8 samples) resumes the
    window, the method and the fallback exactly."""

    def make() -> AdaptiveMethod:
        return eatta.create(
            "eatta-safe",
            tiny_cnn(),
            oracle=eatta.GroundTruthOracle(),
            window=8,
            fallback_start="adapted",
        )

    a, b = make(), make()
    reqs = _requests([3] * 16)
    for x, y in reqs[:7]:
        a(x, labels=y)
    b.load_state_dict(checkpoint_round_trip(a.state_dict()))
    for x, y in reqs[7:]:
        assert torch.equal(a(x, labels=y), b(x, labels=y))
    assert nested_equal(a.state_dict(), b.state_dict())
    assert a.fallback is not None and b.fallback is not None
    assert nested_equal(a.fallback.state_dict(), b.fallback.state_dict())
    assert a.fallback.step == 6  # 48 samples: a step every 8
