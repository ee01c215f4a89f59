"""DeYO's pseudo-label probability difference (PLPD) as a selection score (Lee et al., ICLR 2024).

DeYO shuffles the patches of each test image (default: a 4 × 4 grid, so 16 patches) and measures
how much the probability of the original pseudo-label drops: ``PLPD = p(ŷ | x) - p(ŷ | x')``.
A large drop means the prediction rests on the object's shape, which the shuffle destroys; DeYO
trusts those samples. As a selection rule (Table 7, "PLPD") the samples with the largest PLPD
are labelled first, the same direction as EATTA's perturbation difference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from eatta.selection.base import OwnGenerator, ScoreSelector, SelectionContext

__all__ = ["PLPDSelector", "patch_shuffle"]


def patch_shuffle(x: Tensor, grid: int, generator: torch.Generator) -> Tensor:
    """Cut each image of ``x`` ``[B, C, H, W]`` into ``grid × grid`` patches and permute them.

    Each image gets its own permutation, drawn from ``generator`` (on the CPU). As in DeYO, an
    image whose sides are not multiples of ``grid`` is resized (bilinear) down to the nearest
    multiples first and back to its size afterwards.
    """
    if x.dim() != 4:
        raise ValueError(f"patch shuffling needs images [B, C, H, W], got shape {tuple(x.shape)}")
    b, c, height, width = x.shape
    if grid < 1 or height < grid or width < grid:
        raise ValueError(f"cannot cut a {height}x{width} image into a {grid}x{grid} grid")
    h, w = height // grid, width // grid
    resized = (h * grid, w * grid) != (height, width)
    if resized:
        x = F.interpolate(x, size=(h * grid, w * grid), mode="bilinear", align_corners=False)
    patches = x.reshape(b, c, grid, h, grid, w).permute(0, 2, 4, 1, 3, 5)
    patches = patches.reshape(b, grid * grid, c, h, w)
    perm = torch.argsort(torch.rand(b, grid * grid, generator=generator), dim=1).to(x.device)
    patches = patches[torch.arange(b, device=x.device).unsqueeze(1), perm]
    out = patches.reshape(b, grid, grid, c, h, w).permute(0, 3, 1, 4, 2, 5)
    out = out.reshape(b, c, h * grid, w * grid)
    if resized:
        out = F.interpolate(out, size=(height, width), mode="bilinear", align_corners=False)
    return out


class PLPDSelector(OwnGenerator, ScoreSelector):
    """Scores each sample by DeYO's PLPD; the largest drop ranks first.

    Runs the model (``ctx.backbone`` then ``ctx.head``, without gradients) once more on the
    patch-shuffled batch; with BatchNorm on batch statistics, as configured by
    :func:`eatta.configure`, that pass changes nothing in the model. The permutations come from
    the selector's own seeded CPU generator, saved in ``state_dict``.

    Args:
        grid: patches per side (DeYO's default 4).
        seed: seed of the permutation generator.
    """

    def __init__(self, grid: int = 4, seed: int = 0) -> None:
        if not isinstance(grid, int) or grid < 1:
            raise ValueError(f"grid must be an integer >= 1, got {grid!r}")
        self.grid = grid
        self.own(torch.Generator().manual_seed(seed))

    def score(self, ctx: SelectionContext) -> Tensor:
        if ctx.backbone is None:
            raise ValueError(
                "PLPD re-runs the model on patch-shuffled inputs and needs the feature extractor: "
                "SelectionContext.backbone is None"
            )
        shuffled = patch_shuffle(ctx.inputs.detach(), self.grid, self.generator)
        with torch.no_grad():
            shuffled_probs = ctx.head(ctx.backbone(shuffled)).softmax(dim=1)
        pl = ctx.pseudo_labels.unsqueeze(1)
        return (ctx.probs.gather(1, pl) - shuffled_probs.gather(1, pl)).squeeze(1)
