"""A LayerNorm source model for digits-C: a small vision transformer, shipped like the CNN.

The paper reports ViT-B/16 (LayerNorm, no BatchNorm) beside ResNet-50; this model lets the
embedded benchmark exercise that half on a CPU (``eatta-bench --backbone digits-vit``).

* Architecture (:class:`DigitsViT`): 4 x 4 patches of the 32 x 32 input (64 tokens) embedded to
  64 dimensions, a class token and learned position embeddings, four pre-norm transformer blocks
  (LayerNorm, 4-head self-attention, LayerNorm, a 128-wide GELU MLP), a final LayerNorm and an
  ``nn.Linear`` head on the class token (``self.head(features)``, so :func:`eatta.split_model`
  finds the split on the first batch). Nothing in it depends on the other samples of a batch:
  it predicts, and adapts, on a batch of one.
* Training (:func:`train_digits_vit`): the CNN's data and augmentation (the clean source split,
  random shifts of up to 1 pixel, seeded initialization and batch order, one thread), AdamW with a
  one-cycle learning rate for :data:`_EPOCHS` epochs.
* Packaged weights (:func:`packaged_digits_vit`, what ``eatta-bench --backbone digits-vit``
  uses): seed 0's result (142k parameters) ships in the package (``digits_vit_v<VERSION>.pt``,
  0.6 MB) with the SHA-256 of its tensors (:data:`DIGITS_VIT_SHA256`). Shipped rather than
  trained on first use (282 s on this project's busy 2-core machine) for the CNN's reason: the
  same seed on another CPU's vector kernels gives other weights, hence other benchmark numbers.
  It was written by ``ATEN_CPU_CAPABILITY=avx2 python tools/train_digits_source.py --model
  digits-vit --write``; without ``--write`` the tool retrains and compares the digests.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eatta.models.digits_cnn import fit_digits_source, state_digest

__all__ = [
    "DIGITS_VIT_SHA256",
    "DIGITS_VIT_VERSION",
    "PACKAGED_VIT_WEIGHTS",
    "DigitsViT",
    "packaged_digits_vit",
    "train_digits_vit",
]

#: Version of the architecture + training recipe; part of the packaged file's name.
DIGITS_VIT_VERSION = "1"

#: The packaged weights (seed 0) and the SHA-256 of their tensors (:func:`state_digest`).
PACKAGED_VIT_WEIGHTS = Path(__file__).with_name(f"digits_vit_v{DIGITS_VIT_VERSION}.pt")
DIGITS_VIT_SHA256 = "98d08954c8856a6fc175c4be6a0109b0ab6fc83ca709ab455f0a6eac73fea466"

_EPOCHS = 60
_MAX_LR = 2e-3
_WEIGHT_DECAY = 0.05


class _Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [n, heads, t, d / heads]
        weights = (q @ k.transpose(-2, -1)).mul(1.0 / math.sqrt(d // self.heads)).softmax(-1)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(n, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class DigitsViT(nn.Module):
    """The untrained digits-C vision transformer (see the module docstring); input
    ``[N, 3, 32, 32]`` in ``[0, 1]``, output ``[N, num_classes]`` logits."""

    def __init__(
        self,
        num_classes: int = 10,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        patch: int = 4,
        image_size: int = 32,
    ) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size {image_size} is not divisible by patch {patch}")
        tokens = (image_size // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[_Block(dim, heads, 2 * dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        t = self.patch_embed(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls_token.expand(len(t), -1, -1), t], dim=1) + self.pos_embed
        features = self.norm(self.blocks(t))[:, 0]
        return self.head(features)


def train_digits_vit(seed: int = 0, epochs: int | None = None) -> tuple[DigitsViT, dict[str, Any]]:
    """Train :class:`DigitsViT` on the clean source split (``epochs`` default: the recipe's;
    AdamW, :func:`~eatta.models.digits_cnn.fit_digits_source`); returns the model (eval mode)
    and its report."""
    epochs = _EPOCHS if epochs is None else epochs
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    return fit_digits_source(
        DigitsViT,
        lambda params: torch.optim.AdamW(params, lr=_MAX_LR, weight_decay=_WEIGHT_DECAY),
        max_lr=_MAX_LR,
        epochs=epochs,
        seed=seed,
        version=DIGITS_VIT_VERSION,
    )


def packaged_digits_vit() -> tuple[DigitsViT, dict[str, Any]]:
    """The vision transformer shipped with the package (eval mode) and its report (that of
    :func:`train_digits_vit`, plus ``"packaged": True``, ``"cached": True``, ``"sha256"`` and
    ``"path"``).

    Raises ``RuntimeError`` if the file is missing or unreadable, or its weights do not match
    :data:`DIGITS_VIT_SHA256` (a damaged installation).
    """
    try:
        blob = torch.load(PACKAGED_VIT_WEIGHTS, map_location="cpu", weights_only=True)
        state, report = blob["state_dict"], dict(blob["report"])
    except Exception as err:  # missing, truncated, or not a checkpoint at all
        raise RuntimeError(
            f"the packaged digits ViT weights {str(PACKAGED_VIT_WEIGHTS)!r} are missing or "
            f"unreadable ({type(err).__name__}); reinstall eatta"
        ) from None
    digest = state_digest(state)
    if digest != DIGITS_VIT_SHA256:
        raise RuntimeError(
            f"the packaged digits ViT weights are damaged (SHA-256 {digest[:16]}..., "
            f"expected {DIGITS_VIT_SHA256[:16]}...); reinstall eatta"
        )
    model = DigitsViT()
    model.load_state_dict(state)
    model.eval()
    report.update(cached=True, packaged=True, sha256=digest, path=str(PACKAGED_VIT_WEIGHTS))
    return model, report
