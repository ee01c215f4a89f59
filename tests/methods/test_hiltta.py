"""HILTTA: each part against an independent computation, a full step against a hand-written
reference of the authors' loop, the active-method contract, asynchronous annotators, bad input."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from _active_method_checks import (
    BAD_INPUTS,
    BAD_ORACLES,
    Answers,
    check_bad_input,
    check_bad_oracle,
    check_budget,
    check_reset_is_exact,
    check_state_dict_round_trip,
    run,
    stream,
)

import eatta
from _state_checks import differences, exact_state
from conftest import confident_cnn, nested_equal
from eatta import GroundTruthOracle
from eatta.annotate import SimulatedAnnotator
from eatta.losses import entropy
from eatta.methods.eta import ETA
from eatta.methods.hiltta import HILTTA, LR_GRID, min_max, smooth
from eatta.methods.source import Source
from eatta.methods.tent import Tent
from eatta.selection.kmargin import k_center_greedy, k_margin, margin_uncertainty

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = [pytest.mark.small_batches, pytest.mark.usefixtures("one_thread")]

C = 5


def make(oracle, budget=2, candidates=(1e-3, 5e-3, 2e-2), **kw):
    """HILTTA over TENT (SGD, Nesterov momentum 0.9) around the tiny confident CNN."""
    model = confident_cnn()
    anchor = copy.deepcopy(model).eval()
    params = eatta.configure(model)
    base = Tent(model, torch.optim.SGD(params, lr=1e-3, momentum=0.9, nesterov=True))
    return HILTTA(
        model, base, oracle=oracle, budget=budget, candidates=candidates, anchor=anchor, **kw
    )


# -- 1. the parts, against independent computations --------------------------------------------


def brute_k_center(points, k):
    """k-center greedy written out: centres as a list, distances recomputed from scratch."""
    pts = [[float(v) for v in row] for row in points.double().reshape(len(points), -1)]
    centres = [[0.0] * len(pts[0])]
    chosen: list[int] = []
    for _ in range(k):
        best, best_d = -1, -1.0
        for i, p in enumerate(pts):
            if i in chosen:
                continue
            d = min(math.dist(p, c) for c in centres)
            if d > best_d:
                best, best_d = i, d
        chosen.append(best)
        centres.append(pts[best])
    return sorted(chosen)


def test_margin_uncertainty_is_one_minus_the_top_two_gap():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0], [5.0, -1.0, 4.0]])
    p = logits.softmax(1)
    want = [1 - (p[0, 0] - p[0, 1]), 1.0, 1 - (p[2, 0] - p[2, 2])]
    assert torch.allclose(margin_uncertainty(logits), torch.tensor(want), atol=1e-7)


def test_k_center_greedy_on_a_hand_example():
    # origin first: the farthest point (index 2, |.| = 10), then the one farthest from {0, p2}
    pts = torch.tensor([[1.0, 0.0], [0.0, 3.0], [10.0, 0.0], [9.0, 0.5], [0.0, -2.0]])
    assert k_center_greedy(pts, 1).tolist() == [2]
    assert k_center_greedy(pts, 2).tolist() == [1, 2]  # (0, 3): 3 from the origin, > 2 for (0,-2)
    assert k_center_greedy(pts, 3).tolist() == [1, 2, 4]
    assert k_center_greedy(pts, 0).tolist() == []


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_k_margin_matches_a_brute_force_computation(seed, k):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(12, C, generator=g) * 2
    feats = torch.randn(12, 6, generator=g)
    p = logits.softmax(1).sort(dim=1, descending=True).values
    scaled = feats * (1 - (p[:, 0] - p[:, 1]))[:, None]
    assert k_margin(logits, feats, k).tolist() == brute_k_center(scaled, k)


def test_k_margin_prefers_uncertain_samples_among_equal_features():
    feats = torch.ones(4, 3)
    logits = torch.tensor([[9.0, 0, 0, 0, 0], [1.0, 0.9, 0, 0, 0], [5.0, 0, 0, 0, 0], [0] * 5])
    assert k_margin(logits, feats, 1).tolist() == [3]  # a full tie: margin 1


def test_min_max_and_equal_values():
    assert torch.equal(min_max([3.0, 1.0, 2.0]), torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64))
    assert torch.equal(min_max([0.7, 0.7]), torch.ones(2, dtype=torch.float64))
    assert min_max([2.0]).tolist() == [1.0]


def test_smooth_starts_with_the_first_ranks_then_averages():
    a = torch.tensor([1.0, 0.0], dtype=torch.float64)
    b = torch.tensor([0.0, 2.0], dtype=torch.float64)
    s = smooth(None, a, 0.5)
    assert torch.equal(s, a) and s is not a
    assert smooth(s, b, 0.5).tolist() == [0.5, 1.0]
    assert smooth(s, b, 0.75).tolist() == [0.75, 0.5]


# -- 2. a full step against a hand-written reference of the authors' loop ---------------------


class Reference:
    """The authors' loop for TENT, written out with plain torch: K-Margin, carried candidates,
    anchor + CE scores normalised and averaged, the winner's copy, then Adam on all params."""

    def __init__(self, values, budget, momentum=0.5, active_lr=1e-5, lr=1e-3, stats="batch"):
        self.model = confident_cnn()
        # their ImageNet anchor: get_model's torchvision model, left in train mode
        self.anchor = copy.deepcopy(self.model).train(stats == "batch")
        self.params = eatta.configure(self.model)
        self.opt = torch.optim.SGD(self.params, lr=lr, momentum=0.9, nesterov=True)
        self.active = torch.optim.Adam(self.model.parameters(), lr=active_lr)
        self.values, self.k, self.m = values, budget, momentum
        self.queue = None

    # the base method's part (TENT: the learning rate, mean entropy, no state)
    def set_value(self, v):
        for g in self.opt.param_groups:
            g["lr"] = v

    def adapt(self, xu):
        loss = entropy(self.model(xu)).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()

    def extra(self):
        return None

    def load_extra(self, extra):
        pass

    def step(self, x, y):
        backbone, head = self.model[:-1], self.model[-1]
        with torch.no_grad():
            z = backbone(x)
            o = head(z)
        lab = k_margin(o, z, self.k)
        unl = torch.tensor([i for i in range(len(x)) if i not in lab.tolist()])
        saved = []
        for v in self.values:
            self.set_value(v)
            self.adapt(x[unl])
            saved.append(
                (
                    copy.deepcopy(self.model.state_dict()),
                    copy.deepcopy(self.opt.state_dict()),
                    copy.deepcopy(self.extra()),
                )
            )
        inp = torch.cat([x[unl], x[lab]])
        n = len(unl)
        q1, q2 = [], []
        with torch.no_grad():
            anchor_p = self.anchor(inp).softmax(1)
            for state, _, _ in saved:
                self.model.load_state_dict(state)
                out = self.model(inp)
                q1.append(((out[:n].softmax(1) - anchor_p[:n]) ** 2).mean().item())
                q2.append(F.cross_entropy(out[n:], y[lab]).item())

        def norm(q):
            v = [a - min(q) for a in q]
            if max(v) == 0:
                v = [a + 1e-6 for a in v]
            return [a / max(v) for a in v]

        total = [a + b for a, b in zip(norm(q1), norm(q2), strict=True)]
        if self.queue is None:
            self.queue = total
        else:
            self.queue = [
                self.m * a + (1 - self.m) * b for a, b in zip(self.queue, total, strict=True)
            ]
        best = min(range(len(total)), key=lambda j: (self.queue[j], j))
        self.model.load_state_dict(saved[best][0])
        self.opt.load_state_dict(saved[best][1])
        self.load_extra(saved[best][2])
        self.set_value(self.values[best])
        for p in self.model.parameters():
            p.requires_grad_(True)
        F.cross_entropy(self.model(x)[lab], y[lab]).backward()
        self.active.step()
        self.active.zero_grad()
        eatta.configure(self.model)  # back to the norm parameters only (configure_model)
        return o, lab, best


class EtaReference(Reference):
    """EATA's step (no Fisher term) as the authors' ``methods/eata.py`` takes it, tuning the
    cosine threshold; the probability average travels with each candidate's copy."""

    def __init__(self, values, budget):
        super().__init__(values, budget, lr=5e-3)
        self.d, self.probs = None, None

    def set_value(self, v):
        self.d = v

    def adapt(self, xu):
        logits = self.model(xu)
        e0 = 0.4 * math.log(C)
        h = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
        keep = torch.nonzero(h < e0).flatten()
        probs = logits[keep].softmax(1)
        if self.probs is not None:
            cos = F.cosine_similarity(self.probs[None], probs, dim=1)
            keep2 = torch.nonzero(cos.abs() < self.d).flatten()
            keep, probs = keep[keep2], probs[keep2]
        hk = h[keep]
        loss = (hk / torch.exp(hk.detach() - e0)).mean()
        if len(keep):
            loss.backward()
            self.opt.step()
            mean = probs.detach().mean(0)
            self.probs = mean if self.probs is None else 0.9 * self.probs + 0.1 * mean
        self.opt.zero_grad()

    def extra(self):
        return self.probs

    def load_extra(self, extra):
        self.probs = extra


@pytest.mark.parametrize(
    ("budget", "lrs", "steps", "learnable", "stats"),
    [
        (2, (1e-1, 1e-3, 5e-2), 20, True, "batch"),  # labels the source model agrees with
        (2, (1e-1, 1e-3, 5e-2), 20, True, "running"),
        (2, (1e-3, 5e-3, 2e-2), 20, False, "batch"),
        (3, LR_GRID, 6, False, "batch"),
        (4, (5e-3,), 4, False, "batch"),
    ],
)
def test_steps_match_the_reference_loop(budget, lrs, steps, learnable, stats):
    xs, ys = stream(steps, seed=7)
    if learnable:
        given = confident_cnn().eval()
        with torch.no_grad():
            ys = [given(x).argmax(1) for x in xs]
    ref = Reference(lrs, budget, stats=stats)
    oracle = Answers()
    m = make(oracle, budget=budget, candidates=lrs, anchor_stats=stats)
    chosen = []
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        out = m(x)
        o, lab, best = ref.step(x, y)
        assert torch.allclose(out, o, atol=1e-5)
        assert m.last_step.selected.tolist() == lab.tolist()
        assert m.last_step.chosen == best
        assert m.value == lrs[best]
        for (name, p), q in zip(m.model.named_parameters(), ref.model.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-5), name
        chosen.append(best)
    if learnable:
        assert len(set(chosen)) >= 2, chosen  # the choice itself is pinned, not only candidate 0
    assert torch.allclose(m.scores, torch.tensor(ref.queue, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("margins", [(0.05, 0.4, 1.0), (1.0, 0.2, 0.05, 0.6)])
def test_eta_steps_match_the_reference_loop(margins):
    xs, ys = stream(12, seed=9)
    given = confident_cnn().eval()
    with torch.no_grad():
        ys = [given(x).argmax(1) for x in xs]
    ref = EtaReference(margins, 2)
    oracle = Answers()
    model = confident_cnn()
    anchor = copy.deepcopy(model).eval()
    opt = torch.optim.SGD(eatta.configure(model), lr=5e-3, momentum=0.9, nesterov=True)
    m = HILTTA(model, ETA(model, opt), oracle=oracle, budget=2, candidates=margins, anchor=anchor)
    chosen = []
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        out = m(x)
        o, lab, best = ref.step(x, y)
        assert torch.allclose(out, o, atol=1e-5)
        assert m.last_step.selected.tolist() == lab.tolist()
        assert m.last_step.chosen == best and m.value == margins[best]
        for p, q in zip(m.model.parameters(), ref.model.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-5)
        # the winner's average, not the last candidate's (the carried steps make ETA's winner the
        # first candidate here, so restoring the wrong copy would show)
        assert torch.allclose(m.base.model_probs, ref.probs, atol=1e-6)
        chosen.append(best)
    assert len(margins) - 1 not in chosen


def test_sar_keeps_the_last_candidates_loss_average_and_the_winners_model(monkeypatch):
    """The authors' SAR path reloads the models and SAM's state only: SAR's loss average and the
    SGD's momentum stay as the last candidate left them, while the model and the rate are the
    winner's (no supervised step: active_lr=0). ``sar_momentum="chosen"``: the winner's
    momentum."""
    from eatta.methods.sar import SAR

    emas, models, momenta = [], [], []
    real = SAR.forward_and_adapt

    def recording(self, x):
        out = real(self, x)
        emas.append(self.ema)
        models.append({k: v.clone() for k, v in self.model.state_dict().items()})
        momenta.append(copy.deepcopy(self.optimizer.state_dict()["state"]))
        return out

    monkeypatch.setattr(SAR, "forward_and_adapt", recording)
    m = eatta.create(
        "hiltta", confident_cnn(), oracle=GroundTruthOracle(), budget=2, base="sar",
        candidates=(1e-3, 5e-2, 1e-1), active_lr=0.0,
    )  # fmt: skip
    assert m.base.reset_constant == 0.0 and m.tune == "lr"
    assert m.optimizer.param_groups[0]["nesterov"] is False
    xs, ys = stream(3, seed=2)
    for x, y in zip(xs, ys, strict=True):
        emas.clear()
        models.clear()
        m(x, labels=y)
        best = m.last_step.chosen
        assert len(emas) == 3 and len(set(emas)) == 3
        assert m.base.ema == emas[-1]
        assert m.value == (1e-3, 5e-2, 1e-1)[best]
        assert not differences(models[best], dict(m.model.state_dict()))  # active_lr=0
        assert not differences(momenta[-1], m.optimizer.state_dict()["state"])
        assert differences(momenta[best], momenta[-1])  # not a tautology: they differ
    chosen = eatta.create(
        "hiltta", confident_cnn(), oracle=GroundTruthOracle(), budget=2, base="sar",
        candidates=(1e-3, 5e-2, 1e-1), active_lr=0.0, sar_momentum="chosen",
    )  # fmt: skip
    for x, y in zip(xs, ys, strict=True):
        momenta.clear()
        chosen(x, labels=y)
        assert not differences(
            momenta[chosen.last_step.chosen], chosen.optimizer.state_dict()["state"]
        )


def test_candidates_are_carried_from_one_to_the_next():
    """With a zero learning rate in between, candidate 2 equals candidate 1: no restart."""
    oracle = Answers()
    xs, ys = stream(1, seed=2)
    oracle.y = ys[0]
    m = make(oracle, candidates=(1e-2, 1e-9, 1e-2), score_momentum=0.0)
    m(xs[0])
    a, ce = m.last_step.anchor_losses, m.last_step.ce_losses
    assert a[0] == pytest.approx(a[1], rel=1e-5) and ce[0] == pytest.approx(ce[1], rel=1e-5)
    assert a[2] > a[0]  # a second real step moved further from the anchor


def test_scores_follow_the_moving_average_of_the_ranks():
    oracle = Answers()
    xs, ys = stream(3, seed=4)
    m = make(oracle, score_momentum=0.25)
    expected = None
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        m(x)
        r = min_max(m.last_step.anchor_losses) + min_max(m.last_step.ce_losses)
        assert torch.equal(m.last_step.ranks, r)
        expected = r if expected is None else 0.25 * expected + 0.75 * r
        assert torch.allclose(m.scores, expected, atol=0, rtol=1e-15)
        assert m.last_step.chosen == int(torch.argmin(expected))


def test_without_labels_the_first_candidate_wins_and_the_scores_stay():
    oracle = Answers()
    xs, ys = stream(2, seed=5)
    m = make(oracle, budget=eatta.Budget(2, every=2))
    oracle.y = ys[0]
    m(xs[0])
    scores = m.scores.clone()
    oracle.y = ys[1]
    m(xs[1])
    assert m.last_step.selected.numel() == 0 and m.last_step.supervised_loss is None
    assert m.last_step.chosen == 0 and m.value == m.candidates[0]
    assert torch.equal(m.scores, scores)
    assert oracle.calls == [2]


def test_eta_base_tunes_d_margin_and_keeps_the_winners_average():
    oracle = Answers()
    model = confident_cnn()
    anchor = copy.deepcopy(model).eval()
    base = ETA(model, torch.optim.SGD(eatta.configure(model), lr=5e-3, momentum=0.9))
    m = HILTTA(model, base, oracle=oracle, budget=2, anchor=anchor)
    assert m.tune == "d_margin" and m.candidates[0] == 0.05 and len(m.candidates) == 7
    xs, ys = stream(3, seed=1)
    run(m, oracle, xs, ys)
    assert base.d_margin == m.candidates[m.last_step.chosen] == m.value


# -- 3. the active-method contract --------------------------------------------------------------


def test_reset_is_exact():
    check_reset_is_exact(make)


def test_state_dict_round_trip(tmp_path):
    check_state_dict_round_trip(make, tmp_path)


def test_budget_every_other_batch():
    check_budget(make)


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input(case):
    check_bad_input(make, case)


@pytest.mark.parametrize("case", sorted(BAD_ORACLES))
def test_bad_oracle(case):
    check_bad_oracle(make, case)


def test_only_the_two_optimizers_parameters_change():
    xs, ys = stream(3)
    oracle = Answers()
    m = make(oracle)
    before = {n: p.detach().clone() for n, p in m.model.named_parameters()}
    anchor = {k: v.clone() for k, v in m.anchor.state_dict().items()}
    run(m, oracle, xs, ys)
    assert all(not torch.equal(p, before[n]) for n, p in m.model.named_parameters())
    assert not differences(anchor, dict(m.anchor.state_dict()))
    flags = {n: p.requires_grad for n, p in m.model.named_parameters()}
    assert flags == {n: ("." in n and n.split(".")[0] in {"1", "4"}) for n in flags}


def test_a_failing_candidate_step_leaves_no_trace(monkeypatch):
    xs, ys = stream(2)
    oracle = Answers()
    m = make(oracle)
    run(m, oracle, xs[:1], ys[:1])
    before = exact_state(m)
    calls = itertools.count()

    real = Tent.forward_and_adapt

    def failing(self, x):
        if next(calls) == 1:
            raise RuntimeError("boom")
        return real(self, x)

    monkeypatch.setattr(Tent, "forward_and_adapt", failing)
    oracle.y = ys[1]
    value = m.value
    with pytest.raises(RuntimeError, match="boom"):
        m(xs[1])
    assert not differences(before, exact_state(m))
    assert m.value == value


def test_a_failing_supervised_step_leaves_no_trace(monkeypatch):
    """After the scores were updated: the average, model and both optimizers are restored."""
    xs, ys = stream(2)
    oracle = Answers()
    m = make(oracle)
    run(m, oracle, xs[:1], ys[:1])
    before = exact_state(m)
    scores = m.scores.clone()

    def failing(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(m, "_supervised", failing)
    oracle.y = ys[1]
    with pytest.raises(RuntimeError, match="boom"):
        m(xs[1])
    assert not differences(before, exact_state(m))
    assert torch.equal(m.scores, scores)


# -- 4. asynchronous annotators -----------------------------------------------------------------


def full(m):
    return {
        "model": {k: v.clone() for k, v in m.model.state_dict().items()},
        "optimizer": copy.deepcopy(m.optimizer.state_dict()),
        "method": copy.deepcopy(m.method_state()),
    }


def test_zero_delay_is_bit_identical_to_the_synchronous_oracle():
    xs, ys = stream(4, seed=1)
    sync, lazy = make(GroundTruthOracle()), make(SimulatedAnnotator(delay=0))
    for x, y in zip(xs, ys, strict=True):
        assert torch.equal(sync(x, labels=y), lazy(x, labels=y))
    assert sync.labels_used == lazy.labels_used == 8
    a, b = full(sync), full(lazy)
    assert a["method"].pop("pending") is None and b["method"].pop("pending")["requests"] == []
    assert not differences(a, b)


@pytest.mark.parametrize("split", [1, 3])
def test_a_resumed_run_with_late_labels_equals_the_uninterrupted_one(split):
    xs, ys = stream(6, seed=3)

    def build():
        ann = SimulatedAnnotator(delay=(0, 2), seed=1)
        return make(ann), ann

    m, ann = build()
    for t in range(split):
        m(xs[t], labels=ys[t])
    saved, saved_ann = copy.deepcopy(m.state_dict()), copy.deepcopy(ann.state_dict())
    tail = [m(x, labels=y) for x, y in zip(xs[split:], ys[split:], strict=True)]
    lates = m.annotation_stats["received"]
    m2, ann2 = build()
    m2.load_state_dict(saved)
    ann2.load_state_dict(saved_ann)
    tail2 = [m2(x, labels=y) for x, y in zip(xs[split:], ys[split:], strict=True)]
    assert all(torch.equal(a, b) for a, b in zip(tail, tail2, strict=True))
    assert not differences(full(m), full(m2))
    assert nested_equal(ann.state_dict(), ann2.state_dict())
    assert lates > 0


def test_late_labels_join_the_pool_of_the_step_they_arrive_in():
    xs, ys = stream(3, seed=6)
    m = make(SimulatedAnnotator(delay=1))
    lates = []
    for x, y in zip(xs, ys, strict=True):
        m(x, labels=y)
        lates.append((m.last_step.late, m.last_step.supervised_loss is not None))
    assert lates == [(0, False), (2, True), (2, True)]


# -- 5. bad settings: clear errors, nothing touched ---------------------------------------------


def pristine():
    model = confident_cnn()
    return model, copy.deepcopy(model.state_dict()), [p.requires_grad for p in model.parameters()]


def untouched(model, state, flags):
    assert not differences(state, dict(model.state_dict()))
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(m.running_mean is not None for m in model.modules() if hasattr(m, "running_mean"))


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"candidates": ()}, ValueError, "empty"),
        ({"candidates": []}, ValueError, "empty"),
        ({"candidates": ("fast",)}, TypeError, "candidates"),
        ({"candidates": (1e-3, True)}, TypeError, "candidates"),
        ({"candidates": 1e-3}, TypeError, "candidates"),
        ({"candidates": (1e-3, -1.0)}, ValueError, "> 0"),
        ({"base": "cotta"}, ValueError, "base"),
        ({"base": "eatta"}, ValueError, "base"),
        ({"budget": 0}, ValueError, "at least one label"),
        ({"budget": eatta.Budget(0)}, ValueError, "at least one label"),
        ({"base": "tent", "tune": "d_margin"}, ValueError, "eta"),
        ({"score_momentum": 1.5}, ValueError, "score_momentum"),
        ({"anchor_stats": "ema"}, ValueError, "anchor_stats"),
        ({"buffer": 300}, ValueError, "no replay buffer"),
        ({"candidate": (1e-3,)}, TypeError, "did you mean 'candidates'"),
    ],
)
def test_create_refuses_bad_settings_before_touching_the_model(kw, error, match):
    model, state, flags = pristine()
    budget = kw.pop("budget", 3)
    with pytest.raises(error, match=match):
        eatta.create("hiltta", model, oracle=GroundTruthOracle(), budget=budget, **kw)
    untouched(model, state, flags)


def test_the_class_refuses_bad_settings():
    model = confident_cnn()
    params = eatta.configure(model)
    tent = Tent(model, torch.optim.SGD(params, lr=1e-3))
    with pytest.raises(ValueError, match="empty"):
        HILTTA(model, tent, oracle=GroundTruthOracle(), candidates=[])
    with pytest.raises(TypeError, match="number"):
        HILTTA(model, tent, oracle=GroundTruthOracle(), candidates=["0.1"])
    with pytest.raises(ValueError, match="at least one label"):
        HILTTA(model, tent, oracle=GroundTruthOracle(), budget=0)
    with pytest.raises(TypeError, match="Tent, ETA or SAR"):
        HILTTA(model, Source(model), oracle=GroundTruthOracle())
    with pytest.raises(TypeError, match="yes/no"):
        HILTTA(model, tent, oracle=SimulatedAnnotator(feedback="binary"))


# -- 6. through the public API on real architectures -------------------------------------------


@pytest.mark.parametrize("base", ["tent", "eta", "sar"])
def test_create_on_the_packaged_digits_cnn(base):
    from eatta.models.digits_cnn import packaged_digits_source

    model, _ = packaged_digits_source()
    m = eatta.create(
        "hiltta", model, dataset="digits-c", oracle=GroundTruthOracle(), budget=3, base=base
    )
    assert isinstance(m, HILTTA) and m.base_name == base and len(m.candidates) == 7
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        x, y = torch.rand(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
        out = m(x, labels=y)
        assert out.shape == (32, 10) and torch.isfinite(out).all()
    assert m.labels_used == 6
    # the anchor is the method's one copy of the model as given (eval mode, its running
    # statistics), read on its input's statistics with anchor_stats="batch" (the default)
    assert m.anchor is m.given and m.anchor.training is False
    norms = [b for b in m.anchor.modules() if isinstance(b, torch.nn.BatchNorm2d)]
    assert norms and all(b.running_mean is not None for b in norms)
    assert m.anchor_stats == "batch"
    running = eatta.create(
        "hiltta", packaged_digits_source()[0], oracle=GroundTruthOracle(), anchor_stats="running"
    )
    assert running.anchor is running.given and running.anchor_stats == "running"


def test_create_on_a_torchvision_resnet():
    from eatta._compat import import_torchvision

    tv = import_torchvision()
    torch.manual_seed(0)
    model = tv.models.resnet18(num_classes=10)
    m = eatta.create("hiltta", model, oracle=GroundTruthOracle(), budget=3, candidates=(1e-4, 1e-3))
    x, y = torch.rand(8, 3, 32, 32), torch.randint(0, 10, (8,))
    before = m.model.fc.weight.detach().clone()
    out = m(x, labels=y)
    assert out.shape == (8, 10) and m.labels_used == 3
    assert m.last_step.selected.numel() == 3 and len(m.last_step.anchor_losses) == 2
    assert not torch.equal(before, m.model.fc.weight)  # the supervised step trains all params


def test_bench_style_overrides_through_the_registry():
    spec = eatta.methods.registry.get_spec("hiltta")
    cfg = spec.config_for("digits-c", {"base": "sar", "candidates": [1e-3, 2e-3]})
    assert cfg.candidates == (1e-3, 2e-3) and cfg.lr == 5e-3 and spec.active
