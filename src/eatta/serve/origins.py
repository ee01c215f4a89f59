"""Where a label request's sample came from: the inference request's id and the row in it.

The method asks about a sample of the batch it steps on (its window's samples, which came from
several inference requests), by position in that batch. :class:`Origins` keeps the last samples
the adapter handed to the method, in order, with the ``(request id, row)`` each came from, and
finds a label request's sample among them: first at the position the window's order gives, then,
if the values differ there (the window was reset), by value, newest first. The label queue calls
:meth:`Origins.of` when the method submits (``LabelQueue(origin=...)``), and the page lists the
result as ``request_id`` and ``row``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from eatta.annotate.requests import LabelRequest

__all__ = ["Origins"]


class Origins:
    """The last ``keep`` samples handed to the method and where each came from.

    Args:
        keep: samples kept (the window's size plus the largest batch covers every sample a
            step can ask about).
        window: the window's size (None: the method steps on each batch as given).
    """

    def __init__(self, keep: int, window: int | None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep, self.window = keep, window
        self._recent: collections.deque[tuple[Tensor, str, int]] = collections.deque(maxlen=keep)
        self._last_rows = 0
        self._lock = threading.Lock()

    def add(self, x: Tensor, origins: Sequence[tuple[str, int]]) -> None:
        """The batch ``x`` the method is about to be given, and the origin of each row."""
        if len(origins) != x.shape[0]:
            raise ValueError(f"{len(origins)} origins for {x.shape[0]} rows")
        with self._lock:
            for sample, (name, row) in zip(x, origins, strict=True):
                self._recent.append((sample, name, row))
            self._last_rows = int(x.shape[0])

    def of(self, request: LabelRequest) -> tuple[str, int] | None:
        """``(request id, row)`` of the sample ``request`` asks about; None if not found."""
        with self._lock:
            recent = list(self._recent)
            rows = self._last_rows
        if not recent:
            return None
        if self.window is None or rows >= self.window:
            span = min(rows, len(recent))  # the last batch, stepped on as given
        else:
            span = min(self.window, len(recent))  # the window, oldest first, ending with it
        sample = request.sample.detach().to("cpu")
        guess = len(recent) - span + request.index
        if 0 <= request.index < span and _same(recent[guess][0], sample):
            return recent[guess][1], recent[guess][2]
        for kept, name, row in reversed(recent):
            if _same(kept, sample):
                return name, row
        return None

    def state_dict(self, held: int) -> dict[str, Any]:
        """The origins of the last ``held`` samples (those a restored window holds)."""
        with self._lock:
            last = list(self._recent)[-held:] if held > 0 else []
        return {"origins": [(name, row) for _, name, row in last]}

    def load_state_dict(self, state: dict[str, Any], samples: Tensor | None) -> None:
        """Pair the saved origins with ``samples`` (the restored window's, oldest first); they
        are dropped when the counts differ."""
        saved = [(str(name), int(row)) for name, row in state.get("origins", [])]
        with self._lock:
            self._recent.clear()
            self._last_rows = 0
            if samples is None or len(saved) != samples.shape[0]:
                return
            for sample, (name, row) in zip(samples.detach().to("cpu"), saved, strict=True):
                self._recent.append((sample, name, row))


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
