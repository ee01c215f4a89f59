"""EATTA's step: adaptation, degenerate steps, bad input, reset, state round trips."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import eatta
import eatta.gradients.exact
from _state_checks import assert_reset_state, assert_same_state, differences, exact_state
from conftest import confident_cnn, tiny_cnn
from eatta import EATTA, Budget, GroundTruthOracle, InvalidInputError, OracleError
from eatta.buffer import LabelBuffer
from eatta.debias import GradNormDebiaser
from eatta.losses import default_entropy_margin, entropy

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


def make(model=None, budget=1, oracle=None, lr=0.05, **kw):
    model = model if model is not None else confident_cnn()
    params = eatta.configure(model)
    oracle = oracle if oracle is not None else GroundTruthOracle()
    return EATTA(
        model, torch.optim.SGD(params, lr=lr, momentum=0.9), oracle=oracle, budget=budget, **kw
    )


LR = 0.05


def sgd_first_step(model: nn.Module, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameters after a first SGD step with momentum (the buffer starts as the gradient)."""
    named = dict(model.named_parameters())
    return {n: named[n].detach() - LR * g for n, g in grads.items()}


def grads_of(model: nn.Module, loss: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    named = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [named[n] for n in names], retain_graph=True)
    return dict(zip(names, grads, strict=True))


def trained_names(m: EATTA) -> list[str]:
    ids = {id(p) for p in m.params}
    return [n for n, p in m.model.named_parameters() if id(p) in ids]


def assert_params(m: EATTA, expected: dict[str, torch.Tensor], atol: float = 1e-7) -> None:
    named = dict(m.model.named_parameters())
    for n, want in expected.items():
        torch.testing.assert_close(named[n].detach(), want, rtol=0, atol=atol, msg=n)


def test_two_line_use_predicts_and_adapts_only_norm_params(batch):
    x, y = batch
    model = confident_cnn()
    frozen = {n: p.clone() for n, p in model.named_parameters()}
    params = eatta.configure(model)
    oracle = GroundTruthOracle()
    adapted = EATTA(model, torch.optim.SGD(params, lr=0.05, momentum=0.9), oracle=oracle, budget=1)
    oracle.set_labels(y)
    logits = adapted(x)
    assert logits.shape == (16, 5) and not logits.requires_grad
    assert adapted.labels_used == 1 and oracle.revealed == 1
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, frozen[n])}
    assert changed and all(n in {"1.weight", "1.bias", "4.weight", "4.bias"} for n in changed)


def test_returned_logits_are_computed_before_the_update(batch):
    x, y = batch
    m = make()
    m.oracle.set_labels(y)
    with torch.no_grad():
        expected = m.model(x)
    assert torch.equal(m(x), expected)
    with torch.no_grad():
        assert not torch.allclose(m.model(x), expected)


def test_budget_every_n_batches_and_total_cap(batch):
    x, y = batch
    m = make(budget=Budget(2, every=3, total=5))
    used = []
    for _ in range(9):
        m(x, labels=y)
        used.append(m.labels_used)
    # labels on batches 0, 3, 6 (2 each) capped at 5 in total
    assert used == [2, 2, 2, 4, 4, 4, 5, 5, 5]


def test_no_label_step_applies_the_confident_entropy_gradient_with_weight_one(batch):
    x, _ = batch
    m = make(oracle=lambda inputs, idx: None)  # abstains
    names = trained_names(m)
    ref = copy.deepcopy(m.model)
    h = entropy(ref(x))
    confident = h < default_entropy_margin(5)
    assert 0 < int(confident.sum()) < len(x)  # a real subset, so the mask matters
    expected = sgd_first_step(ref, grads_of(ref, h[confident].mean(), names))
    m(x)
    assert_params(m, expected)
    rec = m.last_step
    assert m.labels_used == 0 and rec.loss_sup is None and rec.weights is None
    assert torch.equal(rec.loss, rec.loss_unsup) and int(rec.num_unsup) == int(confident.sum())
    assert m.debiaser.current is None  # EMA untouched
    assert m.balance.classes == [] and m.budget.batches_seen == 1


def test_per_sample_abstention_counts_only_answered(batch):
    x, y = batch

    def oracle(inputs, idx):
        out = y[idx].clone()
        out[0] = eatta.ABSTAIN
        return out

    m = make(budget=3, oracle=oracle)
    m(x)
    assert m.labels_used == 2 and len(m.last_step.selected) == 2


def test_empty_unsup_set_applies_the_labelled_gradient_alone(batch):
    x, y = batch
    m = make(model=tiny_cnn(), entropy_margin=0.0)  # nothing is confident
    names = trained_names(m)
    ref = copy.deepcopy(m.model)
    m(x, labels=y)
    rec = m.last_step
    (i,) = rec.selected.tolist()
    expected = sgd_first_step(
        ref, grads_of(ref, F.cross_entropy(ref(x)[i : i + 1], y[i : i + 1]), names)
    )
    assert_params(m, expected)
    assert int(rec.num_unsup) == 0 and float(rec.loss_unsup) == 0.0
    assert float(rec.weights.sup) == 1.0 and float(rec.weights.unsup) == 0.0
    assert m.debiaser.current is None
    assert torch.equal(rec.loss, rec.loss_sup)


def test_labelled_update_is_the_gradient_norm_weighted_sum(batch):
    x, y = batch
    m = make()
    names = trained_names(m)
    ref = copy.deepcopy(m.model)
    m(x, labels=y)
    rec = m.last_step
    (i,) = rec.selected.tolist()
    o = ref(x)
    h = entropy(o)
    mask = h.detach() < default_entropy_margin(5)
    mask[i] = False
    gs = grads_of(ref, F.cross_entropy(o[i : i + 1], y[i : i + 1]), names)
    gu = grads_of(ref, h[mask].mean(), names)
    ns = torch.linalg.vector_norm(torch.stack([g.norm() for g in gs.values()]))
    nu = torch.linalg.vector_norm(torch.stack([g.norm() for g in gu.values()]))
    assert not math.isclose(float(ns), float(nu), rel_tol=0.05)  # the direction is testable
    w_sup, w_unsup = 2 * nu / (ns + nu), 2 * ns / (ns + nu)  # the larger norm, the smaller weight
    torch.testing.assert_close(rec.grad_norm_sup, ns, rtol=1e-5, atol=0)
    torch.testing.assert_close(rec.grad_norm_unsup, nu, rtol=1e-5, atol=0)
    torch.testing.assert_close(rec.weights.sup, w_sup, rtol=1e-5, atol=0)
    torch.testing.assert_close(rec.weights.unsup, w_unsup, rtol=1e-5, atol=0)
    expected = sgd_first_step(ref, {n: w_sup * gs[n] + w_unsup * gu[n] for n in names})
    assert_params(m, expected, atol=1e-6)


def test_ema_weights_follow_the_exact_recursion(make_image_batches):
    alpha = 0.3  # not the default: a test written for 0.8 alone would fail here
    m = make(debiaser=GradNormDebiaser(alpha=alpha))
    ema = None
    g = torch.Generator().manual_seed(4)
    for x in make_image_batches(4, size=16):
        m(x * 4 - 2, labels=torch.randint(0, 5, (16,), generator=g))
        w = m.last_step.weights
        gs, gu = float(m.last_step.grad_norm_sup), float(m.last_step.grad_norm_unsup)
        raw = (2 * gu / (gs + gu), 2 * gs / (gs + gu))
        assert math.isclose(float(w.sup_raw), raw[0], rel_tol=1e-5)
        assert math.isclose(float(w.unsup_raw), raw[1], rel_tol=1e-5)
        ema = (
            raw
            if ema is None
            else tuple(alpha * e + (1 - alpha) * r for e, r in zip(ema, raw, strict=True))
        )
        assert math.isclose(float(w.sup), ema[0], rel_tol=1e-5)
        assert math.isclose(float(w.unsup), ema[1], rel_tol=1e-5)
        assert [float(t) for t in m.debiaser.current] == [float(w.sup), float(w.unsup)]


def test_ablation_without_gnd_applies_the_plain_sum(batch):
    x, y = batch
    m = make(debiaser=GradNormDebiaser(normalize=False), selector=None, balance=None)
    names = trained_names(m)
    ref = copy.deepcopy(m.model)
    m(x, labels=y)
    rec = m.last_step
    assert float(rec.weights.sup) == 1.0 and float(rec.weights.unsup) == 1.0
    (i,) = rec.selected.tolist()
    o = ref(x)
    h = entropy(o)
    mask = h.detach() < default_entropy_margin(5)
    mask[i] = False
    loss = F.cross_entropy(o[i : i + 1], y[i : i + 1]) + h[mask].mean()
    assert_params(m, sgd_first_step(ref, grads_of(ref, loss, names)), atol=1e-6)


def wide_cnn() -> nn.Sequential:
    """Large enough activations (64 px) that the default "auto" mode segments its gradients."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 5),
    )
    with torch.no_grad():
        model[-1].weight.mul_(20.0)
    return model


@pytest.mark.parametrize("labelled", [True, False], ids=["labelled", "no-label"])
def test_default_path_runs_at_most_two_backward_passes(labelled):
    m = make(wide_cnn(), budget=1 if labelled else 0)
    assert m.grad_mode == "auto" and not eatta.gradients.exact.has_module_hooks(m.model)
    x = torch.randn(16, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    plan = m.gradient.plan(m.model(x))
    assert plan is not None and plan.cuts  # the default path segments this graph
    passes = {n: 0 for n in trained_names(m)}
    named = dict(m.model.named_parameters())
    handles = [
        named[n].register_hook(lambda g, n=n: passes.__setitem__(n, passes[n] + 1)) for n in passes
    ]
    m(x, labels=torch.arange(16) % 5)
    for hd in handles:
        hd.remove()
    assert m.last_step.skipped is False and (m.labels_used == 1) == labelled
    assert set(passes.values()) == ({2} if labelled else {1})  # every parameter, no more


def test_buffer_replays_into_the_supervised_loss(batch):
    x, y = batch
    m = make(buffer=LabelBuffer(capacity=3, batch_size=3))
    for _ in range(3):
        m(x, labels=y)
    ref = copy.deepcopy(m.model)
    m(x, labels=y)
    rec = m.last_step
    bx, by = m.replay.buffer.contents()  # full, and a batch of 3 replays all of it (in some order)
    assert len(m.replay.buffer) == 3 and torch.equal(bx[-1:], x[rec.selected])
    assert torch.equal(by[-1:], y[rec.selected])
    with torch.no_grad():
        own = F.cross_entropy(ref(x)[rec.selected], y[rec.selected])
        replayed = F.cross_entropy(ref(bx), by)
    torch.testing.assert_close(rec.loss_sup, own + replayed, rtol=1e-6, atol=1e-7)


def test_steps_per_batch_reselects_each_step(batch):
    x, y = batch
    m = make(steps=2)
    m(x, labels=y)
    assert m.labels_used == 2 and m.budget.batches_seen == 2


# -- bad input: clear error, nothing changed ------------------------------------------------------
BAD_INPUTS = {
    "int dtype": lambda x: x.to(torch.int64),
    "wrong rank": lambda x: x[0],
    "empty batch": lambda x: x[:0],
    "batch of one with BatchNorm": lambda x: x[:1],
    "NaN": lambda x: x.clone().index_fill_(0, torch.tensor([3]), float("nan")),
    "inf": lambda x: x.clone().index_fill_(0, torch.tensor([0]), float("inf")),
    "float64 into float32 model": lambda x: x.double(),
    "not a tensor": lambda x: x.numpy(),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_and_leaves_state(batch, case):
    x, y = batch
    m = make(buffer=2)
    m(x, labels=y)  # some state first
    before = exact_state(m)
    with pytest.raises(InvalidInputError):
        m(BAD_INPUTS[case](x), labels=y)
    assert_same_state(before, m)


def test_exact_state_sees_what_repr_misses(batch):
    """The comparison itself: a generator advanced by one draw, a momentum changed by 1 ulp."""
    x, y = batch
    m = make()
    m(x, labels=y)
    before = exact_state(m)
    m.selector.noise.generator.manual_seed(123)
    assert differences(before, exact_state(m)) == ["/method/selector/noise/rng"]
    m.selector.noise.load_state_dict(before["method"]["selector"]["noise"])
    buf = next(iter(m.optimizer.state.values()))["momentum_buffer"]
    buf[0] = torch.nextafter(buf[0], torch.tensor(1.0))
    assert differences(before, exact_state(m)) == ["/optimizer/state/0/momentum_buffer"]


def test_wrong_device_raises(batch):
    x, _ = batch
    m = make()
    with pytest.raises(InvalidInputError, match="meta"):
        m(x.to("meta"))


BAD_ORACLES = {
    "wrong shape": lambda inp, idx: torch.zeros(len(idx) + 1, dtype=torch.long),
    "float labels": lambda inp, idx: torch.zeros(len(idx)),
    "out of range": lambda inp, idx: torch.full((len(idx),), 99),
    "negative": lambda inp, idx: torch.full((len(idx),), -7),
    "raises": lambda inp, idx: (_ for _ in ()).throw(KeyError("annotator offline")),
    "not labels": lambda inp, idx: "cat",
}


@pytest.mark.parametrize("case", sorted(BAD_ORACLES))
def test_bad_oracle_raises_and_leaves_state(batch, case):
    x, y = batch
    answers = {"ok": True}

    def oracle(inp, idx):
        return y[idx] if answers["ok"] else BAD_ORACLES[case](inp, idx)

    m = make(oracle=oracle, buffer=2)
    m(x)
    answers["ok"] = False
    before = exact_state(m)
    with pytest.raises(OracleError):
        m(x)
    assert_same_state(before, m)
    answers["ok"] = True  # and the stream goes on as if the failed batch never happened
    m(x)
    assert m.labels_used == 2


def test_constructor_errors():
    model = confident_cnn()
    params = eatta.configure(model)
    opt = torch.optim.SGD(params, lr=0.1)
    with pytest.raises(TypeError, match="oracle"):
        EATTA(model, opt, oracle=None)
    with pytest.raises(ValueError, match="per_batch"):
        EATTA(model, opt, oracle=lambda *a: None, budget=-1)
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not the model's"):
        EATTA(model, torch.optim.SGD(other.parameters(), lr=0.1), oracle=lambda *a: None)
    with pytest.raises(TypeError, match="options"):  # the keywords are the one way
        EATTA(model, opt, oracle=lambda *a: None, grad_mode="batched", options=object())
    with pytest.raises(ValueError, match="steps"):
        EATTA(model, opt, oracle=lambda *a: None, steps=0)


# -- one transaction per step -------------------------------------------------------------------
class Boom(RuntimeError):
    pass


def full_buffer_method(batch) -> EATTA:
    x, y = batch
    m = make(buffer=LabelBuffer(capacity=2, batch_size=2), budget=2)
    m(x, labels=y)
    m(x + 0.5, labels=y)  # the buffer is full: the next add overwrites
    return m


@pytest.mark.parametrize("where", ["gradients", "debiaser", "optimizer"])
def test_a_failure_anywhere_in_the_step_rolls_every_part_back(batch, monkeypatch, where):
    x, y = batch
    m = full_buffer_method(batch)
    before = exact_state(m)

    def fail(*args, **kwargs):
        raise Boom(where)

    if where == "gradients":
        monkeypatch.setattr(m.gradient.strategy, "grads", fail)
    elif where == "debiaser":
        monkeypatch.setattr(m.debiaser, "weights", fail)
    else:  # validate before mutate: the last thing that can fail comes before any commit
        monkeypatch.setattr(m.optimizer, "step", fail)
    with pytest.raises(Boom):
        m(x - 0.5, labels=y)
    if where != "optimizer":
        assert_same_state(before, m)
    else:  # the optimizer raised in its own step: the parts are back, the model untouched
        after = exact_state(m)
        assert differences(before["method"], after["method"]) == []
        assert differences(before["model"], after["model"]) == []


def test_a_failed_second_step_keeps_the_first(batch, monkeypatch):
    x, y = batch
    m = make(steps=2)
    calls = {"n": 0}
    real = m.gradient.strategy.grads

    def second_fails(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise Boom("second step")
        return real(*args, **kwargs)

    monkeypatch.setattr(m.gradient.strategy, "grads", second_fails)
    with pytest.raises(Boom):
        m(x, labels=y)
    assert m.labels_used == 1 and m.budget.batches_seen == 1  # step 1 committed, step 2 undone
    ref = make(steps=1)
    ref(x, labels=y)
    assert not differences(exact_state(ref)["method"], exact_state(m)["method"])
    assert not differences(exact_state(ref)["model"], exact_state(m)["model"])


# -- non-finite gradients: skipped, counted, warned once --------------------------------------
class _NanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


class Overflow(nn.Module):
    """Identity forward; a NaN gradient backward while ``on`` (a model's own overflow)."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x):
        return _NanGrad.apply(x) if self.on else x


def overflowing_cnn() -> nn.Sequential:
    model = confident_cnn()
    return nn.Sequential(*list(model)[:3], Overflow(), *list(model)[3:])


@pytest.mark.parametrize("labelled", [True, False], ids=["labelled", "no-label"])
def test_non_finite_gradients_skip_the_step_and_change_nothing(make_image_batches, labelled):
    xs = [x * 4 - 2 for x in make_image_batches(3, size=16)]
    ys = [torch.arange(16) % 5] * 3
    m = make(overflowing_cnn(), budget=1 if labelled else 0, buffer=2)
    ref = make(overflowing_cnn(), budget=1 if labelled else 0, buffer=2)
    m(xs[0], labels=ys[0]), ref(xs[0], labels=ys[0])
    before = exact_state(m)
    m.model[3].on = True
    with torch.no_grad():
        expected_logits = m.model(xs[1])
    with pytest.warns(RuntimeWarning, match="not finite") as caught:
        out = m(xs[1], labels=ys[1])
    assert caught[0].filename == __file__  # points at the caller's line
    assert torch.equal(out, expected_logits) and m.last_step.skipped
    assert m.last_step.selected.numel() == m.last_step.labels.numel() == 0  # nothing applied
    assert m.skipped_steps == 1
    before["method"]["skipped_steps"] = 1  # the count is the one thing that changes
    assert_same_state(before, m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        m(xs[1], labels=ys[1])
    assert m.skipped_steps == 2 and m.method_state()["skipped_steps"] == 2
    m.model[3].on = False  # the stream goes on as if the bad batches never came
    assert torch.equal(m(xs[2], labels=ys[2]), ref(xs[2], labels=ys[2]))
    assert not differences(exact_state(ref)["model"], exact_state(m)["model"])
    m.reset()
    assert m.skipped_steps == 0


# -- the oracle's labels belong to one batch ---------------------------------------------------
def test_labels_are_not_served_to_the_next_batch(batch):
    x, y = batch
    m = make()
    m.oracle.set_labels(y)
    m(x)
    before = exact_state(m)
    with pytest.raises(OracleError, match="set_labels"):  # forgotten: an error, not stale labels
        m(x + 1)
    assert_same_state(before, m)
    m(x + 1, labels=y)
    assert m.labels_used == 2 and m.oracle.revealed == 2


def test_labels_keyword_is_checked_before_anything_changes(batch):
    x, y = batch
    m = make()
    before = exact_state(m)
    with pytest.raises(InvalidInputError, match="labels must have shape"):
        m(x, labels=y[:3])
    assert_same_state(before, m)
    abstains = make(oracle=lambda inp, idx: None)
    with pytest.raises(TypeError, match="set_labels"):
        abstains(x, labels=y)


def test_last_k_history_records_the_annotated_classes(batch):
    x, _ = batch
    m = make(balance="last-k")
    pl = m.model(x).argmax(1)
    wrong = (pl + 1) % 5  # an annotator who always disagrees with the model
    m(x, labels=wrong)
    (i,) = m.last_step.selected.tolist()
    assert m.balance.classes == [int(wrong[i])] != [int(pl[i])]


# -- reset and state -------------------------------------------------------------------------
def test_reset_restores_everything(batch):
    x, y = batch
    m = make(buffer=4)
    initial = exact_state(m)
    for _ in range(3):
        m(x, labels=y)
    assert differences(initial, exact_state(m))
    spent = m.budget.lifetime_used
    assert spent == 3  # one label a batch
    m.reset()
    assert_reset_state(initial, m, spent)  # all but the budget's lifetime count


def run_stream(m: EATTA, xs, ys):
    outs = []
    for x, y in zip(xs, ys, strict=True):
        m.oracle.set_labels(y)
        outs.append(m(x))
    return outs


def stream(n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(16, 3, 8, 8, generator=g) for _ in range(n)], [
        torch.randint(0, 5, (16,), generator=g) for _ in range(n)
    ]


def test_state_dict_round_trip_continues_identically(tmp_path):
    xs, ys = stream()
    a = make(buffer=8, budget=2)
    run_stream(a, xs[:3], ys[:3])
    path = tmp_path / "state.pt"
    torch.save(a.state_dict(), path)
    tail_a = run_stream(a, xs[3:], ys[3:])

    b = make(buffer=8, budget=2)
    b.load_state_dict(torch.load(path, weights_only=True))
    tail_b = run_stream(b, xs[3:], ys[3:])
    assert all(torch.equal(p, q) for p, q in zip(tail_a, tail_b, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(a.params, b.params, strict=True))
    assert a.labels_used == b.labels_used <= 12


def test_loaded_state_moves_to_the_models_device(batch, monkeypatch):
    x, y = batch
    a = make(buffer=4)
    a(x, labels=y)
    b = make(buffer=4)
    # a model "on" another device: every part that holds tensors follows it, none is reset
    monkeypatch.setattr(type(b), "device", property(lambda self: torch.device("meta")))
    b.load_state_dict(a.state_dict())
    assert (
        b.replay.buffer._store[0].device.type == "meta" and b.debiaser._state.device.type == "meta"
    )
    assert len(b.replay.buffer) == 1 and b.labels_used == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resume_on_another_device_continues_the_stream(tmp_path):
    xs, ys = stream()
    a = make(buffer=8, budget=2)
    run_stream(a, xs[:3], ys[:3])
    torch.save(a.state_dict(), tmp_path / "s.pt")
    tail_a = run_stream(a, xs[3:], ys[3:])
    model = confident_cnn().cuda()
    b = make(model=model, buffer=8, budget=2)
    b.load_state_dict(torch.load(tmp_path / "s.pt", map_location="cpu", weights_only=True))
    assert b.replay.buffer._store[0].is_cuda and b.debiaser._state.is_cuda
    tail_b = run_stream(b, [x.cuda() for x in xs[3:]], ys[3:])
    for p, q in zip(tail_a, tail_b, strict=True):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-4, atol=1e-4)


RESUME_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_eatta import make, run_stream, stream
    xs, ys = stream()
    m = make(buffer=8, budget=2)
    if sys.argv[1] == "save":
        run_stream(m, xs[:3], ys[:3])
        torch.save(m.state_dict(), sys.argv[2])
    else:
        m.load_state_dict(torch.load(sys.argv[2], weights_only=True))
        outs = run_stream(m, xs[3:], ys[3:])
        torch.save({{"outs": outs, "params": [p.detach() for p in m.params]}}, sys.argv[3])
    """
)


def test_resume_in_a_new_process_is_bit_identical(tmp_path):
    import os

    tests = os.path.dirname(__file__)
    script = tmp_path / "resume.py"
    script.write_text(
        RESUME_SCRIPT.format(tests=tests).replace(
            "sys.path.insert(0, ",
            f"sys.path.insert(0, {os.path.dirname(tests)!r}); sys.path.insert(0, ",
        )
    )
    state, result = tmp_path / "state.pt", tmp_path / "result.pt"
    subprocess.run([sys.executable, str(script), "save", str(state)], check=True)
    subprocess.run([sys.executable, str(script), "load", str(state), str(result)], check=True)
    got = torch.load(result, weights_only=True)

    xs, ys = stream()
    m = make(buffer=8, budget=2)
    outs = run_stream(m, xs, ys)[3:]
    assert all(torch.equal(p, q) for p, q in zip(outs, got["outs"], strict=True))
    assert all(torch.equal(p, q) for p, q in zip(m.params, got["params"], strict=True))


def test_reference_preset_trains_the_authors_set_and_measures_all_norms():
    from eatta.golden import TinyResNetLike
    from eatta.methods.registry import create

    model = TinyResNetLike(4, 3)
    with torch.no_grad():
        model.fc.weight.mul_(10)
    oracle = GroundTruthOracle()
    split = (eatta.golden._Features(model), model.fc)
    m = create("eatta", model, dataset="imagenet-c", oracle=oracle, preset="reference", split=split)
    trained = {n for n, p in model.named_parameters() if any(p is q for q in m.params)}
    assert trained == {
        "bn1.weight",
        "bn1.bias",
        "layer1.0.weight",
        "layer1.1.weight",
        "layer1.1.bias",
    }
    assert m.steps == 2 and model.layer4[1].weight.requires_grad  # measured, not trained
    layer4 = model.layer4[1].weight.clone()
    oracle.set_labels(torch.randint(0, 3, (8,)))
    m(torch.randn(8, 3, 8, 8))
    assert m.labels_used == 2 and torch.equal(layer4, model.layer4[1].weight)
    with pytest.raises(ValueError, match="preset"):
        create("eatta", TinyResNetLike(4, 3), oracle=oracle, preset="bogus")


# -- details a mutation run showed untested (tools/mutation_score.py) ---------------------------
def test_default_budget_is_one_label_per_batch(batch):
    x, y = batch
    model = confident_cnn()
    m = EATTA(model, torch.optim.SGD(eatta.configure(model), lr=LR), oracle=GroundTruthOracle())
    m(x, labels=y)
    m(x, labels=y)
    assert m.labels_used == 2 and len(m.last_step.selected) == 1


def test_without_allowance_nothing_is_selected_asked_or_planned(batch, monkeypatch):
    x, y = batch
    asked, planned = [], []
    oracle = GroundTruthOracle()
    m = make(budget=Budget(1, every=2), oracle=lambda i, idx: asked.append(1) or oracle(i, idx))
    plan = m.gradient.strategy.plan
    monkeypatch.setattr(m.gradient.strategy, "plan", lambda *a: planned.append(1) or plan(*a))
    selections = []
    select = m.selector.select  # what the active layer asks through, for every method
    monkeypatch.setattr(
        m.selector, "select", lambda *a, **k: selections.append(1) or select(*a, **k)
    )
    for _ in range(2):
        oracle.set_labels(y)
        m(x)
    # the first batch has a label (selection, oracle, cut planning), the second none of them
    assert (len(selections), len(asked), len(planned)) == (1, 1, 1)
    assert m.labels_used == 1 and len(m.last_step.selected) == 0


def test_the_entropy_margin_is_strict(batch):
    x, _ = batch
    probe = make(budget=0)
    probe(x)
    h = entropy(probe.last_step.logits)
    margin = float(h.sort().values[5])  # exactly one sample's entropy
    m = make(budget=0, entropy_margin=margin)
    m(x)
    assert torch.equal(m.last_step.logits, probe.last_step.logits)
    assert int(m.last_step.num_unsup) == int((h < margin).sum()) == 5


def test_one_confident_sample_is_enough_for_the_weights(batch):
    x, y = batch
    probe = make()
    probe(x, labels=y)
    h = entropy(probe.last_step.logits)
    h[probe.last_step.selected] = float("inf")
    low = h.sort().values
    m = make(entropy_margin=float((low[0] + low[1]) / 2))  # exactly one confident sample
    m(x, labels=y)
    rec = m.last_step
    assert int(rec.num_unsup) == 1 and torch.equal(rec.selected, probe.last_step.selected)
    assert 0 < float(rec.weights.unsup) < 2 and m.debiaser.current is not None  # not degenerate
    torch.testing.assert_close(rec.weights.sup + rec.weights.unsup, torch.tensor(2.0))


def test_no_gradient_is_kept_between_batches(batch):
    x, y = batch
    m = make(budget=Budget(1, every=2))
    m(x, labels=y)  # a labelled step, then a no-label step
    m(x, labels=y)
    assert m.labels_used == 1 and all(p.grad is None for p in m.model.parameters())


def test_the_first_label_is_replayed_at_once(batch):
    x, y = batch
    m = make(buffer=LabelBuffer(capacity=4, batch_size=4))
    ref = copy.deepcopy(m.model)
    m(x, labels=y)
    rec = m.last_step
    assert len(m.replay.buffer) == 1
    with torch.no_grad():
        own = F.cross_entropy(ref(x)[rec.selected], y[rec.selected])
        replayed = F.cross_entropy(ref(x[rec.selected]), y[rec.selected])
    torch.testing.assert_close(rec.loss_sup, own + replayed, rtol=1e-6, atol=1e-7)


def _one_by_one_cnn() -> nn.Sequential:
    """A BatchNorm CNN whose last BatchNorm sees 1x1 features at 8 px (as ResNet-18 at 32 px):
    one sample alone cannot be normalized there."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Flatten(), nn.Linear(8, 5),
    )  # fmt: skip
    with torch.no_grad():
        model[-1].weight.mul_(8.0)
    return model


def test_a_first_label_a_batchnorm_model_cannot_normalize_alone_is_replayed_with_the_batch(batch):
    """Issue 66: ``buffer=300`` on a small input raised BatchNorm's "Expected more than 1 value
    per channel" on the first labelled step; the sample now runs with the batch (its logits
    read with the batch's statistics), later draws of several samples alone as before."""
    x, y = batch
    m = make(_one_by_one_cnn(), buffer=LabelBuffer(capacity=300, batch_size=32))
    ref = copy.deepcopy(m.model)
    m(x, labels=y)
    rec = m.last_step
    with torch.no_grad():
        own = F.cross_entropy(ref(x)[rec.selected], y[rec.selected])
        both = ref(torch.cat([x, x[rec.selected]]))[len(x) :]
        replayed = F.cross_entropy(both, y[rec.selected])
    torch.testing.assert_close(rec.loss_sup, own + replayed, rtol=1e-6, atol=1e-7)
    for _ in range(3):  # two or more buffered samples replay alone, as the authors' code does
        m(x, labels=y)
    assert len(m.replay.buffer) == 4 and torch.isfinite(m.last_step.loss_sup)


def with_spare_parameter() -> nn.Sequential:
    """A model whose optimizer also holds a parameter the forward pass never uses."""
    model = confident_cnn()
    model.register_parameter("spare", nn.Parameter(torch.ones(3)))
    return model


@pytest.mark.parametrize(
    "case", ["labelled", "no-label", "no-gnd"], ids=["labelled", "no-label", "no-gnd"]
)
def test_parameters_the_losses_do_not_reach_get_a_zero_gradient(batch, case):
    x, y = batch
    model = with_spare_parameter()
    params = [*eatta.configure(model), model.spare]
    debiaser = GradNormDebiaser(normalize=False) if case == "no-gnd" else None
    m = EATTA(
        model,
        torch.optim.SGD(params, lr=LR, momentum=0.9),
        oracle=GroundTruthOracle(),
        budget=0 if case == "no-label" else 1,
        debiaser=debiaser,
    )
    m(x, labels=y)
    assert not m.last_step.skipped and torch.equal(model.spare, torch.ones(3))
    assert m.labels_used == (0 if case == "no-label" else 1)


def test_state_saved_before_skip_counting_loads_with_no_skips(batch):
    x, y = batch
    m = make()
    m(x, labels=y)
    state = m.method_state()
    assert state.pop("skipped_steps") == 0
    m.skipped_steps = 3
    m.load_method_state(state)
    assert m.skipped_steps == 0


def test_the_finite_check_adds_no_reduction_when_the_norms_cover_the_update(batch, monkeypatch):
    x, y = batch
    calls = []
    norm = eatta.gradients.exact.global_norm
    counted = lambda g: calls.append(1) or norm(g)  # noqa: E731
    monkeypatch.setattr(eatta.gradients.exact, "global_norm", counted)
    make()(x, labels=y)  # trained = measured: the two norms saw every gradient
    assert len(calls) == 2
    calls.clear()
    model = confident_cnn()
    params = eatta.configure(model)
    EATTA(
        model,
        torch.optim.SGD(params, lr=LR),
        oracle=GroundTruthOracle(),
        grad_norm_params=params[:2],  # norms over a part: the update needs its own check
    )(x, labels=y)
    assert len(calls) == 3
