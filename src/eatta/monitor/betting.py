"""Which of two models is better, tested by betting on every answer since the last decision.

Each answer gives one observation ``v`` of the paired accuracy difference ``acc(adapted) -
acc(given)`` (the Horvitz-Thompson estimate of :mod:`eatta.selection.drawn`): its conditional
mean, given everything before its draw, is the mean paired difference of the batch it was drawn
from, and its range ``[-b, b]`` is known before the draw (``b = 1 / (n min_D q)``, the largest
weight among the samples the two models disagree on; elsewhere ``v = 0``).

:class:`SignTest` runs two wealth processes over the answers since it was last cleared (testing
by betting: Waudby-Smith & Ramdas, "Estimating means of bounded random variables by betting",
JRSS-B 2024; Shafer & Vovk's game-theoretic probability)::

    K_up   <- K_up   * (1 + beta_up   * v / b)      beta in [0, BET_CAP], chosen before v
    K_down <- max(K_down, 1) * (1 - beta_down * v / b)

If every answered batch's mean paired difference is at most 0 (the adapted model never better),
``K_up`` is a nonnegative supermartingale starting at 1, and by Ville's inequality it ever reaches
``1 / level`` with probability at most ``level``; so ``K_up >= 1 / level`` is an anytime-valid,
level-``level`` test, read after every answer, at any arrival rate and however late the answers.
No answer is forgotten: the evidence is every answer since the last decision.

``K_down`` watches the other side as a change detector: before each answer it is raised to 1 if
it fell below (``K_down <- max(K_down, 1) * (1 - beta_down * v / b)``, the CUSUM e-detector of
Shin, Ramdas & Rinaldo, "E-detectors", 2023: the largest wealth of a bettor started at any answer
since the last decision). Its guarantee is an average run length: while the adapted model is
never worse, it reaches ``1 / level`` after ``1 / level`` answers or more on average (a false
alarm serves the source model, the safe side, until ``K_up`` shows the adapted one better again).
In exchange, a long trusted stretch cannot use up the evidence a drift needs.

The bets are plug-ins (any predictable choice keeps the guarantee; this one only decides how fast
evidence grows): the mean ``m`` and mean square ``s`` of ``r = v / b`` (with one prior answer of
``r = 0`` and ``r^2 = 1``) give ``beta_up = clip(m / s, 0, BET_CAP)`` (Kelly's fraction, to second
order), over every answer since the last decision, and ``beta_down = clip(-m / s, 0, BET_CAP)``
over the last ``recent`` answers (a detector must follow the recent answers; on simulated
answers with a weak signal, 30 % +1 and 15 % -1, the up bet over all answers reached the
threshold within 400 answers in 94 % of 300 runs, over the last 16 in 76 %).
While the recent answers favour the adapted model, ``beta_down`` is 0 and ``K_down`` does not
move. When the adapted model drifts after it was trusted, with answers ``r = -1`` from then on (it
errs wherever the two differ and the source model does not), ``K_down`` reaches ``1 / level``
within :func:`drift_answers` answers, however long it was trusted before
(``tests/monitor/test_betting.py`` checks it answer by answer).

Assumption: whether (and when) an answer arrives does not depend on its label.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from eatta.monitor.confseq import check_level

__all__ = ["BET_CAP", "SignTest", "check_recent_answers", "drift_answers"]

#: Largest fraction of the wealth bet on one answer (each answer then keeps at least 1 - BET_CAP).
BET_CAP = 0.75


def check_recent_answers(recent: object, name: str = "fallback recent") -> int:
    """``recent`` as an int number of answers >= 1, or an error naming it."""
    if isinstance(recent, bool) or not isinstance(recent, int):
        raise TypeError(f"{name} must be an int number of answers, got {recent!r}")
    if recent < 1:
        raise ValueError(f"{name} must be at least 1 answer, got {recent}")
    return recent


def _bet(total: float, squares: float, m: int) -> float:
    """The up bet from ``m`` recent answers' sum and sum of squares (one prior answer 0, 1)."""
    mean, square = total / (m + 1), (squares + 1.0) / (m + 1)
    return min(max(mean / square, 0.0), BET_CAP)


def drift_answers(recent: int, level: float) -> int:
    """Answers within which :class:`SignTest` (``recent``, ``level``) reaches ``K_down >= 1 /
    level`` once every answer is ``r = -1``, whatever came before: after ``recent`` such answers
    the recent answers are only them (no answer lowered ``K_down``, floored at 1), and each
    further one multiplies it by ``1 + beta``, ``beta`` the bet on ``recent`` answers of -1."""
    recent, level = check_recent_answers(recent), check_level(level)
    beta = _bet(float(recent), float(recent), recent)
    return recent + math.ceil(math.log(1.0 / level) / math.log1p(beta) - 1e-12)


class SignTest:
    """Two anytime-valid tests of the sign of the answers' mean (see the module docstring).

    Args:
        level: each test's error level, in (0, 1): the chance of ever deciding for a side whose
            null (every answered batch's mean on the other side, or 0) holds.
        recent: answers the bets are sized from, >= 1.
    """

    def __init__(self, level: float = 0.05, recent: int = 16) -> None:
        self.level = check_level(level, "fallback level")
        self.recent = check_recent_answers(recent)
        self._recent: deque[float] = deque(maxlen=self.recent)
        self.clear()

    def clear(self) -> None:
        """A new decision: both wealths back to 1, the answer count to 0 (the recent answers are
        kept: it only sizes bets)."""
        self.up = self.down = 1.0
        self.answers = 0
        self.total = 0.0  # sum of v since the last clear (the running estimate)
        self._r_sum = self._r_squares = 0.0  # of r = v / b since the last clear (the up bet)

    def add(self, value: float, bound: float, count: int = 1) -> None:
        """``count`` draws that hit one sample, each an observation ``value`` in ``[-bound,
        bound]`` (``bound`` known before the draw)."""
        if not bound > 0.0 or not math.isfinite(bound):
            raise ValueError(f"an answer's bound must be positive and finite, got {bound!r}")
        if abs(value) > bound * (1.0 + 1e-9):
            raise ValueError(f"an answer's value {value!r} is outside [-{bound}, {bound}]")
        r = max(-1.0, min(1.0, value / bound))
        for _ in range(count):
            m = len(self._recent)
            total = sum(self._recent)
            squares = sum(x * x for x in self._recent)
            self.up *= 1.0 + _bet(self._r_sum, self._r_squares, self.answers) * r
            self.down = max(self.down, 1.0) * (1.0 - _bet(-total, squares, m) * r)
            self._recent.append(r)
            self.answers += 1
            self.total += value
            self._r_sum += r
            self._r_squares += r * r

    @property
    def mean(self) -> float:
        """Mean observation since the last clear (nan before any)."""
        return self.total / self.answers if self.answers else math.nan

    def decided(self) -> str | None:
        """``"worse"`` (the adapted model: ``K_down >= 1/level``; checked first, the safe
        side), ``"better"`` (``K_up >= 1/level``) or None."""
        if self.down >= 1.0 / self.level:
            return "worse"
        if self.up >= 1.0 / self.level:
            return "better"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "up": self.up,
            "down": self.down,
            "answers": self.answers,
            "total": self.total,
            "r_sum": self._r_sum,
            "r_squares": self._r_squares,
            "recent": list(self._recent),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.up, self.down = float(state["up"]), float(state["down"])
        self.answers, self.total = int(state["answers"]), float(state["total"])
        self._r_sum, self._r_squares = float(state["r_sum"]), float(state["r_squares"])
        self._recent = deque((float(r) for r in state["recent"]), maxlen=self.recent)
