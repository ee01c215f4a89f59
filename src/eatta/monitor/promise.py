r"""The promise ``eatta-safe`` keeps: never worse than the given model by more than ``tolerance``
points, at every batch, with probability at least ``1 - level``.

**The promise.** Batches ``t = 1, 2, ...`` of ``n_t`` samples are each served by one predictor
``s_t`` (:mod:`eatta.monitor.serving`): the model as given ``g``, the adapted model ``a``, or ``a``
on some of the samples where it differs from ``g`` and ``g`` elsewhere. With
``N_T = sum_{t<=T} n_t``, ``X_t = sum_{i in batch t} (1[s_t(x_i) != y_i] - 1[g(x_i) != y_i])``
(the errors of what served batch ``t``, less the given model's, on the same samples; 0 where
``g`` served) and ``C_T = sum_{t<=T} X_t``, the rule below keeps

    P( for every T:  C_T <= tolerance / 100 * N_T )  >=  1 - level.

**What it assumes.**

- *(A1) Known draws.* Each answer is to a request drawn from a pool (the batch, the uniform
  subset the given model predicted on, or a window's samples) with a known inclusion
  probability ``q_i > 0`` per draw, fixed before the draw (:mod:`eatta.selection.drawn`).
- *(A2) The annotator answers what was asked.* The promise is about the answers' labels: a noisy
  annotator's wrong labels count as the truth. A yes/no answer on the adapted prediction is
  scored at its worst for what served (a "no" counts the given model right where it can be), which
  only raises the estimates; an abstention, a skipped, dropped or expired request counts as no
  answer.
- *(A3) Arrivals tell nothing.* Whether and when an answer arrives does not depend on its label
  or on which sample was drawn, and nothing the method does before it arrives depends on which
  sample was drawn (``eatta-safe`` keeps a pending sample unused).

Nothing is assumed of the stream: the models may get worse or better at any time, answered
batches need not resemble unanswered ones (no pooling across batches), and nothing label-free
decides: the disagreement counts below bound what a batch can cost, they never say which model is
right.

**A served batch's own evidence.** What served batch ``t`` is fixed before its draw, so the set
``S_t`` of its samples where it differs from ``g`` (``D_t = |S_t|``) is. An answer ``y`` to a
draw of sample ``i`` gives ``h_i = 1[y != s_t(x_i)] - 1[y != g(x_i)]`` (0 off ``S_t``) and the
Horvitz-Thompson estimate ``Y = h_i / q_i`` of ``X_t``: ``E[Y | past] = X_t`` and ``|Y| <= B_t =
max_{i in S_t} 1 / q_i``, known before the draw. ``k`` draws of a batch are ``k`` observations
of ``X_t / k`` each (``Y / k``, within ``B_t / k``). Where the given model predicted on a uniform
subset ``M`` of ``m`` of the ``n`` samples only (the adapted model served alone), ``Y = (n / m)
h_i / q_i`` with ``q`` the draw's within ``M``: its mean given ``M`` is ``X_M = (n / m) sum_{i in
M} h_i`` (within ``(n / m) |S_t cap M|``), and ``X_t - X_M`` has mean 0 and is sub-Gaussian with
variance factor ``n^2 / m`` (sampling without replacement is no more spread than with it,
Hoeffding 1963; each ``(n / m) h_i`` lies in ``[-n/m, n/m]``).

**The confidence sequence** (:class:`ExcessBound`). Over the answers in the order they arrive,
``Z_j = X_j - Y_j`` (``X_j`` the part of its batch's excess the answer estimates) has mean 0 given
everything before (A3). For a predictable centre ``d_j`` (the answers so far predict it, clipped
to ``[-r_j, r_j]``, ``r_j`` the part's range) and ``c_j = b_j + |d_j|`` (``b_j`` the answer's
bound), ``xi_j = (d_j - Y_j) / c_j >= -1``, and for ``lam`` in ``[0, 1)`` Fan, Grama & Liu's
``exp(lam xi - psi(lam) xi^2) <= 1 + lam xi`` (``psi(lam) = -log(1 - lam) - lam``;
``tests/monitor/test_promise.py`` checks it on a grid) gives, with ``lam = eta c_j``,

    E[ exp(eta c_j xi_j - psi(eta c_j) xi_j^2) | past ]  <=  1 + eta (d_j - X_j)
                                                          <=  exp(eta (d_j - X_j)),

that is ``E[exp(eta Z_j - psi(eta c_j) xi_j^2) | past] <= 1`` (``c_j xi_j - (d_j - X_j) = Z_j``),

and Hoeffding's lemma gives ``E[exp(eta Z_j - eta^2 b_j^2 / 2) | past] <= 1`` for any ``eta >=
0`` (the subset's part adds ``eta^2 n^2 / (2 m)``). Each bet ``eta_k`` of :data:`BETS` takes, per
answer, the first where ``eta_k c_j <= LAMBDA_CAP`` and the second elsewhere (a choice made before
the answer), so ``M_k = exp(eta_k sum_j Z_j - P_k)`` (``P_k`` the summed penalties) is a
nonnegative supermartingale, and so is ``M = sum_k w_k M_k``. By Ville's inequality ``M`` ever
reaches ``1 / level`` with probability at most ``level``; on the complement, at every moment,
``sum_j X_j < sum_j Y_j + rho`` with ``rho`` the root of ``sum_k w_k exp(eta_k rho - P_k) = 1 /
level`` (the left side increases in ``rho``).

**The ledger** (:class:`Promise`). A served batch is charged ``D_t`` (``n - m + |S_t cap M|``
where the given model saw ``m`` of ``n``) when it is served, one ``k``-th per draw; a draw's
answer takes its share back out and adds its observation to the confidence sequence; a share
whose answer never comes stays. So at every moment

    L = (sum of the answered Y + rho) + (the shares still charged)  >=  C_T

on the event above. The certified bound ``R_T`` (:attr:`Promise.reserve`) is ``R_T = min(R_{T-1}
+ D_T, L)`` after each batch and ``min(R_T, L)`` after each answer: ``C_T <= R_T`` by induction
(``C_T = C_{T-1} + X_T <= R_{T-1} + D_T``). Batch ``T`` is served, when its predictions are known
and before any of its answers (:func:`decide`), by the adapted model if its ``D^a_T`` fits the
batch's stake, else by the adapted model on as many of those samples as fit (the two models'
mean probabilities lean to them most; the given model elsewhere), else by the given model; the
stake (:meth:`Promise.stake`) is a share of the room ``tolerance / 100 * N_T - R_{T-1}``, so
``R_{T-1} + D^s_T <= tolerance / 100 * N_T`` whatever serves, and the given model always fits
(``D = 0``, and ``R_{T-1} <= tolerance / 100 * N_{T-1}``). Hence ``C_T <= R_T <= tolerance /
100 * N_T`` for every ``T`` on an event of probability at least ``1 - level``: the promise.
``100 R_T / N_T`` is the certified bound in points (:attr:`Promise.bound`). The stake only
decides how fast the room is spent (any share keeps the promise): half of it (:data:`STAKE`)
for a batch an answer will measure, a tenth (:data:`UNMEASURED`) for one served without a step.

Requests smaller than a window are served, and charged, between its steps; the window's step
draws among the requests served since its last draw, with what served each, so its answer is
the same estimate over the window's samples (those measured before, or served as the given
model served them, count 0) and takes their charges out. The adapted model serves alone (the
given model predicting on a subset only: the cheap step) only where a batch's worst case, all
its ``n`` samples, fits its stake.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from eatta.monitor.confseq import check_level

__all__ = [
    "BETS",
    "LAMBDA_CAP",
    "STAKE",
    "UNMEASURED",
    "Cover",
    "ExcessBound",
    "Plan",
    "Promise",
    "decide",
    "excess",
    "psi_e",
]

#: The bets ``eta`` (per sample of excess) the confidence sequence mixes, and their weights: a
#: geometric grid from 1 to ``2^-14`` (the range of one answer runs from one sample to a few
#: hundred), equal weights. Chosen on simulated streams only (benchmarks/promise_simulation.py:
#: weights falling toward the small bets, or toward the large ones, a finer grid and other caps
#: were within the seeds' spread or worse), on no real stream.
BETS: tuple[tuple[float, float], ...] = tuple((2.0**-j, 1.0 / 15) for j in range(15))
#: The largest ``eta c`` an answer's empirical-Bernstein penalty is used at (Hoeffding's beyond).
LAMBDA_CAP = 0.8
#: The share of the room one batch may take (at least one sample while the room has one): a
#: batch that takes it all is lost on one unfavourable answer, and the room then grows back from
#: a sample at a time (betting all one's wealth each round). Chosen on simulated streams only
#: (benchmarks/promise_simulation.py: 0.25 to 0.5 kept the most, 1 the least).
STAKE = 0.5
#: The share a batch no answer will measure may take (served without a step: it only spends the
#: room). Chosen on simulated streams only (benchmarks/promise_simulation.py, "1 step in 3").
UNMEASURED = 0.1


def psi_e(lam: float) -> float:
    """``-log(1 - lam) - lam``, for ``lam`` in ``[0, 1)``."""
    return -math.log1p(-lam) - lam


def excess(label: int | None, correct: bool | None, served: int, given: int, adapted: int) -> int:
    """``h = 1[y != served] - 1[y != given]`` for one answer: a class ``label``, or yes/no
    (``correct``) on the ``adapted`` prediction, scored at the worst a label consistent with it
    allows (A2)."""
    if served == given:
        return 0
    if label is not None:
        return int(label != served) - int(label != given)
    if correct:
        return int(adapted != served) - int(adapted != given)
    # "no": any class but the adapted one; the worst is the given one where it can be (h = 1),
    # else a class neither predicts (h = 0)
    return 1 if given != adapted else 0


class ExcessBound:
    """An anytime-valid upper confidence sequence on the sum of the answered parts' excess
    (module docstring), at ``level``."""

    def __init__(self, level: float) -> None:
        self.level = check_level(level, "level")
        self.clear()

    def clear(self) -> None:
        self.answers = 0
        self.total = 0.0  # sum of Y
        self.lean = 0.0  # sum of Y / b (the centre's)
        self.penalty = [0.0] * len(BETS)
        self._radius = 0.0

    def centre(self, bound: float, reach: float) -> float:
        """The predictable centre of the next answer: the mean of ``Y / b`` so far (one prior
        answer of 0) times ``bound``, clipped to ``[-reach, reach]``."""
        return max(-reach, min(reach, bound * self.lean / (self.answers + 1)))

    def add(self, value: float, bound: float, reach: float, spread: float = 0.0) -> None:
        """One answer: ``value`` (``Y``), its range ``[-bound, bound]``, the range ``[-reach,
        reach]`` of what it estimates, ``spread`` a variance factor of its own (a subset's)."""
        if not (bound > 0.0 and math.isfinite(bound) and reach >= 0.0 and spread >= 0.0):
            raise ValueError(f"an answer's ranges must be finite, bound > 0: {bound!r}, {reach!r}")
        if abs(value) > bound * (1.0 + 1e-9):
            raise ValueError(f"an answer's estimate {value!r} is outside [-{bound}, {bound}]")
        d = self.centre(bound, reach)
        c = bound + abs(d)
        xi2 = ((d - value) / c) ** 2
        for k, (eta, _) in enumerate(BETS):
            lam = eta * c
            pen = psi_e(lam) * xi2 if lam <= LAMBDA_CAP else 0.5 * eta * eta * bound * bound
            self.penalty[k] += pen + 0.5 * eta * eta * spread
        self.answers += 1
        self.total += value
        self.lean += max(-1.0, min(1.0, value / bound))
        self._radius = self.root()

    def root(self) -> float:
        """``rho >= 0`` with ``sum_k w_k exp(eta_k rho - P_k) = 1 / level``."""
        target = 1.0 / self.level
        terms = [(eta, w, p) for (eta, w), p in zip(BETS, self.penalty, strict=True)]

        def mix(r: float) -> float:
            return sum(w * math.exp(min(700.0, eta * r - p)) for eta, w, p in terms)

        hi = min((math.log(target / w) + p) / eta for eta, w, p in terms)
        lo = 0.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if mix(mid) < target:
                lo = mid
            else:
                hi = mid
        return hi

    @property
    def upper(self) -> float:
        """The bound on the answered parts' summed excess (0 before any answer: nothing)."""
        return self.total + self._radius if self.answers else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "answers": self.answers,
            "total": self.total,
            "lean": self.lean,
            "penalty": list(self.penalty),
            "radius": self._radius,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["penalty"]) != len(BETS):
            raise ValueError("this promise's state was saved with other bets")
        self.answers, self.total = int(state["answers"]), float(state["total"])
        self.lean, self._radius = float(state["lean"]), float(state["radius"])
        self.penalty = [float(p) for p in state["penalty"]]


class Promise:
    """The confidence sequence and the ledger of the module docstring.

    Args:
        tolerance: points of error the served predictions may exceed the given model's by, >= 0.
        level: the chance the promise may fail, in (0, 1).
    """

    def __init__(self, tolerance: float, level: float) -> None:
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float):
            raise TypeError(f"tolerance must be a number of points >= 0, got {tolerance!r}")
        if not 0.0 <= float(tolerance) < math.inf:
            raise ValueError(f"tolerance must be a finite number of points >= 0, got {tolerance!r}")
        self.tolerance = float(tolerance)
        self.level = check_level(level, "level")
        self.sequence = ExcessBound(self.level)
        self.clear()

    def clear(self) -> None:
        self.sequence.clear()
        self.samples = 0  # N_T
        self.reserve = 0.0  # R_T: the certified bound on C_T, in samples
        self.charged = 0.0  # the shares whose answers have not come (or never will)
        self._bounds = array("d")  # the bound in points after each served batch

    # -- reading -------------------------------------------------------------------------------
    def allowance(self, more: int = 0) -> float:
        """``tolerance / 100 * N``, ``N`` the samples served so far plus ``more``."""
        return self.tolerance / 100.0 * (self.samples + more)

    def room(self, n: int) -> float:
        """How many samples where what serves differs from the given model a batch of ``n`` may
        have now (the promise's own limit)."""
        return self.allowance(n) - self.reserve

    def stake(self, n: int, *, measured: bool = True) -> float:
        """How many a batch of ``n`` is given: :data:`STAKE` of the room, at least one sample
        while the room has one (a batch an answer will measure), or :data:`UNMEASURED` of it (one
        no answer will)."""
        room = self.room(n)
        if not measured:
            return max(UNMEASURED * room, 0.0)
        return max(STAKE * room, min(room, 1.0))

    @property
    def bound(self) -> float:
        """The certified bound: the most the served error can exceed the given model's so far,
        in points, at the stated level (0 before any batch)."""
        return 100.0 * self.reserve / self.samples if self.samples else 0.0

    @property
    def ledger(self) -> float:
        """``L``: the answered excess's bound plus the shares still charged, in samples."""
        return self.sequence.upper + self.charged

    def adapted_alone(self, n: int, *, measured: bool = True) -> bool:
        """Whether a batch of ``n`` fits its stake whatever its disagreements (the adapted model
        may then serve it with the given model predicting on a subset only)."""
        return n <= self.stake(n, measured=measured)

    # -- serving and answers -------------------------------------------------------------------
    def serve(self, n: int, charge: float, *, force: bool = False) -> None:
        """A batch of ``n`` served, differing from the given model on at most ``charge``
        samples (its worst case, charged until its answers come); ``force``: whether or not it
        fits (what would be certified, measured only)."""
        if not force and charge > 0 and charge > self.room(n) + 1e-9:
            raise AssertionError(f"a charge of {charge} does not fit the room {self.room(n)}")
        self.samples += n
        self.reserve += charge
        self.charged += charge
        self._bounds.append(self.bound)

    def refine(self, released: float) -> None:
        """A charge lowered to what was found exactly (``released`` samples the given model,
        predicting on them later, agrees with what served)."""
        self.charged -= released
        self.reserve = min(self.reserve, self.ledger)

    def answer(
        self, share: float, value: float, bound: float, reach: float, spread: float = 0.0
    ) -> None:
        """A draw's answer: its ``share`` of its batch's charge comes out, its observation
        (:meth:`ExcessBound.add`) goes in."""
        self.sequence.add(value, bound, reach, spread)
        self.charged -= share
        self.reserve = min(self.reserve, self.ledger)

    def bounds(self) -> list[float]:
        """The certified bound in points after each served batch (``100 R_T / N_T``)."""
        return list(self._bounds)

    def stats(self) -> dict[str, Any]:
        """The promise and where it stands: tolerance, level, the certified bound (points),
        samples served, answers read, the answered excess's bound and the samples still charged
        (the worst case of the batches without their answers)."""
        return {
            "tolerance": self.tolerance,
            "level": self.level,
            "bound": self.bound,
            "samples": self.samples,
            "answers": self.sequence.answers,
            "answered_bound": self.sequence.upper,
            "charged": self.charged,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "sequence": self.sequence.state_dict(),
            "samples": self.samples,
            "reserve": self.reserve,
            "charged": self.charged,
            "bounds": self._bounds.tobytes(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sequence.load_state_dict(state["sequence"])
        self.samples, self.reserve = int(state["samples"]), float(state["reserve"])
        self.charged = float(state["charged"])
        bounds = array("d")
        bounds.frombytes(bytes(state["bounds"]))
        self._bounds = bounds


# -- what serves a batch, and what its draw measures ----------------------------------------------


@dataclass
class Plan:
    """What serves a request under the promise, chosen before its draw: ``what`` (``"adapted"``,
    ``"part"``: the adapted model on ``charge`` of its disagreements and the given model
    elsewhere, or ``"source"``), the served predictions ``served`` (one per sample),
    the served logits ``out``, and ``charge``, its worst case (samples that may differ from the
    given model: all ``n`` where the given model did not predict)."""

    what: str
    served: Tensor
    out: Tensor
    charge: float
    n: int


@dataclass
class Cover:
    """What a step's draw measures: the served predictions over the step's samples
    (``served``; the given model's where nothing it measures served), the samples where they
    differ from the given model (``focus``, None where none), the charge its answers release
    (``charge``), a subset's scale ``n / m`` and spread ``n^2 / m`` (1 and 0 for the whole
    batch), ``reach`` (how far the measured excess can go, in samples) and ``single`` (the
    estimate holds for a draw of one request only: a subset's)."""

    served: Tensor
    focus: Tensor | None
    charge: float
    reach: float
    scale: float = 1.0
    spread: float = 0.0
    single: bool = False
    refund: float = 0.0  # a window's: charge released where the given model now agrees


def _blend(adapted: Tensor, given: Tensor) -> Tensor:
    p = 0.5 * (adapted.detach().float().softmax(1) + given.detach().float().softmax(1))
    return p.log()


def decide(
    promise: Promise,
    adapted: Tensor,
    given: Tensor | None,
    given_pred: Tensor,
    *,
    force: bool = False,
    measured: bool = True,
) -> Plan:
    """The adapted model if its disagreements with the given model fit the promise's stake for
    a batch of ``adapted``'s samples (:meth:`Promise.stake`), else the adapted model on as many
    of them as fit (those the two models' mean probabilities lean to most), else the given
    model; nothing is charged yet (:meth:`Promise.serve`). ``given``: the given model's logits
    on the whole batch (None: it predicted on some samples only, ``given_pred`` -1 elsewhere:
    only the adapted model can serve, at its worst case); ``force``: the adapted model, whatever
    the stake; ``measured``: whether an answer will measure the batch (else a smaller stake)."""
    n = adapted.shape[0]
    a = adapted.detach().argmax(1)
    if given is None:
        seen = given_pred >= 0
        lo, m = torch.stack([((a != given_pred) & seen).sum(), seen.sum()]).tolist()
        return Plan("adapted", a, adapted.detach(), float(lo + n - m), n)
    differ = a != given_pred
    count = int(differ.sum())
    stake = promise.stake(n, measured=measured)
    if force or count <= stake:
        return Plan("adapted", a, adapted.detach(), float(count), n)
    take = math.floor(stake + 1e-9)
    if take < 1:
        return Plan("source", given_pred, given.to(adapted.dtype), 0.0, n)
    # the mean probabilities' lean to the adapted class over the given one, where they differ
    mixed = _blend(adapted, given)
    lean = mixed.gather(1, a[:, None])[:, 0] - mixed.gather(1, given_pred[:, None])[:, 0]
    lean = lean.masked_fill(~differ, -math.inf)
    rows = torch.zeros_like(differ)
    rows[lean.topk(take).indices] = True
    served = torch.where(rows, a, given_pred)
    out = torch.where(rows[:, None], adapted.detach(), given.to(adapted.dtype))
    return Plan("part", served, out, float(take), n)
