"""K-Margin selection (HILTTA, Li et al., TMLR 2025): uncertain *and* spread-out samples.

Each sample's feature vector is scaled by its margin uncertainty ``1 - (p_1 - p_2)`` (the two
largest softmax probabilities), and k-center greedy picks ``k`` of the scaled vectors, starting
from the origin as the one centre already chosen: each pick is the sample farthest (Euclidean)
from every centre so far, the first such sample on a tie. Confident samples sit near the origin
and are picked late; uncertain ones far apart are picked first. The indices come back in
ascending order, as in the authors' code (github.com/Yushu-Li/HILTTA, ``hiltta.py``).

The scaled features are computed in the model's precision (float32, as in the authors' code)
and the distances in float64 on the CPU, as the authors' NumPy code does too (stacking its
float64 zero row, the origin, onto the float32 features promotes the array to float64). Only
the last bit of a float64 distance can differ between the two (NumPy's and torch's norms sum in
different orders), so the same samples are chosen except at exact float64 ties of distinct
distances.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from eatta.balance import ClassBalance, Selection
from eatta.selection.base import SelectionContext

__all__ = ["KMarginSelector", "k_center_greedy", "k_margin", "margin_uncertainty"]


def margin_uncertainty(logits: Tensor) -> Tensor:
    """``1 - (p_1 - p_2)`` per row of ``[batch, classes]`` logits (1: a tie, 0: certain)."""
    if logits.dim() != 2 or logits.shape[1] < 2:
        raise ValueError(f"logits must be [batch, classes >= 2], got {tuple(logits.shape)}")
    top2 = logits.detach().softmax(dim=1).topk(2, dim=1).values
    return 1.0 - (top2[:, 0] - top2[:, 1])


def k_center_greedy(points: Tensor, k: int) -> Tensor:
    """Indices (ascending) of ``k`` rows of ``points`` chosen greedily, the origin the first
    centre: each step takes the row farthest from its nearest centre (first row on a tie)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    n = points.shape[0]
    if k > n:
        raise ValueError(f"cannot choose {k} of {n} samples")
    pts = points.detach().reshape(n, -1).to("cpu", torch.float64)
    nearest = pts.norm(dim=1)  # distance to the origin, the centre chosen before any sample
    chosen = torch.zeros(n, dtype=torch.bool)
    for _ in range(k):
        gap = nearest.masked_fill(chosen, -1.0)  # distances are >= 0: chosen rows never win
        j = int(torch.argmax(gap))  # first maximum
        chosen[j] = True
        nearest = torch.minimum(nearest, (pts - pts[j]).norm(dim=1))
    return chosen.nonzero().flatten()


def k_margin(logits: Tensor, features: Tensor, k: int) -> Tensor:
    """HILTTA's K-Margin: k-center greedy on ``features`` scaled by the margin uncertainty."""
    if features.shape[0] != logits.shape[0]:
        raise ValueError(
            f"features ({features.shape[0]} rows) and logits ({logits.shape[0]}) disagree"
        )
    u = margin_uncertainty(logits).to(features.device, features.dtype)
    scaled = features.detach().reshape(features.shape[0], -1) * u[:, None]
    return k_center_greedy(scaled, k)


class KMarginSelector:
    """:func:`k_margin` as a :class:`~eatta.selection.base.Selector` (stateless; the class
    balance is not consulted, as in HILTTA)."""

    def select(self, ctx: SelectionContext, k: int, balance: ClassBalance) -> Selection:
        k = min(k, ctx.logits.shape[0])
        idx = k_margin(ctx.logits, ctx.features, k)
        classes = ctx.pseudo_labels[idx.to(ctx.logits.device)].tolist()
        return Selection(idx, [int(c) for c in classes])

    def commit(self, ctx: SelectionContext, selection: Selection, labels: Tensor) -> None:
        """Nothing to learn from the labels."""

    def reset(self) -> None:
        """Stateless."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless."""
