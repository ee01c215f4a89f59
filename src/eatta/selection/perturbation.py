"""EATTA's perturbation-difference selector (paper Eq. 3) and its noise.

The noise is a :class:`NoiseSource`: seeded Gaussian draws (:class:`GaussianNoise`, the
default), or recorded draws replayed (:class:`RecordedNoise`, e.g. from a golden trace).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from typing_extensions import Protocol, runtime_checkable

from eatta.selection.base import OwnGenerator, ScoreSelector, SelectionContext

__all__ = ["GaussianNoise", "NoiseSource", "PerturbationSelector", "RecordedNoise"]


@runtime_checkable
class NoiseSource(Protocol):
    """Draws the feature perturbation; its state is saved with the method."""

    def __call__(self, shape: torch.Size, device: torch.device, dtype: torch.dtype) -> Tensor: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class GaussianNoise(OwnGenerator):
    """``N(0, std²)`` noise from its own ``torch.Generator``.

    Drawn on ``generator_device`` (the CPU by default, as the authors' code does, so CPU and GPU
    runs see the same noise) and moved to the features' device.
    """

    def __init__(
        self, std: float = 0.01, seed: int | None = 0, generator_device: str | torch.device = "cpu"
    ) -> None:
        if not std >= 0:
            raise ValueError(f"noise std must be >= 0, got {std}")
        self.std = float(std)
        generator = torch.Generator(device=generator_device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        self.own(generator)

    def __call__(self, shape: torch.Size, device: torch.device, dtype: torch.dtype) -> Tensor:
        eps = torch.randn(shape, generator=self.generator, device=self.generator.device)
        if self.std != 1.0:
            eps = eps * self.std
        return eps.to(device=device, dtype=dtype, non_blocking=True)


class RecordedNoise:
    """Replays a recorded sequence of noise tensors, one per call (e.g. from a golden trace)."""

    def __init__(self, draws: Sequence[Tensor]) -> None:
        self.draws = list(draws)
        self.position = 0

    def __call__(self, shape: torch.Size, device: torch.device, dtype: torch.dtype) -> Tensor:
        if self.position >= len(self.draws):
            raise IndexError(f"recorded noise exhausted after {len(self.draws)} draws")
        eps = self.draws[self.position]
        if tuple(eps.shape) != tuple(shape):
            raise ValueError(
                f"recorded noise draw {self.position} has shape {tuple(eps.shape)}, "
                f"the features need {tuple(shape)}"
            )
        self.position += 1
        return eps.to(device=device, dtype=dtype)

    def reset(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class PerturbationSelector(ScoreSelector):
    """Scores each sample by how much its predicted-class probability moves under feature noise.

    ``diff_i = |p_i[ŷ_i] - softmax(h(z_i + ε_i))[ŷ_i]|`` with ``ε ~ N(0, σ²)`` (σ = 0.01). Samples
    near the source/target border move most and are the easiest to learn in one step. Only the
    head runs twice. Pass ``noise`` (e.g. :class:`RecordedNoise`) to replay draws.
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
