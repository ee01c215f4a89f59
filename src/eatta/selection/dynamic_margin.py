"""CEMA's dynamic entropy margins as a selection rule (Chen et al., ICLR 2024).

CEMA uploads to the cloud only the samples whose entropy lies between a low and a high
threshold: above ``E_max`` a sample is unreliable, below ``E_min`` it carries little information.
``E_max`` is dynamic. In CEMA's public code (``EntropyCriterion``) it is, once a warm-up count of
samples has been seen, ``E_max^0 · (running mean entropy / mean entropy at warm-up) · λ``, the
running mean covering every sample seen so far; before the warm-up it is ``E_max^0``. As the
adapted model grows confident the mean entropy falls and so does ``E_max``. In active TTA the
uploaded samples are the ones sent to the annotator (the oracle replaces CEMA's foundation
model), so the "dynamic margin" selection labels samples from this band.

EATTA's settings (supplementary): ``E_max^0 = 0.4 ln C``, ``E_min = 0.02 ln C``, decreasing
factor ``λ = 1.0``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from eatta.balance import ClassBalance, Selection
from eatta.selection.base import ScoreSelector, SelectionContext

__all__ = ["DynamicMarginSelector", "plan_within"]


def plan_within(
    balance: ClassBalance, scores: Tensor, pseudo_labels: Tensor, mask: Tensor, k: int
) -> Selection:
    """Plan a selection among the samples where ``mask`` is true only (indices into the batch)."""
    keep = mask.nonzero().flatten()
    sub = balance.plan(scores[keep], pseudo_labels[keep], k)
    sub.indices = keep.cpu()[sub.indices].to(torch.long)
    return sub


class DynamicMarginSelector(ScoreSelector):
    """Labels samples whose entropy lies in CEMA's band ``(E_min, E_max^t)``, most uncertain first.

    Score: ``H`` inside the band; outside it ``-1 - d`` with ``d`` the distance to the band, so
    the band ranks first and, when it holds fewer than ``k`` samples, the nearest samples outside
    it follow. With ``strict=True`` samples outside the band are never selected (CEMA uploads
    nothing else), so fewer than ``k`` may come back.

    The running entropy statistics behind ``E_max^t`` observe every batch the selector is asked
    to select from: :meth:`select` records the batch (like a random generator advancing; the
    method restores ``state_dict`` if the step fails), and the batch counts towards its own
    threshold, as in CEMA. :meth:`score` is pure.

    Args:
        high_factor: ``E_max^0 = high_factor · ln C`` (0.4).
        low_factor: ``E_min = low_factor · ln C`` (0.02).
        decreasing_factor: ``λ`` (1.0).
        warmup_samples: samples to see before ``E_max`` becomes dynamic; the mean entropy over
            the batches that reach this count is the reference. Default 1: the first batch.
        strict: select only inside the band.
    """

    #: running entropy statistics: sum and count over the batches seen, and the warm-up mean
    #: entropy (None until ``warmup_samples`` were seen)
    _sum: float
    _count: int
    _warm: float | None

    def __init__(
        self,
        high_factor: float = 0.4,
        low_factor: float = 0.02,
        decreasing_factor: float = 1.0,
        warmup_samples: int = 1,
        strict: bool = False,
    ) -> None:
        if not high_factor > 0 or not 0 <= low_factor < high_factor:
            raise ValueError(f"need 0 <= low_factor < high_factor, got {low_factor}, {high_factor}")
        if not decreasing_factor > 0:
            raise ValueError(f"decreasing_factor must be > 0, got {decreasing_factor}")
        if not isinstance(warmup_samples, int) or warmup_samples < 1:
            raise ValueError(f"warmup_samples must be an integer >= 1, got {warmup_samples!r}")
        self.high_factor = float(high_factor)
        self.low_factor = float(low_factor)
        self.decreasing_factor = float(decreasing_factor)
        self.warmup_samples = warmup_samples
        self.strict = strict
        self.reset()

    # -- thresholds ------------------------------------------------------------------------
    def _stats_with(self, h: Tensor) -> tuple[float, int, float | None]:
        total = self._sum + float(h.detach().double().sum())
        count = self._count + int(h.numel())
        warm = self._warm
        if warm is None and count >= self.warmup_samples:
            warm = total / count
        return total, count, warm

    def _thresholds(
        self, num_classes: int, total: float, count: float, warm: float | None
    ) -> tuple[float, float]:
        log_c = math.log(num_classes)
        high = self.high_factor * log_c
        if warm is not None and warm > 0 and count > 0:
            high = high * (total / count / warm) * self.decreasing_factor
        return high, self.low_factor * log_c

    def thresholds(self, num_classes: int) -> tuple[float, float]:
        """``(E_max^t, E_min)`` from the batches observed so far."""
        return self._thresholds(num_classes, self._sum, self._count, self._warm)

    @property
    def mean_entropy(self) -> float | None:
        """Running mean entropy of every observed sample (None before the first batch)."""
        return self._sum / self._count if self._count else None

    # -- selection ---------------------------------------------------------------------------
    def _band_scores(self, ctx: SelectionContext) -> tuple[Tensor, Tensor, tuple[float, float]]:
        h = ctx.entropy
        high, low = self._thresholds(ctx.logits.shape[1], *self._stats_with(h))
        band = (h > low) & (h < high)
        distance = torch.where(h >= high, h - high, low - h)
        return torch.where(band, h, -1.0 - distance), band, (high, low)

    def score(self, ctx: SelectionContext) -> Tensor:
        return self._band_scores(ctx)[0]

    def select(self, ctx: SelectionContext, k: int, balance: ClassBalance) -> Selection:
        scores, band, limits = self._band_scores(ctx)
        if self.strict:
            selection = plan_within(balance, scores, ctx.pseudo_labels, band, k)
        else:
            selection = balance.plan(scores, ctx.pseudo_labels, k)
        selection.update.setdefault("scores", scores)
        selection.update["band"] = band
        selection.update["thresholds"] = limits
        self._sum, self._count, self._warm = self._stats_with(ctx.entropy)
        return selection

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        self._sum = 0.0
        self._count = 0
        self._warm = None

    def state_dict(self) -> dict[str, Any]:
        return {"sum": self._sum, "count": self._count, "warm": self._warm}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sum = float(state["sum"])
        self._count = int(state["count"])
        self._warm = None if state["warm"] is None else float(state["warm"])
