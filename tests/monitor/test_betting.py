"""The betting test of the fallback's decisions: wealth by hand, the stated drift bound, its
level under the null, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from eatta.monitor.evidence import BET_CAP, SignTest, drift_answers


def test_wealth_follows_the_bets_by_hand():
    """Answers r = 1, 1, -1 (bound 2, values 2, 2, -2): the bets from the answers before each,
    with one prior answer (0, 1): up bets 0, 1/2, 2/3 capped at 0.75 -> 2/3; down bets 0."""
    t = SignTest(level=0.05, recent=16)
    for v in (2.0, 2.0, -2.0):
        t.add(v, bound=2.0)
    up = (1 + 0 * 1) * (1 + 0.5 * 1) * (1 - (2 / 3) * 1)
    assert t.up == pytest.approx(up, rel=1e-12)
    assert t.down == pytest.approx(1.0, rel=1e-12)  # never bet against: the mean stayed >= 0
    assert t.answers == 3 and t.mean == pytest.approx(2 / 3)


def test_a_count_is_that_many_observations():
    a, b = SignTest(), SignTest()
    a.add(0.5, bound=1.0, count=3)
    for _ in range(3):
        b.add(0.5, bound=1.0)
    assert a.state_dict() == b.state_dict()


def test_the_drift_bound_by_hand():
    """window 16: the bet on a window of -1s is 16/17, capped at 0.75; 1.75^6 >= 20 > 1.75^5."""
    assert 1.75**5 < 20 <= 1.75**6
    assert drift_answers(16, 0.05) == 16 + 6
    beta = min(1 / 2, BET_CAP)  # window 1: one -1 and the prior: mean -1/2, square 1
    assert drift_answers(1, 0.05) == 1 + math.ceil(math.log(20) / math.log(1 + beta))


@pytest.mark.parametrize("trusted", [0, 50, 5000])
@pytest.mark.parametrize("noisy", [False, True])
def test_a_drift_after_any_trust_is_caught_within_the_stated_answers(trusted, noisy):
    g = torch.Generator().manual_seed(trusted)
    t = SignTest(level=0.05, recent=16)
    mix = torch.tensor([0.2, 0.2, 0.6])  # -1, 0, +1: mean 0.4
    for _ in range(trusted):  # trusted: +1, or mostly +1 with some 0 and -1 when noisy
        r = float(torch.multinomial(mix, 1, generator=g)) - 1 if noisy else 1.0
        t.add(r, bound=1.0)
    caught = None
    for i in range(1, 100):
        t.add(-1.0, bound=1.0)
        if t.decided() == "worse":
            caught = i
            break
    assert caught is not None and caught <= drift_answers(16, 0.05)


def test_under_the_null_the_adapted_model_is_rarely_shown_better():
    """Mean 0 answers (+1 or -1 at random): over 200 streams of 400 answers the up-wealth
    reaches 20 in at most level's share (plus sampling slack) of them."""
    g = torch.Generator().manual_seed(0)
    hits = 0
    for _ in range(200):
        t = SignTest(level=0.05, recent=16)
        signs = torch.randint(0, 2, (400,), generator=g) * 2 - 1
        for r in signs.tolist():
            t.add(float(r), bound=1.0)
            if t.up >= 20:
                hits += 1
                break
    assert hits <= 0.05 * 200 + 6  # Ville: at most 5 % in expectation


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"recent": 0}, "at least 1 answer"), ({"level": 1.0}, "level"), ({"level": 0}, "level")],
)
def test_bad_settings(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SignTest(**kw)


def test_bad_answers_change_nothing():
    t = SignTest()
    t.add(0.5, bound=1.0)
    before = t.state_dict()
    with pytest.raises(ValueError, match="outside"):
        t.add(2.0, bound=1.0)
    with pytest.raises(ValueError, match="bound"):
        t.add(0.0, bound=0.0)
    assert t.state_dict() == before


def test_the_up_bet_reads_every_answer_since_the_decision_the_down_bet_the_window():
    """window 2: after +1, +1, -1, -1 the up bet reads all four (mean 0: no bet), the down bet
    the last two (-1, -1 and the prior: mean -2/3, square 1: 2/3)."""
    t = SignTest(level=0.05, recent=2)
    for r in (1.0, 1.0, -1.0, -1.0):
        t.add(r, bound=1.0)
    up, down = t.up, t.down
    t.add(1.0, bound=1.0)
    assert t.up == pytest.approx(up * (1 + 0.0), rel=1e-12)
    assert t.down == pytest.approx(max(down, 1.0) * (1 - 2 / 3), rel=1e-12)
    t.clear()
    assert (t.up, t.down, t.answers) == (1.0, 1.0, 0)
