"""The guard's block test: hand-computed decisions, the union bound, bad input, state."""

from __future__ import annotations

import math
import random

import pytest

from eatta.monitor.guard import Guard, ResetEvent


def feed(guard: Guard, pairs: list[tuple[int, int]]) -> list[ResetEvent]:
    return [e for a, s in pairs if (e := guard.update(a, s)) is not None]


def radius(n: int, alpha: float, total: int = 0, nonzero: int | None = None) -> float:
    """The tighter of Hoeffding and Maurer-Pontil at alpha / 2 each, by hand."""
    nonzero = n if nonzero is None else nonzero
    mean = total / n
    var = (nonzero - n * mean**2) / (n - 1)
    hoeffding = 2.0 * math.sqrt(math.log(4.0 / alpha) / (2.0 * n))
    log = math.log(8.0 / alpha)
    bernstein = math.sqrt(2 * var * log / n) + 7 * 2 * log / (3 * (n - 1))
    return min(hoeffding, bernstein)


def test_the_radius_is_the_tighter_bound_by_hand():
    # all differences -1: no variance, Bernstein's linear term only, which Hoeffding beats at 50
    assert Guard.radius(50, -50, 50, 0.05) == pytest.approx(radius(50, 0.05, -50, 50))
    assert 14 * math.log(160) / (3 * 49) > Guard.radius(50, -50, 50, 0.05)
    # ... and loses to at 2,000
    assert Guard.radius(2000, -2000, 2000, 0.05) == pytest.approx(14 * math.log(160) / (3 * 1999))
    # half the differences +-1 at random: Hoeffding is tighter at small n
    assert Guard.radius(40, 0, 20, 0.05) == pytest.approx(2.0 * math.sqrt(math.log(80) / 80))
    # many audits with few disagreements: Bernstein is tighter
    r = Guard.radius(4000, 400, 800, 0.05)
    assert r == pytest.approx(radius(4000, 0.05, 400, 800))
    assert r < 2.0 * math.sqrt(math.log(80) / 8000)


def test_a_block_worse_than_the_source_resets_with_its_evidence():
    g = Guard("source", level=0.1, block=50)
    # block 1: the adapted model always wrong, the source always right: gain -1
    events = feed(g, [(0, 1)] * 50)
    assert len(events) == 1
    e = events[0]
    alpha_1 = 0.1 / 2
    assert e.reason == "worse than source" and e.block == 1 and e.audits == 50
    assert e.gain == -1.0 and e.level == pytest.approx(alpha_1)
    assert e.high == pytest.approx(-1.0 + radius(50, alpha_1, -50, 50))
    # 49 audits do not complete a block: nothing is decided
    assert feed(Guard("source", 0.1, 50), [(0, 1)] * 49) == []


def test_a_gain_whose_interval_reaches_zero_does_not_reset():
    g = Guard("source", level=0.05, block=100)
    # gain -0.2 over 100 audits: radius > 0.2 at alpha/2 -> the upper bound is above 0
    pairs = [(0, 1)] * 20 + [(1, 1)] * 80
    assert feed(g, pairs) == []
    assert g.blocks == 1


def test_drift_compares_with_the_best_earlier_block_since_the_reset():
    g = Guard("drift", level=0.05, block=200)
    good = [(1, 0)] * 180 + [(1, 1)] * 20  # gain 0.9
    fair = [(1, 0)] * 100 + [(1, 1)] * 100  # gain 0.5
    bad = [(1, 1)] * 200  # gain 0
    assert feed(g, good) == []
    assert feed(g, fair) == []  # 0.5 + r2 > 0.9 - r1
    events = feed(g, bad)  # 0 + r3 < 0.9 - r1: worse than block 1
    assert len(events) == 1 and events[0].reason == "worse than earlier"
    assert events[0].reference_block == 1
    assert events[0].reference_low == pytest.approx(0.9 - radius(200, 0.05 / 2, 180, 180))
    assert events[0].level == pytest.approx(0.05 / 12)  # block 3: alpha / (3 * 4)
    # a "source" guard ignores drift, a "drift" guard ignores the source
    assert feed(Guard("source", 0.05, 200), good + fair + bad) == []
    assert feed(Guard("drift", 0.05, 50), [(0, 1)] * 50) == []
    # after a restart, earlier blocks are no reference
    g.restart()
    assert feed(g, bad) == []


def test_no_false_resets_beyond_the_level_when_nothing_degrades():
    """Stationary paired audits (gain 0.2): over 200 streams of 30 blocks, resets in at most
    level of them (the union bound over blocks)."""
    rng = random.Random(0)
    level, streams = 0.1, 200
    reset_streams = 0
    for _ in range(streams):
        g = Guard("paired", level=level, block=40)
        pairs = []
        for _ in range(30 * 40):
            a = int(rng.random() < 0.7)
            s = int(rng.random() < 0.5)
            pairs.append((a, s))
        reset_streams += bool(feed(g, pairs))
    assert reset_streams / streams <= level


def test_the_state_round_trips_and_continues_identically():
    g = Guard("paired", 0.05, 10)
    feed(g, [(1, 0)] * 25)
    h = Guard("source", 0.2, 3)
    h.load_state_dict(g.state_dict())
    rest = [(0, 1)] * 40
    assert [e.to_dict() for e in feed(g, rest)] == [e.to_dict() for e in feed(h, rest)]
    assert g.state_dict() == h.state_dict()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"policy": "sometimes"}, ValueError, "unknown guard policy"),
        ({"level": 0.0}, ValueError, r"\(0, 1\)"),
        ({"level": 1.0}, ValueError, r"\(0, 1\)"),
        ({"block": 1}, ValueError, "block"),
        ({"block": 2.5}, ValueError, "block"),
    ],
)
def test_bad_guard_input_is_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        Guard(**kwargs)
