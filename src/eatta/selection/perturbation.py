"""EATTA's perturbation-difference selector (paper Eq. 3)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from eatta.noise import GaussianNoise, NoiseSource
from eatta.selection.base import ScoreSelector, SelectionContext

__all__ = ["PerturbationSelector"]


class PerturbationSelector(ScoreSelector):
    """Scores each sample by how much its predicted-class probability moves under feature noise.

    ``diff_i = |p_i[ŷ_i] - softmax(h(z_i + ε_i))[ŷ_i]|`` with ``ε ~ N(0, σ²)`` (σ = 0.01). Samples
    near the source/target border move most and are the easiest to learn in one step. Only the
    head runs twice. Pass ``noise`` (e.g. :class:`~eatta.noise.RecordedNoise`) to replay draws.
    """

    def __init__(self, std: float = 0.01, noise: NoiseSource | None = None, seed: int = 0) -> None:
        self.noise: NoiseSource = noise if noise is not None else GaussianNoise(std, seed=seed)

    def score(self, ctx: SelectionContext) -> Tensor:
        z = ctx.features.detach()
        eps = self.noise(z.shape, z.device, z.dtype)
        with torch.no_grad():
            perturbed = ctx.head(z + eps).softmax(dim=1)
        pl = ctx.pseudo_labels.unsqueeze(1)
        return (ctx.probs.gather(1, pl) - perturbed.gather(1, pl)).abs().squeeze(1)

    def reset(self) -> None:
        reset = getattr(self.noise, "reset", None)
        if reset is not None:
            reset()

    def state_dict(self) -> dict[str, Any]:
        return {"noise": self.noise.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.noise.load_state_dict(state["noise"])

    def snapshot(self) -> dict[str, Any]:
        """A token for :meth:`restore` (the noise source's state dict holds fresh copies)."""
        return self.noise.state_dict()

    def restore(self, token: dict[str, Any]) -> None:
        self.noise.load_state_dict(token)
