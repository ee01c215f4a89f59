"""Noise for the perturbation selector: seeded Gaussian draws, or recorded draws replayed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from typing_extensions import Protocol, runtime_checkable

__all__ = ["GaussianNoise", "NoiseSource", "RecordedNoise"]


@runtime_checkable
class NoiseSource(Protocol):
    """Draws the feature perturbation; its state is saved with the method."""

    def __call__(self, shape: torch.Size, device: torch.device, dtype: torch.dtype) -> Tensor: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class GaussianNoise:
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
        self.generator = torch.Generator(device=generator_device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self._initial = self.generator.get_state()

    def __call__(self, shape: torch.Size, device: torch.device, dtype: torch.dtype) -> Tensor:
        eps = torch.randn(shape, generator=self.generator, device=self.generator.device)
        if self.std != 1.0:
            eps = eps * self.std
        return eps.to(device=device, dtype=dtype, non_blocking=True)

    def reset(self) -> None:
        self.generator.set_state(self._initial)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["rng"])


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
