"""A window of recent samples: how a method adapts on requests of 1 to a few samples.

BatchNorm normalizes with the statistics of the batch, so a batch of a few samples gives noisy
statistics and, adapted on, collapses the model (docs/small-batches.md); a batch of 1 cannot be
normalized at all. With a window (``eatta.create(name, model, window=64)``, or the same keyword
to any method's constructor), each request is served by the current model on
:class:`~eatta.normalization.MixedBatchNorm`'s EMA statistics (no dependence on the request's
size), its samples join a :class:`SampleWindow` of the last ``size`` samples, and every
``every`` samples the method takes its usual step on the window, as if the window were a batch
(a method's budget then counts these steps). After the step the window's statistics, under the
updated parameters, are folded into the EMA.

The window is a part of any method (``Tent(..., window=64)``): a
:class:`~eatta.hooks.Hook` that, before each step, serves a request smaller than the
window with the current model and chooses what the step adapts on (the window's samples when a
step is due, else nothing), and after it folds the step's statistics into the served ones.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from eatta._warn import warn_at_caller
from eatta.hooks import Batch, HostMethod
from eatta.normalization import (
    MixedBatchNorm,
    absorb_statistics,
    batch_statistics,
    use_mixed_norm,
)

__all__ = [
    "SMALL_BATCH",
    "SMALL_REQUEST",
    "WINDOW_MOMENTUM",
    "WINDOW_REFRESH",
    "SampleWindow",
    "SmallBatchWarning",
    "check_window",
    "small_batch_advice",
    "warn_small_batch",
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


#: How :class:`SmallBatchWarning` tells the user to set a window and to turn windowing off, in
#: the terms of whoever runs the method (a command line sets its own flags: ``--window 64``).
_ADVICE: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar(
    "eatta_small_batch_advice",
    default=("eatta.create(name, model, window=64)", "window=False"),
)


@contextmanager
def small_batch_advice(window: str, off: str) -> Iterator[None]:
    """Within, :class:`SmallBatchWarning` suggests ``window`` to set a window and ``off`` to
    turn windowing off (a command line's flags: ``"--window 64"``, ``"--window off"``)."""
    token = _ADVICE.set((window, off))
    try:
        yield
    finally:
        _ADVICE.reset(token)


def warn_small_batch(method: HostMethod, x: Tensor, window_off: bool) -> bool:
    """Warn (:class:`SmallBatchWarning`) when a method without a window adapts on a small batch
    ``x``: under :data:`SMALL_BATCH` samples on a BatchNorm model (:data:`SMALL_REQUEST` on
    another, LayerNorm or GroupNorm). Returns whether it warned: a method calls it on its first
    such batch, whatever came before it, and warns once."""
    if window_off:
        return False
    batchnorm = method.has_batchnorm
    if x.shape[0] >= (SMALL_BATCH if batchnorm else SMALL_REQUEST):
        return False
    n, name = x.shape[0], type(method).__name__
    why = (
        f"{name} adapts a BatchNorm model on batches of {n} samples: their statistics are too "
        "noisy to normalize and adapt on, and the error can rise far above the source "
        "model's (docs/small-batches.md)"
        if batchnorm
        else f"{name} takes a step on every batch of {n} samples: each follows so few "
        "samples' gradient that the error can drift up (the digits ViT lost 4-5 points at "
        "batch 1; docs/benchmarks.md)"
    )
    window, off = _ADVICE.get()
    warn_at_caller(
        f"{why}. Adapt on a window of recent samples ({window}), or turn this warning off ({off})",
        SmallBatchWarning,
    )
    return True


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

    #: the part's keyword and state key (:class:`~eatta.hooks.Hook`)
    name = "window"
    #: the window is emptied by every reset
    measures = False

    def __init__(
        self,
        size: int,
        every: int | None = None,
        refresh: int | None = None,
        momentum: float = WINDOW_MOMENTUM,
    ) -> None:
        self.size, self.every = check_window(size, every)
        if isinstance(momentum, bool) or not isinstance(momentum, int | float):
            raise TypeError(f"window momentum must be a number in (0, 1], got {momentum!r}")
        if not 0 < momentum <= 1:
            raise ValueError(f"window momentum must be in (0, 1], got {momentum!r}")
        #: the EMA rate of the statistics requests are served with
        self.momentum = float(momentum)
        if refresh is not None and (
            isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 1
        ):
            raise ValueError(f"window refresh must be None or an int >= 1 sample, got {refresh!r}")
        #: samples between refreshes of the served statistics without a step (None: at steps only)
        self.refresh = refresh
        self._labels: Tensor | None = None  # the request in progress's known labels
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
        return (
            f"SampleWindow(size={self.size}, every={self.every}, refresh={self.refresh}, "
            f"momentum={self.momentum})"
        )

    # -- as a part of a method ---------------------------------------------------------------
    @classmethod
    def build(cls, method: HostMethod, parts: Mapping[str, Any]) -> SampleWindow | None:
        """The window a method's keywords ask for (:class:`~eatta.methods.base.Parts`:
        ``window``, and ``window_every``, ``window_refresh``, ``window_momentum`` with a number of
        samples; a ``window_refresh`` of None: refreshed at steps only), set up on ``method``.
        None: no window."""
        window = parts.get("window")
        options = [k for k in ("window_every", "window_refresh", "window_momentum") if k in parts]
        if window is True:
            raise TypeError("window=True is ambiguous: give a number of samples, e.g. window=64")
        if window is None or window is False or isinstance(window, SampleWindow):
            if options:
                where = "the SampleWindow" if isinstance(window, SampleWindow) else "window="
                raise TypeError(f"{', '.join(options)} set(s) up a window: give them to {where}")
            if not isinstance(window, SampleWindow):
                return None
            built = window
        else:
            momentum = parts.get("window_momentum")
            built = cls(
                window,
                parts.get("window_every"),
                parts.get("window_refresh", WINDOW_REFRESH),
                WINDOW_MOMENTUM if momentum is None else momentum,
            )
        built.setup(method)
        return built

    def setup(self, method: HostMethod) -> None:
        """Check that ``method`` adapts, and swap the model's BatchNorm layers for
        :class:`~eatta.normalization.MixedBatchNorm` serving on EMA statistics at rate
        :attr:`momentum` (layers swapped already must serve so)."""
        if not method.adapts:
            raise ValueError(
                f"{type(method).__name__} does not adapt: a window has nothing to step"
            )
        use_mixed_norm(method.model, stats="ema", momentum=self.momentum)
        for name, m in method.model.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and not (
                isinstance(m, MixedBatchNorm) and m.stats == "ema" and not m.update
            ):
                setting = ""
                if isinstance(m, MixedBatchNorm):
                    setting = f" with stats={m.stats!r}, update={m.update}"
                raise ValueError(
                    f"a window serves requests on the EMA statistics of MixedBatchNorm layers, "
                    f"and layer {name!r} is a {type(m).__name__}{setting}"
                )

    def check(self, method: HostMethod, batch: Batch) -> None:
        """Nothing to refuse: any request joins the window."""

    def _known(self, method: HostMethod, batch: Batch) -> Tensor | None:
        """The request's labels for the window (a simulated annotator's), if known: the ones
        given, else the oracle's, else a part's auditor's, so that a step on the window can
        audit its older samples too."""
        if batch.labels is not None:
            return batch.labels
        oracle = getattr(method, "oracle", None)
        for taker in method.label_takers():
            known: Tensor | None = getattr(taker, "batch_labels", None)
            if known is None:
                continue
            if len(known) != batch.x.shape[0]:
                who = "oracle" if taker is oracle else "auditor"
                raise ValueError(
                    f"the {who} holds {len(known)} labels for a request of {batch.x.shape[0]} "
                    "samples; give each request its own (method(x, labels=y))"
                )
            return known
        return None

    def before_step(self, method: HostMethod, batch: Batch) -> None:
        """A request of ``size`` samples or more is stepped on as given; a smaller one is served
        by the current model (no step), and completes the window's step when one is due."""
        x = batch.x
        self._labels = self._known(method, batch)
        batch.around.append(batch_statistics)
        if x.shape[0] >= self.size:
            return
        with torch.no_grad():
            batch.adapted = method.logits(x)
        if not self.due_after(x.shape[0]):
            batch.step_x = batch.step_labels = None
            return
        wx, wy = self.contents_with(x, self._labels)
        oracle = getattr(method, "oracle", None)
        if bool((wy >= 0).any()) and hasattr(oracle, "set_labels"):
            oracle.set_labels(wy)  # type: ignore[union-attr]  # checked just above
        batch.step_x, batch.step_labels = wx, wy

    def after_step(self, method: HostMethod, batch: Batch) -> None:
        """Fold the step's statistics, under the updated parameters, into the served ones; then
        the request joins the window."""
        x, model = batch.x, method.model
        if batch.stepped:
            assert batch.step_x is not None
            absorb_statistics(model, batch.step_x)
        if x.shape[0] >= self.size:  # a full batch: stepped on as given, it fills the window
            self.passed(x, self._labels)
        elif batch.stepped:
            self.commit(x, self._labels, stepped=True)
            self.refreshed()
        else:
            self.commit(x, self._labels, stepped=False)
            if self.refresh_due():
                absorb_statistics(model, self.contents())
                self.refreshed()
        self._labels = None


def _labels_for(x: Tensor, y: Tensor | None) -> Tensor:
    if y is None:
        return torch.full((len(x),), -1, dtype=torch.long)
    return torch.as_tensor(y).to(torch.long).reshape(-1).cpu()
