r"""The promise ``eatta-safe`` keeps: never worse than the given model by more than ``tolerance``
points, at every batch, with probability at least ``1 - level``.

**The promise.** Batches ``t = 1, 2, ...`` of ``n_t`` samples are each served by one predictor
``s_t``: the model as given ``g``, the adapted model ``a`` or their blend ``b``
(:mod:`eatta.monitor.serving`). With ``N_T = sum_{t<=T} n_t`` and the served excess

    C_T = sum_{t<=T} sum_{i in batch t} (1[s_t(x_i) != y_i] - 1[g(x_i) != y_i])

(errors of what served, less the given model's, on the same samples), the rule below keeps

    P( for every T:  C_T <= tolerance / 100 * N_T )  >=  1 - level.

**What it assumes.**

- *(A1) Known draws.* Each answer is to a request drawn from a pool (the step's batch, or the
  uniform subset the given model predicted on) with a known inclusion probability ``q_i``
  (:mod:`eatta.selection.drawn`), every sample of the pool on which the two models disagree
  having ``q_i >= (1 - explore) / D`` (``D`` those disagreements); so ``explore < 1``.
- *(A2) The annotator answers what was asked.* The promise is about the answers' labels: a noisy
  annotator's wrong labels count as the truth. A yes/no answer on the adapted prediction is
  scored at its worst for the adapted model and the blend (a "no" where the two models differ
  counts the given model right), which only lowers what the answers certify; an abstention or a
  skipped request counts as no answer.
- *(A3) Arrivals tell nothing.* Whether and when an answer arrives, late or never, does not
  depend on its label or on which sample was drawn, and nothing the method does before the answer
  arrives depends on which sample was drawn (``eatta-safe`` keeps a pending sample unused).
- *(A4) The answered represent the served.* A batch served by ``a`` (or ``b``) without an answer
  of its own is charged the harm rate its disagreements have on average on the answered draws:
  the harm per disagreement of the batches ``a`` (``b``) served is, summed, no larger than the
  answered draws' mean rate times their disagreements. With answers at once every served batch
  is answered; late answers, a person's pace and requests smaller than the step's pool lean on it
  (the safety study's misleading streams test it: docs/safety.md).

Nothing label-free decides: the disagreement counts below bound what a batch can cost, they never
say which model is right.

**The harm rates.** For a draw of sample ``I`` from a pool with ``D >= 1`` disagreements, and a
predictor ``P`` in ``{a, b}``, ``h_P = 1[y != P(x_I)] - 1[y != g(x_I)]`` (0 wherever ``P`` and
``g`` agree, and ``b`` agrees with ``g`` wherever ``a`` does) and

    r_P = h_P / (q_I D)   in   [-1 / (1 - explore), 1 / (1 - explore)]          (A1)

has conditional mean ``rho_P = X_P / D``, the pool's harm per disagreement (``X_P``: the excess
of ``P`` over ``g`` on the pool). Scaled to ``Y = -r_P / c``, ``c = 2 / (1 - explore)``, each
``Y`` lies in ``[-1/2, 1/2]`` with conditional mean ``mu = -rho_P / c`` (or below it, for a yes/no
answer). For ``lam`` in ``[0, 1)`` and ``xi >= -1``, ``exp(lam xi - psi(lam) xi^2) <= 1 + lam xi``
with ``psi(lam) = -log(1 - lam) - lam`` (Fan, Grama & Liu 2015; ``tests/monitor/test_promise.py``
checks it on a grid). With ``xi = Y - d``, ``d`` the mean of the earlier ``Y`` (predictable, in
``[-1/2, 1/2]``), taking expectations and multiplying by ``exp(-lam (mu - d))``:

    E[ exp(lam (Y - mu) - psi(lam) (Y - d)^2) | past ]  <=  1.

and, ``Y`` lying in an interval of length 1, ``E[exp(lam (Y - mu)) | past] <= exp(lam^2 / 8)``
for any ``lam >= 0`` (Hoeffding's lemma). So for each bet ``k`` of the fixed list :data:`BETS`
the product over the answers, ``M_k = prod exp(lam_k (Y_j - mu_j) - pen_kj)`` with ``pen_kj =
psi(lam_k) (Y_j - d_j)^2`` or ``lam_k^2 / 8``, is a nonnegative supermartingale in the order the
answers arrive (A3), and so is ``M = sum_k w_k M_k`` (weights summing to 1); by Ville's
inequality ``M`` ever reaches ``2 / level`` with probability at most ``level / 2``. On the
complement, for every number ``m`` of answers, with ``S = sum r_j``, ``V = sum (Y_j - d_j)^2`` and
``pen_k = psi(lam_k) V`` or ``m lam_k^2 / 8``, the sum ``R = sum rho_j`` satisfies
(``Y - mu = (rho - r) / c``)

    sum_k w_k exp(lam_k (R - S) / c - pen_k)  <  2 / level,

whose left side increases with ``R``: ``R < S + t`` with ``t`` its root, and the mean harm rate of
the answered draws is at most ``U_P = min(1, (S + t) / m)`` (1 before any answer). This holds for
every ``m`` at once, so it may be read after every answer, however late (:class:`RateBound`).
The adapted model and the blend have one bound each, at ``level / 2`` each: both hold together
with probability at least ``1 - level``.

**The ledger.** Each served batch ``t`` has ``D_t``, the disagreements of ``a`` with ``g`` on it
(counted where ``g`` predicted; where it predicted on a subset only, between ``lo_t`` and
``hi_t = lo_t + n_t - m_t``), and costs at most ``w_t``, the samples where what served differs
from ``g`` (``0`` for ``g``, the count for ``b``, ``hi_t`` for ``a``). Two bounds of ``C_T``:

    rate:    B_T = sum_{P in (a, b)} U_P * (sum of hi_t over P's batches  if U_P >= 0,
                                              sum of lo_t over P's batches  if U_P < 0)   (A4)
    ledger:  L_T = min(B_T, L_{T-1} + w_T),      L_0 = 0.

On the event where both rate bounds hold, ``C_T <= L_T`` for every ``T``, by induction:
``C_T <= B_T`` (A4), and ``C_T = C_{T-1} + X_T <= L_{T-1} + w_T``. The rule serves batch ``T``
by the first of ``a``, ``b``, ``g`` whose ``L_T`` stays at most ``tolerance / 100 * N_T``, the
rates read *before* batch ``T``'s own answers (so what serves a batch never depends on its
answer); ``g`` always fits, since it adds nothing (``L_T <= L_{T-1} <= tolerance / 100 *
N_{T-1}``). Hence ``C_T <= L_T <= tolerance / 100 * N_T`` for every ``T`` on an event of
probability at least ``1 - level``: the promise. The allowance is spent as soon as this allows,
batch by batch: before any answer, a blend that differs from ``g`` on a few samples fits in what
the batches served by ``g`` have put aside. ``L_T`` is the certified bound
(:attr:`Promise.bound`, in points: ``100 L_T / N_T``).

The adapted model serves alone (the given model then predicts on a subset only: the cheap step)
only when ``U_a <= 0`` and ``B`` fits: its batches then add at most ``U_a lo_t <= 0``.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from eatta.monitor.confseq import check_level

__all__ = ["BETS", "Promise", "RateBound", "harms", "psi_e", "rate_root"]

#: The bets the rate bounds mix: ``(kind, lam, weight)``, ``"eb"`` the empirical-Bernstein factor
#: ``exp(lam (Y - mu) - psi(lam) (Y - d)^2)`` (``lam < 1``), ``"h"`` Hoeffding's ``exp(lam (Y -
#: mu) - lam^2 / 8)`` (any ``lam``: the fastest on a few answers that all agree). Chosen on
#: simulated answers only (``tests/monitor/test_promise.py``), on no stream.
BETS: tuple[tuple[str, float, float], ...] = (
    ("h", 2.0, 0.2),
    ("eb", 0.9, 0.25),
    ("eb", 0.6, 0.15),
    ("eb", 0.35, 0.15),
    ("eb", 0.2, 0.15),
    ("eb", 0.1, 0.1),
)


def psi_e(lam: float) -> float:
    """``-log(1 - lam) - lam``, for ``lam`` in ``[0, 1)``."""
    return -math.log1p(-lam) - lam


def rate_root(spread: float, draws: int, c: float, level: float) -> float:
    """``t >= 0`` with ``sum_k w_k exp(lam_k t / c - pen_k) = 1 / level`` over :data:`BETS`
    (``pen``: ``psi(lam) spread``, or ``draws lam^2 / 8``; the module docstring's root)."""
    target = 1.0 / level
    terms = [
        (lam, w, psi_e(lam) * spread if kind == "eb" else draws * lam * lam / 8.0)
        for kind, lam, w in BETS
    ]

    def mix(t: float) -> float:
        return sum(w * math.exp(min(700.0, lam * t / c - pen)) for lam, w, pen in terms)

    # each term alone reaching the target gives an upper end of the bracket
    hi = min((math.log(target / w) + pen) * c / lam for lam, w, pen in terms)
    lo = 0.0
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        if mix(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


class RateBound:
    """An anytime-valid upper bound on the mean harm rate of the answered draws (module
    docstring), at ``level``; ``explore`` sets the range of one observation."""

    def __init__(self, level: float, explore: float) -> None:
        self.level = check_level(level, "the rate bound's level")
        if not 0.0 < explore < 1.0:
            raise ValueError(
                f"the promise needs explore < 1 (each disagreement drawn with probability at "
                f"least (1 - explore) / D), got {explore!r}"
            )
        self.c = 2.0 / (1.0 - explore)
        self.clear()

    def clear(self) -> None:
        self.draws = 0
        self.total = 0.0  # sum of r
        self.spread = 0.0  # sum of (Y - d)^2
        self.centre_sum = 0.0  # sum of Y (d: their mean, one prior 0)
        self._upper = 1.0

    def add(self, rate: float, count: int = 1) -> None:
        """``count`` draws of one sample, each observing ``rate`` (an ``r`` of the docstring)."""
        limit = self.c / 2.0
        if not abs(rate) <= limit * (1.0 + 1e-9):
            raise ValueError(f"a harm rate observation {rate!r} is outside [-{limit}, {limit}]")
        y = max(-0.5, min(0.5, -rate / self.c))
        for _ in range(count):
            d = max(-0.5, min(0.5, self.centre_sum / (self.draws + 1)))
            self.spread += (y - d) ** 2
            self.centre_sum += y
            self.total += rate
            self.draws += 1
        t = rate_root(self.spread, self.draws, self.c, self.level)
        self._upper = max(-1.0, min(1.0, (self.total + t) / self.draws))

    @property
    def upper(self) -> float:
        """The bound ``U`` on the mean harm per disagreement (1 before any answer)."""
        return self._upper

    def state_dict(self) -> dict[str, Any]:
        return {
            "draws": self.draws,
            "total": self.total,
            "spread": self.spread,
            "centre_sum": self.centre_sum,
            "upper": self._upper,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.draws = int(state["draws"])
        self.total, self.spread = float(state["total"]), float(state["spread"])
        self.centre_sum, self._upper = float(state["centre_sum"]), float(state["upper"])


def harms(
    label: int | None, correct: bool | None, adapted: int, given: int, blend: int
) -> tuple[int, int]:
    """``(h_a, h_b)`` of one answer: a class ``label``, or yes/no (``correct``) on the adapted
    prediction, scored at the worst a label consistent with it allows (module docstring, A2)."""
    if label is not None:
        candidates = [label]
    elif correct:
        candidates = [adapted]
    else:  # any class but the adapted one: the given one, the blend's, or another (h = 0)
        candidates = [c for c in (given, blend) if c != adapted] or [-1]

    def worst(pred: int) -> int:
        return max(int(y != pred) - int(y != given) if y >= 0 else 0 for y in candidates)

    return worst(adapted), worst(blend)


class Promise:
    """The rate bounds and the ledger of the module docstring.

    Args:
        tolerance: points of error the served predictions may exceed the given model's by, >= 0.
        level: the chance the promise may fail, in (0, 1).
        explore: the draw's share off the disagreements (:class:`RateBound`).
    """

    def __init__(self, tolerance: float, level: float, explore: float) -> None:
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float):
            raise TypeError(f"tolerance must be a number of points >= 0, got {tolerance!r}")
        if not 0.0 <= float(tolerance) < math.inf:
            raise ValueError(f"tolerance must be a finite number of points >= 0, got {tolerance!r}")
        self.tolerance = float(tolerance)
        self.level = check_level(level, "level")
        self.adapted = RateBound(self.level / 2.0, explore)
        self.blend = RateBound(self.level / 2.0, explore)
        self.clear()

    def clear(self) -> None:
        self.adapted.clear()
        self.blend.clear()
        self.samples = 0  # N_T
        self.ledger = 0.0  # L_T
        # disagreement sums of the batches each predictor served: a's lo and hi, b's
        self.adapted_lo = self.adapted_hi = self.blend_d = 0
        self._bounds = array("d")  # the bound in points after each served batch

    # -- reading -------------------------------------------------------------------------------
    def allowance(self, more: int = 0) -> float:
        """``tolerance / 100 * N``, ``N`` the samples served so far plus ``more``."""
        return self.tolerance / 100.0 * (self.samples + more)

    def rate_bound(self, adapted: tuple[int, int] = (0, 0), blend: int = 0) -> float:
        """``B`` with one more batch's disagreements counted: ``adapted`` (lo, hi) for ``a``,
        ``blend`` for ``b``."""
        ua, ub = self.adapted.upper, self.blend.upper
        lo, hi = self.adapted_lo + adapted[0], self.adapted_hi + adapted[1]
        return ua * (hi if ua >= 0 else lo) + ub * (self.blend_d + blend)

    @property
    def bound(self) -> float:
        """The certified bound: the most the served error can exceed the given model's so far,
        in points, at the stated level (0 before any batch)."""
        return 100.0 * self.ledger / self.samples if self.samples else 0.0

    def adapted_alone(self, n: int) -> bool:
        """Whether the adapted model will serve a batch of ``n`` whatever its disagreements (the
        given model may then predict on a subset only)."""
        return self.adapted.upper <= 0.0 and self.rate_bound() <= self.allowance(n)

    # -- serving -------------------------------------------------------------------------------
    def choose(
        self,
        n: int,
        adapted: tuple[int, int],
        blend: int | None,
        *,
        force: str | None = None,
    ) -> str:
        """What serves a batch of ``n``: ``"adapted"``, ``"blend"`` or ``"source"`` (``force``:
        that one, whatever the bound), counted in the ledger. ``adapted``: ``(lo, hi)``, the
        adapted model's disagreements with the given one on the batch; ``blend``: the blend's
        (None where the given model did not predict on the whole batch)."""
        room = self.allowance(n)
        lo, hi = adapted
        options = [
            ("adapted", min(self.rate_bound((lo, hi)), self.ledger + hi)),
            ("source", min(self.rate_bound(), self.ledger)),
        ]
        if blend is not None:
            d = lo  # the given model predicted on the whole batch: lo == hi
            options.insert(1, ("blend", min(self.rate_bound(blend=d), self.ledger + blend)))
        if force is not None:
            what, bound = next(o for o in options if o[0] == force)
        else:
            what, bound = next((o for o in options if o[1] <= room), options[-1])
        if what == "adapted":
            self.adapted_lo += lo
            self.adapted_hi += hi
        elif what == "blend":
            self.blend_d += lo
        self.samples += n
        self.ledger = bound
        self._bounds.append(self.bound)
        return what

    def observe(self, h_adapted: int, h_blend: int, q_d: float, count: int = 1) -> None:
        """One answer (``count`` draws of its sample): its harms and ``q D`` (the inclusion
        probability per draw times the pool's disagreements)."""
        if not q_d > 0.0:
            return  # no disagreement in the pool: nothing to learn of either rate
        self.adapted.add(h_adapted / q_d, count)
        self.blend.add(h_blend / q_d, count)

    def bounds(self) -> list[float]:
        """The certified bound in points after each served batch (``100 L_T / N_T``)."""
        return list(self._bounds)

    def stats(self) -> dict[str, Any]:
        """The promise and where it stands: tolerance, level, the certified bound (points),
        samples served, answers read and the two rate bounds."""
        return {
            "tolerance": self.tolerance,
            "level": self.level,
            "bound": self.bound,
            "samples": self.samples,
            "answers": self.adapted.draws,
            "rate_adapted": self.adapted.upper,
            "rate_blend": self.blend.upper,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "adapted": self.adapted.state_dict(),
            "blend": self.blend.state_dict(),
            "samples": self.samples,
            "ledger": self.ledger,
            "sums": [self.adapted_lo, self.adapted_hi, self.blend_d],
            "bounds": self._bounds.tobytes(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.adapted.load_state_dict(state["adapted"])
        self.blend.load_state_dict(state["blend"])
        self.samples, self.ledger = int(state["samples"]), float(state["ledger"])
        self.adapted_lo, self.adapted_hi, self.blend_d = (int(v) for v in state["sums"])
        bounds = array("d")
        bounds.frombytes(bytes(state["bounds"]))
        self._bounds = bounds
