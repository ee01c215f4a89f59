"""Answers scored for the fallback: each one an unbiased observation of the paired difference.

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
fallback's :class:`~eatta.monitor.betting.SignTest`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from eatta.annotate.oracle import ABSTAIN, OracleError
from eatta.annotate.requests import Answer
from eatta.monitor.betting import SignTest
from eatta.selection.drawn import Draw

__all__ = ["AnswerBook", "Asked", "drawn_weight"]


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


def drawn_weight(draw: Draw | None, index: int) -> tuple[float, int] | None:
    """``(1 / (n q), count)`` of a drawn position (None if it was not drawn)."""
    if draw is None:
        return None
    hits = (draw.indices == index).nonzero()
    if not len(hits):
        return None
    j = int(hits[0])
    return 1.0 / (draw.n * float(draw.q[j])), int(draw.counts[j])


class AnswerBook:
    """Requests waiting, answers heard in the step, and their observations (module docstring)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.answers = 0  # answers scored (lifetime)
        self._periods: dict[int, list[float]] = {}  # period -> [answers, sum of estimates]
        self.pending: dict[str, Asked] = {}
        self.begin()

    def begin(self) -> None:
        """A new step: no answer heard yet."""
        self._heard: list[tuple[Tensor, Tensor]] = []  # sync answers in this step
        self._answered: list[Answer] = []  # async answers in this step

    # -- hearing ----------------------------------------------------------------------------
    def hear_sync(self, indices: Tensor, answer: object) -> None:
        """A synchronous answer, kept as it came: the method validates it (a bad one fails the
        step, and it is never scored)."""
        if answer is None:
            return
        try:
            got = torch.as_tensor(answer).reshape(-1).long().cpu()
        except (TypeError, ValueError, RuntimeError):
            return
        if len(got) == len(indices):
            self._heard.append((indices.detach().cpu().clone(), got))

    def hear(self, answers: list[Answer]) -> None:
        """Asynchronous answers, scored after the step."""
        self._answered.extend(a for a in answers if isinstance(a, Answer))

    def forget(self, ids: list[str]) -> None:
        for i in ids:
            self.pending.pop(i, None)

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
    def score_sync(
        self, test: SignTest, draw: Draw | None, adapted: Tensor, given: Tensor, period: int
    ) -> None:
        """Score the step's synchronous answers against this step's predictions."""
        for indices, got in self._heard:
            self.score_labels(test, indices, got, draw, adapted, given, period)
        self._heard = []

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
    ) -> None:
        """Labels answered at once for the drawn ``indices`` of this step's batch."""
        if draw is None:
            return
        for j, i in enumerate(indices.tolist()):
            y, hit = int(got[j]), drawn_weight(draw, i)
            if y == ABSTAIN or hit is None:
                continue
            a, g = int(y == int(adapted[i])), int(y == int(given[i]))
            self.add(test, hit[0] * (a - g), draw.bound, hit[1], period)

    def _score_answer(self, test: SignTest, ans: Answer, epoch: int) -> None:
        asked = self.pending.pop(ans.id, None)
        if asked is None or ans.skip:
            return
        if ans.label is not None:
            a, g = int(ans.label == asked.adapted), int(ans.label == asked.given)
        else:  # yes/no on the adapted prediction (module docstring)
            a = int(bool(ans.correct))
            g = a if asked.given == asked.adapted else int(not a)
        if asked.epoch == epoch:
            self.add(test, asked.weight * (a - g), asked.bound, asked.count, asked.period)

    def add(self, test: SignTest, value: float, bound: float, count: int, period: int) -> None:
        """One answer: ``count`` draws of the same sample, each an observation ``value`` in
        ``[-bound, bound]``."""
        self.answers += 1
        tally = self._periods.setdefault(period, [0.0, 0.0])
        tally[0] += count
        tally[1] += value * count
        test.add(value, bound, count)

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
