"""EATTA's performance options: gradient modes, segment plans, autocast, channels-last, deferral."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import eatta
import eatta.golden
from _state_checks import assert_same_state, exact_state
from conftest import GOLDEN_DIR, confident_cnn
from eatta import EATTA, GroundTruthOracle, InvalidInputError
from eatta.buffer import LabelBuffer
from eatta.configure import collect_params
from eatta.gradients import check_gradient, make_gradient
from eatta.gradients.exact import (
    Batched,
    Segmented,
    TwoPass,
    batched_grads,
    plan_segments,
    segmented_grads,
    two_pass_grads,
)
from eatta.losses import entropy

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

MODES = ("auto", "segmented", "batched")
SEGMENTED_4 = functools.partial(segmented_grads, segments=4)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one thread is fastest and immune to a busy machine's scheduling."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Block(nn.Module):
    """conv-BN-ReLU-conv-BN plus the identity: a residual block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


def tiny_resnet(num_classes: int = 5, width: int = 8, seed: int = 0) -> nn.Sequential:
    """Stem, two residual blocks, pooling, a confident head: a Sequential, so the split is found."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        Block(width),
        Block(width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, num_classes),
    )
    with torch.no_grad():
        model[-1].weight.mul_(8.0)
    return model


def make(model: nn.Module, segment_min_bytes: int | None = None, **kw) -> EATTA:
    params = eatta.configure(model)
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True)
    method = EATTA(model, opt, oracle=GroundTruthOracle(), **kw)
    if segment_min_bytes is not None and isinstance(method.gradient.strategy, Segmented):
        method.gradient.strategy.min_bytes = (
            segment_min_bytes if method.gradient.strategy.auto else 0.0
        )
    return method


def run(method: EATTA, xs, ys) -> list[torch.Tensor]:
    outs = []
    for x, y in zip(xs, ys, strict=True):
        method.oracle.set_labels(y)
        outs.append(method(x))
    return outs


def stream(n: int = 3, batch: int = 12, size: int = 8, classes: int = 5, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(batch, 3, size, size, generator=g) for _ in range(n)]
    ys = [torch.randint(0, classes, (batch,), generator=g) for _ in range(n)]
    return xs, ys


def params_of(method: EATTA) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in method.model.named_parameters()}


def assert_same_run(a: EATTA, b: EATTA, atol: float) -> None:
    for k, v in params_of(a).items():
        torch.testing.assert_close(params_of(b)[k], v, rtol=0, atol=atol, msg=k)
    ra, rb = a.last_step, b.last_step
    assert torch.equal(ra.selected, rb.selected)
    for field in ("grad_norm_sup", "grad_norm_unsup", "loss"):
        torch.testing.assert_close(getattr(rb, field), getattr(ra, field), rtol=1e-6, atol=atol)


# -- gradient modes ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("build", [tiny_resnet, confident_cnn], ids=["resnet", "cnn"])
def test_grad_modes_give_the_same_updates(mode, build):
    xs, ys = stream()
    ref = make(build(), grad_mode="two-pass")
    other = make(build(), grad_mode=mode, segment_min_bytes=0)  # "auto" segments too
    outs_ref, outs = run(ref, xs, ys), run(other, xs, ys)
    for a, b in zip(outs_ref, outs, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    assert_same_run(ref, other, atol=1e-6)
    assert ref.last_step.weights is not None  # a full labelled step with both losses


@pytest.mark.parametrize("mode", MODES)
def test_grad_modes_agree_with_a_label_buffer(mode):
    xs, ys = stream(n=4)
    ref = make(tiny_resnet(), grad_mode="two-pass", buffer=LabelBuffer(capacity=5, batch_size=3))
    other = make(
        tiny_resnet(),
        grad_mode=mode,
        buffer=LabelBuffer(capacity=5, batch_size=3),
        segment_min_bytes=0,
    )
    run(ref, xs, ys), run(other, xs, ys)
    assert_same_run(ref, other, atol=1e-6)


def test_auto_plans_segments_from_the_logits_for_large_graphs_only():
    x = stream(n=1)[0][0]
    auto, seg = make(tiny_resnet()), make(tiny_resnet(), grad_mode="segmented")
    two = make(tiny_resnet(), grad_mode="two-pass")
    assert isinstance(auto.gradient.strategy, Segmented)
    assert isinstance(two.gradient.strategy, TwoPass)
    small = auto.gradient.plan(auto.model(x))  # a few KiB of activations: not worth segmenting
    assert small is not None and not small.cuts
    assert 0 < small.graph_bytes < auto.gradient.strategy.min_bytes == 32 * 2**20
    assert len(seg.gradient.plan(seg.model(x)).cuts) >= 1  # asked for explicitly: segmented anyway
    eager = make(tiny_resnet(), segment_min_bytes=0)
    assert len(eager.gradient.plan(eager.model(x)).cuts) >= 1
    assert two.gradient.plan(two.model(x)) is None


def test_invalid_options_are_rejected():
    model = tiny_resnet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="grad_mode"):
        make(model, grad_mode="fast")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="grad_segments"):
        check_gradient("auto", segments=0)
    with pytest.raises(ValueError, match="segment_min_bytes"):
        check_gradient("auto", segment_min_bytes=-1)
    with pytest.raises(ValueError, match="approx_proxy"):
        check_gradient("approx", proxy="middle")
    with pytest.raises(ValueError, match="approx_refresh"):
        check_gradient("approx", refresh=0)
    check_gradient("auto", segments=1, segment_min_bytes=0)  # the bounds


def test_the_gradient_is_chosen_once_and_defaults_to_four_segments():
    model = tiny_resnet()
    params = list(model.parameters())
    gradient = make_gradient("auto", model, params, params)
    assert (gradient.strategy.segments, gradient.strategy.auto) == (4, True)
    assert isinstance(make_gradient("two-pass", model, params, params).strategy, TwoPass)
    with pytest.raises(TypeError, match="backbone"):  # the approximate one estimates at it
        make_gradient("approx", model, params, params)


def test_keywords_set_the_step():
    m = make(tiny_resnet(), grad_mode="batched", autocast=True)
    assert (m.grad_mode, m.autocast, m.channels_last) == ("batched", True, False)
    assert isinstance(m.gradient.strategy, Batched)


def test_grad_modes_reproduce_the_golden_traces(monkeypatch):
    for mode in ("segmented", "batched"):  # "auto" (two passes here) is test_golden.py
        monkeypatch.setattr(eatta.golden, "EATTA", functools.partial(EATTA, grad_mode=mode))
        for path in sorted(GOLDEN_DIR.glob("*.pt")):
            report = eatta.golden.replay_trace(path)
            assert report.ok and report.worst_ratio <= 1.0, (mode, path.name)


# -- the segment plan ---------------------------------------------------------------------------
def _losses(model: nn.Module, x: torch.Tensor):
    o = model(x)
    return F.cross_entropy(o[:2], torch.tensor([0, 1])), entropy(o).mean()


def _all_equal(a, b) -> bool:
    return all((u is None and v is None) or torch.equal(u, v) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize("segments", [2, 3, 4, 8])
def test_segmented_grads_are_bitwise_the_two_pass_grads(segments):
    model = tiny_resnet()
    params = eatta.configure(model)
    x = stream(n=1)[0][0]
    ref = two_pass_grads(*_losses(model, x), params)
    first, second = _losses(model, x)
    plan = plan_segments([first.grad_fn, second.grad_fn], params, segments)
    assert 1 <= len(plan.cuts) <= segments - 1
    assert set(plan.segment_of) <= set(range(plan.num_segments)) and -1 not in plan.segment_of
    got = segmented_grads(first, second, params, segments, plan)
    assert _all_equal(ref[0], got[0]) and _all_equal(ref[1], got[1])


class LongSkip(nn.Module):
    """``head(f2(f1(a)) + pool(a))``: the skip from ``a`` bypasses everything between."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.f1 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.f2 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Linear(4, 3)
        self.seen: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.stem(x)
        b = self.f1(a)
        c = self.f2(b)
        self.seen = {"a": a, "b": b, "c": c}
        return self.head((c + a).mean(dim=(2, 3)))


def test_no_cut_inside_a_bypassed_region_and_grads_stay_exact():
    torch.manual_seed(0)
    model = LongSkip()
    params = eatta.configure(model)
    x = torch.randn(6, 3, 6, 6)
    ref = two_pass_grads(*_losses(model, x), params)
    first, second = _losses(model, x)
    inside = set()
    stack = [model.seen["c"].grad_fn]
    stop = model.seen["a"].grad_fn
    while stack:  # every node strictly between a and the join: none may be a cut
        node = stack.pop()
        if node is None or node is stop or node in inside:
            continue
        inside.add(node)
        stack.extend(n for n, _ in node.next_functions)
    plan = plan_segments([first.grad_fn, second.grad_fn], params, 8)
    assert plan.cuts and all(edge.node not in inside for edge in plan.cuts)
    got = segmented_grads(first, second, params, 8, plan)
    assert _all_equal(ref[0], got[0]) and _all_equal(ref[1], got[1])


class Shared(nn.Module):
    """The same conv-BN applied twice, with another layer between: shared weights."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.mid = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(self.mid(self.block(self.stem(x))))
        return self.head(h.mean(dim=(2, 3)))


@pytest.mark.parametrize("fn", [SEGMENTED_4, batched_grads], ids=["segmented", "batched"])
def test_shared_weights_get_the_two_pass_gradients(fn):
    torch.manual_seed(0)
    model = Shared()
    params = eatta.configure(model)
    x = torch.randn(6, 3, 6, 6)
    ref = two_pass_grads(*_losses(model, x), params)
    got = fn(*_losses(model, x), params)
    for r, g in zip(ref[0] + ref[1], got[0] + got[1], strict=True):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fn", [SEGMENTED_4, batched_grads], ids=["segmented", "batched"])
def test_unused_parameters_get_none_like_two_pass(fn):
    model = tiny_resnet()
    params = eatta.configure(model)
    unused = nn.Parameter(torch.ones(3))
    x = stream(n=1)[0][0]
    ref = two_pass_grads(*_losses(model, x), [*params, unused])
    got = fn(*_losses(model, x), [*params, unused])
    assert ref[0][-1] is None and got[0][-1] is None and got[1][-1] is None
    assert all(g is not None for g in got[0][:-1] + got[1][:-1])


# -- autocast and channels-last ------------------------------------------------------------------
def test_autocast_off_changes_nothing():
    xs, ys = stream()
    a, b = make(tiny_resnet()), make(tiny_resnet(), autocast=False, channels_last=False)
    for u, v in zip(run(a, xs, ys), run(b, xs, ys), strict=True):
        assert torch.equal(u, v)
    assert all(torch.equal(v, params_of(b)[k]) for k, v in params_of(a).items())


def test_bf16_autocast_runs_the_backbone_in_bf16_and_keeps_the_rest_fp32():
    xs, ys = stream()
    method = make(tiny_resnet(), autocast=True)
    dtypes = []
    method.model[0].register_forward_hook(lambda mod, inp, out: dtypes.append(out.dtype))
    before = params_of(method)
    outs = run(method, xs, ys)
    assert dtypes and all(d == torch.bfloat16 for d in dtypes)
    assert all(o.dtype == torch.float32 and torch.isfinite(o).all() for o in outs)
    rec = method.last_step
    assert rec.scores.dtype == torch.float32 and rec.weights is not None
    assert torch.isfinite(rec.grad_norm_sup) and torch.isfinite(rec.grad_norm_unsup)
    after = params_of(method)
    assert all(v.dtype == torch.float32 for v in after.values())
    assert any(not torch.equal(after[k], before[k]) for k in before)
    # close to the fp32 run on every batch and in the update itself: bf16 changes rounding (about
    # 0.3% of the logits, 4% of the update here), not the method
    ref = make(tiny_resnet())
    ref_outs = run(ref, xs, ys)
    for got, want in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0.06)
    assert torch.equal(method.last_step.selected, ref.last_step.selected)
    moved = {k: params_of(ref)[k] - v for k, v in before.items()}
    error = {k: after[k] - params_of(ref)[k] for k in before}
    norm = lambda d: sum(float(t.norm()) ** 2 for t in d.values()) ** 0.5  # noqa: E731
    assert norm(moved) > 0 and norm(error) < 0.1 * norm(moved)


def test_channels_last_converts_model_and_input_and_keeps_the_update():
    xs, ys = stream()
    ref = make(tiny_resnet())
    method = make(tiny_resnet(), channels_last=True)
    conv = method.model[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    seen = []
    method.model[0].register_forward_pre_hook(
        lambda mod, inp: seen.append(inp[0].is_contiguous(memory_format=torch.channels_last))
    )
    for a, b in zip(run(ref, xs, ys), run(method, xs, ys), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert seen and all(seen)
    assert_same_run(ref, method, atol=1e-5)
    method.reset()  # the reset copies the initial weights back into the channels-last tensors
    assert torch.equal(method.model[0].weight, make(tiny_resnet()).model[0].weight)


# -- the deferred finiteness check ---------------------------------------------------------------


@pytest.mark.parametrize("labelled", [True, False], ids=["with-label", "no-label-step"])
def test_deferred_finite_check_raises_before_any_state_change(monkeypatch, labelled):
    xs, ys = stream()
    budget = eatta.Budget(1) if labelled else eatta.Budget(1, every=2)
    method = make(tiny_resnet(), budget=budget)
    method._finite.everywhere = True  # the accelerator's path, on the CPU
    run(method, xs[:1], ys[:1])  # a first step, so there is state to keep
    before, revealed = exact_state(method), method.oracle.revealed
    bad = xs[1].clone()
    bad[2, 0, 0, 0] = float("nan")
    method.oracle.set_labels(ys[1])
    with pytest.raises(InvalidInputError, match="NaN or infinite"):
        method(bad)
    assert_same_state(before, method)
    assert method.oracle.revealed == revealed  # the oracle was not asked about a bad batch
    assert method._finite.flag is None
    # a good batch afterwards behaves exactly as without deferral
    ref = make(tiny_resnet(), budget=eatta.Budget(1) if labelled else eatta.Budget(1, every=2))
    run(ref, xs[:1], ys[:1])
    torch.testing.assert_close(
        run(method, xs[1:2], ys[1:2])[0], run(ref, xs[1:2], ys[1:2])[0], rtol=0, atol=0
    )


@pytest.mark.parametrize("deferred", [True, False], ids=["accelerator", "cpu"])
def test_check_input_defers_the_finiteness_read_only_where_it_saves_a_sync(monkeypatch, deferred):
    method = make(tiny_resnet())
    method._finite.everywhere = deferred  # the accelerator's path, on the CPU
    bad = stream(n=1)[0][0].clone()
    bad[0, 0, 0, 0] = float("inf")
    if deferred:  # no host sync now: a flag on the device, read at the step's sync
        method.check_input(bad)
        assert method._finite.flag is not None and not bool(method._finite.flag)
        assert method.check_finite  # unchanged by the deferred call
    else:
        with pytest.raises(InvalidInputError, match="NaN or infinite"):
            method.check_input(bad)
        assert method._finite.flag is None


def test_finite_check_is_deferred_only_off_the_cpu_and_for_side_effect_free_forwards():
    method = make(tiny_resnet())
    assert not method._finite.applies(torch.zeros(2, 3, 8, 8), method.model)
    meta = torch.empty(2, 3, 8, 8, device="meta")
    assert method._finite.applies(meta, method.model)
    torch.manual_seed(0)
    stats = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 2))
    params = list(stats[1].parameters())
    updating = EATTA(stats.train(), torch.optim.SGD(params, lr=0.1), oracle=GroundTruthOracle())
    assert not updating._finite.applies(meta, updating.model)  # train-mode BN: running stats


def test_auto_keeps_two_plain_passes_when_the_model_has_hooks():
    xs, ys = stream(n=1)
    method = make(tiny_resnet(), segment_min_bytes=0)  # would segment, were it not for hooks
    assert method.gradient.strategy.active
    calls = []

    def count(mod: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        out.register_hook(lambda g: calls.append(1))

    method.model[1].register_forward_hook(count)
    assert not method.gradient.strategy.active
    run(method, xs, ys)
    assert len(calls) == 2  # one per backward pass, none repeated at a cut


@pytest.mark.parametrize("mode", MODES)
def test_grad_modes_agree_when_norms_are_measured_over_more_parameters(mode):
    """The reference preset's shape: train some layers (conv weights too), measure all norms."""

    def build(grad_mode: str) -> EATTA:
        model = tiny_resnet()
        norms, _ = collect_params(model, "norm")
        train = list(model[3].parameters()) + list(model[1].parameters())  # block 1 and stem BN
        eatta.configure(model, lambda mod, m, p: mod.startswith(("3.", "1")))
        opt = torch.optim.SGD(train, lr=0.05, momentum=0.9)
        method = EATTA(
            model, opt, oracle=GroundTruthOracle(), grad_norm_params=norms, grad_mode=grad_mode
        )
        if isinstance(method.gradient.strategy, Segmented):
            method.gradient.strategy.min_bytes = 0  # segment even these small graphs
        return method

    xs, ys = stream()
    ref, other = build("two-pass"), build(mode)
    run(ref, xs, ys), run(other, xs, ys)
    assert_same_run(ref, other, atol=1e-6)
