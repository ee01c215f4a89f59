"""Label requests drawn at random with known inclusion probabilities, so the answers also measure.

A deterministic top-k selector asks only about the samples it ranks first: every other sample has
probability 0 of being asked, and no weighting can turn those answers into an unbiased estimate
of the model's accuracy. :class:`DisagreementDraw` instead draws the ``k`` requests of a batch of
``n`` samples independently (with replacement) from

    q_i = explore * s_i / sum(s) + (1 - explore) * [i in D] / |D|

where ``s`` is the wrapped selector's score (the perturbation difference by default) mixed with a
little uniform mass so that every sample can be asked, and ``D`` the samples on which the adapted
model and the reference model (the model as the user gave it, whose predictions the method's
fallback puts in the selection context, ``ctx.reference``) predict different classes. With
``D`` empty, or no reference, the whole draw follows the scores. A ``focus`` (given by the
fallback that keeps a promise, :func:`eatta.monitor.safe_parts`) replaces ``D`` by the samples it
names: where what serves the batch differs from the given model, so that the
answer measures what served.

The reference may have predicted on only some of the batch, a uniformly drawn subset ``S`` of
``m`` samples (``ctx.candidates``; its forward pass then costs ``m / n`` of a full one): the
draw is then made within ``S`` with ``n`` replaced by ``m``, and ``d_I / (m q_I)`` estimates the
mean over ``S`` without bias, hence, ``S`` being uniform, the batch's mean.

Why the disagreements: the paired difference acc(adapted) - acc(reference) is non-zero only on
``D``, so drawing there is what makes one answer a batch enough to compare the two models
(Sawade et al., "Active comparison of prediction models", NeurIPS 2012), and a sample the two
models disagree on is also one of the adapted model's most contested predictions, worth learning
from. Each answer ``y`` to a request for sample ``i`` then gives the unbiased per-batch estimate
``(1[y = a_i] - 1[y = r_i]) / (n q_i)`` of the batch's mean paired difference (Horvitz-Thompson
with one draw; ``k`` draws average ``k`` of them), bounded in absolute value by
``1 / (1 - explore)`` on ``D`` and 0 elsewhere. The selection carries the :class:`Draw` (``q`` of
the drawn samples and how often each was drawn: ``selection.update["draw"]``) for the estimator
(:mod:`eatta.monitor.fallback`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from eatta.balance import ClassBalance, NoClassBalance, Selection
from eatta.selection.base import ScoreSelector, SelectionContext
from eatta.selection.perturbation import PerturbationSelector

__all__ = ["DisagreementDraw", "Draw", "answer_bound", "check_explore"]

#: Uniform mass mixed into the score part so that no sample has inclusion probability 0.
_FLOOR = 0.05


def check_explore(explore: object) -> float:
    """``explore`` as a float in (0, 1], or an error naming it (0 would give samples outside
    the disagreements inclusion probability 0 when there are disagreements)."""
    if isinstance(explore, bool) or not isinstance(explore, int | float) or math.isnan(explore):
        raise TypeError(f"explore must be a number in (0, 1], got {explore!r}")
    if not 0.0 < float(explore) <= 1.0:
        raise ValueError(
            f"explore must be in (0, 1]: the share of the draw that follows the selector's "
            f"scores (0 would give some samples inclusion probability 0), got {explore!r}"
        )
    return float(explore)


@dataclass(frozen=True)
class Draw:
    """One batch's draw: the asked positions (sorted), their inclusion probability per draw
    ``q``, how often each was drawn, the number of draws ``k``, the number ``n`` of samples drawn
    from (the batch, or the candidates) and how many of them the two models disagreed on."""

    indices: Tensor
    q: Tensor
    counts: Tensor
    k: int
    n: int
    disagreements: int
    #: the largest ``|d_i| / (n q_i)`` any sample of the draw could give (:func:`answer_bound`),
    #: known before the draw
    bound: float = 1.0


def answer_bound(q: Tensor, disagree: Tensor | None) -> float:
    """The range ``[-b, b]`` of one answer's estimate ``d_i / (n q_i)``, known before the draw:
    ``b = 1 / (n min q)`` over the disagreements (``d_i = 0`` elsewhere), over all samples when
    there is none (the estimate is then 0; ``b`` only sizes a bet)."""
    n = q.shape[0]
    if n == 0:
        return 1.0
    pool = q if disagree is None or not bool(disagree.any()) else q[disagree.to(q.device)]
    return float(1.0 / (n * float(pool.min())))


def inclusion_probabilities(scores: Tensor, disagree: Tensor | None, explore: float) -> Tensor:
    """``q`` over the batch (sums to 1, every entry > 0): ``explore`` on the floored, normalized
    scores, the rest uniform over the disagreements (``disagree``, a bool mask; all on the
    scores when it is None or empty)."""
    n = scores.shape[0]
    s = scores.detach().double().clamp_min(0.0)
    total = float(s.sum())
    if total > 0.0 and math.isfinite(total):
        base = (1.0 - _FLOOR) * s / total + _FLOOR / n
    else:
        base = torch.full((n,), 1.0 / n, dtype=torch.float64, device=s.device)
    if disagree is None or not bool(disagree.any()):
        return base
    d = disagree.to(device=s.device, dtype=torch.float64)
    return explore * base + (1.0 - explore) * d / d.sum()


class DisagreementDraw:
    """Selector that draws requests from :func:`inclusion_probabilities` (module docstring).

    ``draws = True``: its answers are drawn with known probabilities, so a fallback may score
    them (:class:`~eatta.monitor.SourceFallback`).

    Args:
        base: the selector whose per-sample score guides the draw off the disagreements (a
            :class:`~eatta.selection.base.ScoreSelector`; default: the perturbation selector).
        explore: share of each draw that follows the scores, in (0, 1].
        seed: the draw's generator seed (its state is part of :meth:`state_dict`).
        focus: called with the selection context before each draw: a bool mask of the batch's
            samples the rest of the draw goes to instead of the disagreements (None: the
            disagreements).

    It takes no class balance (the balance would change which sample is asked after the draw,
    and the inclusion probabilities with it): give the method ``balance=None``.
    """

    def __init__(
        self,
        base: ScoreSelector | None = None,
        *,
        explore: float = 0.25,
        seed: int = 0,
        focus: Callable[[SelectionContext], Tensor | None] | None = None,
    ) -> None:
        if base is None:
            base = PerturbationSelector()
        if not isinstance(base, ScoreSelector):
            raise TypeError(
                f"DisagreementDraw needs a ScoreSelector (a per-sample score), got "
                f"{type(base).__name__}"
            )
        self.base = base
        self.draws = True
        self.explore = check_explore(explore)
        self.seed = int(seed)
        self.focus = focus
        self._gen = torch.Generator().manual_seed(self.seed)

    def select(self, ctx: SelectionContext, k: int, balance: ClassBalance) -> Selection:
        if not isinstance(balance, NoClassBalance):
            raise TypeError(
                "DisagreementDraw draws with known probabilities and takes no class balance "
                f"(got {type(balance).__name__}): give the method balance=None"
            )
        n = ctx.inputs.shape[0]
        scores = self.base.score(ctx)
        disagree = None
        if ctx.reference is not None:
            ref = ctx.reference.to(ctx.pseudo_labels.device)
            if ref.shape != ctx.pseudo_labels.shape:
                raise ValueError(
                    f"reference predictions have shape {tuple(ref.shape)}, the batch "
                    f"{tuple(ctx.pseudo_labels.shape)}"
                )
            disagree = ref != ctx.pseudo_labels
        if self.focus is not None:
            aim = self.focus(ctx)
            if aim is not None:
                disagree = aim.to(ctx.pseudo_labels.device)
        sub_scores, sub_dis = scores.detach(), disagree  # the whole batch: no gather
        if ctx.candidates is None:
            pool = torch.arange(n)
        else:
            pool = ctx.candidates.cpu()
            if len(pool):
                lo, hi = pool.aminmax()
                if int(lo) < 0 or int(hi) >= n:
                    raise ValueError(f"candidates out of range for a batch of {n}: {pool.tolist()}")
            sub_scores = sub_scores[pool.to(scores.device)]
            sub_dis = None if disagree is None else disagree[pool.to(disagree.device)]
        q = inclusion_probabilities(sub_scores, sub_dis, self.explore).cpu()
        if k <= 0 or len(pool) == 0:
            return Selection(torch.empty(0, dtype=torch.long), [], {"scores": scores})
        drawn = torch.multinomial(q.float(), k, replacement=True, generator=self._gen)
        pos, counts = torch.unique(drawn, sorted=True, return_counts=True)
        idx = pool[pos]
        classes: list[int] = (
            ctx.pseudo_labels.detach()[idx.to(ctx.pseudo_labels.device)].cpu().tolist()
        )
        n_dis = 0 if sub_dis is None else int(sub_dis.sum())
        bound = answer_bound(q, None if sub_dis is None else sub_dis.cpu())
        draw = Draw(idx, q[pos], counts, k, len(pool), n_dis, bound)
        return Selection(idx, classes, {"scores": scores, "draw": draw})

    def commit(self, ctx: SelectionContext, selection: Selection, labels: Tensor) -> None:
        self.base.commit(ctx, selection, labels)

    def reset(self) -> None:
        self.base.reset()
        self._gen.manual_seed(self.seed)

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base.state_dict(), "generator": self._gen.get_state()}

    def snapshot(self) -> tuple[Any, Tensor]:
        """A token for :meth:`restore`: the base's own snapshot (else a copy of its state) and
        the generator's state (``get_state`` returns a copy), without a deep copy per step."""
        snap = getattr(self.base, "snapshot", None)
        base = snap() if snap is not None else copy.deepcopy(self.base.state_dict())
        return base, self._gen.get_state()

    def restore(self, token: tuple[Any, Tensor]) -> None:
        base, gen = token
        restore = getattr(self.base, "restore", None)
        if restore is not None:
            restore(base)
        else:
            self.base.load_state_dict(copy.deepcopy(base))
        self._gen.set_state(gen)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base.load_state_dict(state["base"])
        self._gen.set_state(state["generator"])
