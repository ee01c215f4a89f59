"""Whether a tensor holds only finite values, in one reduction.

``isfinite(x).all()`` writes an elementwise mask and reduces it; on an input batch that mask is
most of the check's cost. The smallest and largest elements say the same: a NaN propagates into
both, and an infinity is one of them. So ``isfinite(min(x)) & isfinite(max(x))`` equals
``isfinite(x).all()``, read in one pass with no mask (about 8x faster on a batch of 64 digits
images, one CPU thread).
"""

from __future__ import annotations

import torch
from torch import Tensor


def all_finite(x: Tensor) -> Tensor:
    """A 0-d bool tensor on ``x``'s device: whether every element of ``x`` is finite, as
    ``isfinite(x).all()``."""
    if not x.is_floating_point() or x.numel() == 0:  # complex, integer, bool, empty: the mask
        return torch.isfinite(x).all()
    lo, hi = torch.aminmax(x)
    return torch.isfinite(lo) & torch.isfinite(hi)
