"""The promise of ``eatta-safe``: the inequality its proof rests on, the rate bounds, the ledger,
the promise itself on adversarial simulated streams, and its state through resume, reset and
late answers."""

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
from eatta.monitor.promise import BETS, Promise, RateBound, harms, psi_e, rate_root

pytestmark = pytest.mark.small_batches


def test_the_inequality_the_proof_rests_on_holds_on_a_grid():
    """``exp(lam xi - psi(lam) xi^2) <= 1 + lam xi`` for ``xi >= -1``, ``lam`` in ``[0, 1)``
    (Fan, Grama & Liu), with equality at ``xi = -1`` and 0."""
    for lam in (0.0, 0.05, 0.1, 0.35, 0.6, 0.9, 0.99):
        for k in range(-100, 301):
            xi = k / 100
            left, right = math.exp(lam * xi - psi_e(lam) * xi * xi), 1 + lam * xi
            assert left <= right + 1e-12
        assert math.isclose(math.exp(-lam - psi_e(lam)), 1 - lam, rel_tol=1e-9)


def test_the_root_is_where_the_mixture_reaches_one_over_the_level():
    c, level = 2.0 / 0.75, 0.025
    for spread, draws in ((0.0, 1), (0.3, 5), (4.0, 50)):
        t = rate_root(spread, draws, c, level)
        mix = sum(
            w * math.exp(lam * t / c - (psi_e(lam) * spread if k == "eb" else draws * lam**2 / 8))
            for k, lam, w in BETS
        )
        assert math.isclose(mix, 1 / level, rel_tol=1e-9)
    assert math.isclose(sum(w for _, _, w in BETS), 1.0)


def test_all_favourable_answers_certify_a_rate_below_zero_only_after_several():
    """Every answer shows the adapted model right where the given one errs (r = -1 / (1 -
    explore)): a bound that moved on one or two such answers would not be anytime-valid at 2.5 %
    (each could come from a rate of 0 with probability one half)."""
    bound = RateBound(0.025, 0.25)
    assert bound.upper == 1.0
    seen = []
    for _ in range(20):
        bound.add(-1 / 0.75)
        seen.append(bound.upper)
    assert min(seen[:5]) > 0  # 2^-5 > 2.5 %: no valid bound could certify a rate of 0 yet
    first = next(i for i, u in enumerate(seen) if u <= 0)
    assert 6 <= first <= 12
    assert all(b <= a for a, b in itertools.pairwise(seen))


def test_an_observation_outside_the_draws_range_is_refused():
    bound = RateBound(0.05, 0.25)
    with pytest.raises(ValueError, match="outside"):
        bound.add(1.5)
    with pytest.raises(ValueError, match="explore < 1"):
        RateBound(0.05, 1.0)


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        ((3, None, 3, 5, 3), (-1, -1)),  # a label: the adapted (and blend) right, given wrong
        ((5, None, 3, 5, 3), (1, 1)),
        ((7, None, 3, 5, 3), (0, 0)),  # both wrong
        ((None, True, 3, 5, 5), (-1, 0)),  # yes: the adapted right; the blend is the given model
        ((None, False, 3, 5, 3), (1, 1)),  # no: the given model counted right (the worst)
        ((None, False, 3, 5, 5), (1, 0)),
        ((None, False, 3, 5, 8), (1, 1)),  # the blend differs from both: counted wrong
        ((None, False, 3, 3, 3), (0, 0)),  # the two agree: no harm either way
    ],
)
def test_answers_are_scored_at_their_worst(answer, want):
    label, correct, adapted, given, blend = answer
    assert harms(label, correct, adapted, given, blend) == want


def test_without_answers_the_ledger_spends_what_the_given_model_put_aside():
    """Batches of 64 the blend changes on one sample, the adapted model on 3: 0.5 points of 64
    samples put 0.32 aside a batch, so the blend fits at the 4th batch (1.28 >= 1), the 7th
    (2.24 >= 2), the 10th (3.2 >= 3); the adapted model (3 more) never does."""
    promise = Promise(0.5, 0.05, 0.25)
    served = [promise.choose(64, (3, 3), 1) for _ in range(12)]
    assert [i for i, w in enumerate(served) if w != "source"] == [3, 6, 9]
    assert set(served) == {"source", "blend"}
    assert promise.ledger == 3.0 and promise.bound == pytest.approx(100 * 3 / (12 * 64))
    assert promise.bounds()[3] == pytest.approx(100 / 256)
    assert all(b <= 0.5 + 1e-12 for b in promise.bounds())
    # the adapted model alone changes 3: it fits only where 3 samples are put aside beyond
    assert Promise(0.5, 0.05, 0.25).choose(64, (0, 0), None) == "adapted"


def _simulate(seed: int, harm: float, batches: int, tolerance: float, level: float) -> float:
    """A stream where, on each batch, the adapted model disagrees with the given one on ``D``
    samples (drawn at random), each of which it gets wrong where the given model is right with
    probability ``(1 + harm) / 2`` and right where it is wrong otherwise (so the harm per
    disagreement is ``harm``); the blend takes the adapted model's side on half of them. One
    request a batch, drawn as DisagreementDraw draws, answered at once. Returns the largest
    running excess (points) of what served over the given model."""
    rng = random.Random(seed)
    promise = Promise(tolerance, level, 0.25)
    excess = seen = 0
    worst = -math.inf
    for _ in range(batches):
        n, d = 64, rng.randint(0, 24)
        h = [1 if rng.random() < (1 + harm) / 2 else -1 for _ in range(d)]
        blend = d // 2  # the blend sides with the adapted model on the first half
        what = promise.choose(n, (d, d), blend)
        excess += {"adapted": sum(h), "blend": sum(h[:blend]), "source": 0}[what]
        seen += n
        worst = max(worst, 100 * excess / seen)
        if d:  # the draw: 0.75 uniform on the disagreements, 0.25 uniform on the batch
            q = [0.75 / d + 0.25 / n] * d + [0.25 / n] * (n - d)
            i = rng.choices(range(n), weights=q)[0]
            h_a = h[i] if i < d else 0
            h_b = h_a if i < blend else 0
            promise.observe(h_a, h_b, q[i] * d)
    return worst


def test_the_promise_holds_on_streams_where_adapting_hurts():
    """Where every disagreement more likely costs than gains (harm 0.1) or always costs (1),
    the running excess passes the tolerance in at most ``level`` of the runs (with binomial
    room: 80 runs at 5 %, at most 9), whatever the bound let through."""
    for harm in (1.0, 0.1):
        worst = [_simulate(seed, harm, 200, 0.5, 0.05) for seed in range(80)]
        assert sum(w > 0.5 for w in worst) <= 9
        assert max(worst) < 2.0


def test_where_adapting_helps_the_adapted_model_comes_to_serve():
    """Harm -0.5 (the adapted model right on three disagreements in four): after some answers
    the bound certifies it and it serves, and the served error ends below the given model's."""
    ends = []
    for seed in range(5):
        rng = random.Random(seed)
        promise = Promise(0.5, 0.05, 0.25)
        served = []
        for _ in range(300):
            d = rng.randint(4, 24)
            h = [1 if rng.random() < 0.25 else -1 for _ in range(d)]
            served.append(promise.choose(64, (d, d), d // 2))
            q = [0.75 / d + 0.25 / 64] * d + [0.25 / 64] * (64 - d)
            i = rng.choices(range(64), weights=q)[0]
            h_a = h[i] if i < d else 0
            promise.observe(h_a, h_a if i < d // 2 else 0, q[i] * d)
        assert served[-100:].count("adapted") >= 90
        ends.append(promise.bound)
    assert max(ends) < 0  # certified better than the given model


def test_the_promise_resumes_bit_identically():
    a, rng = Promise(0.5, 0.05, 0.25), random.Random(3)
    for _ in range(30):
        a.choose(64, (5, 5), 2)
        a.observe(rng.choice((-1, 0, 1)), 0, 0.9)
    b = Promise(0.5, 0.05, 0.25)
    b.load_state_dict(bytes_round_trip(a.state_dict()))
    for _ in range(30):
        h = rng.choice((-1, 0, 1))
        assert a.choose(64, (5, 5), 2) == b.choose(64, (5, 5), 2)
        a.observe(h, 0, 0.9)
        b.observe(h, 0, 0.9)
    assert nested_equal(a.state_dict(), b.state_dict())


# -- eatta-safe with its promise ------------------------------------------------------------------


def stream(n: int, size: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 3, 8, 8, generator=g), torch.randint(0, 5, (size,), generator=g))
        for _ in range(n)
    ]


def test_eatta_safe_reports_its_promise_and_bound_at_every_batch():
    never = SimulatedAnnotator(delay="never", seed=0)
    method = eatta.create("eatta-safe", tiny_cnn(5, seed=1), oracle=never, lr=0.05, tolerance=1.0)
    fb = method.fallback
    for x, y in stream(4):
        method(x, labels=y)
    promise = fb.stats()["promise"]  # type: ignore[union-attr]
    assert promise["tolerance"] == 1.0 and promise["level"] == 0.05
    assert promise["samples"] == 64 and promise["answers"] == 0
    assert len(fb.bounds()) == 4 and fb.bound == fb.bounds()[-1] <= 1.0  # type: ignore[union-attr]
    assert [w for _, w in fb.history()] == [  # type: ignore[union-attr]
        "bound" if s == "source" else "promise"
        for s, _ in fb.history()  # type: ignore[union-attr]
    ]


def test_eatta_safe_keeps_its_promise_through_late_answers_and_resume():
    """Answers 3 batches late: the bounds read them when they come; a resumed copy serves
    bit for bit what the first one serves, pending answers included."""

    def make() -> eatta.AdaptiveMethod:
        oracle = SimulatedAnnotator(delay=3, seed=0)
        return eatta.create("eatta-safe", tiny_cnn(5, seed=1), oracle=oracle, lr=0.05)

    data = stream(10)
    a = make()
    for x, y in data[:5]:
        a(x, labels=y)
    assert a.fallback.stats()["promise"]["answers"] == 2  # type: ignore[union-attr]
    b = make()
    # pickled: a pending request keeps its Draw, which torch.load(weights_only=True) refuses (as
    # on main before the promise)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    for x, y in data[5:]:
        assert torch.equal(a(x, labels=y), b(x, labels=y))
    assert nested_equal(a.fallback.state_dict(), b.fallback.state_dict())  # type: ignore[union-attr]
    assert a.fallback.stats()["promise"]["answers"] == 7  # type: ignore[union-attr]
    a.reset()
    assert a.fallback.stats()["promise"] == Promise(0.5, 0.05, 0.25).stats()  # type: ignore[union-attr]


def test_eatta_safe_with_requests_of_one_through_a_window_counts_every_served_request():
    method = eatta.create(
        "eatta-safe", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), lr=0.05, window=16
    )
    for x, y in stream(2, size=16):
        for i in range(16):
            method(x[i : i + 1], labels=y[i : i + 1])
    promise = method.fallback.stats()["promise"]  # type: ignore[union-attr]
    assert promise["samples"] == 32 and len(method.fallback.bounds()) == 32  # type: ignore[union-attr]


def test_the_lean_rule_stays_by_name_and_reports_no_promise():
    method = eatta.create(
        "eatta-safe", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), fallback_start="blend"
    )
    for x, y in stream(2):
        method(x, labels=y)
    assert "promise" not in method.fallback.stats()  # type: ignore[union-attr]
    assert method.fallback.bound is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"level": 0.0}, "level"), ({"tolerance": -1.0}, "tolerance"), ({"explore": 1.0}, "explore")],
)
def test_bad_promises_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        eatta.create("eatta-safe", tiny_cnn(5, seed=1), oracle=GroundTruthOracle(), **kw)
