"""Loss terms shared by the methods: prediction entropy, confidence filtering, and the
complementary label of a "no" answer."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["complementary_cross_entropy", "default_entropy_margin", "entropy", "masked_mean"]


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


def complementary_cross_entropy(logits: Tensor, not_labels: Tensor) -> Tensor:
    """Mean of ``-log(1 - p_c)`` over the rows, ``c`` the class each sample is known not to be
    (a "no" to "is it ``c``?"): it lowers ``p_c`` and leaves the other classes' ratios alone.

    Computed as ``logsumexp(o) - logsumexp(o without c)``, stable for confident ``p_c`` near 1.
    """
    rows = torch.arange(len(not_labels), device=logits.device)
    others = logits.index_put((rows, not_labels.to(logits.device)), logits.new_tensor(-math.inf))
    return (torch.logsumexp(logits, dim=1) - torch.logsumexp(others, dim=1)).mean()
