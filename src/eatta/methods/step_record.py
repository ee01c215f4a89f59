"""What one EATTA step did (:attr:`eatta.EATTA.last_step`): a short summary when printed."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from eatta.annotate.pending import Arrived
from eatta.debias import LossWeights

__all__ = ["StepRecord", "late_answers"]

#: No sample: the default of the record's index fields (never written into: a step that records
#: indices sets tensors of its own).
_NONE = torch.empty(0, dtype=torch.long)


def _short(t: Tensor | None) -> str:
    if t is None:
        return "-"
    return f"{float(t):.4g}" if t.numel() == 1 else str(t.tolist())


@dataclass(repr=False)
class StepRecord:
    """What one adaptation step did; tensors stay on the device (reading them syncs).

    ``requested``: this batch's samples sent to the annotator; ``selected``/``labels``: those
    answered with a class in this step (with a late annotator, empty until the answer lands:
    ``late`` counts the earlier requests answered in this step, ``late_answers`` lists them as
    ``(step asked, sample, answer)``). ``asked`` and ``answered`` count them: samples sent to the
    annotator in this step, and answers heard in it (classes and "no"s, late ones included),
    what the method's ``labels_asked`` and ``labels_answered`` add up.
    ``negatives``: this batch's samples answered "no". ``skipped``: the gradients were not
    finite, so no update was applied and no state changed. ``grad_norms_approx``: the norms are
    the approximate step's estimates. Printed, it is a short summary; the tensors are its fields.
    """

    logits: Tensor
    pseudo_labels: Tensor
    scores: Tensor | None = None
    requested: Tensor = _NONE
    selected: Tensor = _NONE
    labels: Tensor = _NONE
    class_history: list[int] = field(default_factory=list)
    loss_sup: Tensor | None = None
    loss_unsup: Tensor | None = None
    num_unsup: Tensor | None = None
    grad_norm_sup: Tensor | None = None
    grad_norm_unsup: Tensor | None = None
    weights: LossWeights | None = None
    loss: Tensor | None = None
    skipped: bool = False
    negatives: Tensor = _NONE
    late: int = 0
    late_answers: list[tuple[int, int, str]] = field(default_factory=list)
    grad_norms_approx: bool = False
    asked: int = 0
    answered: int = 0

    def __repr__(self) -> str:
        if self.skipped:
            return "StepRecord(skipped: the update was not finite)"
        w = self.weights
        parts = [
            f"asked {self.requested.tolist()}",
            f"answered {dict(zip(self.selected.tolist(), self.labels.tolist(), strict=True))}",
            *([f"no on {self.negatives.tolist()}"] if len(self.negatives) else []),
            *([f"late {self.late_answers}"] if self.late_answers else []),
            f"loss {_short(self.loss)} (sup {_short(self.loss_sup)}, "
            f"unsup {_short(self.loss_unsup)} on {_short(self.num_unsup)})",
            "weights -" if w is None else f"weights {_short(w.sup)} / {_short(w.unsup)}",
        ]
        return f"StepRecord({', '.join(parts)})"


def late_answers(late: list[Arrived]) -> list[tuple[int, int, str]]:
    """Late answers as ``(step asked, sample, "class 3" | "not 3")`` (a "no" on the prediction)."""
    return [
        (
            a.request.step,
            a.request.index,
            f"class {a.label}" if a.label is not None else f"not {a.not_label}",
        )
        for a in late
    ]
