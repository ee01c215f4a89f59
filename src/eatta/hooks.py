"""The one protocol every optional part of a method implements, and the batch it sees.

A method's parts (a window of recent samples, the given model as a fallback, an accuracy
monitor, a weight anchor) are :class:`Hook` objects given to its constructor (or to
``eatta.create``) and called by the method in one place, in the order they are listed
(:meth:`eatta.methods.base.AdaptiveMethod.forward`)::

    check(method, batch)          every part, before anything changes (it may refuse the batch)
    before_step(method, batch)    every part: may choose what the step adapts on, add a context
                                  around the step, give the step the given model's predictions
    the method's step on batch.step_x (its own transaction), unless a part set it to None
    after_step(method, batch)     every part: may change what is served, or ask for a reset
    reset / state_dict / load_state_dict, with the method's own

A part never calls another part and is never attached after construction; a part that needs what
another part produced reads it from the :class:`Batch` (the given model's predictions for a
drawing selector, the step's answers for the fallback).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn
from typing_extensions import Protocol, runtime_checkable

__all__ = ["Batch", "Hook", "HostMethod"]


class HostMethod(Protocol):
    """What the parts read of the method they serve (:class:`eatta.AdaptiveMethod`, declared
    here so that the parts' modules and the method's need not import each other)."""

    adapts: ClassVar[bool]
    model: nn.Module

    @property
    def params(self) -> list[nn.Parameter]: ...

    @property
    def has_batchnorm(self) -> bool: ...

    @property
    def given(self) -> nn.Module: ...

    def params_at_creation(self) -> list[tuple[nn.Parameter, Tensor]]: ...

    def logits(self, x: Tensor) -> Tensor: ...

    def given_logits(self, x: Tensor) -> Tensor: ...

    def label_takers(self) -> list[object]: ...


@dataclass
class Batch:
    """One request on its way through a method and its parts.

    ``x``, ``labels``: the request and its simulated labels (None: none given). ``step_x``,
    ``step_labels``: what the step adapts on (the request itself unless a window chose its
    samples; None: no step this time). ``adapted``: the adapted model's logits for ``x``, before
    its update; ``step_logits``: the step's (before the update); ``served``: what the method
    returns (a part may replace it). ``reference``: the given model's class for each row of
    ``step_x`` (-1 where it did not predict), read by a selector that draws by disagreement, and
    ``candidates`` the rows it predicted on (None: all). ``asked``: what each step asked and was
    answered. ``around``: contexts entered around the step. ``reset``: why a part asks for the
    method's reset after this batch (None: no reset).
    """

    x: Tensor
    labels: Tensor | None = None
    step_x: Tensor | None = None
    step_labels: Tensor | None = None
    adapted: Tensor | None = None
    step_logits: Tensor | None = None
    served: Tensor | None = None
    reference: Tensor | None = None
    candidates: Tensor | None = None
    asked: list[Any] = field(default_factory=list)  # eatta.methods.active.AnswerRecord
    around: list[Callable[[], AbstractContextManager[Any]]] = field(default_factory=list)
    reset: str | None = None

    @property
    def stepped(self) -> bool:
        """Whether the method stepped on this request (or on a window it completed)."""
        return self.step_logits is not None


@runtime_checkable
class Hook(Protocol):
    """An optional part of a method (see the module docstring). Every call is made by the
    method; none is needed beyond these.

    ``name``: the keyword the part is given as (``window``, ``fallback``, ``monitor``,
    ``weight_anchor``) and the key of its state in the method's. ``measures``: whether it
    measures the stream (the fallback, the monitor): such a part keeps its state through a reset
    that a part asked for (``batch.reset``), and is cleared by the user's ``reset()`` only.
    """

    name: str
    measures: bool

    def check(self, method: HostMethod, batch: Batch) -> None: ...

    def before_step(self, method: HostMethod, batch: Batch) -> None: ...

    def after_step(self, method: HostMethod, batch: Batch) -> None: ...

    def reset(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
