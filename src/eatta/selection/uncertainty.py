"""Classic selection scores compared with EATTA's in the paper's Table 7, and random selection.

Each selector is a :class:`~eatta.selection.base.ScoreSelector`: it scores every sample of the
batch (larger = more worth labelling) and the class balance picks the top ``k`` (under
:class:`~eatta.balance.NoClassBalance` exactly ``argsort(score, descending)[:k]``).

- :class:`MaxEntropySelector`: prediction entropy (active learning's "max entropy").
- :class:`LeastConfidenceSelector`: ``1 - max_c p_c``.
- :class:`MinMarginSelector`: the smallest gap between the two largest probabilities.
- :class:`RandomSelector`: uniform random draws from a seeded generator.
- :class:`EntropyMarginSelector`: EATA's entropy margin (reliable samples only).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from eatta.selection.base import OwnGenerator, ScoreSelector, SelectionContext

__all__ = [
    "EntropyMarginSelector",
    "LeastConfidenceSelector",
    "MaxEntropySelector",
    "MinMarginSelector",
    "RandomSelector",
]


class MaxEntropySelector(ScoreSelector):
    """Labels the samples whose predictions have the highest entropy."""

    def score(self, ctx: SelectionContext) -> Tensor:
        return ctx.entropy


class LeastConfidenceSelector(ScoreSelector):
    """Labels the samples with the lowest top-class probability (score ``1 - max p``)."""

    def score(self, ctx: SelectionContext) -> Tensor:
        return 1.0 - ctx.probs.max(dim=1).values


class MinMarginSelector(ScoreSelector):
    """Labels the samples with the smallest margin between the two most probable classes.

    Score ``p_(2) - p_(1)`` (minus the margin), so the smallest margin ranks first. A one-class
    model has no second class: every score is ``-1``.
    """

    def score(self, ctx: SelectionContext) -> Tensor:
        p = ctx.probs
        if p.shape[1] < 2:
            return torch.full((p.shape[0],), -1.0, device=p.device, dtype=p.dtype)
        top = p.topk(2, dim=1).values
        return top[:, 1] - top[:, 0]


class RandomSelector(OwnGenerator, ScoreSelector):
    """Uniformly random samples: the score is a fresh ``U(0, 1)`` draw per sample.

    Under no class balancing the top ``k`` of i.i.d. uniform draws is a uniformly random
    ``k``-subset. Draws come from the selector's own CPU generator (seeded, saved in
    ``state_dict``), so a stream replays identically on any device.
    """

    def __init__(self, seed: int = 0) -> None:
        self.own(torch.Generator().manual_seed(seed))

    def score(self, ctx: SelectionContext) -> Tensor:
        draws = torch.rand(ctx.logits.shape[0], generator=self.generator, dtype=torch.float64)
        return draws.to(ctx.logits.device)


class EntropyMarginSelector(ScoreSelector):
    """EATA's entropy margin as a selection rule: the most uncertain of the reliable samples.

    EATA (Niu et al., ICML 2022) calls a sample reliable when its entropy is below the margin
    ``E_0 = 0.4 ln C`` and weights reliable samples by ``exp(E_0 - H)``. Table 7 of the EATTA paper
    names only this entropy criterion ("Entropy Margin"), so here a sample is eligible when
    ``H < margin`` and, among eligible samples, the one closest to the margin (largest entropy)
    ranks first: it is still reliable but the least certain, the most informative of them. So that
    ``k`` samples are always chosen, ineligible samples rank after every eligible one, nearest to
    the margin first. Score: ``H`` below the margin, ``margin - H - 1`` (``<= -1``) otherwise.
    EATA's second filter (cosine redundancy against a moving average of predictions) is not part
    of this rule.

    Args:
        margin: the entropy margin; default ``0.4 ln C`` for ``C`` classes.
    """

    def __init__(self, margin: float | None = None) -> None:
        if margin is not None and not margin > 0:
            raise ValueError(f"entropy margin must be > 0, got {margin}")
        self.margin = margin

    def resolve_margin(self, num_classes: int) -> float:
        """The margin used for ``num_classes`` classes."""
        return self.margin if self.margin is not None else 0.4 * math.log(num_classes)

    def score(self, ctx: SelectionContext) -> Tensor:
        h = ctx.entropy
        m = self.resolve_margin(ctx.logits.shape[1])
        return torch.where(h < m, h, (m - h) - 1.0)
