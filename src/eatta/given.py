"""The model as the user gave it: what wrapping changes in it, and how to give it back.

Wrapping a model changes it in place: :func:`eatta.configure` sets modes and ``requires_grad``
(its parameters and buffers keep their values), a window swaps its BatchNorm layers for
:class:`~eatta.normalization.MixedBatchNorm`, channels-last changes its parameters' memory
format, and adaptation changes the adapted parameters. The first of these records the model as it
was (:func:`record`): every module's children, training flag and BatchNorm
``track_running_stats``, every parameter's and buffer's memory format, and every parameter's
``requires_grad``. A method takes the values when it is built (:meth:`AsGiven.with_values`), so
weights loaded between configuring and wrapping are the given ones. From that record:

- :meth:`AsGiven.restore` puts it all back into the model (``method.unwrap()``, or a build that
  failed half-way), so that ``model(x)`` and ``model.state_dict()`` are bit for bit what they were;
- :meth:`AsGiven.copy` gives a frozen copy of the model as given (eval mode, no gradients): the
  one copy a method keeps beside the adapted model (:attr:`eatta.AdaptiveMethod.given`), for
  its fallback and its monitor alike.

The record lives beside the model (a weak reference: nothing is added to the model) until
``unwrap()`` gives the model back.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = ["AsGiven", "forget", "record", "recorded", "undone_on_error"]

_RECORDS: weakref.WeakKeyDictionary[nn.Module, AsGiven] = weakref.WeakKeyDictionary()


class AsGiven:
    """A model as it was given (see the module docstring); ``values=False`` records all but the
    parameters' and buffers' values (:meth:`with_values` adds them)."""

    def __init__(self, model: nn.Module, *, values: bool = True) -> None:
        self.model = model
        self._modules = [
            (m, dict(m._modules), m.training, getattr(m, "track_running_stats", None))
            for m in model.modules()
        ]
        self._tensors = [
            (m, name, kind, None if t is None else _format_of(t))
            for m in model.modules()
            for kind, table in (("p", m._parameters), ("b", m._buffers))
            for name, t in table.items()
        ]
        self._grad = [(p, p.requires_grad) for p in model.parameters()]
        self._values: list[Tensor | None] | None = self._take() if values else None

    def _take(self) -> list[Tensor | None]:
        """The values now, each in its recorded memory format (None: none as given)."""
        out: list[Tensor | None] = []
        for m, name, kind, fmt in self._tensors:
            t = (m._parameters if kind == "p" else m._buffers).get(name)
            out.append(None if t is None or fmt is None else t.detach().clone(memory_format=fmt))
        return out

    def with_values(self) -> AsGiven:
        """This record with the parameters' and buffers' values as they are now."""
        taken = copy.copy(self)
        taken._values = self._take()
        return taken

    @torch.no_grad()
    def restore(self) -> nn.Module:
        """Put the model back as it was given (structure, modes, values, memory formats,
        ``requires_grad``). Returns the model."""
        if self._values is None:
            raise RuntimeError("this record holds no values: take them with with_values()")
        for m, children, training, track in self._modules:
            m._modules.clear()
            m._modules.update(children)
            m.training = training
            if track is not None:
                m.track_running_stats = track
        for (m, name, kind, _), saved in zip(self._tensors, self._values, strict=True):
            table: dict[str, Tensor | None] = m._parameters if kind == "p" else m._buffers  # type: ignore[assignment]  # Parameter is a Tensor
            current = table.get(name)
            if saved is None or current is None:  # None as given, or a buffer dropped since
                table[name] = None if saved is None else saved.clone()
            else:  # the same object (an optimizer's), its given values and storage
                current.data = saved.clone()
        for p, requires_grad in self._grad:
            p.requires_grad_(requires_grad)
        return self.model

    def copy(self) -> nn.Module:
        """A frozen copy of the model as given: eval mode, no gradients, the model untouched."""
        twin = copy.deepcopy(self)  # the model and the modules it no longer holds, consistently
        return twin.restore().eval().requires_grad_(False)


def _format_of(t: Tensor) -> torch.memory_format:
    """The memory format ``t`` is laid out in (contiguous unless channels-last)."""
    if t.is_contiguous():
        return torch.contiguous_format
    for fmt, dim in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if t.dim() == dim and t.is_contiguous(memory_format=fmt):
            return fmt
    return torch.preserve_format


def record(model: nn.Module) -> AsGiven:
    """The record of ``model`` as given (no values), taken now unless one was taken already."""
    found = _RECORDS.get(model)
    if found is None:
        found = _RECORDS[model] = AsGiven(model, values=False)
    return found


def recorded(model: nn.Module) -> AsGiven | None:
    """``model``'s record, if eatta changed it since it was given (None: it is as given)."""
    return _RECORDS.get(model)


def forget(model: nn.Module) -> None:
    """Drop ``model``'s record (it is as given again, or its changes are to be kept)."""
    _RECORDS.pop(model, None)


@contextmanager
def undone_on_error(model: nn.Module) -> Iterator[None]:
    """Within, every change to ``model`` is undone if the body raises (a build that failed after
    configuring the model), and a record taken inside is dropped."""
    existed = recorded(model) is not None
    now = AsGiven(model)
    try:
        yield
    except BaseException:
        now.restore()
        if not existed:
            forget(model)
        raise
