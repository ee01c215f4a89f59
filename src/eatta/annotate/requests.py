"""What a method asks an annotator, and what comes back.

A :class:`LabelRequest` is one selected sample: a stable id, the sample, and the model's logits
for it (its prediction and confidence are what a person, or a yes/no annotator, is shown). An
:class:`Answer` names a request by id and gives a class (``label``), a yes/no on the request's
prediction (``correct``), or ``skip``. Answers are checked where they are handed in: a wrong type,
a class out of range or a request that is not open raises :class:`AnswerError` naming it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

__all__ = ["FEEDBACK", "Answer", "AnswerError", "Feedback", "LabelRequest", "check_feedback"]

#: What an annotator answers: a full class label, or yes/no on the model's prediction.
Feedback = Literal["label", "binary"]
FEEDBACK: tuple[Feedback, ...] = ("label", "binary")


class AnswerError(ValueError):
    """An answer that cannot be taken: unknown, expired, answered or cancelled request, a value of
    the wrong type or out of range. Nothing was applied."""


def check_feedback(kind: object) -> Feedback:
    """``kind`` if it is a known feedback kind, else a :class:`ValueError` naming it."""
    if kind not in FEEDBACK:
        raise ValueError(f"unknown feedback kind {kind!r}; use one of {', '.join(FEEDBACK)}")
    return kind  # narrowed to Feedback by the membership test above


@dataclass(frozen=True, eq=False)
class LabelRequest:
    """One sample a method asks about.

    ``sample`` and ``logits`` are detached copies on the model's device; reading
    :attr:`prediction` or :attr:`confidence` synchronises with it (the annotator pays that, not the
    step). ``step`` is the method's step at which it was asked, ``index`` the sample's position in
    that batch, ``kind`` the feedback the method asks for.
    """

    id: str
    sample: Tensor
    logits: Tensor
    kind: Feedback
    step: int
    index: int

    @property
    def num_classes(self) -> int:
        return int(self.logits.shape[-1])

    @property
    def prediction(self) -> int:
        """The model's class for the sample when it was asked."""
        return int(self.logits.argmax())

    @property
    def confidence(self) -> float:
        """The model's probability for :attr:`prediction`."""
        return float(self.logits.float().softmax(-1).max())


def _label(value: object, rid: str) -> int:
    if isinstance(value, bool):
        raise AnswerError(f"answer to {rid!r}: label must be an integer class, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]  # ints, numpy and 0-d int tensors
    except TypeError:
        raise AnswerError(
            f"answer to {rid!r}: label must be an integer class, got {type(value).__name__} "
            f"{value!r}"
        ) from None


@dataclass(frozen=True)
class Answer:
    """An annotator's answer to request ``id``: exactly one of ``label`` (a class),
    ``correct`` (yes/no on the request's prediction) or ``skip=True``."""

    id: str
    label: int | None = None
    correct: bool | None = None
    skip: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise AnswerError(f"an answer needs a request id (a non-empty str), got {self.id!r}")
        if not isinstance(self.skip, bool):
            raise AnswerError(f"answer to {self.id!r}: skip must be a bool, got {self.skip!r}")
        given = [self.label is not None, self.correct is not None, self.skip]
        if sum(given) != 1:
            raise AnswerError(
                f"answer to {self.id!r} must give exactly one of label, correct, skip"
            )
        if self.label is not None:
            object.__setattr__(self, "label", _label(self.label, self.id))
        if self.correct is not None and not isinstance(self.correct, bool):
            raise AnswerError(
                f"answer to {self.id!r}: a yes/no answer must be a bool, got "
                f"{type(self.correct).__name__} {self.correct!r}"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Answer:
        """An answer from JSON-like data (``{"id": ..., "label": k}``, ``{"id": ..., "correct":
        true}`` or ``{"id": ..., "skip": true}``); unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise AnswerError(f"an answer must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"id", "label", "correct", "skip"})
        if unknown:
            raise AnswerError(
                f"unknown answer key(s) {unknown}; use id with label, correct or skip"
            )
        return cls(
            id=data.get("id"),  # type: ignore[arg-type]  # checked in __post_init__
            label=data.get("label"),
            correct=data.get("correct"),
            skip=data.get("skip", False),
        )

    def check(self, num_classes: int) -> None:
        """Raise :class:`AnswerError` if the label is outside ``[0, num_classes)``."""
        if self.label is not None and not 0 <= self.label < num_classes:
            raise AnswerError(
                f"answer to {self.id!r}: label {self.label} is outside [0, {num_classes})"
            )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.label is not None:
            out["label"] = self.label
        elif self.correct is not None:
            out["correct"] = self.correct
        else:
            out["skip"] = True
        return out
