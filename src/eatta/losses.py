"""Loss terms shared by the methods: prediction entropy and confidence filtering."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["default_entropy_margin", "entropy", "masked_mean"]


def entropy(logits: Tensor) -> Tensor:
    """Per-sample Shannon entropy of ``softmax(logits)`` (natural log), shape ``[B]``."""
    log_p = logits.log_softmax(dim=1)
    return -(log_p.exp() * log_p).sum(dim=1)


def default_entropy_margin(num_classes: int) -> float:
    """The confident-sample threshold used by EATA, SAR and EATTA: ``0.4 ln C``."""
    return 0.4 * math.log(num_classes)


def masked_mean(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Mean of ``values[mask]`` and the mask's count, without a host sync.

    An empty mask gives a mean of exactly 0 (with a zero gradient), never NaN.
    """
    count = mask.sum()
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return total / count.clamp_min(1).to(values.dtype), count
