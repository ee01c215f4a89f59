"""Whether a tensor holds only finite values, in one reduction.

``isfinite(x).all()`` writes an elementwise mask and reduces it; on an input batch that mask is
most of the check's cost. The smallest and largest elements say the same: a NaN propagates into
both, and an infinity is one of them. So ``isfinite(min(x)) & isfinite(max(x))`` equals
``isfinite(x).all()``, read in one pass with no mask (about 8x faster on a batch of 64 digits
images, one CPU thread).

:func:`is_finite` is the same answer read at once, as a ``bool``: on the CPU the two extremes are
read as Python floats, which spares the small tensor ops that dominate a request of one sample.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def all_finite(x: Tensor) -> Tensor:
    """A 0-d bool tensor on ``x``'s device: whether every element of ``x`` is finite, as
    ``isfinite(x).all()``."""
    if not x.is_floating_point() or x.numel() == 0:  # complex, integer, bool, empty: the mask
        return torch.isfinite(x).all()
    lo, hi = torch.aminmax(x)
    return torch.isfinite(lo) & torch.isfinite(hi)


def is_finite(x: Tensor) -> bool:
    """``bool(all_finite(x))``, for a caller that reads the answer now (it syncs the device)."""
    if x.device.type != "cpu" or not x.is_floating_point() or x.numel() == 0:
        return bool(all_finite(x))
    lo, hi = torch.aminmax(x)
    return math.isfinite(lo.item()) and math.isfinite(hi.item())
