"""FIFO buffer of labelled samples replayed at every step (the paper's BFS = 300 variant)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["LabelBuffer", "make_buffer"]


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
        self._store: tuple[Tensor, Tensor] | None = None  # (samples, labels), allocated on add
        self._start = 0  # position of the oldest sample in the ring
        self._size = 0
        self._journal: list[tuple[int, Tensor, Tensor]] | None = None

    def __len__(self) -> int:
        return self._size

    def add(self, x: Tensor, y: Tensor) -> None:
        """Append samples (oldest evicted first when full), on the storage's device."""
        x, y = x.detach(), y.detach()
        if self._store is None:
            self._store = (
                x.new_empty((self.capacity, *x.shape[1:])),
                y.new_empty((self.capacity,), dtype=torch.long),
            )
        xs, ys = self._store
        if x.shape[1:] != xs.shape[1:]:
            raise ValueError(
                f"buffer holds samples of shape {tuple(xs.shape[1:])}, got {tuple(x.shape[1:])}"
            )
        for i in range(x.shape[0]):
            slot = (self._start + self._size) % self.capacity
            if self._size == self.capacity:
                if self._journal is not None:  # keep what is overwritten, for restore()
                    self._journal.append((slot, xs[slot].clone(), ys[slot].clone()))
                self._start = (self._start + 1) % self.capacity
            else:
                self._size += 1
            xs[slot] = x[i]
            ys[slot] = y[i]

    def snapshot(self) -> tuple[Any, ...]:
        """A token for :meth:`restore`: positions, the generator's state and a journal of the
        samples overwritten from now on (one small copy per evicted sample, no full copy)."""
        self._journal = []
        return (
            self._store is None,
            self._start,
            self._size,
            self.generator.get_state(),
            self._journal,
        )

    def restore(self, token: tuple[Any, ...]) -> None:
        """Undo every change since :meth:`snapshot` returned ``token``."""
        empty, start, size, rng, journal = token
        if self._store is not None:
            xs, ys = self._store
            for slot, xv, yv in reversed(journal):
                xs[slot] = xv
                ys[slot] = yv
        journal.clear()
        self._journal = None
        if empty:
            self._store = None
        self._start, self._size = start, size
        self.generator.set_state(rng)

    def to(self, device: torch.device | str) -> LabelBuffer:
        """Move the stored samples to ``device`` (the generator stays on the CPU)."""
        if self._store is not None:
            self._store = (self._store[0].to(device), self._store[1].to(device))
        return self

    def contents(self) -> tuple[Tensor, Tensor]:
        """All buffered samples, oldest first."""
        xs, ys = self._filled()
        order = (torch.arange(self._size) + self._start) % self.capacity
        order = order.to(xs.device)
        return xs[order], ys[order]

    def sample(self) -> tuple[Tensor, Tensor]:
        """A random mini-batch of ``min(batch_size, len(self))`` distinct samples."""
        xs, ys = self._filled()
        n = min(self.batch_size, self._size)
        pick = torch.randperm(self._size, generator=self.generator)[:n]
        slots = ((pick + self._start) % self.capacity).to(xs.device)
        return xs[slots], ys[slots]

    def _filled(self) -> tuple[Tensor, Tensor]:
        if not self._size:
            raise ValueError("buffer is empty")
        assert self._store is not None  # samples were added
        return self._store

    def reset(self) -> None:
        self._store = None
        self._start = self._size = 0
        self._journal = None
        self.generator.set_state(self._initial_rng)

    def state_dict(self) -> dict[str, Any]:
        if self._size:
            x, y = self.contents()
            x, y = x.clone(), y.clone()
        else:
            x = y = None  # type: ignore[assignment]  # an empty buffer saves None
        return {"x": x, "y": y, "rng": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        self.generator.set_state(state["rng"])
        if state["x"] is not None:
            self.add(state["x"], state["y"])


def make_buffer(spec: LabelBuffer | int | None, *, seed: int = 0) -> LabelBuffer | None:
    """A replay buffer from a capacity (an int; 0 or None: no buffer) or an instance (returned
    as it is): ``buffer=`` takes either, in ``eatta.create`` and the class API."""
    if spec is None or isinstance(spec, LabelBuffer):
        return spec
    if isinstance(spec, bool) or not isinstance(spec, int):
        raise TypeError(
            f"buffer must be a capacity (int), a LabelBuffer or None, got {type(spec).__name__}"
        )
    if spec < 0:
        raise ValueError(f"buffer capacity must be >= 0, got {spec}")
    return LabelBuffer(spec, seed=seed) if spec else None
