"""The base of every adaptation method: wrap a model, predict, adapt in place, reset, save."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from eatta._finite import is_finite
from eatta.methods.parts import StepParts, WithParts
from eatta.normalization import has_batchnorm
from eatta.split import ModelSplit, split_model

__all__ = ["AdaptiveMethod", "InvalidInputError"]


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


class AdaptiveMethod(WithParts, nn.Module):
    """A test-time adaptation method around ``model``: ``forward(x)`` predicts and adapts.

    Holds the model (as submodule ``model``) and its optimizer. ``reset()`` restores the model,
    the optimizer and all method state as they were when the method was created.
    ``state_dict()`` holds the model's state plus, as extra state, the optimizer's and the
    method's, so ``load_state_dict`` resumes a stream exactly. Subclasses implement
    :meth:`forward_and_adapt` and list their stateful components in :meth:`state_parts`.

    Each step is one transaction (:meth:`step`): the state parts are snapshotted before it and
    restored if it raises, so a failed step leaves no trace; the model and optimizer are never
    touched before everything that can fail has run (validate, then mutate).

    The parts that compose with any method (:mod:`eatta.methods.parts`: a window of recent
    samples, the given model as a fallback, a monitor, a weight anchor) are given to a method's
    constructor, whose last line attaches them once everything they bind to is built
    (``self.attach(**parts)``), or to :meth:`attach` later.
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
        self._has_batchnorm = has_batchnorm(model)
        self._rank = _expected_rank(model)
        self.last_step: Any = None  # what the last step did (method-specific record)
        self._saved_parts: list[tuple[Any, Any]] | None = None  # the open transaction's snapshot
        self._parts = StepParts(self)  # window, fallback, monitor, weight anchor: none yet
        self._initial_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self._initial_optimizer = (
            copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
        )

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

    # -- prediction ------------------------------------------------------------------------
    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """Predict on ``x`` (logits, computed before this batch's update) and adapt.

        ``labels``: the batch's true labels for a simulated annotator (the method's oracle must
        have ``set_labels``, e.g. :class:`~eatta.annotate.GroundTruthOracle`); it reveals only
        those the method asks for.
        """
        x, labels = self._take_request(x, labels)
        try:
            return self._parts.serve(x, labels, self._known_labels(x, labels))
        finally:
            end_batch = getattr(getattr(self, "oracle", None), "end_batch", None)
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
            takers = [oracle, *self._parts.auditors()]
            if not any(hasattr(t, "set_labels") for t in takers):
                raise TypeError(
                    f"{type(self).__name__}(x, labels=...) needs an oracle (or a monitor's "
                    "auditor) with set_labels (a GroundTruthOracle)"
                )
            labels = torch.as_tensor(labels)
            if labels.shape != (x.shape[0],):
                raise InvalidInputError(
                    f"labels must have shape ({x.shape[0]},), got {tuple(labels.shape)}"
                )
        self._parts.check(x, labels)
        if labels is not None and hasattr(oracle, "set_labels"):
            oracle.set_labels(labels)  # type: ignore[union-attr]  # checked just above
        return x, labels

    def _known_labels(self, x: Tensor, labels: Tensor | None) -> Tensor | None:
        """A windowed request's labels for the window (a simulated annotator's), if known: the
        oracle's, else an auditor's (a label-free method's fallback or monitor), so that a step
        on the window can audit its older samples too."""
        if self.window is None or labels is not None:
            return labels
        for taker in (getattr(self, "oracle", None), *self._parts.auditors()):
            known: Tensor | None = getattr(taker, "batch_labels", None)
            if known is None:
                continue
            if len(known) != x.shape[0]:
                raise InvalidInputError(
                    f"the {'oracle' if taker is getattr(self, 'oracle', None) else 'auditor'} "
                    f"holds {len(known)} labels for a request of {x.shape[0]} samples; give "
                    "each request its own (method(x, labels=y))"
                )
            return known
        return None

    def step(self, x: Tensor) -> Tensor:
        """One step on ``x`` (a batch, or a window's samples) as one transaction, gradients on:
        :meth:`forward_and_adapt`'s logits. The parts run around it
        (:meth:`eatta.methods.parts.StepParts.step`); call ``method(x)`` to serve a request."""
        if self._split is None:
            self._split_example = x
        try:
            with self.transaction(), torch.enable_grad():
                return self.forward_and_adapt(x)
        finally:
            self._split_example = None

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
            off = " with windowing turned off (window=False)" if self._parts.window_off else ""
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
        if self.check_finite and not is_finite(x):
            raise InvalidInputError("input contains NaN or infinite values")

    # -- state -------------------------------------------------------------------------------
    def reset(self, *, keep_monitor: bool = False) -> None:
        """Restore model, optimizer and method state to their values at creation; the window is
        emptied, and the monitor and the fallback, if any (:mod:`eatta.monitor`), are cleared
        too unless ``keep_monitor`` (a guard's reset, or a benchmark's reset at each domain,
        keeps measuring the same stream)."""
        self.model.load_state_dict(self._initial_model)
        if self.optimizer is not None and self._initial_optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self._initial_optimizer))
        self.reset_method_state()
        self._parts.reset(keep_monitor=keep_monitor)

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
        signature.update(self._parts.signature())
        return signature

    def get_extra_state(self) -> dict[str, Any]:
        return {
            "signature": self.state_signature(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "method": self.method_state(),
            **self._parts.state_dict(),  # the monitor's, the fallback's, the window's
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
        self._parts.load_state_dict(state, self.device)


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
