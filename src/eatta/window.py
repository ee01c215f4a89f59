"""A window of recent samples: how a method adapts on requests of 1 to a few samples.

BatchNorm normalizes with the statistics of the batch, so a batch of a few samples gives noisy
statistics and, adapted on, collapses the model (docs/small-batches.md); a batch of 1 cannot be
normalized at all. With a window (``eatta.create(name, model, window=64)`` or
:meth:`eatta.AdaptiveMethod.set_window`), each request is served by the current model on
:class:`~eatta.normalization.MixedBatchNorm`'s EMA statistics (no dependence on the request's
size), its samples join a :class:`SampleWindow` of the last ``size`` samples, and every
``every`` samples the method takes its usual step on the window, as if the window were a batch
(a method's budget then counts these steps). After the step the window's statistics, under the
updated parameters, are folded into the EMA.

The window is a part of any method (``Tent(..., window=64)``, :mod:`eatta.methods.parts`, which
serves the requests between steps and steps on the window when one is due); this module holds the
window itself.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "SMALL_BATCH",
    "SMALL_REQUEST",
    "WINDOW_MOMENTUM",
    "WINDOW_REFRESH",
    "SampleWindow",
    "SmallBatchWarning",
    "check_window",
]

#: The EMA rate of the statistics a window serves requests with (``eatta.create(...,
#: window_momentum=)``): 1, the last window's statistics. Chosen on digits-C recurring, seed 100,
#: one round, batches of 8 (docs/small-batches.md): TENT's error 42.2 / 44.5 / 50.2 / 63.9 % at
#: rates 1 / 0.5 / 0.2 / 0.05 (RoTTA's 0.05 lags far behind domains of ~900 samples).
WINDOW_MOMENTUM = 1.0

#: Samples between refreshes of the served statistics from the window, between steps
#: (``eatta.create(..., window_refresh=)``; None: at steps only). Same stream and seed as
#: :data:`WINDOW_MOMENTUM`: TENT 42.2 % without, 41.3 % with a refresh every 16 samples (batch
#: 64: 40.1 %); it shortens the lag behind a new condition for a forward pass of the window.
WINDOW_REFRESH = 16

#: Batches smaller than this, on a model that normalizes with batch statistics and has no window
#: set, get a :class:`SmallBatchWarning` (digits-C: TENT's error rises from 40 % at 64 to 67 %
#: at 8 and 89 % at 2; docs/small-batches.md).
SMALL_BATCH = 32

#: Batches smaller than this, on a model without batch statistics (LayerNorm, GroupNorm) and with
#: no window set, get a :class:`SmallBatchWarning` too: each step then follows a few samples'
#: gradient. On the digits ViT (docs/benchmarks.md, at equal labels per sample and step per
#: sample) TENT lost 4.8 points and ``eatta-stable`` 4.2 at batch 1, where at batch 8
#: ``eatta-stable`` held (−0.3); one model, so the bound is a guess elsewhere.
SMALL_REQUEST = 8


class SmallBatchWarning(UserWarning):
    """A model adapts on batches too small: for BatchNorm statistics (under
    :data:`SMALL_BATCH`), or for a step to average over (under :data:`SMALL_REQUEST`)."""


def check_window(size: object, every: object = None) -> tuple[int, int]:
    """``(size, every)`` validated: a window of at least 2 samples, a step every ``every >= 1``
    samples (default: ``size``). Errors name the value."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"window must be an int number of samples, got {size!r}")
    if size < 2:
        raise ValueError(
            f"window must hold at least 2 samples (BatchNorm needs 2 to normalize), got {size}"
        )
    if every is None:
        every = size
    if isinstance(every, bool) or not isinstance(every, int):
        raise TypeError(f"window every must be an int number of samples, got {every!r}")
    if every < 1:
        raise ValueError(f"window every must be >= 1 sample, got {every}")
    return size, every


class SampleWindow:
    """The last ``size`` samples served and, for simulations, their labels (-1 where unknown:
    a simulated annotator then abstains), and when the next step is due (every ``every``
    samples).

    A ring buffer allocated on the first sample; ``contents_with`` reads the window as it would
    be after a request without changing it, and ``commit`` records the request, so a step that
    fails leaves the window as it was.
    """

    def __init__(self, size: int, every: int | None = None, refresh: int | None = None) -> None:
        self.size, self.every = check_window(size, every)
        if refresh is not None and (
            isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 1
        ):
            raise ValueError(f"window refresh must be None or an int >= 1 sample, got {refresh!r}")
        #: samples between refreshes of the served statistics without a step (None: at steps only)
        self.refresh = refresh
        self.since_refresh = 0
        self._x: Tensor | None = None
        self._y: Tensor | None = None
        self.filled = 0  # samples held (at most size)
        self.pos = 0  # next slot to write
        self.since = 0  # samples since the last step
        self.steps = 0  # steps taken on the window
        self.samples = 0  # samples seen

    # -- reading -----------------------------------------------------------------------------
    def due_after(self, n: int) -> bool:
        """Whether a request of ``n`` samples completes ``every`` samples since the last step
        (with at least 2 samples in the window)."""
        return self.since + n >= self.every and min(self.filled + n, self.size) >= 2

    def contents_with(self, x: Tensor, y: Tensor | None) -> tuple[Tensor, Tensor]:
        """The window, oldest first, after adding ``x`` (labels ``y``, or unknown)."""
        y = _labels_for(x, y)
        if self._x is None or self.filled == 0:
            return x[-self.size :], y[-self.size :]
        keep = min(self.filled, self.size - min(len(x), self.size))
        if keep == 0:
            return x[-self.size :], y[-self.size :]
        idx = (torch.arange(self.pos - keep, self.pos) % self.size).to(self._x.device)
        assert self._y is not None  # allocated with _x
        return (
            torch.cat([self._x[idx], x])[-self.size :],
            torch.cat([self._y[idx.cpu()], y])[-self.size :],
        )

    def contents(self) -> Tensor:
        """The samples held, oldest first."""
        if self._x is None or self.filled == 0:
            raise RuntimeError("the window is empty")
        idx = (torch.arange(self.pos - self.filled, self.pos) % self.size).to(self._x.device)
        return self._x[idx]

    def refresh_due(self) -> bool:
        """Whether the served statistics are due a refresh from the window (no step)."""
        return self.refresh is not None and self.since_refresh >= self.refresh and self.filled >= 2

    def refreshed(self) -> None:
        self.since_refresh = 0

    # -- writing -----------------------------------------------------------------------------
    def commit(self, x: Tensor, y: Tensor | None, *, stepped: bool) -> None:
        """Add a request's samples (and labels) and, if a step was taken on the window, count it."""
        y = _labels_for(x, y)
        if self._x is None or self._x.shape[1:] != x.shape[1:] or self._x.dtype != x.dtype:
            self._x = x.new_zeros((self.size, *x.shape[1:]))
            self._y = torch.full((self.size,), -1, dtype=torch.long)
            self.filled = self.pos = 0
        x, y = x[-self.size :].detach(), y[-self.size :]
        assert self._y is not None
        end = self.pos + len(x)
        if end <= self.size:  # no wrap: a plain slice copy (a single request's path, kept cheap)
            self._x[self.pos : end] = x.to(self._x.device)
            self._y[self.pos : end] = y
        else:
            slots = (torch.arange(len(x)) + self.pos) % self.size
            self._x[slots.to(self._x.device)] = x.to(self._x.device)
            self._y[slots] = y
        self.pos = (self.pos + len(x)) % self.size
        self.filled = min(self.filled + len(x), self.size)
        self.samples += len(x)
        self.since += len(x)
        self.since_refresh += len(x)
        if stepped:
            self.since -= self.every
            self.steps += 1

    def passed(self, x: Tensor, y: Tensor | None) -> None:
        """A batch of ``size`` samples or more, stepped on as given: it fills the window and the
        count of samples since the last step starts again (it is no window step)."""
        self.commit(x, y, stepped=False)
        self.since = 0

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty the window and the counters."""
        self._x = self._y = None
        self.filled = self.pos = self.since = self.steps = self.samples = 0
        self.since_refresh = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "every": self.every,
            "x": None if self._x is None else self._x.clone(),
            "y": None if self._y is None else self._y.clone(),
            "filled": self.filled,
            "pos": self.pos,
            "since": self.since,
            "steps": self.steps,
            "samples": self.samples,
            "since_refresh": self.since_refresh,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["size"], state["every"]) != (self.size, self.every):
            raise ValueError(
                f"this state is of a window of {state['size']} samples stepping every "
                f"{state['every']}; this window holds {self.size}, every {self.every}"
            )
        self._x = None if state["x"] is None else state["x"].clone()
        self._y = None if state["y"] is None else state["y"].clone()
        for key in ("filled", "pos", "since", "steps", "samples"):
            setattr(self, key, int(state[key]))
        self.since_refresh = int(state.get("since_refresh", 0))

    def to(self, device: torch.device) -> SampleWindow:
        if self._x is not None:  # the labels stay on the CPU, where the annotators read them
            self._x = self._x.to(device)
        return self

    def __repr__(self) -> str:
        return f"SampleWindow(size={self.size}, every={self.every}, refresh={self.refresh})"


def _labels_for(x: Tensor, y: Tensor | None) -> Tensor:
    if y is None:
        return torch.full((len(x),), -1, dtype=torch.long)
    return torch.as_tensor(y).to(torch.long).reshape(-1).cpu()
