"""Class balancing of the labelled samples: which classes were labelled recently.

A class balance turns per-sample scores (larger = more worth labelling) and pseudo-labels into the
indices to label, without changing itself (:meth:`plan`); the method calls :meth:`commit` only
once the oracle has answered, so a failed step leaves the balance untouched.

- :class:`NoClassBalance`: plain top-k by score.
- :class:`LastKClasses`: the paper's rule (Sec. 3.2): skip classes among the last K labels.
- :class:`ReferenceBalance`: the rule of the authors' code that produced the published
  numbers and the golden traces (docs/method.md §3).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from typing_extensions import Protocol, runtime_checkable

__all__ = [
    "ClassBalance",
    "LastKClasses",
    "NoClassBalance",
    "ReferenceBalance",
    "Selection",
    "make_balance",
]


@dataclass
class Selection:
    """Indices chosen for labelling (CPU, int64, in the rule's order) and the balance update."""

    indices: Tensor
    classes: list[int] = field(default_factory=list)
    update: dict[str, Any] = field(default_factory=dict)


def _ranked(scores: Tensor, pseudo_labels: Tensor) -> tuple[list[int], list[int], list[float]]:
    """Sample order by descending score, with classes and scores, in one device-to-host copy."""
    order = torch.argsort(scores.detach(), descending=True, stable=True)
    packed = torch.stack(
        [order.double(), pseudo_labels[order].double(), scores.detach()[order].double()]
    ).cpu()
    o, c, s = packed.tolist()
    return [int(i) for i in o], [int(i) for i in c], s


@runtime_checkable
class ClassBalance(Protocol):
    """Chooses ``k`` samples from scores and pseudo-labels; remembers what was labelled."""

    def plan(self, scores: Tensor, pseudo_labels: Tensor, k: int) -> Selection: ...

    def commit(
        self, selection: Selection, answered: list[bool], labels: list[int] | None = None
    ) -> None: ...

    def reset(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class NoClassBalance:
    """No class balancing: the ``k`` highest scores."""

    def plan(self, scores: Tensor, pseudo_labels: Tensor, k: int) -> Selection:
        order, classes, _ = _ranked(scores, pseudo_labels)
        k = min(k, len(order))
        return Selection(torch.tensor(order[:k], dtype=torch.long), classes[:k])

    def commit(
        self, selection: Selection, answered: list[bool], labels: list[int] | None = None
    ) -> None:
        pass

    def reset(self) -> None:
        pass

    def snapshot(self) -> None:
        return None

    def restore(self, token: None) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    @property
    def classes(self) -> list[int]:
        return []


class LastKClasses:
    """The paper's rule: prefer the best sample whose class is not among the last ``K`` labels.

    The last ``K`` labels are the annotated classes (the oracle's answers, as the paper's text
    says), compared with the candidates' pseudo-labels. For ``k > 1`` labels the rule is applied
    greedily, each pick adding its pseudo-label to the recent set for the rest of the batch; when
    every remaining candidate's class is recent, the best remaining score is taken.
    """

    def __init__(self, k_recent: int = 2) -> None:
        if k_recent < 0:
            raise ValueError(f"k_recent must be >= 0, got {k_recent}")
        self.k_recent = k_recent
        self._recent: deque[int] = deque(maxlen=k_recent)

    @property
    def classes(self) -> list[int]:
        return list(self._recent)

    def plan(self, scores: Tensor, pseudo_labels: Tensor, k: int) -> Selection:
        order, classes, _ = _ranked(scores, pseudo_labels)
        k = min(k, len(order))
        recent = deque(self._recent, maxlen=self.k_recent)
        taken: list[int] = []
        taken_classes: list[int] = []
        for _ in range(k):
            pick = next(
                (p for p in range(len(order)) if p not in taken and classes[p] not in recent),
                None,
            )
            if pick is None:
                pick = next(p for p in range(len(order)) if p not in taken)
            taken.append(pick)
            taken_classes.append(classes[pick])
            if self.k_recent:
                recent.append(classes[pick])
        idx = torch.tensor([order[p] for p in taken], dtype=torch.long)
        return Selection(idx, taken_classes)

    def commit(
        self, selection: Selection, answered: list[bool], labels: list[int] | None = None
    ) -> None:
        """Record the answered samples' labels (their pseudo-labels if ``labels`` is None)."""
        classes = selection.classes if labels is None else labels
        for c, ok in zip(classes, answered, strict=True):
            if ok and self.k_recent:
                self._recent.append(int(c))

    def reset(self) -> None:
        self._recent.clear()

    def snapshot(self) -> list[int]:
        return list(self._recent)

    def restore(self, token: list[int]) -> None:
        self._recent = deque(token, maxlen=self.k_recent)

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self._recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recent = deque((int(c) for c in state["recent"]), maxlen=self.k_recent)


class ReferenceBalance:
    """The class balancing of the authors' code (docs/method.md §3), behind the paper's numbers.

    State: ``history`` (class ids) and ``stored_diff[c]``, the score of the sample last labelled
    for class ``c``. With an empty history the top-``m`` are taken. Otherwise each of the top-``m``
    candidates (class ``c``, score ``d``) is taken if ``c`` is not in the history or
    ``d >= stored_diff[c]``; if ``c`` is in the history and ``d < stored_diff[c]``, the first sample
    at sorted position ``>= m`` whose class is not in the history is taken instead (nothing if
    none). Selected samples come out in sorted-position order, each at most once. If nothing was
    taken, the top-``m`` are (and the history is not extended). Taken classes are appended, then a
    history longer than 2 keeps only its last element (not after the first, empty-history
    selection: the reference code trims only in its balancing branch, as trace B shows).
    """

    def __init__(self) -> None:
        self.history: list[int] = []
        self.stored_diff: dict[int, float] = {}

    @property
    def classes(self) -> list[int]:
        return list(self.history)

    def plan(self, scores: Tensor, pseudo_labels: Tensor, k: int) -> Selection:
        order, classes, diffs = _ranked(scores, pseudo_labels)
        m = min(k, len(order))
        if not self.history:
            picked = list(range(m))
            return self._selection(order, classes, diffs, picked, extend=True, trim=False)
        recent = set(self.history)
        chosen: set[int] = set()
        assigned: list[int] = []  # sorted positions, in the order their stored_diff is written
        for j in range(m):
            c, d = classes[j], diffs[j]
            if c in recent and d < self.stored_diff.get(c, float("-inf")):
                j = next((q for q in range(m, len(order)) if classes[q] not in recent), -1)
                if j < 0:
                    continue
            chosen.add(j)
            assigned.append(j)
        if not chosen:
            return self._selection(order, classes, diffs, list(range(m)), extend=False)
        return self._selection(
            order, classes, diffs, sorted(chosen), extend=True, assigned=assigned
        )

    @staticmethod
    def _selection(
        order: list[int],
        classes: list[int],
        diffs: list[float],
        positions: list[int],
        extend: bool,
        assigned: list[int] | None = None,
        trim: bool = True,
    ) -> Selection:
        writes = [(classes[q], diffs[q]) for q in (positions if assigned is None else assigned)]
        idx = torch.tensor([order[q] for q in positions], dtype=torch.long)
        picked_classes = [classes[q] for q in positions]
        return Selection(idx, picked_classes, {"extend": extend, "trim": trim, "writes": writes})

    def commit(
        self, selection: Selection, answered: list[bool], labels: list[int] | None = None
    ) -> None:
        """Record the answered picks' pseudo-labels (the reference code ignores the labels)."""
        if not any(answered):
            return
        answered_classes = {c for c, ok in zip(selection.classes, answered, strict=True) if ok}
        for c, d in selection.update["writes"]:
            if c in answered_classes:
                self.stored_diff[c] = d
        if selection.update["extend"]:
            self.history.extend(c for c, ok in zip(selection.classes, answered, strict=True) if ok)
            if selection.update["trim"] and len(self.history) > 2:
                self.history = self.history[-1:]

    def reset(self) -> None:
        self.history = []
        self.stored_diff = {}

    def snapshot(self) -> tuple[list[int], dict[int, float]]:
        return list(self.history), dict(self.stored_diff)

    def restore(self, token: tuple[list[int], dict[int, float]]) -> None:
        self.history, self.stored_diff = list(token[0]), dict(token[1])

    def state_dict(self) -> dict[str, Any]:
        keys = sorted(self.stored_diff)
        return {
            "history": list(self.history),
            "stored_classes": keys,
            "stored_diff": [self.stored_diff[c] for c in keys],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [int(c) for c in state["history"]]
        self.stored_diff = {
            int(c): float(d)
            for c, d in zip(state["stored_classes"], state["stored_diff"], strict=True)
        }


def make_balance(spec: str | ClassBalance | None) -> ClassBalance:
    """A class balance from a name (``"reference"``, ``"last-k"``, ``"none"``) or an instance."""
    if spec is None or spec == "none":
        return NoClassBalance()
    if spec == "reference":
        return ReferenceBalance()
    if spec in ("last-k", "paper"):
        return LastKClasses()
    if isinstance(spec, str):
        raise ValueError(f"unknown class balance {spec!r}; use 'reference', 'last-k' or 'none'")
    if not isinstance(spec, ClassBalance):
        raise TypeError(
            "balance must be a name ('reference', 'last-k', 'none'), None or a ClassBalance, "
            f"got {type(spec).__name__}"
        )
    return spec
