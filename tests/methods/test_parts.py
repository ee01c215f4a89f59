"""The parts (eatta.methods.base.Parts, eatta.hooks): every registered method takes them as
keywords, from its class and from ``create``; bad parts are refused before anything changes; the
weight anchor's pull is exactly ``θ ← α·θ + (1 − α)·θ₀``, alone, with a window at requests of 1 and
8, and with eatta-safe's fallback and the approximate step; ``reset()`` and ``state_dict()`` keep it
exact."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import eatta
from conftest import confident_cnn, image_batches, nested_equal
from eatta.methods.baseline import baseline
from eatta.methods.cema import CEMA
from eatta.methods.cotta import CoTTA
from eatta.methods.eatta import EATTA
from eatta.methods.eta import ETA, EATAFisher, compute_fishers
from eatta.methods.hiltta import HILTTA
from eatta.methods.rdumb import RDumb
from eatta.methods.registry import get_spec
from eatta.methods.sar import SAR
from eatta.methods.simatta import SimATTA
from eatta.methods.source import Source
from eatta.methods.tent import Tent
from eatta.monitor.fallback import SourceFallback
from eatta.monitor.monitor import AccuracyMonitor
from eatta.normalization import use_mixed_norm

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

ALPHA = 0.9


def windowed_model() -> nn.Module:
    """The tiny CNN with its BatchNorm layers on EMA statistics, as a window needs."""
    model = confident_cnn()
    use_mixed_norm(model, stats="ema", momentum=1.0)
    return model


def sgd(model: nn.Module, params: str = "norm") -> torch.optim.Optimizer:
    return torch.optim.SGD(eatta.configure(model, params), lr=0.01, momentum=0.9)


def oracle() -> eatta.GroundTruthOracle:
    return eatta.GroundTruthOracle()


def eata(model: nn.Module, **parts: Any) -> EATAFisher:
    opt = sgd(model)
    fishers = compute_fishers(model, image_batches(2), opt.param_groups[0]["params"])
    return EATAFisher(model, opt, fishers=fishers, **parts)


#: Each registered method from its class, the parts given to the constructor.
CLASSES: dict[str, Callable[..., eatta.AdaptiveMethod]] = {
    "baseline": lambda m, **p: baseline(m, sgd(m), oracle=oracle(), **p),
    "cema": lambda m, **p: CEMA(m, sgd(m), oracle=oracle(), **p),
    "cotta": lambda m, **p: CoTTA(m, sgd(m, "all"), **p),
    "eata": eata,
    "eatta": lambda m, **p: EATTA(m, sgd(m), oracle=oracle(), **p),
    "eatta-safe": lambda m, **p: EATTA(m, sgd(m), oracle=oracle(), balance=None, **p),
    "eatta-stable": lambda m, **p: EATTA(m, sgd(m), oracle=oracle(), **p),
    "eta": lambda m, **p: ETA(m, sgd(m), **p),
    "hiltta": lambda m, **p: HILTTA(m, Tent(m, sgd(m)), oracle=oracle(), **p),
    "rdumb": lambda m, **p: RDumb(m, sgd(m), reset_every=2, **p),
    "sar": lambda m, **p: SAR(m, sgd(m), **p),
    "simatta": lambda m, **p: SimATTA(m, sgd(m), oracle=oracle(), steps=2, **p),
    "source": lambda m, **p: Source(m, **p),
    "tent": lambda m, **p: Tent(m, sgd(m), **p),
}


def requests(samples: int, size: int, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(samples, 3, 8, 8, generator=g)
    y = torch.randint(0, 5, (samples,), generator=g)
    return [(x[i : i + size], y[i : i + size]) for i in range(0, samples, size)]


def trained(method: eatta.AdaptiveMethod) -> list[Tensor]:
    """The values of the parameters the method's optimizer updates, in order."""
    return [p.detach().clone() for p, _ in method.params_at_creation()]


def test_the_table_covers_every_registered_method() -> None:
    assert sorted(CLASSES) == eatta.available()


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_method_takes_the_parts_from_its_class(name: str) -> None:
    """Window, fallback, monitor and weight anchor as constructor keywords, nothing assigned
    afterwards: requests of 8 on a window of 16, a step every 2 requests, the fallback deciding
    and the monitor auditing at each."""
    model = windowed_model()
    fallback = SourceFallback(auditor=oracle())
    monitor = AccuracyMonitor(oracle(), share=0.5)
    if name == "source":  # it never adapts: a window or an anchor has nothing to act on
        for part, message in (("window", "does not adapt"), ("weight_anchor", "updates no")):
            with pytest.raises(ValueError, match=message):
                CLASSES[name](copy.deepcopy(model), **{part: 16 if part == "window" else ALPHA})
        method = CLASSES[name](model, fallback=fallback, monitor=monitor)
    else:
        method = CLASSES[name](
            model, window=16, fallback=fallback, monitor=monitor, weight_anchor=ALPHA
        )
        assert method.window is not None and method.window.size == 16
        assert method.weight_anchor is not None and method.weight_anchor.alpha == ALPHA
    assert method.fallback is fallback and method.monitor is monitor
    for x, y in requests(32, 8):
        assert method(x, labels=y).shape == (8, 5)
    assert fallback.step == (4 if name == "source" else 2)
    assert monitor.stats()["received"] > 0


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_method_takes_the_parts_from_create(name: str) -> None:
    kw: dict[str, Any] = {"oracle": oracle()} if get_spec(name).active else {}
    if name == "eata":
        kw["fisher_data"] = image_batches(2)
    model = confident_cnn()
    if name == "source":
        before = copy.deepcopy(model.state_dict())
        with pytest.raises(ValueError, match="updates no parameter"):
            eatta.create(name, model, weight_anchor=ALPHA)
        assert nested_equal(model.state_dict(), before)
        return
    method = eatta.create(name, model, window=16, weight_anchor=ALPHA, **kw)
    assert method.window is not None and method.weight_anchor is not None
    for x, y in requests(32, 8):
        method(x, labels=y) if kw.get("oracle") else method(x)
    assert method.window.steps == 2


# -- refused before anything changes --------------------------------------------------------------

BAD_ANCHORS: list[tuple[Any, type[Exception]]] = [
    (0, ValueError),
    (0.0, ValueError),
    (-0.5, ValueError),
    (1.5, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    (True, TypeError),
    ("0.9", TypeError),
]


@pytest.mark.parametrize(("alpha", "error"), BAD_ANCHORS)
def test_a_bad_anchor_is_refused_before_anything_changes(alpha: Any, error: type) -> None:
    # create: before the model is touched (its BatchNorm layers not swapped for a window)
    model = confident_cnn()
    before = copy.deepcopy(model.state_dict())
    kinds = [type(m) for m in model.modules()]
    with pytest.raises(error, match="weight_anchor"):
        eatta.create("tent", model, window=16, weight_anchor=alpha)
    assert nested_equal(model.state_dict(), before) and [type(m) for m in model.modules()] == kinds
    # the class path: model and optimizer as they were
    model = confident_cnn()
    opt = sgd(model)
    model_state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    with pytest.raises(error, match="weight_anchor"):
        Tent(model, opt, weight_anchor=alpha)
    assert nested_equal(model.state_dict(), model_state)
    assert nested_equal(opt.state_dict(), opt_state)


@pytest.mark.parametrize(
    ("parts", "error", "message"),
    [
        ({"weight_anchor": 2.0, "window": 8}, ValueError, "weight_anchor"),
        ({"window": True, "weight_anchor": ALPHA}, TypeError, "window=True"),
        ({"window": 1, "weight_anchor": ALPHA}, ValueError, "at least 2"),
        ({"weight_anchor": ALPHA, "window_every": 4}, TypeError, "window_every"),
        ({"weight_anchor": ALPHA, "fallback": "not a part"}, TypeError, "fallback="),
        ({"weight_anchor": ALPHA, "windw": 8}, TypeError, "unknown part"),
    ],
)
def test_bad_parts_are_refused_together_before_anything_changes(
    parts: dict[str, Any], error: type, message: str
) -> None:
    """Given to the constructor with good ones: the bad part is refused before any is built;
    the model (its modules too: no BatchNorm swapped for the window) and the optimizer are
    bit-identical."""
    model = confident_cnn()
    opt = sgd(model)
    model_state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    kinds = [type(m) for m in model.modules()]
    with pytest.raises(error, match=message):
        Tent(model, opt, **parts)
    assert nested_equal(model.state_dict(), model_state)
    assert nested_equal(opt.state_dict(), opt_state)
    assert [type(m) for m in model.modules()] == kinds


def test_a_fallback_with_no_answers_to_read_is_refused_on_the_first_request() -> None:
    """A fallback that reads the method's own drawn answers, on a method that draws none: its
    check refuses the first request, before the method changes."""
    model = confident_cnn()
    method = Tent(model, sgd(model), fallback=SourceFallback())
    before = copy.deepcopy(method.state_dict())
    with pytest.raises(ValueError, match="auditor="):
        method(requests(8, 8)[0][0])
    assert nested_equal(method.state_dict(), before)


# -- the pull -------------------------------------------------------------------------------------


def twins(
    build: Callable[..., eatta.AdaptiveMethod], alpha: float
) -> tuple[eatta.AdaptiveMethod, eatta.AdaptiveMethod]:
    """The same method twice from the same model, without and with the anchor."""
    return build(), build(weight_anchor=alpha)


def assert_pulled(plain: eatta.AdaptiveMethod, anchored: eatta.AdaptiveMethod) -> None:
    """After the first step of each: ``θ = α·θ_step + (1 − α)·θ₀`` exactly, ``θ_step`` the plain
    twin's; everything the anchor does not touch identical."""
    alpha = anchored.weight_anchor.alpha  # type: ignore[union-attr]
    pairs = anchored.params_at_creation()
    assert pairs
    for (theta, theta0), stepped in zip(pairs, trained(plain), strict=True):
        assert not torch.equal(stepped, theta0)  # the step moved it
        assert torch.equal(theta, alpha * stepped + (1 - alpha) * theta0)
    anchored_ids = {id(p) for p, _ in pairs}
    mine = dict(anchored.model.named_parameters())
    for name, p in plain.model.named_parameters():
        if id(mine[name]) not in anchored_ids:
            assert torch.equal(p, mine[name])


def test_one_step_pulls_every_trained_weight_back_exactly() -> None:
    model = confident_cnn()
    plain, anchored = twins(lambda **p: eatta.create("tent", copy.deepcopy(model), **p), ALPHA)
    x = image_batches(1, size=16)[0]
    torch.testing.assert_close(plain(x), anchored(x), rtol=0, atol=0)  # served before the pull
    assert_pulled(plain, anchored)


def test_the_anchor_follows_the_model_to_another_dtype() -> None:
    """After ``method.double()`` the pull runs in float64 toward θ₀ converted once (kept beside
    the parameter, not converted again at every step)."""
    model = confident_cnn()
    plain, anchored = twins(lambda **p: eatta.create("tent", copy.deepcopy(model), **p), ALPHA)
    plain.double()
    anchored.double()
    x = image_batches(1, size=16)[0].double()
    torch.testing.assert_close(plain(x), anchored(x), rtol=0, atol=0)
    anchor = anchored.weight_anchor
    assert anchor is not None
    for (theta, theta0), stepped in zip(anchor.pairs, trained(plain), strict=True):
        assert theta.dtype == theta0.dtype == torch.float64
        assert torch.equal(theta, ALPHA * stepped + (1 - ALPHA) * theta0)
    kept = [t0 for _, t0 in anchor.pairs]
    anchored(image_batches(2, size=16)[1].double())
    assert all(t0 is k for (_, t0), k in zip(anchor.pairs, kept, strict=True))


def test_alpha_one_changes_nothing() -> None:
    model = confident_cnn()
    plain, anchored = twins(lambda **p: eatta.create("eta", copy.deepcopy(model), **p), 1.0)
    for x in image_batches(4, size=16):
        torch.testing.assert_close(plain(x), anchored(x), rtol=0, atol=0)
    assert nested_equal(plain.model.state_dict(), anchored.model.state_dict())


def test_a_step_that_updates_nothing_is_not_pulled() -> None:
    method = eatta.create("eta", confident_cnn(), weight_anchor=ALPHA)
    first, second = image_batches(2, size=16)
    method(first)
    after_first = trained(method)
    method.entropy_margin = 1e-12  # no sample is reliable: ETA skips its update
    method(second)
    assert method.last_step is not None and not method.last_step.updated
    assert nested_equal(trained(method), after_first)


@pytest.mark.parametrize("size", [1, 8])
def test_the_pull_follows_each_window_step(size: int) -> None:
    """window=64: requests of 1 and 8 are served between steps, the first step (at sample 64)
    is pulled back, and the served statistics are folded in under the pulled weights."""
    model = confident_cnn()
    plain, anchored = twins(
        lambda **p: eatta.create("tent", copy.deepcopy(model), window=64, **p), ALPHA
    )
    for x, _ in requests(64, size):
        torch.testing.assert_close(plain(x), anchored(x), rtol=0, atol=0)
    assert plain.window.steps == anchored.window.steps == 1  # type: ignore[union-attr]
    assert_pulled(plain, anchored)


@pytest.mark.parametrize("size", [1, 8])
def test_the_pull_composes_with_the_fallback_the_window_and_the_approximate_step(
    size: int,
) -> None:
    """eatta-safe (its fallback deciding at each step), grad_mode="approx", window=64."""
    model = confident_cnn()

    def safe(**parts: Any) -> eatta.AdaptiveMethod:
        return eatta.create(
            "eatta-safe", copy.deepcopy(model), oracle=oracle(), grad_mode="approx", window=64,
            **parts,
        )  # fmt: skip

    plain, anchored = twins(safe, ALPHA)
    assert isinstance(anchored.fallback, SourceFallback)
    for x, y in requests(64, size):
        torch.testing.assert_close(plain(x, labels=y), anchored(x, labels=y), rtol=0, atol=0)
    assert anchored.fallback.step == 1 and anchored.labels_used == plain.labels_used == 1
    assert_pulled(plain, anchored)


# -- reset and state ------------------------------------------------------------------------------


def test_reset_starts_the_anchored_stream_again_exactly() -> None:
    method = eatta.create("tent", confident_cnn(), weight_anchor=ALPHA)
    batches = image_batches(3, size=16)
    first = [method(x) for x in batches]
    method.reset()
    again = [method(x) for x in batches]
    assert nested_equal(first, again)


@pytest.mark.parametrize("name", ["tent", "eatta"])
def test_a_saved_anchored_stream_resumes_exactly(name: str) -> None:
    """A fresh method around the same given model, loaded from a state taken mid-stream, goes
    on exactly as the one that saved it: θ₀ is the given model in both."""
    model = confident_cnn()
    kw: dict[str, Any] = {"oracle": oracle()} if name == "eatta" else {}
    batches = requests(64, 16)
    live = eatta.create(name, copy.deepcopy(model), weight_anchor=ALPHA, **kw)
    for x, y in batches[:2]:
        live(x, labels=y) if kw else live(x)
    state = copy.deepcopy(live.state_dict())
    fresh = {"oracle": oracle()} if kw else {}
    resumed = eatta.create(name, copy.deepcopy(model), weight_anchor=ALPHA, **fresh)
    resumed.load_state_dict(state)
    for x, y in batches[2:]:
        a = live(x, labels=y) if kw else live(x)
        b = resumed(x, labels=y) if kw else resumed(x)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert nested_equal(live.state_dict(), resumed.state_dict())
