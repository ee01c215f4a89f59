"""The approximate EATTA step (``grad_mode="approx"``): one backward pass, estimated norms."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import eatta
from conftest import confident_cnn
from eatta import EATTA, GroundTruthOracle
from eatta.debias import BoundedGradNormDebiaser, GradNormDebiaser, LossWeights
from eatta.gradients.approx import (
    NormCalibration,
    feature_grad,
    last_norm_params,
    logit_grad_ce,
    logit_grad_entropy,
)
from eatta.losses import entropy, masked_mean
from eatta.methods.registry import create

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 5, (16,), generator=g)


def _method(model: nn.Module, lr: float = 2.5e-4, **kw) -> EATTA:
    params = eatta.configure(model)
    return EATTA(model, torch.optim.SGD(params, lr=lr), oracle=GroundTruthOracle(), **kw)


# -- the closed form through the head ------------------------------------------------------------
def test_logit_grads_by_hand():
    # two classes, logits (0, 0): p = (1/2, 1/2); cross-entropy on class 0: δ = p − e_0
    o = torch.zeros(1, 2)
    assert torch.equal(logit_grad_ce(o, torch.tensor([0])), torch.tensor([[-0.5, 0.5]]))
    # uniform p is the entropy's maximum: zero gradient; a masked row contributes nothing
    o = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # second row: p = (3/4, 1/4)
    g = logit_grad_entropy(o, torch.tensor([True, True]))
    assert torch.allclose(g[0], torch.zeros(2))
    p = torch.tensor([0.75, 0.25])
    h = -(p * p.log()).sum()
    assert torch.allclose(g[1], -p * (p.log() + h) / 2)  # mean over the 2 rows
    assert g[1, 0] < 0 < g[1, 1]  # lowering the entropy sharpens the larger logit
    g = logit_grad_entropy(o, torch.tensor([False, True]))
    assert torch.equal(g[0], torch.zeros(2))
    assert torch.allclose(g[1], -p * (p.log() + h))  # one row: the mean is that row
    # through a linear head o = z Wᵀ + b: ∂L/∂z = δ W, here δ (1, 2) and W (2, 3)
    w = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 1.0]])
    assert torch.equal(
        feature_grad(torch.tensor([[-0.5, 0.5]]), w), torch.tensor([[-0.5, -1.5, -1.0]])
    )


def test_closed_form_head_gradient_equals_autograd():
    torch.manual_seed(0)
    head = nn.Linear(6, 4)
    z = torch.randn(10, 6, requires_grad=True)
    o = head(z)
    idx, y = torch.tensor([2, 7]), torch.tensor([3, 0])
    mask = entropy(o).detach() < 1.2
    mask[idx] = False
    assert 0 < int(mask.sum()) < 10
    ce = F.cross_entropy(o[idx], y)
    ent, _ = masked_mean(entropy(o), mask)
    auto_ce, auto_ent = (torch.autograd.grad(loss, z, retain_graph=True)[0] for loss in (ce, ent))
    delta_ce = torch.zeros_like(o)
    delta_ce[idx] = logit_grad_ce(o.detach()[idx], y)
    delta_ent = logit_grad_entropy(o.detach(), mask)
    assert torch.allclose(feature_grad(delta_ce, head.weight), auto_ce, atol=1e-6)
    assert torch.allclose(feature_grad(delta_ent, head.weight), auto_ent, atol=1e-6)


def test_last_norm_params_is_the_last_norm_layer():
    model = confident_cnn()
    params = eatta.configure(model)
    assert last_norm_params(model[:-1], params) == [model[4].weight, model[4].bias]
    assert last_norm_params(model[:-1], params[:2]) == [model[1].weight, model[1].bias]
    assert last_norm_params(nn.Sequential(nn.Conv2d(3, 3, 1)), params) == []


# -- one backward pass ---------------------------------------------------------------------------
class _CountBackward(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        _CountBackward.calls += 1
        return g


class _Counter(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _CountBackward.apply(x)


def _counted_model() -> nn.Sequential:
    """confident_cnn with a layer after the first BatchNorm counting the backward passes that
    reach it (every pass that computes the first BatchNorm's gradient goes through it)."""
    m = confident_cnn()
    return nn.Sequential(*list(m[:2]), _Counter(), *list(m[2:]))


@pytest.mark.parametrize(("mode", "passes"), [("auto", 2), ("two-pass", 2), ("approx", 1)])
def test_backward_passes_through_the_network(mode, passes):
    x, y = _batch()
    method = _method(_counted_model(), grad_mode=mode)
    for _ in range(3):
        _CountBackward.calls = 0
        method(x, labels=y)
        assert method.last_step.loss_sup is not None and int(method.last_step.num_unsup) > 0
        assert _CountBackward.calls == passes


def test_refresh_steps_take_the_exact_passes():
    x, y = _batch()
    method = _method(_counted_model(), grad_mode="approx", approx_refresh=3)
    calls, approx = [], []
    for _ in range(7):
        _CountBackward.calls = 0
        method(x, labels=y)
        calls.append(_CountBackward.calls)
        approx.append(method.last_step.grad_norms_approx)
    assert calls == [2, 1, 1, 2, 1, 1, 2]
    assert approx == [c == 1 for c in calls]


# -- what the step computes ----------------------------------------------------------------------
class _Replay(GradNormDebiaser):
    """Records the norms it receives; applies given weights if any (else the faithful rule)."""

    def __init__(self, fixed: list[LossWeights] | None = None) -> None:
        super().__init__()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.given: list[LossWeights] = []
        self.fixed = fixed

    def weights(self, g_sup, g_unsup, has_unsup):  # type: ignore[no-untyped-def]
        self.seen.append((g_sup.clone(), g_unsup.clone()))
        w = super().weights(g_sup, g_unsup, has_unsup)
        if self.fixed is not None:
            w = self.fixed[len(self.given)]
        self.given.append(w)
        return w


def test_update_is_the_weighted_sum_with_the_estimated_weights():
    """One approximate step == the exact two-pass step given the approximate step's weights,
    and those weights come from the last norm layer's gradient norms of the two losses."""
    x, y = _batch()
    base = confident_cnn()
    approx_model, exact_model = copy.deepcopy(base), copy.deepcopy(base)
    rec = _Replay()
    approx = _method(approx_model, lr=1.0, grad_mode="approx", debiaser=rec)
    before = [p.detach().clone() for p in approx.params]
    approx(x, labels=y)
    replay = _Replay(fixed=rec.given)
    exact = _method(exact_model, lr=1.0, grad_mode="two-pass", debiaser=replay)
    exact(x, labels=y)
    for p, q in zip(approx.params, exact.params, strict=True):  # the same update
        assert torch.allclose(p, q, atol=1e-6)
    assert any(not torch.equal(p, b) for p, b in zip(approx.params, before, strict=True))
    # the estimates: the norms over the last BatchNorm's affine parameters, by hand
    idx = approx.last_step.selected
    probe = copy.deepcopy(base)
    eatta.configure(probe)
    o = probe(x)
    mask = entropy(o).detach() < 0.4 * math.log(5)
    mask[idx] = False
    loss_sup = F.cross_entropy(o[idx], y[idx])
    loss_unsup, _ = masked_mean(entropy(o), mask)
    last = [probe[4].weight, probe[4].bias]

    def norm(loss):  # type: ignore[no-untyped-def]
        gs = torch.autograd.grad(loss, last, retain_graph=True)
        return torch.cat([g.reshape(-1) for g in gs]).norm()

    g_sup, g_unsup = rec.seen[0]
    assert torch.allclose(g_sup, norm(loss_sup), rtol=1e-5)
    assert torch.allclose(g_unsup, norm(loss_unsup), rtol=1e-5)
    # the exact norms differ (more layers): the estimate is not the exact value in disguise
    assert replay.seen[0][0] > g_sup
    w = rec.given[0]  # first step: the raw Eq. 4-5 weights
    assert torch.allclose(w.sup, 2 * g_unsup / (g_sup + g_unsup))
    assert torch.allclose(w.unsup, 2 * g_sup / (g_sup + g_unsup))
    assert approx.last_step.grad_norms_approx and not exact.last_step.grad_norms_approx
    assert torch.equal(approx.last_step.grad_norm_sup, g_sup)


def test_head_proxy_uses_the_feature_gradient():
    x, y = _batch()
    rec = _Replay()
    model = confident_cnn()
    method = _method(copy.deepcopy(model), grad_mode="approx", approx_proxy="head", debiaser=rec)
    method(x, labels=y)
    idx = method.last_step.selected
    eatta.configure(model)
    z = model[:-1](x)
    o = model[-1](z)
    mask = entropy(o).detach() < 0.4 * math.log(5)
    mask[idx] = False
    delta_sup = torch.zeros_like(o)
    delta_sup[idx] = logit_grad_ce(o.detach()[idx], y[idx])
    delta_unsup = logit_grad_entropy(o.detach(), mask)
    g_sup, g_unsup = rec.seen[0]
    assert torch.allclose(g_sup, feature_grad(delta_sup, model[-1].weight).norm(), rtol=1e-5)
    assert torch.allclose(g_unsup, feature_grad(delta_unsup, model[-1].weight).norm(), rtol=1e-5)


def test_refresh_scales_the_estimates_by_the_last_exact_ratio():
    x, y = _batch()
    rec = _Replay()
    method = _method(confident_cnn(), grad_mode="approx", approx_refresh=2, debiaser=rec)
    est = []
    orig = NormCalibration.refresh

    def spy(self, e, exact):  # type: ignore[no-untyped-def]
        est.append((e, exact))
        orig(self, e, exact)

    NormCalibration.refresh = spy  # type: ignore[method-assign]
    try:
        for _ in range(3):
            method(x, labels=y)
    finally:
        NormCalibration.refresh = orig  # type: ignore[method-assign]
    assert len(est) == 2  # steps 0 and 2 refreshed
    (e0, x0), (e2, x2) = est
    assert torch.equal(rec.seen[0][0], x0[0]) and torch.equal(rec.seen[2][1], x2[1])  # exact
    # step 1: estimate × (exact / estimate) of step 0, each loss on its own
    scale = (x0[0] / e0[0], x0[1] / e0[1])
    seen = rec.seen[1]
    raw = (seen[0] / scale[0], seen[1] / scale[1])
    assert torch.allclose(raw[0] / raw[1], e2[0] / e2[1], rtol=0.2)  # same batch, near model
    assert not torch.allclose(seen[0], raw[0])


# -- the exact path and the defaults -------------------------------------------------------------
def test_exact_step_is_the_default_and_records_exact_norms():
    x, y = _batch()
    method = create("eatta", confident_cnn(), oracle=GroundTruthOracle())
    assert method.grad_mode == "auto" and not method.gradient.approximate
    assert not hasattr(method.gradient, "calibration")
    method(x, labels=y)
    assert not method.last_step.grad_norms_approx
    assert "grad_norm_estimate" not in method.method_state()


def test_stable_variant_builds_the_approximate_step_with_bounded_weights():
    method = create(
        "eatta-stable",
        confident_cnn(),
        oracle=GroundTruthOracle(),
        grad_mode="approx",
        approx_refresh=8,
    )
    assert method.grad_mode == "approx" and method.gradient.calibration.period == 8
    assert method.gradient.proxy == "last-norm"
    assert isinstance(method.debiaser, BoundedGradNormDebiaser)
    x, y = _batch()
    method(x, labels=y)
    w = method.last_step.weights
    assert method.last_step.grad_norms_approx is False  # step 0 is a refresh
    assert float(w.sup) >= 1.0 >= float(w.unsup)


# -- state ---------------------------------------------------------------------------------------
def test_calibration_state_round_trips_and_skips_roll_back():
    x, y = _batch()
    method = _method(confident_cnn(), grad_mode="approx", approx_refresh=4)
    for _ in range(2):
        method(x, labels=y)
    state = method.state_dict()
    assert state  # model and method state
    other = _method(confident_cnn(), grad_mode="approx", approx_refresh=4)
    other.load_state_dict(state)
    assert other.gradient.calibration.steps == 2
    assert torch.equal(other.gradient.calibration._scale, method.gradient.calibration._scale)
    method.reset()
    assert method.gradient.calibration.steps == 0 and method.gradient.calibration._scale is None
    mismatch = _method(confident_cnn(), grad_mode="approx", approx_refresh=3)
    with pytest.raises(ValueError, match="approx_refresh=4"):
        mismatch.load_state_dict(state)
    # a step whose gradients are not finite changes nothing, the step counter included
    skipper = _method(confident_cnn(), lr=1.0, grad_mode="approx", approx_refresh=4)
    skipper(x, labels=y)
    with torch.no_grad():
        skipper.model[-1].weight.mul_(float("inf"))
    with pytest.warns(RuntimeWarning, match="skipped"):
        skipper(x, labels=y)
    assert skipper.skipped_steps == 1 and skipper.gradient.calibration.steps == 1


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -3, 1.5, True])
def test_bad_refresh_period_is_an_error_naming_it(bad):
    with pytest.raises(ValueError, match=f"approx_refresh.*{bad!r}"):
        _method(confident_cnn(), grad_mode="approx", approx_refresh=bad)


def test_auto_proxy_is_the_last_norm_layer_where_there_is_one_else_the_head():
    """The default runs the approximate step on every model the exact step runs on."""
    with_norm = _method(confident_cnn(), grad_mode="approx")
    assert with_norm.gradient.proxy == "last-norm" and with_norm.gradient.proxy_params
    no_norm = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(144, 5))
    params = list(no_norm[0].parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    method = EATTA(no_norm, opt, oracle=GroundTruthOracle(), grad_mode="approx")
    assert method.gradient.proxy == "head"
    x, y = _batch()
    before = [p.detach().clone() for p in params]
    method(x, labels=y)
    assert method.last_step.grad_norms_approx
    assert any(not torch.equal(a, p) for a, p in zip(before, params, strict=True))


def test_eatta_safe_runs_on_a_model_without_normalization_layers():
    """The public path: eatta-safe (the approximate step by default) on an MLP, every
    parameter adapted, as the exact eatta runs on it."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 5))
    x, y = _batch()
    for name in ("eatta", "eatta-safe"):
        method = create(name, copy.deepcopy(mlp), oracle=GroundTruthOracle(), params="all")
        for _ in range(2):
            assert torch.isfinite(method(x, labels=y)).all()
        assert method.labels_used == 2
    assert method.gradient.proxy == "head"
    given, adapted = mlp.parameters(), method.model.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(given, adapted, strict=True))


def test_bad_proxy_and_unsupported_models_are_errors():
    with pytest.raises(ValueError, match=r"approx_proxy.*'fast'"):
        _method(confident_cnn(), grad_mode="approx", approx_proxy="fast")
    with pytest.raises(ValueError, match="grad_mode"):
        _method(confident_cnn(), grad_mode="approximate")
    no_norm = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(144, 5))
    params = list(no_norm[0].parameters())
    with pytest.raises(ValueError, match="last-norm"):
        EATTA(
            no_norm,
            torch.optim.SGD(params, lr=0.1),
            oracle=GroundTruthOracle(),
            grad_mode="approx",
            approx_proxy="last-norm",
        )
    # the head estimate needs no normalization layer
    method = EATTA(
        no_norm,
        torch.optim.SGD(params, lr=0.1),
        oracle=GroundTruthOracle(),
        grad_mode="approx",
        approx_proxy="head",
    )
    x, y = _batch()
    method(x, labels=y)
    with pytest.raises(ValueError, match="approx_refresh"):
        create("eatta", confident_cnn(), oracle=GroundTruthOracle(), approx_refresh=0)
    with pytest.raises(ValueError, match="approx_proxy"):
        create("eatta-stable", confident_cnn(), oracle=GroundTruthOracle(), approx_proxy="x")


# -- any model the exact step works on: the split (and the proxy) found on the first batch -----
class _FeaturesClassifier(nn.Module):
    """A published-CNN shape: ``features`` then ``classifier``, split found only on a batch."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@pytest.mark.parametrize("size", [1, 8, 64])
def test_approx_on_a_custom_model_finds_its_proxy_on_the_first_batch(size):
    torch.manual_seed(0)
    model = _FeaturesClassifier()
    with pytest.raises(eatta.split.SplitNotFoundError):
        eatta.split.split_model(_FeaturesClassifier())  # no rule by class: needs a batch
    window = {"window": 64} if size == 1 else {}
    method = create("eatta", model, oracle=GroundTruthOracle(), grad_mode="approx", **window)
    before = [p.detach().clone() for p in method.params]
    g = torch.Generator().manual_seed(3)
    steps = 64 if size == 1 else 1  # a request of 1 joins the window: it steps at the 64th
    for _ in range(steps):
        x = torch.randn(size, 3, 8, 8, generator=g)
        y = torch.randint(0, 5, (size,), generator=g)
        out = method(x, labels=y)
        assert out.shape == (size, 5)
    record = method.last_step
    assert record is not None and not record.skipped
    assert record.grad_norms_approx  # one backward pass on estimated norms
    assert method.labels_used == 1
    bn = method.model.features[1]
    assert [id(p) for p in method.gradient.proxy_params] == [id(bn.weight), id(bn.bias)]
    assert any(not torch.equal(a, p) for a, p in zip(before, method.params, strict=True))


def test_approx_with_the_fallback_and_an_annotator_16_batches_late_on_a_custom_model():
    from eatta.annotate import SimulatedAnnotator

    torch.manual_seed(0)
    ann = SimulatedAnnotator(delay=16)
    method = create("eatta-safe", _FeaturesClassifier(), oracle=ann, grad_mode="approx")
    g = torch.Generator().manual_seed(4)
    for _ in range(20):
        x = torch.randn(8, 3, 8, 8, generator=g)
        method(x, labels=torch.randint(0, 5, (8,), generator=g))
    assert method.labels_used == 20  # one request per batch
    assert method.annotation_stats["received"] == 4  # the answers to batches 1-4 came back
    assert method.last_step is not None and method.last_step.late == 1
    assert method.last_step.grad_norms_approx
