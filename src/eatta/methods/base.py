"""The base of every adaptation method: wrap a model, predict, adapt in place, reset, save."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from typing_extensions import Protocol

from eatta._warn import warn_at_caller
from eatta.normalization import MixedBatchNorm, absorb_statistics, batch_statistics
from eatta.split import ModelSplit, split_model
from eatta.window import SMALL_BATCH, SampleWindow, SmallBatchWarning

__all__ = ["AdaptiveMethod", "InvalidInputError", "StepFallback", "StepObserver"]


class StepObserver(Protocol):
    """What runs after each step and is saved with the method: the accuracy monitor
    (:class:`eatta.monitor.AccuracyMonitor`). Declared here so the two modules need not import
    each other. An optional ``bind(method)`` checks, when it is attached, that it can act."""

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


#: The parts every method's constructor takes (:meth:`AdaptiveMethod.attach`).
_PARTS = ("window", "fallback", "monitor")


class InvalidInputError(ValueError):
    """The batch cannot be adapted on (wrong dtype, rank, device, size, or non-finite values)."""


def _expected_rank(model: nn.Module) -> int | None:
    for m in model.modules():
        if isinstance(m, nn.Conv1d):
            return 3
        if isinstance(m, nn.Conv2d):
            return 4
        if isinstance(m, nn.Conv3d):
            return 5
        if isinstance(m, nn.Linear):
            return None
    return None


class AdaptiveMethod(nn.Module):
    """A test-time adaptation method around ``model``: ``forward(x)`` predicts and adapts.

    Holds the model (as submodule ``model``) and its optimizer. ``reset()`` restores the model,
    the optimizer and all method state as they were when the method was created.
    ``state_dict()`` holds the model's state plus, as extra state, the optimizer's and the
    method's, so ``load_state_dict`` resumes a stream exactly. Subclasses implement
    :meth:`forward_and_adapt` and list their stateful components in :meth:`state_parts`.

    Each ``forward`` is one transaction: the parts are snapshotted before the step and restored
    if it raises, so a failed step leaves no trace; the model and optimizer are never touched
    before everything that can fail has run (validate, then mutate).

    Three parts compose with any method, given to its constructor (every subclass's constructor
    takes them, see :meth:`__init_subclass__`) or to :meth:`attach`:

    - ``window``: a window of recent samples (:mod:`eatta.window`) for requests of 1 to a few;
    - ``fallback``: the source model one step away (:class:`eatta.monitor.SourceFallback`),
      deciding at each step (a window's steps included) and serving requests between steps from
      whichever model it serves;
    - ``monitor``: audited accuracy and a guard (:class:`eatta.monitor.AccuracyMonitor`).
    """

    #: Whether forward updates the model (False: predictions only, fine under inference_mode).
    adapts: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        split: ModelSplit | tuple[nn.Module, nn.Module] | None = None,
        check_finite: bool = True,
        window: int | bool | SampleWindow | None = None,
        fallback: StepFallback | None = None,
        monitor: StepObserver | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        self.model = model
        self.optimizer = optimizer
        self.check_finite = check_finite
        self._split = ModelSplit(*split) if split is not None else None
        self._split_example: Tensor | None = None  # the batch in progress, to find the split on
        if optimizer is not None:
            owned = {id(p) for p in model.parameters()}
            foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in owned]
            if foreign:
                raise ValueError(
                    f"the optimizer holds {len(foreign)} parameter(s) that are not the model's"
                )
        self._has_batchnorm = any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
        )
        self._rank = _expected_rank(model)
        self._window: SampleWindow | None = None  # the small-batch window (:meth:`set_window`)
        self._window_off = False  # set_window(False): windowing turned off explicitly
        self._warned_small = False
        self._small_run = 0  # consecutive batches under SMALL_BATCH (warned at the second)
        self.last_step: Any = None  # what the last step did (method-specific record)
        self._saved_parts: list[tuple[Any, Any]] | None = None  # the open transaction's snapshot
        self._monitor: StepObserver | None = None
        self._fallback: StepFallback | None = None
        self._initial_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self._initial_optimizer = (
            copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
        )
        self.attach(window=window, fallback=fallback, monitor=monitor)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every subclass's constructor also takes the parts (``window=``, ``fallback=``,
        ``monitor=``, keyword-only): they are attached, all checked first, once the subclass
        is built, so any method composes with them without declaring them."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_takes_parts", False):
            return

        @functools.wraps(init)
        def with_parts(self: AdaptiveMethod, *args: Any, **kw: Any) -> None:
            parts = {k: kw.pop(k) for k in _PARTS if k in kw}  # the outermost wrapper's
            init(self, *args, **kw)
            if parts:
                self.attach(**parts)

        with_parts._takes_parts = True  # type: ignore[attr-defined]  # marks the wrapper
        cls.__init__ = with_parts  # type: ignore[method-assign]  # adds the parts keywords

    # -- parts -------------------------------------------------------------------------------
    def attach(
        self,
        *,
        window: int | bool | SampleWindow | None = None,
        fallback: StepFallback | None = None,
        monitor: StepObserver | None = None,
    ) -> None:
        """Attach parts (None: leave that part as it is); each is checked, for this method and
        together, before any is attached. ``window``: a number of samples or a
        :class:`~eatta.window.SampleWindow` (see :meth:`set_window`), False: windowing off."""
        if window is not None and window is not False:
            window = self._check_window(window)
        for part in (fallback, monitor):
            bind = getattr(part, "bind", None)
            if bind is not None:
                bind(self)
        if window is not None:
            self._window, self._window_off = (None, True) if window is False else (window, False)
        if fallback is not None:
            self._fallback = fallback
        if monitor is not None:
            self._monitor = monitor

    @property
    def fallback(self) -> StepFallback | None:
        """The source model beside the adapted one, served on evidence
        (:class:`eatta.monitor.SourceFallback`); None: the adapted model is always served."""
        return self._fallback

    @fallback.setter
    def fallback(self, part: StepFallback | None) -> None:
        if part is None:
            self._fallback = None
        else:
            self.attach(fallback=part)

    @property
    def monitor(self) -> StepObserver | None:
        """Audited accuracy and guard (:func:`eatta.monitor.attach`); None: no audits."""
        return self._monitor

    @monitor.setter
    def monitor(self, part: StepObserver | None) -> None:
        if part is None:
            self._monitor = None
        else:
            self.attach(monitor=part)

    # -- structure ---------------------------------------------------------------------------
    @property
    def split(self) -> ModelSplit:
        """The model's feature extractor and head (found automatically unless given).

        Found on first use, on the batch in progress when there is one (see
        :func:`eatta.split.split_model`), and kept.
        """
        if self._split is None:
            self._split = split_model(self.model, example=self._split_example)
        return self._split

    @property
    def params(self) -> list[nn.Parameter]:
        """Parameters the optimizer updates."""
        if self.optimizer is None:
            return []
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    @property
    def labels_used(self) -> int:
        """Labels used so far: none for a label-free method (see
        :class:`eatta.methods.active.ActiveMethod`)."""
        return 0

    # -- prediction ------------------------------------------------------------------------
    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """Predict on ``x`` (logits, computed before this batch's update) and adapt.

        ``labels``: the batch's true labels for a simulated annotator (the method's oracle must
        have ``set_labels``, e.g. :class:`~eatta.annotate.GroundTruthOracle`); it reveals only
        those the method asks for.
        """
        x, labels = self._take_request(x, labels)
        oracle = getattr(self, "oracle", None)
        try:
            known = self._known_labels(x, labels, oracle)
            if self.window is not None and x.shape[0] < self.window.size:  # between steps
                out = self.window.serve(self, x, known, oracle)
                if self.monitor is not None:
                    self.monitor.observe(self, x, out, labels)
                return out if self.fallback is None else self.fallback.serve(x, out)
            self._warn_small_batch(x)
            out = self.adapt_on(x)
            if self.window is not None:  # a full batch: stepped on as given, it fills the window
                self.window.passed(x, known)
            if self.monitor is not None:  # after the step: audit, score, guard
                self.monitor.observe(self, x, out, labels)
            return self.decide(x, out, labels)
        finally:
            end_batch = getattr(oracle, "end_batch", None)
            if end_batch is not None:  # labels belong to one batch
                end_batch()

    def _take_request(self, x: Tensor, labels: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Check a request (and its simulated labels) before anything changes; give the labels
        to the oracle."""
        if self.adapts and torch.is_inference_mode_enabled():
            raise RuntimeError(
                f"{type(self).__name__} adapts with autograd and cannot run under "
                "torch.inference_mode(); call it under torch.no_grad() or outside any context "
                "(the method enables gradients for its own update)"
            )
        self.check_input(x)
        if x.is_inference():  # made under inference_mode: a normal copy can be saved for backward
            x = x.clone()
        oracle = getattr(self, "oracle", None)
        if labels is not None:
            auditors = [w.auditor for w in (self.monitor, self.fallback) if w is not None]
            if not hasattr(oracle, "set_labels") and not any(
                hasattr(a, "set_labels") for a in auditors
            ):
                raise TypeError(
                    f"{type(self).__name__}(x, labels=...) needs an oracle (or a monitor's "
                    "auditor) with set_labels (a GroundTruthOracle)"
                )
            labels = torch.as_tensor(labels)
            if labels.shape != (x.shape[0],):
                raise InvalidInputError(
                    f"labels must have shape ({x.shape[0]},), got {tuple(labels.shape)}"
                )
        if self.fallback is not None:
            self.fallback.check(x, labels)
        if labels is not None and hasattr(oracle, "set_labels"):
            oracle.set_labels(labels)  # type: ignore[union-attr]  # checked just above
        return x, labels

    def _known_labels(self, x: Tensor, labels: Tensor | None, oracle: Any) -> Tensor | None:
        """A windowed request's labels for the window (a simulated annotator's), if known."""
        if self.window is None or labels is not None:
            return labels
        known: Tensor | None = getattr(oracle, "batch_labels", None)
        if known is not None and len(known) != x.shape[0]:
            raise InvalidInputError(
                f"the oracle holds {len(known)} labels for a request of {x.shape[0]} "
                "samples; give each request its own (method(x, labels=y))"
            )
        return known

    def adapt_on(self, x: Tensor) -> Tensor:
        """One step on ``x`` (a batch, or a window's samples): the adapted model's logits before
        its update. With a fallback, the source model predicts first; with a window, the step
        normalizes with ``x``'s statistics, which are then folded into the served ones."""
        if self._split is None:
            self._split_example = x
        norm = batch_statistics() if self.window is not None else nullcontext()
        try:
            if self.fallback is not None:  # the source model's predictions, before the step
                self.fallback.before(x)
            with self.transaction(), torch.enable_grad(), norm:
                out = self.forward_and_adapt(x)
        finally:
            self._split_example = None
        if self.window is not None:
            absorb_statistics(self.model, x)
        return out

    def decide(
        self, x: Tensor, logits: Tensor, labels: Tensor | None, *, served: bool = True
    ) -> Tensor:
        """After a step: the fallback scores its answers and decides; what is served."""
        if self.fallback is None:
            return logits
        return self.fallback.after(self, x, logits, labels, served=served)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Snapshot :meth:`state_parts`; restore them if the body raises."""
        outer = self._saved_parts
        self.snapshot_parts()
        try:
            yield
        except BaseException:
            self.restore_parts()
            raise
        finally:
            self._saved_parts = outer

    def snapshot_parts(self) -> None:
        """(Re)take the open transaction's snapshot, e.g. after a committed step of several.

        A part's own ``snapshot()``/``restore(token)`` is used when it has one (cheap: the
        budget's counters, a generator state, a buffer's journal), else a deep copy of its
        ``state_dict()``.
        """
        saved = []
        for part in self.state_parts().values():
            if part is None:
                continue
            snap = getattr(part, "snapshot", None)
            saved.append((part, snap() if snap is not None else copy.deepcopy(part.state_dict())))
        self._saved_parts = saved

    def restore_parts(self) -> None:
        """Restore every part to the open transaction's snapshot."""
        for part, token in self._saved_parts or []:
            restore = getattr(part, "restore", None)
            if restore is not None:
                restore(token)
            else:
                part.load_state_dict(copy.deepcopy(token))

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def check_input(self, x: Tensor) -> None:
        """Raise :class:`InvalidInputError` for a batch that cannot be adapted on."""
        if not isinstance(x, Tensor):
            raise InvalidInputError(f"input must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise InvalidInputError(f"input must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() < 2 or (self._rank is not None and x.dim() != self._rank):
            want = f"{self._rank}-d [batch, ...]" if self._rank else "at least 2-d [batch, ...]"
            raise InvalidInputError(f"input must be {want}, got shape {tuple(x.shape)}")
        if x.shape[0] == 0:
            raise InvalidInputError("input batch is empty")
        if x.shape[0] == 1 and self._has_batchnorm and self.window is None:
            if self._window_off:
                raise InvalidInputError(
                    f"a batch of 1 (input shape {tuple(x.shape)}) cannot be adapted on with "
                    "windowing turned off (window=False): the model's BatchNorm layers normalize "
                    "with the statistics of the batch; set a window (window=64) to serve single "
                    "requests"
                )
            raise InvalidInputError(
                f"a batch of 1 (input shape {tuple(x.shape)}) cannot be adapted on: the model's "
                "BatchNorm layers normalize with the statistics of the batch; create the method "
                "with a window of recent samples, eatta.create(name, model, window=64), to serve "
                "single requests (docs/small-batches.md)"
            )
        ref = next(self.model.parameters(), None)
        if ref is not None:
            if x.device != ref.device:
                raise InvalidInputError(f"input is on {x.device}, the model on {ref.device}")
            if x.dtype != ref.dtype:
                raise InvalidInputError(
                    f"input dtype {x.dtype} differs from the model's {ref.dtype}"
                )
        if self.check_finite and not bool(torch.isfinite(x).all()):
            raise InvalidInputError("input contains NaN or infinite values")

    # -- small batches ---------------------------------------------------------------------
    @property
    def window(self) -> SampleWindow | None:
        """The small-batch window (:meth:`set_window`); None: each batch adapted on as given."""
        return self._window

    def set_window(
        self, size: int | bool | None, every: int | None = None, refresh: int | None = None
    ) -> None:
        """Adapt on a window of the last ``size`` samples, stepping every ``every`` samples.

        With a window, a batch smaller than ``size`` is served by the current model on robust
        statistics (the EMA of :class:`~eatta.normalization.MixedBatchNorm`, independent of the
        batch, so a batch of 1 works), joins the window, and every ``every`` samples (default
        ``size``) the method steps on the window as on a batch; its budget then counts these
        steps. ``refresh``: also refresh the served statistics from the window every ``refresh``
        samples between steps (None: at steps only). A batch of ``size`` or more is adapted on
        as without a window. ``False`` turns
        windowing off explicitly (no small-batch warning; a batch of 1 on a BatchNorm model is
        an error naming it); ``None`` leaves it unset. The model's BatchNorm layers must be
        :class:`~eatta.normalization.MixedBatchNorm` with ``stats="ema"``
        (``eatta.create(..., window=64)`` swaps them in before configuring). Call it before the
        stream: the window is part of the method's state signature.
        """
        if size is None or size is False:
            self._window, self._window_off = None, size is False
            return
        self.attach(window=SampleWindow(size, every, refresh) if size is not True else size)

    def _check_window(self, window: int | bool | SampleWindow) -> SampleWindow:
        """``window`` as a :class:`SampleWindow` this method can step on, or an error."""
        if window is True:
            raise TypeError("window=True is ambiguous: give a number of samples, e.g. window=64")
        if not isinstance(window, SampleWindow):
            window = SampleWindow(window)
        if not self.adapts:
            raise ValueError(f"{type(self).__name__} does not adapt: a window has nothing to step")
        for name, m in self.model.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and not (
                isinstance(m, MixedBatchNorm) and m.stats == "ema" and not m.update
            ):
                raise ValueError(
                    f"a window serves requests on the EMA statistics of MixedBatchNorm layers, and "
                    f"layer {name!r} is a {type(m).__name__}"
                    + (_mixed_setting(m) if isinstance(m, MixedBatchNorm) else "")
                    + ": create the method with eatta.create(name, model, window=...), or call "
                    "eatta.normalization.use_mixed_norm(model, stats='ema') before eatta.configure"
                )
        return window

    def _warn_small_batch(self, x: Tensor) -> None:
        """Once per method: a second batch in a row under :data:`~eatta.window.SMALL_BATCH`
        samples on a BatchNorm model, with no window decided (set or turned off)."""
        if self._warned_small or self._window_off or self.window is not None:
            return
        if not self.adapts or not self._has_batchnorm:
            return
        if x.shape[0] >= SMALL_BATCH:
            self._small_run = 0
            return
        self._small_run += 1
        if self._small_run < 2:  # one short batch (a domain's remainder) is no small-batch stream
            return
        self._warned_small = True
        warn_at_caller(
            f"{type(self).__name__} adapts a BatchNorm model on batches of {x.shape[0]} "
            "samples: their statistics are too noisy to normalize and adapt on, and the error can "
            "rise far above the source model's (docs/small-batches.md). Create the method with a "
            "window of recent samples, eatta.create(name, model, window=64), or turn this off "
            "with set_window(False)",
            SmallBatchWarning,
        )

    # -- state -------------------------------------------------------------------------------
    def reset(self, *, keep_monitor: bool = False) -> None:
        """Restore model, optimizer and method state to their values at creation; the monitor
        and the fallback, if any (:mod:`eatta.monitor`), are cleared too unless
        ``keep_monitor`` (a guard's reset, or a benchmark's reset at each domain, keeps measuring
        the same stream)."""
        self.model.load_state_dict(self._initial_model)
        if self.optimizer is not None and self._initial_optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self._initial_optimizer))
        self.reset_method_state()
        if self.window is not None:
            self.window.reset()
        if not keep_monitor:
            for watcher in (self.monitor, self.fallback):
                if watcher is not None:
                    watcher.reset()

    def state_parts(self) -> dict[str, Any]:
        """Named stateful components (budget, selector, buffer, ...), each with ``reset()``,
        ``state_dict()`` and ``load_state_dict()``; None entries are skipped. Override to list
        them, and the three methods below handle them."""
        return {}

    def reset_method_state(self) -> None:
        """Clear method-specific state: reset every part and the step record (extend for more)."""
        self.last_step = None
        for part in self.state_parts().values():
            if part is not None:
                part.reset()

    def method_state(self) -> dict[str, Any]:
        """Method-specific state to save: every part's state dict (extend for other state)."""
        return {
            name: None if part is None else part.state_dict()
            for name, part in self.state_parts().items()
        }

    def load_method_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`method_state` returned, then move every part that can move
        (``to(device)``) to the model's device: a state saved on another device, or loaded
        with ``map_location="cpu"``, resumes where the model is."""
        device = self.device
        for name, part in self.state_parts().items():
            if part is None:
                continue
            if state.get(name) is not None:
                part.load_state_dict(state[name])
            move = getattr(part, "to", None)
            if device is not None and move is not None:
                move(device)

    @property
    def device(self) -> torch.device | None:
        """The device of the model's first parameter (None for a model without parameters)."""
        ref = next(self.model.parameters(), None)
        return None if ref is None else ref.device

    def features_and_logits(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(z, o)``: the backbone's features and the head's ``[batch, classes]`` logits."""
        if self._split is None:
            self._split = split_model(self.model, example=x)
        backbone, head = self._split
        z = backbone(x)
        o = head(z)
        if o.dim() != 2:
            raise RuntimeError(
                f"the head must return [batch, classes] logits, got {tuple(o.shape)}"
            )
        return z, o

    def state_signature(self) -> dict[str, Any]:
        """What a saved state must match to load: the method's class and its state parts (their
        names and types), so a state from another method or configuration is refused."""
        signature: dict[str, Any] = {
            "method": type(self).__qualname__,
            "parts": {
                name: type(part).__qualname__
                for name, part in self.state_parts().items()
                if part is not None
            },
        }
        if self.window is not None:  # only then: states saved without a window load as before
            signature["window"] = [self.window.size, self.window.every]
        return signature

    def get_extra_state(self) -> dict[str, Any]:
        state = {
            "signature": self.state_signature(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "method": self.method_state(),
        }
        if self.monitor is not None:
            state["monitor"] = self.monitor.state_dict()
        if self.fallback is not None:
            state["fallback"] = self.fallback.state_dict()
        if self.window is not None:
            state["window"] = self.window.state_dict()
        return state

    def set_extra_state(self, state: dict[str, Any]) -> None:
        theirs, mine = state.get("signature"), self.state_signature()
        if theirs is not None and theirs != mine:  # states from before signatures load as before
            raise ValueError(
                f"this state was saved by {_describe(theirs)} and cannot be loaded into "
                f"{_describe(mine)}; nothing was changed"
            )
        if self.optimizer is not None and state.get("optimizer") is not None:
            # deep copy: torch shares same-device tensors with the source dict, so a state taken
            # from a live method would otherwise keep moving with it
            self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.load_method_state(state.get("method", {}))
        if self.window is not None and state.get("window") is not None:
            self.window.load_state_dict(state["window"])
            if self.device is not None:
                self.window.to(self.device)
        if self.monitor is not None and state.get("monitor") is not None:
            self.monitor.load_state_dict(copy.deepcopy(state["monitor"]))
        if self.fallback is not None and state.get("fallback") is not None:
            self.fallback.load_state_dict(copy.deepcopy(state["fallback"]))


def _mixed_setting(m: MixedBatchNorm) -> str:
    return f" with stats={m.stats!r}, update={m.update}"


def _describe(signature: dict[str, Any]) -> str:
    parts = ", ".join(f"{k}={v}" for k, v in sorted(signature.get("parts", {}).items()))
    window = signature.get("window")
    where = f", a window of {window[0]} stepping every {window[1]}" if window else ""
    return f"{signature.get('method')} ({parts or 'no state parts'}{where})"


def unique_params(params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
    """Parameters in order, each once."""
    seen: set[int] = set()
    out = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out
