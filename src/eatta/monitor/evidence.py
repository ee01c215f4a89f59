"""The fallback's evidence: answers scored into observations, and the test that bets on them.

**Scoring.** Answers scored for the fallback: each one an unbiased observation of the paired
difference.

An answer ``y`` to a request for sample ``i``, drawn with probability ``q_i`` per draw among ``n``
candidates (:mod:`eatta.selection.drawn`), gives

    v = (1[y = a_i] - 1[y = g_i]) / (n q_i)

where ``a_i`` and ``g_i`` are the adapted and the given model's predictions when it was asked:
``E[v]`` is the batch's mean paired difference ``acc(adapted) - acc(given)`` (Horvitz-Thompson with
one draw), and ``|v| <= b``, the draw's bound, known before it. A sample drawn ``c`` times counts
``c`` observations. A yes/no answer on the adapted prediction counts the given model right after a
"no" where the two differ (its correctness is then unknown: the safe side).

:class:`AnswerBook` keeps what the answers need until they arrive (:class:`Asked`, per request),
the answers heard during a step, the per-period tallies, and adds each observation to the
fallback's :class:`SignTest`.

**The test.** Which of two models is better, tested by betting on every answer since the last
decision.

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
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from eatta.annotate.oracle import ABSTAIN, OracleError
from eatta.annotate.requests import Answer
from eatta.monitor.confseq import check_level
from eatta.monitor.promise import Cover, Promise, excess
from eatta.selection.drawn import Draw

__all__ = [
    "BET_CAP",
    "AnswerBook",
    "Asked",
    "SignTest",
    "check_recent_answers",
    "drawn_weight",
    "drift_answers",
    "paired",
]

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


def paired(
    label: int | None, correct: bool | None, adapted: int, given: int, *, unknown: int = 1
) -> tuple[int, int]:
    """``(adapted right, given right)`` for one answer: a class ``label``, or yes/no
    (``correct``) on the adapted prediction. After a "no" where the two models differ, the given
    model's correctness is unknown and counts ``unknown`` (1: the fallback's safe side, the given
    model right; 0: the monitor's lower bound). The one scoring the fallback and the monitor
    share."""
    if label is not None:
        return int(label == adapted), int(label == given)
    a = int(bool(correct))
    return a, (a if given == adapted else (unknown if not a else 0))


@dataclass(frozen=True)
class Asked:
    """A request waiting for its answer: what the observation needs when it arrives."""

    weight: float  # 1 / (n q): the answer's Horvitz-Thompson weight (one draw)
    bound: float  # the draw's largest possible |estimate| (known before it)
    count: int  # how often the draw picked the sample (each pick is one observation)
    adapted: int
    given: int
    period: int
    epoch: int
    step: int
    pool: int = 0  # samples the draw was made among
    disagreements: int = 0  # of them, where the two models disagreed
    served: int = -1  # the promise: what served the sample (-1: the answer measures nothing)
    share: float = 0.0  # of its batch's charge, per draw
    per: float = 0.0  # the estimate per unit of h (n / (m q k))
    cap: float = 0.0  # the estimate's bound
    reach: float = 0.0  # the measured excess's bound
    spread: float = 0.0  # a subset's variance factor


def drawn_weight(draw: Draw | None, index: int) -> tuple[float, int] | None:
    """``(1 / (n q), count)`` of a drawn position (None if it was not drawn)."""
    if draw is None:
        return None
    hits = (draw.indices == index).nonzero()
    if not len(hits):
        return None
    j = int(hits[0])
    return 1.0 / (draw.n * float(draw.q[j])), int(draw.counts[j])


def measure(cover: Cover | None, draw: Draw, weight: float, served: int, n: int) -> dict[str, Any]:
    """What an answer to a draw of ``draw`` (Horvitz-Thompson weight ``weight = 1 / (m q)``)
    measures for the promise, given the step's ``cover`` over its ``n`` samples: the served
    class, the share of the charge each draw releases, the estimate per unit of ``h``, its bound
    (``n`` times the draw's, over the focus), the measured excess's and the subset's spread, per
    draw of ``k``. Nothing (``served`` -1) without a charge, or for a subset's draw of more than
    one request."""
    k = draw.k
    if cover is None or cover.charge <= 0 or k < 1 or (cover.single and k != 1):
        return {"served": -1}
    return {
        "served": served,
        "share": cover.charge / k,
        "per": cover.scale * weight * draw.n / k,
        # no sample of the pool served differently: every estimate is 0 (any bound holds)
        "cap": (n * draw.bound if cover.focus is not None else 1.0) / k,
        "reach": cover.reach / k,
        "spread": cover.spread / (k * k),
    }


class AnswerBook:
    """Requests waiting, answers heard in the step, and their observations (module docstring)."""

    def __init__(self, promise: Promise | None = None) -> None:
        self.promise = promise  # the promise reads every answer too (what it measured)
        self.clear()

    def clear(self) -> None:
        self.answers = 0  # answers scored (lifetime)
        self._periods: dict[int, list[float]] = {}  # period -> [answers, sum of estimates]
        self.pending: dict[str, Asked] = {}
        self.begin()

    def begin(self) -> None:
        """A new step: no answer heard yet."""
        self._answered: list[Answer] = []  # async answers in this step

    def score_step(
        self,
        test: SignTest,
        records: list[Any],
        adapted: Tensor,
        given: Tensor,
        period: int,
        epoch: int,
        step: int,
        cover: Cover | None = None,
    ) -> None:
        """A method's own drawn answers of one step (``records``: its
        :class:`~eatta.annotate.asking.AnswerRecord`, the draw in each selection): those given at
        once are scored against this step's predictions (``adapted``, ``given``; ``cover``: what
        they measure for the promise); asynchronous requests are kept until their answers
        arrive, then scored against the predictions of the step that asked; the answers that
        arrived now are scored."""
        for lab in records:
            draw: Draw | None = None if lab.selection is None else lab.selection.update.get("draw")
            if lab.labels is not None and not lab.requests and lab.selection is not None:
                asked = lab.selection.indices  # answered at once
                self.score_labels(test, asked, lab.labels, draw, adapted, given, period, cover)
            if not lab.requests or draw is None:
                continue
            where = torch.tensor([r.index for r in lab.requests])
            served = given if cover is None else cover.served
            rows = torch.stack([given[where], served[where]]).tolist()  # one read for them all
            for j, r in enumerate(lab.requests):
                hit = drawn_weight(draw, r.index)
                if hit is not None:
                    self.pending[r.id] = Asked(
                        hit[0], draw.bound, hit[1], r.prediction, rows[0][j], period, epoch, step,
                        draw.n, draw.disagreements,
                        **measure(cover, draw, hit[0], rows[1][j], given.shape[0]),
                    )  # fmt: skip
            self._answered.extend(a.answer for a in lab.arrived)
        self.score_answers(test, epoch)

    # -- hearing ----------------------------------------------------------------------------
    def hear(self, answers: list[Answer]) -> None:
        """Asynchronous answers, scored after the step."""
        self._answered.extend(a for a in answers if isinstance(a, Answer))

    def keep(self, ids: list[str]) -> None:
        """Forget every request but ``ids`` (the ones still awaited: answered, cancelled or
        expired ones never come back)."""
        live = set(ids)
        self.pending = {k: v for k, v in self.pending.items() if k in live}

    def expire(self, step: int, expiry: int) -> list[str]:
        """Drop the requests older than ``expiry`` steps; their ids."""
        old = [i for i, a in self.pending.items() if step - a.step > expiry]
        for i in old:
            del self.pending[i]
        return old

    def check_audits(self, answers: list[Answer], prefix: str, step: int, audits: int) -> None:
        """An audit answer for a request never sent (ids ``{prefix}{step}-{j}``) is an error,
        raised before any answer is scored."""
        for ans in answers:
            if ans.id in self.pending:
                continue
            at, _, j = ans.id[len(prefix) :].partition("-")
            if not (
                ans.id.startswith(prefix)
                and at.isdigit()
                and j.isdigit()
                and int(at) <= step
                and int(j) < audits
            ):
                raise OracleError(
                    f"the auditor answered request {ans.id!r}, which the fallback never asked "
                    "about; no answer of this batch was scored"
                )

    # -- scoring ----------------------------------------------------------------------------
    def score_answers(self, test: SignTest, epoch: int) -> None:
        """Score the step's asynchronous answers against the predictions kept when they were
        asked (those asked in this ``epoch`` only)."""
        for ans in self._answered:
            self._score_answer(test, ans, epoch)
        self._answered = []

    def score_labels(
        self,
        test: SignTest,
        indices: Tensor,
        got: Tensor,
        draw: Draw | None,
        adapted: Tensor,
        given: Tensor,
        period: int,
        cover: Cover | None = None,
    ) -> None:
        """Labels answered at once for the drawn ``indices`` of this step's batch (``cover``:
        what they measure for the promise)."""
        if draw is None:
            return
        served = given if cover is None else cover.served
        for j, i in enumerate(indices.tolist()):
            y, hit = int(got[j]), drawn_weight(draw, i)
            if y == ABSTAIN or hit is None:
                continue
            # one read of the three predictions
            a_i, g_i, s_i = torch.stack([adapted[i], given[i], served[i]]).tolist()
            a, g = paired(y, None, a_i, g_i)
            self.add(test, hit[0] * (a - g), draw.bound, hit[1], period)
            self._certify(y, None, a_i, g_i, hit[1], measure(cover, draw, hit[0], s_i, len(given)))

    def _score_answer(self, test: SignTest, ans: Answer, epoch: int) -> None:
        asked = self.pending.pop(ans.id, None)
        if asked is None or ans.skip:
            return
        a, g = paired(ans.label, ans.correct, asked.adapted, asked.given)
        if asked.epoch == epoch:
            self.add(test, asked.weight * (a - g), asked.bound, asked.count, asked.period)
        fields = {k: getattr(asked, k) for k in ("served", "share", "per", "cap", "reach")}
        fields["spread"] = asked.spread
        self._certify(ans.label, ans.correct, asked.adapted, asked.given, asked.count, fields)

    def _certify(
        self,
        label: int | None,
        correct: bool | None,
        adapted: int,
        given: int,
        count: int,
        fields: dict[str, Any],
    ) -> None:
        """One answer to the promise (``count`` draws of its sample, ``fields`` from
        :func:`measure`): each draw takes its share of the batch's charge out and adds its
        estimate."""
        if self.promise is None or fields["served"] < 0 or label == ABSTAIN:
            return
        h = excess(label, correct, fields["served"], given, adapted)
        for _ in range(count):
            self.promise.answer(
                fields["share"], h * fields["per"], fields["cap"], fields["reach"],
                fields["spread"],
            )  # fmt: skip

    def add(self, test: SignTest, value: float, bound: float, count: int, period: int) -> None:
        """One answer: ``count`` draws of the same sample, each an observation ``value`` in
        ``[-bound, bound]``."""
        self.answers += 1
        tally = self._periods.setdefault(period, [0.0, 0.0])
        tally[0] += count
        tally[1] += value * count
        if self.promise is None:  # under the promise no test decides (and the draw's range is
            test.add(value, bound, count)  # that of where it measures, not the disagreements)

    def period_gain(self, period: int) -> tuple[int, float]:
        """Answers and mean estimated paired difference (adapted - given accuracy) in a period."""
        n, total = self._periods.get(period, [0.0, 0.0])
        return int(n), (total / n if n else math.nan)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "answers": self.answers,
            "periods": {p: list(t) for p, t in self._periods.items()},
            "pending": {k: asdict(v) for k, v in self.pending.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.answers = int(state["answers"])
        self._periods = {int(p): [float(t[0]), float(t[1])] for p, t in state["periods"].items()}
        self.pending = {str(k): Asked(**v) for k, v in state["pending"].items()}
