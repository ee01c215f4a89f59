"""FIFO buffer of labelled samples replayed at every step (the paper's BFS = 300 variant)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["LabelBuffer"]


class LabelBuffer:
    """Keeps the last ``capacity`` labelled samples; draws random mini-batches of them.

    Storage is allocated on the first :meth:`add` on the samples' device and dtype. Draws use the
    buffer's own CPU generator, saved in ``state_dict``.
    """

    def __init__(self, capacity: int = 300, batch_size: int = 32, seed: int = 0) -> None:
        if capacity < 1 or batch_size < 1:
            raise ValueError(
                f"buffer capacity and batch_size must be >= 1, got {capacity}, {batch_size}"
            )
        self.capacity = capacity
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self._initial_rng = self.generator.get_state()
        self._x: Tensor | None = None
        self._y: Tensor | None = None
        self._start = 0  # position of the oldest sample in the ring
        self._size = 0
        self._journal: list[tuple[int, Tensor, Tensor]] | None = None

    def __len__(self) -> int:
        return self._size

    def add(self, x: Tensor, y: Tensor) -> None:
        """Append samples (oldest evicted first when full), on the storage's device."""
        x, y = x.detach(), y.detach()
        if self._x is None:
            self._x = x.new_empty((self.capacity, *x.shape[1:]))
            self._y = y.new_empty((self.capacity,), dtype=torch.long)
        assert self._y is not None
        if x.shape[1:] != self._x.shape[1:]:
            raise ValueError(
                f"buffer holds samples of shape {tuple(self._x.shape[1:])}, "
                f"got {tuple(x.shape[1:])}"
            )
        for i in range(x.shape[0]):
            slot = (self._start + self._size) % self.capacity
            if self._size == self.capacity:
                if self._journal is not None:  # keep what is overwritten, for restore()
                    self._journal.append((slot, self._x[slot].clone(), self._y[slot].clone()))
                self._start = (self._start + 1) % self.capacity
            else:
                self._size += 1
            self._x[slot] = x[i]
            self._y[slot] = y[i]

    def snapshot(self) -> tuple[Any, ...]:
        """A token for :meth:`restore`: positions, the generator's state and a journal of the
        samples overwritten from now on (one small copy per evicted sample, no full copy)."""
        self._journal = []
        return (self._x is None, self._start, self._size, self.generator.get_state(), self._journal)

    def restore(self, token: tuple[Any, ...]) -> None:
        """Undo every change since :meth:`snapshot` returned ``token``."""
        empty, start, size, rng, journal = token
        if self._x is not None and self._y is not None:
            for slot, xv, yv in reversed(journal):
                self._x[slot] = xv
                self._y[slot] = yv
        journal.clear()
        self._journal = None
        if empty:
            self._x = self._y = None
        self._start, self._size = start, size
        self.generator.set_state(rng)

    def to(self, device: torch.device | str) -> LabelBuffer:
        """Move the stored samples to ``device`` (the generator stays on the CPU)."""
        if self._x is not None and self._y is not None:
            self._x, self._y = self._x.to(device), self._y.to(device)
        return self

    def contents(self) -> tuple[Tensor, Tensor]:
        """All buffered samples, oldest first."""
        if self._x is None or self._y is None or self._size == 0:
            raise ValueError("buffer is empty")
        order = (torch.arange(self._size) + self._start) % self.capacity
        order = order.to(self._x.device)
        return self._x[order], self._y[order]

    def sample(self) -> tuple[Tensor, Tensor]:
        """A random mini-batch of ``min(batch_size, len(self))`` distinct samples."""
        if self._x is None or self._y is None or self._size == 0:
            raise ValueError("buffer is empty")
        n = min(self.batch_size, self._size)
        pick = torch.randperm(self._size, generator=self.generator)[:n]
        slots = ((pick + self._start) % self.capacity).to(self._x.device)
        return self._x[slots], self._y[slots]

    def reset(self) -> None:
        self._x = self._y = None
        self._start = self._size = 0
        self._journal = None
        self.generator.set_state(self._initial_rng)

    def state_dict(self) -> dict[str, Any]:
        if self._size:
            x, y = self.contents()
            x, y = x.clone(), y.clone()
        else:
            x = y = None
        return {"x": x, "y": y, "rng": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        self.generator.set_state(state["rng"])
        if state["x"] is not None:
            self.add(state["x"], state["y"])
