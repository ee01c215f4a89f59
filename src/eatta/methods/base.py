"""The base of every adaptation method: wrap a model, predict, adapt in place, reset, save.

A batch goes through :meth:`AdaptiveMethod.forward` in one place: the request is checked (its
tensor, its labels, then every part's own check) before anything changes; every part's
``before_step``; the method's step (:meth:`AdaptiveMethod.forward_and_adapt`, a subclass's, as one
transaction); every part's ``after_step``; and a reset if a part asked for one. The parts are
:class:`~eatta.hooks.Hook` objects given to the constructor as keywords (:class:`Parts`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from typing_extensions import TypedDict, Unpack

from eatta._finite import DeferredFiniteCheck, all_finite
from eatta.anchor import WeightAnchor, check_alpha
from eatta.given import AsGiven, forget, record, recorded
from eatta.hooks import Batch, Hook
from eatta.normalization import has_batchnorm
from eatta.outputs import read_logits
from eatta.split import ModelSplit, check_split, find_split, split_for_copy, split_model
from eatta.window import (
    SMALL_BATCH,
    SMALL_REQUEST,
    WINDOW_MOMENTUM,
    WINDOW_REFRESH,
    SampleWindow,
    warn_small_batch,
)

__all__ = [
    "AdaptiveMethod",
    "InvalidInputError",
    "Options",
    "Parts",
    "check_parts",
    "is_finite",
    "read_logits",
    "unique_params",
]


class InvalidInputError(ValueError):
    """The batch cannot be adapted on (wrong dtype, rank, device, size, or non-finite values)."""


class Parts(TypedDict, total=False):
    """The parts every method's constructor and ``eatta.create`` take (None or absent: none)."""

    #: adapt on a window of the last ``window`` samples, for requests of 1 to a few
    #: (:class:`~eatta.window.SampleWindow`); False: windowing off explicitly
    window: int | bool | SampleWindow | None
    #: the window steps every this many samples (default: its size)
    window_every: int | None
    #: samples between refreshes of the served statistics between steps (None: at steps only)
    window_refresh: int | None
    #: the EMA rate of the statistics a window serves requests with
    window_momentum: float | None
    #: ``α`` of the pull toward the given weights after each step (:mod:`eatta.anchor`)
    weight_anchor: float | None
    #: the given model beside the adapted one (:class:`eatta.monitor.SourceFallback`)
    fallback: Hook | None
    #: audited accuracy and a guard (:class:`eatta.monitor.AccuracyMonitor`)
    monitor: Hook | None


class Options(Parts, total=False):
    """What every method's constructor takes beside its own arguments (``eatta.create`` takes
    them too): the parts (:class:`Parts`) and how the model is read and run."""

    #: ``(backbone, head)``: two modules sharing the model's parameters, ``backbone(x)`` the
    #: tensor the head reads and ``head(backbone(x))`` the logits (None: found automatically)
    split: ModelSplit | tuple[nn.Module, nn.Module] | None
    #: refuse batches with NaN or infinite values (True)
    check_finite: bool
    #: run the model's forward passes under bfloat16 autocast on its device (the feature
    #: extractor only where the method splits the model); logits and losses in the input's dtype
    autocast: bool
    #: convert the model (in place, undone by ``unwrap()``) and each batch to channels-last
    channels_last: bool


#: The order parts run in: the anchor's pull before the window folds the statistics in; the
#: monitor scores a request before the fallback decides on it.
_ORDER = ("weight_anchor", "window", "monitor", "fallback")


def _expected_input(model: nn.Module) -> tuple[int | None, int | None]:
    """The rank and the channels of the batches the model's first layer takes (a convolution;
    None: not known, e.g. a Linear or a transformer first)."""
    for m in model.modules():
        for rank, kind in ((3, nn.Conv1d), (4, nn.Conv2d), (5, nn.Conv3d)):
            if isinstance(m, kind):
                return rank, m.in_channels
        if isinstance(m, nn.Linear):
            return None, None
    return None, None


class AdaptiveMethod(nn.Module):
    """A test-time adaptation method around ``model``: ``forward(x)`` predicts and adapts.

    Holds the model (as submodule ``model``) and its optimizer. Wrapping changes the model in
    place (its modes, the parameters it adapts; :func:`eatta.configure`), never its other values:
    ``reset()`` restores the model (parameters and buffers), the optimizer and all method state
    as they were when the method was created, and :meth:`unwrap` gives back the model exactly as
    it was given. ``state_dict()`` holds the model's state plus, as extra state, the
    optimizer's, the method's and its parts', so ``load_state_dict`` resumes a stream exactly.
    Subclasses implement :meth:`forward_and_adapt` and list their stateful components in
    :meth:`state_parts`.

    Each step is one transaction (:meth:`step`): the state parts are snapshotted before it and
    restored if it raises, so a failed step leaves no trace; the model and optimizer are never
    touched before everything that can fail has run (validate, then mutate).

    ``train()`` and ``eval()`` change nothing of how a method adapts or serves: the wrapped
    model keeps the modes wrapping set (dropout off, BatchNorm on the batch's statistics), and
    a method adapts on every batch whatever its mode, so calling ``eval()`` before serving is
    harmless. To serve without adapting, use the model itself (:meth:`unwrap`) or
    ``eatta.create("source", model)``.
    """

    #: Whether forward updates the model (False: predictions only, fine under inference_mode).
    adapts: ClassVar[bool] = True
    #: Whether the step reads the features the classifier reads (the split): found, or refused,
    #: when the method is built where the model's class or configuration tells
    #: (:func:`eatta.split.find_split`), else on the first batch.
    needs_split: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        split: ModelSplit | tuple[nn.Module, nn.Module] | None = None,
        check_finite: bool = True,
        autocast: bool = False,
        channels_last: bool = False,
        **parts: Unpack[Parts],
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        for name, flag in (("check_finite", check_finite), ("autocast", autocast)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        if not isinstance(channels_last, bool):
            raise TypeError(f"channels_last must be True or False, got {channels_last!r}")
        if optimizer is not None:
            owned = {id(p) for p in model.parameters()}
            foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in owned]
            if foreign:
                raise ValueError(
                    f"the optimizer holds {len(foreign)} parameter(s) that are not the model's"
                )
        if split is not None:
            split = _checked_split_modules(split)
        self._given_record = record(model)  # modes: taken when configured
        self._as_given: AsGiven = self._given_record.with_values()  # values: as wrapped
        if channels_last:  # memory formats as given are in the record: unwrap() restores them
            model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch omits it
        self.model = model
        self.optimizer = optimizer
        self.check_finite = check_finite
        self.autocast, self.channels_last = autocast, channels_last
        self._split = ModelSplit(*split) if split is not None else None
        self._split_given = split is not None  # read through, and checked on the first batch
        self._split_checked = split is None
        self._has_batchnorm = has_batchnorm(model)
        self._rank, self._channels = _expected_input(model)
        self._given: nn.Module | None = None  # the frozen copy of the model as given, on demand
        #: the explicit split's modules made to read each model copy's parameters
        self._twin_splits: weakref.WeakKeyDictionary[nn.Module, ModelSplit] = (
            weakref.WeakKeyDictionary()
        )
        #: the input's finiteness read at the step's host synchronisation on an accelerator
        #: (a method that reads it there sets it; :class:`~eatta._finite.DeferredFiniteCheck`)
        self._deferred: DeferredFiniteCheck | None = None
        self._released = False
        self.last_step: Any = None  # what the last step did (method-specific record)
        self._saved_parts: list[tuple[Any, Any]] | None = None  # the open transaction's snapshot
        self._asked_mark = 0  # the request's answer records before the open transaction
        self.batch: Batch | None = None  # the request in progress
        self.hooks: list[Hook] = _build_parts(self, parts)
        self._window_off = parts.get("window") is False
        self._small_warned = False  # SmallBatchWarning given (once per method)
        self._initial_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self._initial_optimizer = (
            copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
        )
        if self.needs_split and self._split is None:  # by its class, or on an input its
            self._split = find_split(model)  # configuration names; else on the first batch

    # -- structure ---------------------------------------------------------------------------
    @property
    def split(self) -> ModelSplit:
        """The model's feature extractor and head (found automatically unless given).

        Found when the method is built where the method reads features and the model's class
        or configuration tells (:func:`eatta.split.find_split`), else on first use, on the
        batch in progress when there is one (see :func:`eatta.split.split_model`), and kept.
        """
        if self._split is None:
            example = None if self.batch is None else self.batch.step_x
            self._split = split_model(self.model, example=example)
        return self._split

    @property
    def params(self) -> list[nn.Parameter]:
        """Parameters the optimizer updates."""
        if self.optimizer is None:
            return []
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def params_at_creation(self) -> list[tuple[nn.Parameter, Tensor]]:
        """Each parameter the optimizer updates, once, with its value when the method was
        created (what :meth:`reset` restores)."""
        names = {id(p): name for name, p in self.model.named_parameters()}
        return [(p, self._initial_model[names[id(p)]]) for p in unique_params(self.params)]

    @property
    def has_batchnorm(self) -> bool:
        """Whether the model normalizes with the statistics of the batch (BatchNorm layers)."""
        return self._has_batchnorm

    @property
    def labels_used(self) -> int:
        """Labels used so far: none for a label-free method (see
        :class:`eatta.methods.active.ActiveMethod`)."""
        return 0

    def stats(self) -> dict[str, int]:
        """Counts of the stream since the last reset: the labels used, asked, answered and
        pending (all 0 for a label-free method; see :class:`eatta.methods.active.ActiveMethod`)."""
        return {"labels_used": 0, "labels_asked": 0, "labels_answered": 0, "labels_pending": 0}

    def part(self, name: str) -> Any:
        """The part given as ``name`` (a key of :class:`Parts`), or None."""
        return next((h for h in self.hooks if h.name == name), None)

    @property
    def window(self) -> SampleWindow | None:
        """The small-batch window; None: each batch adapted on as given."""
        found: SampleWindow | None = self.part("window")
        return found

    @property
    def fallback(self) -> Any:
        """The given model beside the adapted one, served on evidence
        (:class:`eatta.monitor.SourceFallback`); None: the adapted model is always served."""
        return self.part("fallback")

    @property
    def monitor(self) -> Any:
        """Audited accuracy and guard (:class:`eatta.monitor.AccuracyMonitor`); None: none."""
        return self.part("monitor")

    @property
    def weight_anchor(self) -> Any:
        """The pull back toward the given weights after each step; None: no pull."""
        return self.part("weight_anchor")

    @property
    def serving_model(self) -> nn.Module:
        """The model whose predictions the method serves: its model (CoTTA: its mean teacher).
        A server predicts from a copy of it between steps (:mod:`eatta.realtime`,
        :mod:`eatta.serve`)."""
        return self.model

    # -- the model as given ------------------------------------------------------------------
    @property
    def given(self) -> nn.Module:
        """A frozen copy of the model as it was given (eval mode, its running statistics), made
        on first use: the one copy the method's parts compare the adapted model with."""
        if self._given is None:  # not a submodule: not in state_dict(), not moved by .to()
            object.__setattr__(self, "_given", self._as_given.copy())
        assert self._given is not None
        return self._given

    @torch.no_grad()
    def given_logits(self, x: Tensor) -> Tensor:
        """The given model's logits for ``x`` (its own statistics: per sample, batch-free), read
        as the adapted model's are: through its split's modules when a split was given."""
        given = self.given
        ref = next(given.parameters(), None)
        if ref is not None and (ref.device != x.device or ref.dtype != x.dtype):
            given.to(device=x.device, dtype=x.dtype)
        return self.logits_of(given, x.detach())

    def logits_of(self, twin: nn.Module, x: Tensor) -> Tensor:
        """The logits of ``twin``, a copy of the model (the given one, a method's teacher), for
        ``x``, read as the model's are: through the same split when one was given (its modules
        made to read ``twin``'s parameters, whether or not they are the model's submodules:
        :func:`eatta.split.split_for_copy`), under the same autocast."""
        if self._split_given and self._split is not None:
            split = self._twin_splits.get(twin)
            if split is None:
                split = self._twin_splits[twin] = split_for_copy(self._split, self.model, twin)
            backbone, head = split
            z = self.features(backbone, x)
            return read_logits(head(z), twin, what="the split's head")
        return self._whole(twin, x)

    def _whole(self, model: nn.Module, x: Tensor) -> Tensor:
        """``model(x)``'s logits (:func:`eatta.outputs.read_logits`), the forward under autocast
        when asked, the logits in ``x``'s dtype."""
        if not self.autocast:
            return read_logits(model(x), model)
        with self._autocast(x):
            out = read_logits(model(x), model)
        return out.to(x.dtype)

    def _autocast(self, x: Tensor) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=x.device.type, dtype=torch.bfloat16)

    def features(self, backbone: nn.Module, x: Tensor) -> Tensor:
        """``backbone(x)``: the features, computed under autocast when asked (returned in
        ``x``'s dtype, so the head, the scores and the losses run in it)."""
        if not self.autocast:
            return backbone(x)
        with self._autocast(x):
            z = backbone(x)
        return z.to(x.dtype)

    def unwrap(self) -> nn.Module:
        """The model exactly as it was given (modes, modules, parameters, buffers, memory format,
        ``requires_grad``), restored in place and returned; the method cannot be used after."""
        if recorded(self.model) is self._given_record:
            forget(self.model)
        self._released = True
        return self._as_given.restore()

    def train(self, mode: bool = True) -> AdaptiveMethod:
        """Set the method's flag only: the wrapped model keeps the modes wrapping set, and the
        method adapts whatever its mode (see the class docstring)."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        return self

    # -- prediction ------------------------------------------------------------------------
    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """Predict on ``x`` (logits, computed before this batch's update) and adapt.

        ``labels``: the batch's true labels for a simulated annotator (the method's oracle must
        have ``set_labels``, e.g. :class:`~eatta.annotate.GroundTruthOracle`); it reveals only
        those the method asks for.
        """
        batch = self._begin(x, labels)
        try:
            for hook in self.hooks:
                hook.before_step(self, batch)
            if batch.step_x is not None:
                if self.hooks:
                    batch.step_logits = self._step_within(batch)
                else:
                    batch.step_logits = self.step(batch.step_x)
                if batch.adapted is None:
                    batch.adapted = batch.step_logits
            batch.served = batch.adapted
            for hook in self.hooks:
                hook.after_step(self, batch)
            if batch.reset is not None:
                self.reset(keep_monitor=True)
            assert batch.served is not None
            return batch.served
        finally:
            self.batch = None
            for taker in self.label_takers():
                end_batch = getattr(taker, "end_batch", None)
                if end_batch is not None:  # labels belong to one batch
                    end_batch()

    def _step_within(self, batch: Batch) -> Tensor:
        """The step, inside the contexts the parts asked for."""
        assert batch.step_x is not None
        with contextlib.ExitStack() as stack:
            for enter in batch.around:
                stack.enter_context(enter())
            return self.step(batch.step_x)

    def label_takers(self) -> list[object]:
        """Who may be given a simulated annotator's labels: the oracle, the parts' auditors."""
        takers = [getattr(self, "oracle", None)]
        takers += [getattr(h, "auditor", None) for h in self.hooks]
        return [t for t in takers if t is not None]

    def _begin(self, x: Tensor, labels: Tensor | None) -> Batch:
        """Check a request (and its simulated labels) before anything changes; give the labels
        to the oracle."""
        if self._released:
            raise RuntimeError(
                f"this {type(self).__name__} gave its model back (unwrap()); wrap it anew"
            )
        if self.adapts and torch.is_inference_mode_enabled():
            raise RuntimeError(
                f"{type(self).__name__} adapts with autograd and cannot run under "
                "torch.inference_mode(); call it under torch.no_grad() or outside any context "
                "(the method enables gradients for its own update)"
            )
        self.check_input(x)
        if x.is_inference():  # made under inference_mode: a normal copy can be saved for backward
            x = x.clone()
        if labels is not None:
            takers = self.label_takers()
            if not any(hasattr(t, "set_labels") for t in takers):
                raise TypeError(
                    f"{type(self).__name__}(x, labels=...) needs an oracle (or a part's auditor) "
                    "with set_labels (a GroundTruthOracle)"
                )
            labels = torch.as_tensor(labels)
            if labels.shape != (x.shape[0],):
                raise InvalidInputError(
                    f"labels must have shape ({x.shape[0]},), got {tuple(labels.shape)}"
                )
        batch = Batch(x, labels, step_x=x, step_labels=labels)
        if not self._split_checked:
            check_split(self.model, self.split, x)
            self._split_checked = True
        for hook in self.hooks:
            hook.check(self, batch)
        small = x.shape[0] < (SMALL_BATCH if self._has_batchnorm else SMALL_REQUEST)
        if small and not self._small_warned and self.adapts and self.window is None:
            self._small_warned = warn_small_batch(self, x, self._window_off)
        oracle = getattr(self, "oracle", None)
        if labels is not None and hasattr(oracle, "set_labels"):
            oracle.set_labels(labels)  # type: ignore[union-attr]  # checked just above
        self.batch = batch
        return batch

    def step(self, x: Tensor) -> Tensor:
        """One step on ``x`` (a batch, or a window's samples) as one transaction, gradients on:
        :meth:`forward_and_adapt`'s logits. Call ``method(x)`` to serve a request."""
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with self.transaction(), torch.enable_grad():
            return self.forward_and_adapt(x)

    @contextlib.contextmanager
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
        self._asked_mark = 0 if self.batch is None else len(self.batch.asked)

    def restore_parts(self) -> None:
        """Restore every part to the open transaction's snapshot."""
        for part, token in self._saved_parts or []:
            restore = getattr(part, "restore", None)
            if restore is not None:
                restore(token)
            else:
                part.load_state_dict(copy.deepcopy(token))
        if self.batch is not None:  # what the failed step asked is no longer the request's
            del self.batch.asked[self._asked_mark :]

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        """The method's step on ``x``: its logits before the update (a subclass's)."""
        raise NotImplementedError

    # -- reading the model -----------------------------------------------------------------
    def logits(self, x: Tensor) -> Tensor:
        """The model's ``[batch, classes]`` logits for ``x``: through the split when one was
        given, else the model's output read by :func:`eatta.outputs.read_logits` (a tensor, or a
        mapping or ``ModelOutput`` with ``logits``; anything else is refused in a message naming
        ``split=``); under autocast when asked."""
        if self._split_given:
            assert self._split is not None
            backbone, head = self._split
            return read_logits(
                head(self.features(backbone, x)), self.model, what="the split's head"
            )
        return self._whole(self.model, x)

    def features_and_logits(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(z, o)``: the backbone's features and the head's ``[batch, classes]`` logits."""
        if self._split is None:
            self._split = split_model(self.model, example=x)
        backbone, head = self._split
        z = self.features(backbone, x)
        return z, read_logits(head(z), self.model, what="the head")

    def check_input(self, x: Tensor, *, finite: bool | None = None) -> None:
        """Raise :class:`InvalidInputError` for a batch that cannot be adapted on (``finite``:
        whether to check its values are finite now; None: as ``check_finite`` says)."""
        if not isinstance(x, Tensor):
            raise InvalidInputError(f"input must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise InvalidInputError(f"input must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() < 2 or (self._rank is not None and x.dim() != self._rank):
            want = f"{self._rank}-d [batch, ...]" if self._rank else "at least 2-d [batch, ...]"
            raise InvalidInputError(f"input must be {want}, got shape {tuple(x.shape)}")
        if x.shape[0] == 0:
            raise InvalidInputError("input batch is empty")
        if self._channels is not None and x.shape[1] != self._channels:
            raise InvalidInputError(
                f"input has {x.shape[1]} channel(s) per sample (shape {tuple(x.shape)}) and the "
                f"model's first convolution takes {self._channels}"
            )
        if x.shape[0] == 1 and self._has_batchnorm and self.window is None and self.adapts:
            off = " with windowing turned off (window=False)" if self._window_off else ""
            raise InvalidInputError(
                f"a batch of 1 (input shape {tuple(x.shape)}) cannot be adapted on{off}: the "
                "model's BatchNorm layers normalize with the statistics of the batch; create the "
                "method with a window of recent samples, eatta.create(name, model, window=64), to "
                "serve single requests (docs/small-batches.md)"
            )
        ref = next(self.model.parameters(), None)
        if ref is not None:
            if x.device != ref.device:
                raise InvalidInputError(f"input is on {x.device}, the model on {ref.device}")
            if x.dtype != ref.dtype:
                raise InvalidInputError(
                    f"input dtype {x.dtype} differs from the model's {ref.dtype}"
                )
        finite = self.check_finite if finite is None else finite
        deferred = self._deferred
        if deferred is not None and (x.device.type != "cpu" or deferred.everywhere):  # read at
            # the step's host synchronisation (on the CPU there is no sync to save)
            finite = not deferred.begin(x if finite else None, self.model) and finite
        if finite and not is_finite(x):
            raise InvalidInputError("input contains NaN or infinite values")

    # -- state -------------------------------------------------------------------------------
    def reset(self, *, keep_monitor: bool = False) -> None:
        """Restore model (parameters and buffers), optimizer and method state to their values
        at creation; every part is cleared too, except, with ``keep_monitor``, the parts that
        measure the stream (the monitor, the fallback: a reset their evidence asked for, or a
        benchmark's reset at each domain, keeps measuring the same stream)."""
        self.model.load_state_dict(self._initial_model)
        if self.optimizer is not None and self._initial_optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self._initial_optimizer))
        self.reset_method_state()
        for hook in self.hooks:
            if not (keep_monitor and hook.measures):
                hook.reset()

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
        window = self.window
        if window is not None:
            signature["window"] = [window.size, window.every]
        return signature

    def get_extra_state(self) -> dict[str, Any]:
        return {
            "signature": self.state_signature(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "method": self.method_state(),
            **{hook.name: hook.state_dict() for hook in self.hooks},
        }

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
        device = self.device
        for hook in self.hooks:
            if state.get(hook.name) is not None:
                hook.load_state_dict(copy.deepcopy(state[hook.name]))
                move = getattr(hook, "to", None)
                if device is not None and move is not None:
                    move(device)


def check_parts(parts: Mapping[str, Any]) -> None:
    """The parts' own checks, before any method or model is touched: unknown keywords, the
    window's numbers, the anchor's ``α``, the fallback's and the monitor's kinds."""
    unknown = set(parts) - set(Parts.__annotations__)
    if unknown:
        raise TypeError(
            f"unknown part(s) {', '.join(sorted(unknown))}; the parts are "
            f"{', '.join(Parts.__annotations__)}"
        )
    window = parts.get("window")
    if window is True:
        raise TypeError("window=True is ambiguous: give a number of samples, e.g. window=64")
    if window is not None and window is not False and not isinstance(window, SampleWindow):
        SampleWindow(
            window,
            parts.get("window_every"),
            parts.get("window_refresh", WINDOW_REFRESH),
            parts.get("window_momentum") or WINDOW_MOMENTUM,
        )
    if parts.get("weight_anchor") is not None:
        check_alpha(parts["weight_anchor"])
    for name in ("monitor", "fallback"):
        part = parts.get(name)
        if part is not None and (not isinstance(part, Hook) or part.name != name):
            raise TypeError(
                f"{name}= takes a part whose name is {name!r} (an eatta.monitor "
                f"{'SourceFallback' if name == 'fallback' else 'AccuracyMonitor'}), got "
                f"{type(part).__name__}"
            )


def is_finite(x: Tensor) -> bool:
    """``bool(all_finite(x))``, read now (it syncs the device): on the CPU the two extremes are
    read as Python floats, which spares the small tensor ops that dominate a request of one
    sample."""
    if x.device.type != "cpu" or not x.is_floating_point() or x.numel() == 0:
        return bool(all_finite(x))
    lo, hi = torch.aminmax(x)
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def _checked_split_modules(split: object) -> ModelSplit:
    """``split`` as a :class:`ModelSplit` of two modules, or a :class:`TypeError` saying what it
    is (checked against the model on the first batch: :func:`eatta.split.check_split`)."""
    if not isinstance(split, tuple | list) or len(split) != 2:
        raise TypeError(
            f"split must be a pair (backbone, head) of nn.Modules, got {type(split).__name__}"
        )
    for name, part in zip(("backbone", "head"), split, strict=True):
        if not isinstance(part, nn.Module):
            raise TypeError(f"split's {name} must be an nn.Module, got {type(part).__name__}")
    return ModelSplit(*split)


def _build_parts(method: AdaptiveMethod, parts: Parts) -> list[Hook]:
    """The parts given as keywords, checked and in the order they run (:data:`_ORDER`)."""
    check_parts(parts)
    hooks: dict[str, Hook] = {}
    alpha = parts.get("weight_anchor")
    if alpha is not None:
        hooks["weight_anchor"] = WeightAnchor(alpha, method)
    window = SampleWindow.build(method, parts)
    if window is not None:
        hooks["window"] = window
    for name in ("monitor", "fallback"):
        part: Hook | None = parts.get(name)  # type: ignore[assignment]  # checked: a Hook
        if part is not None:
            hooks[name] = part
    return [hooks[name] for name in _ORDER if name in hooks]


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
