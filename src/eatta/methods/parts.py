"""The parts that hook around any method's step: how a request is served with them.

Four parts compose with every method, given to its constructor or to
:meth:`~eatta.methods.base.AdaptiveMethod.attach` (the keywords of :class:`Parts`):

- ``window``: a window of recent samples (:mod:`eatta.window`) for requests of 1 to a few: a
  smaller request is served between steps and joins the window, and the method steps on the
  window every ``every`` samples;
- ``fallback``: the given model one step away (:class:`eatta.monitor.SourceFallback`): it
  predicts before each step (a window's too), decides after it what is served, and serves the
  requests between steps from whichever model it serves;
- ``monitor``: audited accuracy and a guard (:class:`eatta.monitor.AccuracyMonitor`), told of
  every request once it is served;
- ``weight_anchor``: after each step that updated the model, its weights are pulled back toward
  the given model's (:class:`WeightAnchor`).

:class:`StepParts` holds them for one method (:class:`WithParts` gives them as its attributes)
and runs each request through them::

    a request smaller than the window:  served by the current model -> joins the window
                                        -> a step on the window, when one is due
                                        -> monitor.observe -> fallback.serve
    any other request:                  a step on it -> monitor.observe -> fallback.after

    a step:  fallback.before -> the method's transaction (AdaptiveMethod.step)
             -> the anchor's pull -> with a window, its statistics folded into the served ones
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from typing_extensions import Protocol, TypedDict, Unpack

from eatta._warn import warn_at_caller
from eatta.normalization import MixedBatchNorm, absorb_statistics, batch_statistics
from eatta.window import SMALL_BATCH, SMALL_REQUEST, SampleWindow, SmallBatchWarning

__all__ = [
    "HostMethod",
    "Parts",
    "StepFallback",
    "StepObserver",
    "StepParts",
    "WeightAnchor",
    "WithParts",
]


class HostMethod(Protocol):
    """What the parts need of the method they serve (:class:`eatta.methods.base.AdaptiveMethod`,
    declared here so that the two modules need not import each other)."""

    adapts: ClassVar[bool]
    model: nn.Module

    @property
    def params(self) -> list[nn.Parameter]: ...

    @property
    def has_batchnorm(self) -> bool: ...

    def step(self, x: Tensor) -> Tensor: ...

    def params_at_creation(self) -> list[tuple[nn.Parameter, Tensor]]: ...


class StepObserver(Protocol):
    """What runs after each request is served and is saved with the method: the accuracy
    monitor (:class:`eatta.monitor.AccuracyMonitor`), declared here so that the two modules need
    not import each other. An optional ``bind(method)`` checks, when it is attached, that it can
    act."""

    auditor: object

    def observe(self, method: Any, x: Tensor, logits: Tensor, labels: Tensor | None) -> None: ...

    def reset(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class StepFallback(Protocol):
    """What chooses the served predictions around each step: the source-model fallback
    (:class:`eatta.monitor.SourceFallback`).

    ``bind`` checks, when it is attached, that it can act for the method; ``check`` validates a
    request before anything changes; ``before``/``after`` surround each step (``after`` decides
    and returns what is served; ``served=False`` for a window's step); ``serve`` chooses the
    predictions of a request served between steps (a window)."""

    auditor: object

    def bind(self, method: Any) -> None: ...

    def check(self, x: Tensor, labels: Tensor | None) -> None: ...

    def before(self, x: Tensor) -> None: ...

    def after(
        self,
        method: Any,
        x: Tensor,
        logits: Tensor,
        labels: Tensor | None,
        *,
        served: bool = True,
    ) -> Tensor: ...

    def serve(self, x: Tensor, logits: Tensor) -> Tensor: ...

    def reset(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Parts(TypedDict, total=False):
    """The parts every method's constructor and :meth:`~eatta.methods.base.AdaptiveMethod.attach`
    take (None: leave that part as it is)."""

    #: a number of samples or a :class:`~eatta.window.SampleWindow`; False: windowing off
    window: int | bool | SampleWindow | None
    #: the given model beside the adapted one (:class:`eatta.monitor.SourceFallback`)
    fallback: StepFallback | None
    #: audited accuracy and a guard (:class:`eatta.monitor.AccuracyMonitor`)
    monitor: StepObserver | None
    #: ``α`` of :class:`WeightAnchor`, in (0, 1]
    weight_anchor: float | None


class WeightAnchor:
    """The adapted weights pulled back toward the given model's after each step that updated
    them (ROID's weight ensembling; Marsden et al., WACV 2024)::

        θ ← α·θ + (1 − α)·θ₀

    for every parameter ``θ`` the method's optimizer updates, ``θ₀`` its value when the method
    was created (what :meth:`~eatta.methods.base.AdaptiveMethod.reset` restores). ``α`` in
    (0, 1]: ROID's 0.99 keeps 99 % of each step's weights; 1 changes nothing. A step that wrote
    none of the parameters (a method that skipped its update) is not pulled.
    """

    def __init__(self, alpha: float) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, int | float):
            raise TypeError(f"weight_anchor must be a number in (0, 1], got {alpha!r}")
        if not (math.isfinite(alpha) and 0 < alpha <= 1):
            raise ValueError(f"weight_anchor must be in (0, 1] (1: no pull), got {alpha!r}")
        self.alpha = float(alpha)
        self._pairs: list[tuple[nn.Parameter, Tensor]] = []  # (θ, θ₀), set by bind

    def bind(self, method: HostMethod) -> None:
        """Anchor ``method``'s parameters to their values at its creation."""
        if not method.adapts or not method.params:
            raise ValueError(
                f"{type(method).__name__} updates no parameter: a weight anchor has nothing to pull"
            )
        self._pairs = method.params_at_creation()

    @contextmanager
    def pulling(self) -> Iterator[None]:
        """Around a step: once it has returned, pull the parameters back if it wrote any (a
        parameter's version counts its in-place changes)."""
        versions = [theta._version for theta, _ in self._pairs]
        yield
        if any(theta._version != v for (theta, _), v in zip(self._pairs, versions, strict=True)):
            self.pull()

    @torch.no_grad()
    def pull(self) -> None:
        """``θ ← α·θ + (1 − α)·θ₀`` for every anchored parameter (α = 1: nothing to do)."""
        a = self.alpha
        if a == 1:
            return
        for i, (theta, theta0) in enumerate(self._pairs):
            if theta0.device != theta.device or theta0.dtype != theta.dtype:  # the model moved:
                theta0 = theta0.to(theta)  # θ₀ follows it once, not a copy every step
                self._pairs[i] = (theta, theta0)
            theta.copy_(a * theta + (1 - a) * theta0)

    def __repr__(self) -> str:
        return f"WeightAnchor(alpha={self.alpha})"


class StepParts:
    """One method's parts and how a request is served with them (see the module docstring)."""

    def __init__(self, method: HostMethod) -> None:
        self.method = method
        self.window: SampleWindow | None = None
        self.window_off = False  # windowing turned off explicitly (window=False)
        self.fallback: StepFallback | None = None
        self.monitor: StepObserver | None = None
        self.anchor: WeightAnchor | None = None
        self._warned_small = False
        self._small_run = 0  # consecutive small batches (warned at the second)

    # -- attaching ---------------------------------------------------------------------------
    def attach(self, **parts: Unpack[Parts]) -> None:
        """Attach ``parts``: every one is checked, for the method and beside the others, before
        any is attached."""
        method = self.method
        unknown = set(parts) - set(Parts.__annotations__)
        if unknown:
            raise TypeError(
                f"unknown part(s) {', '.join(sorted(unknown))}; the parts are "
                f"{', '.join(Parts.__annotations__)}"
            )
        window, fallback = parts.get("window"), parts.get("fallback")
        monitor, alpha = parts.get("monitor"), parts.get("weight_anchor")
        if window is not None and window is not False:
            window = _check_window(method, window)
        anchor = None
        if alpha is not None:
            anchor = WeightAnchor(alpha)
            anchor.bind(method)
        for part in (fallback, monitor):
            bind = getattr(part, "bind", None)
            if bind is not None:
                bind(method)
        if window is not None:
            self.window, self.window_off = (None, True) if window is False else (window, False)
        if fallback is not None:
            self.fallback = fallback
        if monitor is not None:
            self.monitor = monitor
        if anchor is not None:
            self.anchor = anchor

    # -- a request ---------------------------------------------------------------------------
    def auditors(self) -> list[object]:
        """Who else may be given a simulated annotator's labels: the monitor's and the
        fallback's auditors."""
        return [p.auditor for p in (self.monitor, self.fallback) if p is not None]

    def check(self, x: Tensor, labels: Tensor | None) -> None:
        """The parts' checks of a request, before anything changes."""
        if self.fallback is not None:
            self.fallback.check(x, labels)

    def serve(self, x: Tensor, labels: Tensor | None, known: Tensor | None) -> Tensor:
        """Serve a checked request (``labels``: a simulated annotator's, ``known``: those the
        window keeps): between steps if it is smaller than the window, else with a step on it;
        the monitor observes it and the fallback chooses what is served."""
        if self.window is not None and x.shape[0] < self.window.size:
            out = self._between_steps(x, known)
            self._observe(x, out, labels)
            return out if self.fallback is None else self.fallback.serve(x, out)
        self._warn_small_batch(x)
        out = self.step(x)
        if self.window is not None:  # a full batch: stepped on as given, it fills the window
            self.window.passed(x, known)
        self._observe(x, out, labels)
        return self._decide(x, out, labels)

    def step(self, x: Tensor) -> Tensor:
        """One step on ``x`` (a request, or the window's samples) with the parts around it: the
        adapted model's logits before its update."""
        if self.fallback is not None:  # the given model's predictions, before the step
            self.fallback.before(x)
        anchored = self.anchor.pulling() if self.anchor is not None else nullcontext()
        norm = batch_statistics() if self.window is not None else nullcontext()
        with anchored, norm:
            out = self.method.step(x)
        if self.window is not None:  # the step's statistics join the ones requests are served on
            absorb_statistics(self.method.model, x)
        return out

    def _between_steps(self, x: Tensor, labels: Tensor | None) -> Tensor:
        """A request smaller than the window: the adapted model's logits on its robust
        statistics. The request joins the window; when a step is due, the method steps on the
        window (the fallback deciding, its predictions not served) before it is recorded."""
        window, model = self.window, self.method.model
        assert window is not None
        with torch.no_grad():
            out: Tensor = model(x)
        if not window.due_after(x.shape[0]):
            window.commit(x, labels, stepped=False)
            if window.refresh_due():
                absorb_statistics(model, window.contents())
                window.refreshed()
            return out
        wx, wy = window.contents_with(x, labels)
        oracle: Any = getattr(self.method, "oracle", None)
        if bool((wy >= 0).any()) and hasattr(oracle, "set_labels"):
            oracle.set_labels(wy)
        logits = self.step(wx)
        window.commit(x, labels, stepped=True)
        window.refreshed()
        self._decide(wx, logits, wy, served=False)
        return out

    def _decide(
        self, x: Tensor, logits: Tensor, labels: Tensor | None, *, served: bool = True
    ) -> Tensor:
        """After a step: the fallback scores its answers and decides; what is served."""
        if self.fallback is None:
            return logits
        return self.fallback.after(self.method, x, logits, labels, served=served)

    def _observe(self, x: Tensor, out: Tensor, labels: Tensor | None) -> None:
        if self.monitor is not None:  # after the step: audit, score, guard
            self.monitor.observe(self.method, x, out, labels)

    def _warn_small_batch(self, x: Tensor) -> None:
        """Once per method: a second batch in a row under :data:`~eatta.window.SMALL_BATCH`
        samples on a BatchNorm model (under :data:`~eatta.window.SMALL_REQUEST` on another),
        with no window decided (set or turned off)."""
        if self._warned_small or self.window_off or self.window is not None:
            return
        method = self.method
        if not method.adapts:
            return
        batchnorm = method.has_batchnorm
        if x.shape[0] >= (SMALL_BATCH if batchnorm else SMALL_REQUEST):
            self._small_run = 0
            return
        self._small_run += 1
        if self._small_run < 2:  # one short batch (a domain's remainder) is no small-batch stream
            return
        self._warned_small = True
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
        warn_at_caller(
            f"{why}. Create the method with a window of recent samples, "
            "eatta.create(name, model, window=64), or turn this off with set_window(False)",
            SmallBatchWarning,
        )

    # -- state -------------------------------------------------------------------------------
    def reset(self, *, keep_monitor: bool = False) -> None:
        """Empty the window; clear the monitor and the fallback unless ``keep_monitor``."""
        if self.window is not None:
            self.window.reset()
        if not keep_monitor:
            for watcher in (self.monitor, self.fallback):
                if watcher is not None:
                    watcher.reset()

    def signature(self) -> dict[str, Any]:
        """What a saved state must match: the window's size and step (only with a window, so
        that states saved without one load as before)."""
        return {} if self.window is None else {"window": [self.window.size, self.window.every]}

    def state_dict(self) -> dict[str, Any]:
        """The state of each part that has one (the window, the monitor, the fallback)."""
        state: dict[str, Any] = {}
        for name, part in (
            ("monitor", self.monitor),
            ("fallback", self.fallback),
            ("window", self.window),
        ):
            if part is not None:
                state[name] = part.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None) -> None:
        """Restore what :meth:`state_dict` returned (parts absent from it are left as they
        are); the window moves to ``device``."""
        if self.window is not None and state.get("window") is not None:
            self.window.load_state_dict(state["window"])
            if device is not None:
                self.window.to(device)
        for name, part in (("monitor", self.monitor), ("fallback", self.fallback)):
            if part is not None and state.get(name) is not None:
                part.load_state_dict(copy.deepcopy(state[name]))


class WithParts:
    """A method's parts as its attributes: a base class of
    :class:`~eatta.methods.base.AdaptiveMethod`, which creates their :class:`StepParts`."""

    _parts: StepParts

    def attach(self, **parts: Unpack[Parts]) -> None:
        """Attach parts (:class:`Parts`; None: leave that part as it is): each is checked, for
        this method and beside the others, before any is attached."""
        self._parts.attach(**parts)

    @property
    def window(self) -> SampleWindow | None:
        """The small-batch window (:meth:`set_window`); None: each batch adapted on as given."""
        return self._parts.window

    @property
    def fallback(self) -> StepFallback | None:
        """The source model beside the adapted one, served on evidence
        (:class:`eatta.monitor.SourceFallback`); None: the adapted model is always served."""
        return self._parts.fallback

    @fallback.setter
    def fallback(self, part: StepFallback | None) -> None:
        if part is None:
            self._parts.fallback = None
        else:
            self.attach(fallback=part)

    @property
    def monitor(self) -> StepObserver | None:
        """Audited accuracy and guard (:func:`eatta.monitor.attach`); None: no audits."""
        return self._parts.monitor

    @monitor.setter
    def monitor(self, part: StepObserver | None) -> None:
        if part is None:
            self._parts.monitor = None
        else:
            self.attach(monitor=part)

    @property
    def weight_anchor(self) -> WeightAnchor | None:
        """The pull back toward the given model's weights after each step; None: no pull."""
        return self._parts.anchor

    def set_window(
        self, size: int | bool | None, every: int | None = None, refresh: int | None = None
    ) -> None:
        """Adapt on a window of the last ``size`` samples, stepping every ``every`` (default
        ``size``) and refreshing the served statistics every ``refresh`` samples between steps
        (None: at steps only; :mod:`eatta.window`). ``False`` turns windowing off explicitly (no
        small-batch warning; a batch of 1 on a BatchNorm model is an error naming it); ``None``
        unsets it. The model's BatchNorm layers must be
        :class:`~eatta.normalization.MixedBatchNorm` with ``stats="ema"``
        (``eatta.create(..., window=64)`` swaps them in). Call it before the stream: the window
        is part of the method's state signature."""
        if size is None or size is False:
            self._parts.window, self._parts.window_off = None, size is False
            return
        self.attach(window=SampleWindow(size, every, refresh) if size is not True else size)


def _check_window(method: HostMethod, window: int | bool | SampleWindow) -> SampleWindow:
    """``window`` as a :class:`SampleWindow` ``method`` can step on, or an error."""
    if window is True:
        raise TypeError("window=True is ambiguous: give a number of samples, e.g. window=64")
    if not isinstance(window, SampleWindow):
        window = SampleWindow(window)
    if not method.adapts:
        raise ValueError(f"{type(method).__name__} does not adapt: a window has nothing to step")
    for name, m in method.model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not (
            isinstance(m, MixedBatchNorm) and m.stats == "ema" and not m.update
        ):
            setting = ""
            if isinstance(m, MixedBatchNorm):
                setting = f" with stats={m.stats!r}, update={m.update}"
            raise ValueError(
                f"a window serves requests on the EMA statistics of MixedBatchNorm layers, and "
                f"layer {name!r} is a {type(m).__name__}{setting}: create the method with "
                "eatta.create(name, model, window=...), or call "
                "eatta.normalization.use_mixed_norm(model, stats='ema') before eatta.configure"
            )
    return window
