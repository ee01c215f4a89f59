"""The selector protocol: which samples of a batch to send to the oracle."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from torch import Tensor, nn
from typing_extensions import Protocol, runtime_checkable

from eatta.balance import ClassBalance, Selection
from eatta.losses import entropy

__all__ = ["ScoreSelector", "SelectionContext", "Selector"]


@dataclass
class SelectionContext:
    """What a selector may look at: the batch, its features and logits, and the model's parts.

    ``features`` and ``logits`` carry the autograd graph of the step; selectors must only read them
    (use ``.detach()``). ``backbone`` is the feature extractor, for selectors that re-run the model
    on transformed inputs (e.g. PLPD); None when the method does not provide it.
    """

    inputs: Tensor
    features: Tensor
    logits: Tensor
    head: nn.Module
    backbone: nn.Module | None = None

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
        scores = self.score(ctx)
        selection = balance.plan(scores, ctx.pseudo_labels, k)
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
