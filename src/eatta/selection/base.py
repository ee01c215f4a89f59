"""The selector protocol: which samples of a batch to send to the oracle."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import Protocol, runtime_checkable

from eatta.balance import ClassBalance, Selection
from eatta.losses import entropy

__all__ = ["DeferredRead", "ScoreSelector", "SelectionContext", "Selector", "to_host"]


@runtime_checkable
class DeferredRead(Protocol):
    """A 0-d flag the method must know on the host before anything changes (the input's
    finiteness, computed on the device): a selector that copies the batch's scores to the host
    copies ``flag`` in the same read and hands its value to :meth:`resolve`, so the step waits
    for the device once (the method reads it itself if no selector did)."""

    flag: Tensor | None

    def resolve(self, value: bool) -> None: ...


def to_host(*tensors: Tensor) -> list[Tensor]:
    """Each tensor on the CPU, flattened, as float64, in ONE device-to-host copy (one wait for an
    accelerator instead of one per tensor). Exact for float32 values and integers below 2**53."""
    flat = [t.detach().reshape(-1).double() for t in tensors]
    packed = torch.cat(flat).cpu()
    return list(packed.split([t.numel() for t in flat]))


@dataclass
class SelectionContext:
    """What a selector may look at: the batch, its features and logits, and the model's parts.

    ``features`` and ``logits`` carry the autograd graph of the step; selectors must only read them
    (use ``.detach()``). ``backbone`` is the feature extractor, for selectors that re-run the model
    on transformed inputs (e.g. PLPD); None when the method does not provide it. ``reference``
    and ``candidates``: the given model's predictions, for a selector that draws by disagreement
    (:class:`~eatta.selection.drawn.DisagreementDraw`).
    """

    inputs: Tensor
    features: Tensor
    logits: Tensor
    head: nn.Module
    backbone: nn.Module | None = None
    #: a flag to read with the selection (see :class:`DeferredRead`); None: none
    deferred: DeferredRead | None = None
    #: the given model's class for each sample (-1 where it did not predict), when a part of
    #: the method predicted with it (the fallback); None: not known
    reference: Tensor | None = None
    #: the positions the given model predicted on (None: all, or not known)
    candidates: Tensor | None = None

    @cached_property
    def probs(self) -> Tensor:
        return self.logits.detach().softmax(dim=1)

    @cached_property
    def pseudo_labels(self) -> Tensor:
        return self.logits.detach().argmax(dim=1)

    @cached_property
    def entropy(self) -> Tensor:
        return entropy(self.logits.detach())


@runtime_checkable
class Selector(Protocol):
    """Chooses up to ``k`` samples to label, through a class balance.

    ``select`` may advance a random generator but must not change other state: the method saves
    ``state_dict()`` before and restores it if the step fails. State that depends on the labels
    (anchors, clusters) is updated in ``commit`` once the oracle has answered.
    """

    def select(self, ctx: SelectionContext, k: int, balance: ClassBalance) -> Selection: ...

    def commit(self, ctx: SelectionContext, selection: Selection, labels: Tensor) -> None: ...

    def reset(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ScoreSelector:
    """A selector defined by a per-sample score: larger means more worth labelling.

    Subclasses implement :meth:`score`; selection ranks by score under the class balance.
    """

    def score(self, ctx: SelectionContext) -> Tensor:
        raise NotImplementedError

    def select(self, ctx: SelectionContext, k: int, balance: ClassBalance) -> Selection:
        """The class balance's pick by score. The scores and pseudo-labels reach the host in one
        copy, with the context's deferred flag (:class:`DeferredRead`), so the balance ranks
        them on the host without waiting for the device again; on the CPU they are used as
        they are (the same order: a stable sort of the same values)."""
        scores = self.score(ctx)
        pseudo = ctx.pseudo_labels
        deferred = ctx.deferred
        flag = None if deferred is None else deferred.flag
        if flag is not None or scores.device.type != "cpu":
            read = to_host(scores, pseudo, *([] if flag is None else [flag]))
            if flag is not None and deferred is not None:
                deferred.resolve(bool(read[2][0] != 0))
            ranked, pseudo = read[0].to(scores.dtype), read[1].long()
        else:
            ranked = scores
        selection = balance.plan(ranked, pseudo, k)
        selection.update.setdefault("scores", scores)
        return selection

    def commit(self, ctx: SelectionContext, selection: Selection, labels: Tensor) -> None:
        pass

    def reset(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class OwnGenerator:
    """A part's own random stream, so its draws replay identically whatever else draws:
    ``generator`` goes back to its first state on :meth:`reset` and its state is the part's
    :meth:`state_dict` (``{"rng": ...}``). Call :meth:`own` with the seeded generator."""

    generator: torch.Generator
    _initial: Tensor

    def own(self, generator: torch.Generator) -> None:
        """Keep ``generator`` (seeded) and its first state."""
        self.generator = generator
        self._initial = generator.get_state()

    def reset(self) -> None:
        self.generator.set_state(self._initial)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["rng"])
