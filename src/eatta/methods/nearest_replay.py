"""Replay of the labelled samples nearest the current batch (IWMS-like, Csaba et al. 2024).

:class:`NearestReplay` keeps the last ``capacity`` labelled samples with their label and their
feature when they were labelled. Each step it offers the ``k`` whose features are nearest (cosine)
to the current batch's mean feature, each weighted by that similarity (clamped at 0), so a label
from a part of the stream that looks like now is learned again, and one from elsewhere is not.
Memory: ``capacity`` samples, labels and ``D``-dim features.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["NearestReplay"]


class NearestReplay:
    """The labelled samples nearest the current batch (see the module docstring)."""

    def __init__(self, capacity: int = 64, k: int = 4) -> None:
        for name, value in (("capacity", capacity), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"nearest replay {name} must be an int >= 1, got {value!r}")
        self.capacity, self.k = capacity, k
        self._x: Tensor | None = None
        self._y: Tensor | None = None
        self._f: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self._y is None else len(self._y)

    def add(self, x: Tensor, y: Tensor, features: Tensor) -> None:
        """Keep labelled samples (the oldest beyond ``capacity`` are forgotten)."""
        if not len(y):
            return
        x, y, f = x.detach(), y.detach(), features.detach().flatten(1).float()
        if self._x is not None and self._y is not None and self._f is not None:
            x = torch.cat([self._x, x.to(self._x)])
            y = torch.cat([self._y, y.to(self._y.device)])
            f = torch.cat([self._f, f.to(self._f.device)])
        self._x, self._y, self._f = x[-self.capacity :], y[-self.capacity :], f[-self.capacity :]

    def nearest(self, features: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """``(samples, labels, weights)`` of the ``k`` kept samples nearest the batch whose
        features are ``features``; None when nothing is kept."""
        if self._x is None or self._y is None or self._f is None:
            return None
        mu = features.detach().flatten(1).float().mean(0).to(self._f.device)
        sim = torch.cosine_similarity(self._f, mu.unsqueeze(0), dim=1)
        top = sim.topk(min(self.k, len(sim))).indices
        return self._x[top], self._y[top], sim[top].clamp(min=0)

    def reset(self) -> None:
        self._x = self._y = self._f = None

    def snapshot(self) -> tuple[Any, ...]:
        return self._x, self._y, self._f  # never changed in place: add() builds new tensors

    def restore(self, token: tuple[Any, ...]) -> None:
        self._x, self._y, self._f = token

    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "k": self.k,
            "x": None if self._x is None else self._x.clone(),
            "y": None if self._y is None else self._y.clone(),
            "f": None if self._f is None else self._f.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (int(state["capacity"]), int(state["k"])) != (self.capacity, self.k):
            raise ValueError(
                f"state was saved with capacity={state['capacity']}, k={state['k']}; this replay "
                f"has capacity={self.capacity}, k={self.k}"
            )
        self._x, self._y, self._f = state["x"], state["y"], state["f"]
