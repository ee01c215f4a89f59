"""The promise of ``eatta-safe``: the inequality its proof rests on, the confidence sequence, the
scoring, the ledger, what serves a batch, the promise itself on simulated streams (adversarial
ones included), and eatta-safe keeping it through late answers, resume, reset and windows."""

from __future__ import annotations

import itertools
import math
import pickle
import random

import pytest
import torch

import eatta
from conftest import bytes_round_trip, nested_equal, tiny_cnn
from eatta.annotate.oracle import GroundTruthOracle
from eatta.annotate.simulated import SimulatedAnnotator
from eatta.monitor.promise import (
    BETS,
    LAMBDA_CAP,
    STAKE,
    UNMEASURED,
    ExcessBound,
    Promise,
    decide,
    excess,
    psi_e,
)

pytestmark = pytest.mark.small_batches


def test_the_inequality_the_proof_rests_on_holds_on_a_grid():
    """``exp(lam xi - psi(lam) xi^2) <= 1 + lam xi`` for ``xi >= -1``, ``lam`` in ``[0, 1)``
    (Fan, Grama & Liu), with equality at ``xi = -1`` and 0."""
    for lam in (0.0, 0.05, 0.1, 0.35, 0.6, LAMBDA_CAP, 0.99):
        for k in range(-100, 301):
            xi = k / 100
            left, right = math.exp(lam * xi - psi_e(lam) * xi * xi), 1 + lam * xi
            assert left <= right + 1e-12
        assert math.isclose(math.exp(-lam - psi_e(lam)), 1 - lam, rel_tol=1e-9)


def test_the_radius_is_where_the_mixture_reaches_one_over_the_level():
    seq = ExcessBound(0.05)
    assert seq.upper == 0.0  # nothing answered: nothing to bound
    for y, b, r in ((-2.0, 2.0, 1.5), (1.0, 4.0, 3.0), (0.0, 1.0, 1.0)):
        seq.add(y, b, r)
        rho = seq.upper - seq.total
        pairs = zip(BETS, seq.penalty, strict=True)
        mix = sum(w * math.exp(eta * rho - p) for (eta, w), p in pairs)
        assert mix == pytest.approx(1 / 0.05, rel=1e-9)
    assert math.isclose(sum(w for _, w in BETS), 1.0)


def test_one_answers_penalty_by_hand():
    """The first answer: centre 0, ``c = b``, ``xi = -y / b``; the empirical-Bernstein penalty
    where ``eta b <= LAMBDA_CAP``, Hoeffding's ``eta^2 b^2 / 2`` beyond, plus the spread's."""
    seq = ExcessBound(0.05)
    seq.add(-3.0, 4.0, 2.0, spread=10.0)
    for (eta, _), p in zip(BETS, seq.penalty, strict=True):
        lam = eta * 4.0
        own = psi_e(lam) * (3.0 / 4.0) ** 2 if lam <= LAMBDA_CAP else eta * eta * 16.0 / 2
        assert p == pytest.approx(own + eta * eta * 10.0 / 2, rel=1e-12)
    # the second answer's centre: the mean of Y / b so far (one prior 0), times b, clipped
    assert seq.centre(4.0, 2.0) == pytest.approx(-1.5)
    assert seq.centre(4.0, 1.0) == -1.0


def test_all_favourable_answers_certify_a_gain_only_after_several():
    """Each answer says the adapted model is right on the one sample it serves differently
    (``Y = -1 / q``, ``q = 0.75 + 0.25 / 64``): a bound that went below 0 on one or two would not
    be anytime-valid (each could come from an excess of 0 with chance one half or more)."""
    seq, b = ExcessBound(0.05), 1 / (0.75 + 0.25 / 64)
    ups = []
    for _ in range(30):
        seq.add(-b, b, 1.0)
        ups.append(seq.upper)
    assert min(ups[:4]) > 0  # 2^-4 > 5 %: no valid bound could certify a gain yet
    first = next(i for i, u in enumerate(ups) if u < 0)
    assert 5 <= first <= 20
    assert all(b2 < a for a, b2 in itertools.pairwise(ups))


def test_an_answer_outside_its_range_is_refused():
    seq = ExcessBound(0.05)
    with pytest.raises(ValueError, match="outside"):
        seq.add(3.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="bound > 0"):
        seq.add(0.0, 0.0, 1.0)
    assert seq.answers == 0


def test_the_confidence_sequence_covers_the_truth_at_every_answer():
    """Batches with 1 to 20 samples served differently, each harmful (+1) with a chance that
    drifts from 0.9 to 0.1 along the stream, one draw each (explore 0.25 of a batch of 64): the
    sum of the answered excess passes the bound at some answer in at most ``level`` of the runs
    (120 runs at 10 %: at most 20 with binomial room)."""
    missed = 0
    for seed in range(120):
        rng, seq, truth = random.Random(seed), ExcessBound(0.1), 0
        for t in range(60):
            d = rng.randint(1, 20)
            p = 0.9 - 0.8 * t / 60
            h = [1 if rng.random() < p else -1 for _ in range(d)]
            q = 0.75 / d + 0.25 / 64
            truth += sum(h)
            y = h[rng.randrange(d)] / q if rng.random() < 0.75 + 0.25 * d / 64 else 0.0
            seq.add(y, 1 / q, d)
            if truth > seq.upper:
                missed += 1
                break
    assert missed <= 20


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        ((3, None, 3, 5, 3), -1),  # a label: what served right, the given model wrong
        ((5, None, 3, 5, 3), 1),
        ((7, None, 3, 5, 3), 0),  # both wrong
        ((7, None, 5, 5, 3), 0),  # the given model served: nothing to measure
        ((None, True, 3, 5, 3), -1),  # yes: the adapted prediction right
        ((None, True, 8, 5, 3), 0),  # yes, but a part served another class: both wrong
        ((None, False, 3, 5, 3), 1),  # no: the given model counted right (the worst)
        ((None, False, 8, 3, 3), 0),  # the two agree: a "no" leaves another class
    ],
)
def test_answers_are_scored_at_their_worst(answer, want):
    label, correct, served, given, adapted = answer
    assert excess(label, correct, served, given, adapted) == want


def test_the_ledger_by_hand():
    """0.5 points of 64 samples put 0.32 aside a batch; a batch is charged what it serves
    differently, an answer takes its share out and its bound in; the certified bound never
    rises on an answer."""
    p = Promise(0.5, 0.05)
    assert p.room(64) == pytest.approx(0.32) and p.stake(64) == pytest.approx(0.32)
    p.serve(64, 0.0)
    assert p.stake(64) == pytest.approx(max(STAKE * 0.64, 0.64))
    with pytest.raises(AssertionError, match="does not fit"):
        p.serve(64, 2.0)
    p.serve(64, 2.0, force=True)  # measured only: what would be certified
    assert p.reserve == 2.0 and p.charged == 2.0 and p.samples == 128
    assert p.bound == pytest.approx(100 * 2 / 128)
    p.answer(2.0, -4.0, 4.0, 2.0)  # an unfavourable-free answer: its bound replaces the charge
    assert p.charged == 0.0
    assert p.reserve == pytest.approx(min(2.0, p.sequence.upper))
    before = p.reserve
    p.serve(64, 0.0)
    p.refine(0.0)
    assert p.reserve <= before
    assert p.bounds() == pytest.approx([0.0, 100 * 2 / 128, 100 * before / 192])


def test_a_batch_no_answer_will_measure_takes_a_smaller_stake_and_no_floor():
    """Served without a step (the online protocol's skipped batch): it only spends the room, so
    it takes UNMEASURED of it, with no one-sample floor."""
    p = Promise(0.5, 0.05)
    for _ in range(9):
        p.serve(64, 0.0)
    room = p.room(64)
    assert room == pytest.approx(3.2)
    assert p.stake(64) == pytest.approx(STAKE * room)
    assert p.stake(64, measured=False) == pytest.approx(UNMEASURED * room)
    fresh = Promise(0.5, 0.05)
    fresh.serve(64, 0.0)
    fresh.serve(64, 0.0)
    assert fresh.stake(64) == pytest.approx(0.96) and fresh.stake(64, measured=False) < 0.1


def _logits(pred: list[int], classes: int = 4, sure: list[float] | None = None) -> torch.Tensor:
    out = torch.zeros(len(pred), classes)
    for i, c in enumerate(pred):
        out[i, c] = 3.0 if sure is None else sure[i]
    return out


def test_what_serves_a_batch():
    """Stake 2.5 (the room 5): the adapted model where it differs on 2 samples; on 4, a part
    of 2: the two it leans to most (its confidence 5 and 4 beside the given model's 3); with no
    room, the given model; with a subset, the adapted model at its worst case."""
    given = _logits([0, 0, 0, 0, 1, 1])
    p = Promise(5.0, 0.05)
    p.serve(36, 0.0)  # room 5 * (36 + 6) / 100 = 2.1 for a batch of 6
    p.serve(58, 0.0)  # ... 5.0: stake 2.5
    assert p.stake(6) == pytest.approx(2.5)
    near = _logits([0, 2, 0, 3, 1, 1], sure=[3, 3, 3, 3, 3, 3])
    plan = decide(p, near, given, given.argmax(1))
    assert plan.what == "adapted" and plan.charge == 2.0 and torch.equal(plan.out, near)
    far = _logits([2, 2, 3, 3, 1, 1], sure=[2.0, 5.0, 4.0, 1.0, 3, 3])
    plan = decide(p, far, given, given.argmax(1))
    assert plan.what == "part" and plan.charge == 2.0
    assert plan.served.tolist() == [0, 2, 3, 0, 1, 1]
    assert torch.equal(plan.out[1], far[1]) and torch.equal(plan.out[0], given[0])
    assert decide(Promise(0.5, 0.05), far, given, given.argmax(1)).what == "source"
    sub = torch.tensor([0, -1, 0, -1, 1, -1])  # the given model on 3 of 6, differing on 2
    alone = decide(p, far, None, sub)
    assert alone.what == "adapted" and alone.charge == 2 + 3  # and the 3 unseen at worst


def _simulate(seed: int, harm: float, batches: int, tolerance: float, level: float) -> float:
    """A stream where, on each batch of 64, the adapted model differs from the given one on
    ``D`` samples, each of which it gets wrong where the given model is right with chance ``(1
    + harm) / 2`` and right where it is wrong otherwise; what serves is :func:`decide`'s choice
    by count (a part takes the first samples), one draw a batch on the samples served
    differently, as the fallback draws it, answered at once. The largest running excess
    (points) of what served over the given model."""
    rng = random.Random(seed)
    p = Promise(tolerance, level)
    excess_, seen, worst = 0, 0, -math.inf
    for _ in range(batches):
        n, d = 64, rng.randint(0, 24)
        h = [1 if rng.random() < (1 + harm) / 2 else -1 for _ in range(d)]
        stake = p.stake(n)
        s = d if d <= stake else (math.floor(stake + 1e-9) if stake >= 1 else 0)
        p.serve(n, float(s))
        excess_ += sum(h[:s])
        seen += n
        worst = max(worst, 100 * excess_ / seen)
        if s:
            q = 0.75 / s + 0.25 / n
            y = h[rng.randrange(s)] / q if rng.random() < 0.75 + 0.25 * s / n else 0.0
            p.answer(float(s), y, 1 / q, float(s))
    return worst


def test_the_promise_holds_on_streams_where_adapting_hurts():
    """Where every disagreement more likely costs than gains (harm 0.1) or always costs (1), the
    running excess passes the tolerance in at most ``level`` of the runs (60 runs at 5 %, at
    most 7 with binomial room)."""
    for harm in (1.0, 0.1):
        worst = [_simulate(seed, harm, 150, 0.5, 0.05) for seed in range(60)]
        assert sum(w > 0.5 for w in worst) <= 7
        assert max(worst) < 1.5


def test_where_adapting_helps_the_adapted_model_comes_to_serve():
    """Harm -0.5 (the adapted model right on three disagreements in four): its answers certify
    it and it comes to serve whole batches (not in the first 20: a few answers certify little),
    keeping a good part of its gain over 6 seeds."""
    kept, early = [], []
    for seed in range(6):
        rng = random.Random(seed)
        p = Promise(0.5, 0.05)
        served, gain, full = 0, 0, []
        for _ in range(300):
            d = rng.randint(4, 24)
            h = [1 if rng.random() < 0.25 else -1 for _ in range(d)]
            stake = p.stake(64)
            s = d if d <= stake else (math.floor(stake + 1e-9) if stake >= 1 else 0)
            p.serve(64, float(s))
            served, gain = served + sum(h[:s]), gain + sum(h)
            full.append(s == d)
            if s:
                q = 0.75 / s + 0.25 / 64
                y = h[rng.randrange(s)] / q if rng.random() < 0.75 + 0.25 * s / 64 else 0.0
                p.answer(float(s), y, 1 / q, float(s))
        kept.append(served / gain)
        early.append(sum(full[:20]))
    assert sum(kept) / len(kept) >= 0.4  # no ranking here: a part is any of them
    assert max(early) <= 2


def test_the_promise_resumes_bit_identically():
    a, rng = Promise(0.5, 0.05), random.Random(3)
    for _ in range(30):
        a.serve(64, 0.0)
        a.answer(0.0, rng.choice((-1.0, 0.0, 1.0)), 1.0, 1.0)
    b = Promise(0.5, 0.05)
    b.load_state_dict(bytes_round_trip(a.state_dict()))
    for _ in range(30):
        y = rng.choice((-1.0, 0.0, 1.0))
        for p in (a, b):
            p.serve(64, math.floor(p.stake(64)))
            p.answer(1.0, y, 1.5, 1.0)
    assert nested_equal(a.state_dict(), b.state_dict())


# -- eatta-safe with its promise ------------------------------------------------------------------


def stream(n: int, size: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 3, 8, 8, generator=g), torch.randint(0, 5, (size,), generator=g))
        for _ in range(n)
    ]


def _running_excess(method: eatta.AdaptiveMethod, data, request: int = 16) -> list[float]:
    """Serve ``data`` in requests of ``request`` and return the running excess (points) of the
    served predictions' errors over the given model's after each request; the certified bound
    covers the excess after each (an event of probability 0.95 or more, here for one seed)."""
    given, out, errors, seen = method.given, [], 0, 0
    promise = method.fallback.promise  # type: ignore[union-attr]
    for x, y in data:
        for i in range(0, len(x), request):
            xs, ys = x[i : i + request], y[i : i + request]
            served = method(xs, labels=ys).argmax(1)
            with torch.no_grad():
                g = given(xs).argmax(1)
            errors += int((served != ys).sum()) - int((g != ys).sum())
            seen += len(xs)
            assert errors <= promise.reserve + 1e-9  # C_T <= R_T
            out.append(100 * errors / seen)
    return out


def test_eatta_safe_reports_its_promise_and_bound_at_every_batch():
    never = SimulatedAnnotator(delay="never", seed=0)
    method = eatta.create("eatta-safe", tiny_cnn(5, seed=1), oracle=never, lr=0.05, tolerance=1.0)
    fb = method.fallback
    for x, y in stream(4):
        method(x, labels=y)
    promise = fb.stats()["promise"]  # type: ignore[union-attr]
    assert promise["tolerance"] == 1.0 and promise["level"] == 0.05
    assert promise["samples"] == 64 and promise["answers"] == 0
    assert promise["charged"] == fb.promise.reserve  # type: ignore[union-attr]  # nothing answered
    assert len(fb.bounds()) == 4 and fb.bound == fb.bounds()[-1] <= 1.0  # type: ignore[union-attr]
    assert [w for _, w in fb.history()] == [  # type: ignore[union-attr]
        "bound" if s == "source" else "promise"
        for s, _ in fb.history()  # type: ignore[union-attr]
    ]


def test_eatta_safe_keeps_its_promise_where_adapting_hurts():
    """A learning rate that wrecks the adapted model, labels at once: the served error stays
    within the tolerance of the given model's at every request, in batches of 16 and in
    requests of 4 through a window of 16 (the window's draw measures the requests it holds)."""
    data = stream(30)
    for kw, request in (({}, 16), ({"window": 16}, 4)):
        method = eatta.create(
            "eatta-safe", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), lr=5.0, **kw
        )
        excess_ = _running_excess(method, data, request)
        assert max(excess_) <= 0.5
        promise = method.fallback.stats()["promise"]  # type: ignore[union-attr]
        assert promise["samples"] == 480 and promise["answers"] > 0


def test_a_window_s_draw_measures_the_requests_it_holds():
    """Requests of 4 through a window of 16, labels at once: each window step's draw goes where
    the requests since the last one served differently, and its answer takes their charge out:
    after whole windows nothing stays charged."""
    method = eatta.create(
        "eatta-safe", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), lr=0.05, window=16,
        tolerance=20.0,
    )  # fmt: skip
    fb = method.fallback
    focused = []
    draw = method.selector  # type: ignore[attr-defined]
    original = draw.focus

    def spy(ctx):
        mask = original(ctx)
        cover = fb._cover  # type: ignore[union-attr]
        focused.append((mask, cover))
        return mask

    draw.focus = spy
    fb._checked = True  # type: ignore[union-attr]  # the spy stands in for the fallback's focus
    for x, y in stream(6):
        for i in range(0, 16, 4):
            method(x[i : i + 4], labels=y[i : i + 4])
    assert len(focused) == 6
    assert any(mask is not None for mask, _ in focused)
    for mask, cover in focused:
        if mask is not None:
            assert int(mask.sum()) == cover.charge  # the samples served differently, all 16
    assert fb.stats()["promise"]["charged"] == 0.0  # type: ignore[union-attr]
    assert fb.stats()["promise"]["samples"] == 96  # type: ignore[union-attr]


def test_eatta_safe_keeps_its_promise_through_late_answers_and_resume():
    """Answers 3 batches late: the bound reads them when they come; a resumed copy serves bit
    for bit what the first one serves, pending answers included; reset starts it over."""

    def make() -> eatta.AdaptiveMethod:
        oracle = SimulatedAnnotator(delay=3, seed=0)
        return eatta.create("eatta-safe", tiny_cnn(5, seed=1), oracle=oracle, lr=0.05)

    data = stream(12)
    a = make()
    for x, y in data[:6]:
        a(x, labels=y)
    b = make()
    # pickled: a pending request keeps its Draw, which torch.load(weights_only=True) refuses
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    for x, y in data[6:]:
        assert torch.equal(a(x, labels=y), b(x, labels=y))
    assert nested_equal(a.fallback.state_dict(), b.fallback.state_dict())  # type: ignore[union-attr]
    a.reset()
    assert a.fallback.stats()["promise"] == Promise(0.5, 0.05).stats()  # type: ignore[union-attr]


def test_requests_of_one_through_a_window_resume_bit_identically():
    """The requests a window's next draw will measure are part of the state."""

    def make() -> eatta.AdaptiveMethod:
        return eatta.create(
            "eatta-safe", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), lr=0.05, window=8,
            tolerance=10.0,
        )  # fmt: skip

    x, y = stream(1, size=24)[0]
    a = make()
    for i in range(13):
        a(x[i : i + 1], labels=y[i : i + 1])
    assert "open" in a.fallback.state_dict()  # type: ignore[union-attr]
    b = make()
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    for i in range(13, 24):
        assert torch.equal(
            a(x[i : i + 1], labels=y[i : i + 1]), b(x[i : i + 1], labels=y[i : i + 1])
        )
    assert nested_equal(a.fallback.state_dict(), b.fallback.state_dict())  # type: ignore[union-attr]
    assert len(a.fallback.bounds()) == 24  # type: ignore[union-attr]


def test_a_draw_that_does_not_go_where_the_promise_measures_is_refused():
    promised = eatta.monitor.SourceFallback(start="promise")
    method = eatta.create(
        "eatta", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), balance=None,
        selector=eatta.selection.drawn.DisagreementDraw(), fallback=promised,
    )  # fmt: skip
    x, y = stream(1)[0]
    with pytest.raises(ValueError, match="focus"):
        method(x, labels=y)


def test_the_lean_rule_stays_by_name_and_reports_no_promise():
    method = eatta.create(
        "eatta-safe", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), fallback_start="blend"
    )
    for x, y in stream(2):
        method(x, labels=y)
    assert "promise" not in method.fallback.stats()  # type: ignore[union-attr]
    assert method.fallback.bound is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kw", "match"), [({"level": 0.0}, "level"), ({"tolerance": -1.0}, "tolerance")]
)
def test_bad_promises_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        eatta.create("eatta-safe", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), **kw)
