"""The layer every active method shares: the annotator, the budget, asking, and answers' terms.

:class:`ActiveMethod` holds what EATTA, CEMA, SimATTA and the Baseline have in common: the
``oracle`` (a synchronous callable or an asynchronous annotator), the per-batch :class:`Budget`,
one :meth:`~ActiveMethod.ask` for both kinds of annotator, ``labels_used`` and
``annotation_stats``, and the rollback of an asynchronous annotator's requests when a step fails.
:func:`answer_terms` gives the supervised terms of answers that are not a fresh class label: a
"no" on the predicted class (``-log(1 - p_c)``) and late answers re-run through the current
model. The label-free base (:mod:`eatta.methods.base`) knows nothing of annotators.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eatta.annotate.oracle import Oracle
from eatta.annotate.pending import Arrived
from eatta.balance import ClassBalance, Selection
from eatta.budget import Budget
from eatta.losses import complementary_cross_entropy
from eatta.methods._active import (
    DEFAULT_LABEL_EXPIRY,
    AsyncAsking,
    check_annotator,
    current_answers,
    select_and_ask,
    split_answer,
)
from eatta.methods.base import AdaptiveMethod, unique_params
from eatta.selection.base import DeferredRead, SelectionContext, Selector
from eatta.split import ModelSplit

__all__ = ["ActiveMethod", "Answers", "answer_terms", "late_samples"]


def _empty() -> Tensor:
    return torch.empty(0, dtype=torch.long)


@dataclass
class Answers:
    """One step's selection and the annotator's answers (CPU indices and labels).

    ``indices``/``targets``: this batch's samples answered with a class, ``answered`` the mask
    over the selection; ``negatives``/``not_labels``: its samples answered "no" and the class
    each is not; ``late``: answers to earlier steps' requests; ``requested``: requests sent now.
    ``late_ctx`` (the late labelled samples' context) and ``late_weight`` (the late labels'
    weights in all) are filled by the method that learns from late answers.
    """

    ctx: SelectionContext | None
    selection: Selection | None
    labels: Tensor | None
    indices: Tensor
    targets: Tensor
    answered: Tensor
    negatives: Tensor = field(default_factory=_empty)
    not_labels: Tensor = field(default_factory=_empty)
    late: list[Arrived] = field(default_factory=list)
    requested: int = 0
    late_ctx: SelectionContext | None = None
    late_weight: float = 0.0
    _on_device: tuple[Tensor, Tensor] | None = field(default=None, repr=False)

    def on(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """``(indices, targets)`` on ``device``: the answer crosses once, in one copy that does
        not block the host (kept for the rest of the step)."""
        if self._on_device is None or self._on_device[0].device != device:
            both = torch.stack([self.indices, self.targets]).to(device, non_blocking=True)
            self._on_device = (both[0], both[1])
        return self._on_device


class ActiveMethod(AdaptiveMethod):
    """An adaptation method that asks an annotator for at most ``budget`` labels per batch.

    Args:
        model, optimizer: as :class:`~eatta.methods.base.AdaptiveMethod` (the optimizer is
            required: its parameters are the ones adapted, set to ``requires_grad=True``).
        oracle: ``oracle(selected_inputs, indices) -> labels`` answering at once, or an
            asynchronous annotator (``submit``/``collect``/``cancel``) whose answers arrive in
            later steps; yes/no answers (``feedback="binary"``) only where
            :attr:`binary_feedback`.
        budget: labels per batch (int) or a :class:`~eatta.budget.Budget`. With an asynchronous
            annotator it counts requests (the annotator's time is spent when asked).
        label_expiry: steps an asynchronous request waits for its answer before it expires.
        split: ``(backbone, head)`` for models whose split is not found automatically.
        check_finite: refuse batches with NaN or infinite values.
        prepare: converts the model in place once the arguments are checked, before its
            initial state is taken (EATTA's channels-last).
    """

    optimizer: torch.optim.Optimizer  # required here (the base allows None)
    #: Whether the method learns from yes/no answers on its predictions.
    binary_feedback: ClassVar[bool] = False
    #: Whether the selector is consulted on every batch, even with no label to spend (CEMA's
    #: band statistics see the whole stream).
    selects_every_batch: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        oracle: Oracle,
        budget: int | Budget = 1,
        label_expiry: int = DEFAULT_LABEL_EXPIRY,
        split: ModelSplit | tuple[nn.Module, nn.Module] | None = None,
        check_finite: bool = True,
        prepare: Callable[[nn.Module], None] | None = None,
    ) -> None:
        name = type(self).__name__
        if optimizer is None:
            raise TypeError(f"{name} needs an optimizer over the parameters to adapt")
        feedback = check_annotator(
            oracle, name, binary=self.binary_feedback, label_expiry=label_expiry
        )
        if prepare is not None:
            prepare(model)
        super().__init__(model, optimizer, split=split, check_finite=check_finite)
        self.oracle = oracle
        self._asking = (
            None if feedback is None else AsyncAsking(oracle, feedback, label_expiry)  # type: ignore[arg-type]  # asynchronous: checked
        )
        self.budget = Budget.coerce(budget)
        self._train = unique_params(self.params)
        if not self._train:
            raise ValueError("the optimizer holds no parameters")

    # -- what the annotator did ----------------------------------------------------------------
    @property
    def labels_used(self) -> int:
        """Labels (requests, with an asynchronous annotator) spent since the last reset."""
        return self.budget.labels_used

    @property
    def annotation_stats(self) -> dict[str, int]:
        """With an asynchronous annotator: requests sent, answers received, skipped, expired,
        refused, dropped by ``reset()``, and pending now (lifetime totals); else empty."""
        return {} if self._asking is None else self._asking.pending.stats()

    @property
    def asynchronous(self) -> bool:
        """Whether the annotator answers in later steps."""
        return self._asking is not None

    @property
    def request_step(self) -> int:
        """The asynchronous annotator's step counter (the step requests are asked at; 0 for a
        synchronous oracle)."""
        return 0 if self._asking is None else self._asking.pending.step

    # -- asking ----------------------------------------------------------------------------------
    def ask(
        self,
        x: Tensor,
        z: Tensor,
        o: Tensor,
        k: int,
        selector: Selector,
        balance: ClassBalance,
        check: Callable[[Selection], None] | None = None,
        deferred: DeferredRead | None = None,
    ) -> Answers:
        """Select up to ``k`` samples of the batch (features ``z``, logits ``o``) and ask.

        ``deferred``: a flag the selector reads with the selection (:class:`~eatta.selection.
        base.DeferredRead`; ``check`` then sees its value without another host read).

        A synchronous oracle answers now; an asynchronous annotator gets the requests, and the
        answers that arrived since the last step are returned (this step's and earlier ones').
        Nothing but the selector's draw changes, and that is restored if anything fails.
        """
        ctx = None
        if k > 0 or self.selects_every_batch:
            backbone, head = self.split
            ctx = SelectionContext(
                inputs=x, features=z, logits=o, head=head, backbone=backbone, deferred=deferred
            )
        asking = self._asking
        if asking is None:
            selection = labels = None
            if ctx is not None:
                selection, labels = select_and_ask(
                    selector, balance, ctx, k, self.oracle, check=check
                )
            asked = _empty() if selection is None else selection.indices
            indices, targets, answered = split_answer(asked, labels)
            return Answers(ctx, selection, labels, indices, targets, answered)
        asking.begin()
        selection = None if ctx is None else asking.request(selector, balance, ctx, k, check)
        current, late = asking.collect()
        asked = _empty() if selection is None else selection.indices
        labels, negatives, not_labels = current_answers(asked, current)
        indices, targets, answered = split_answer(asked, labels)
        return Answers(
            ctx, selection, labels, indices, targets, answered, negatives, not_labels, late,
            asking.sent,
        )  # fmt: skip

    def charge(self, answers: Answers) -> None:
        """Spend the budget: the labels answered (synchronous) or the requests sent."""
        self.budget.commit(len(answers.indices) if self._asking is None else answers.requested)

    def asking_committed(self) -> None:
        """After the update: tell an asynchronous annotator which requests expired."""
        if self._asking is not None:
            self._asking.committed()

    def asking_parts(self) -> dict[str, Any]:
        """The state parts of this layer (merge into :meth:`state_parts`)."""
        return {
            "budget": self.budget,
            "pending": None if self._asking is None else self._asking.pending,
        }

    # -- transaction hooks ----------------------------------------------------------------------
    def restore_parts(self) -> None:
        """As the base's, then cancel the requests the failed step sent (its collected answers
        are kept for the next step)."""
        super().restore_parts()
        if self._asking is not None:
            self._asking.rolled_back()

    def reset_method_state(self) -> None:
        super().reset_method_state()
        if self._asking is not None:
            self._asking.dropped()


def late_samples(late: list[Arrived], like: Tensor) -> Tensor:
    """The kept samples of late answers, stacked on ``like``'s device and dtype."""
    return torch.stack([a.request.sample for a in late]).to(like.device, like.dtype)


def answer_terms(
    o: Tensor,
    answers: Answers,
    late_logits: Tensor | None = None,
    late_weights: Tensor | None = None,
) -> list[Tensor]:
    """Supervised terms of the answers that are not this batch's class labels.

    ``-log(1 - p_c)`` (:func:`~eatta.losses.complementary_cross_entropy`) on this batch's
    samples answered "no" on class ``c``; and, given ``late_logits`` (the late answers' samples
    through the current model, rows in the order of ``answers.late``), cross-entropy on the late
    class labels and ``-log(1 - p_c)`` on the late "no" answers, each late label at its weight
    when ``late_weights`` are given (the mean over the late labels as without weights).
    """
    terms = []
    if len(answers.negatives):
        neg = answers.negatives.to(o.device)
        terms.append(complementary_cross_entropy(o[neg], answers.not_labels.to(o.device)))
    if late_logits is None:
        return terms
    late, ol, w = answers.late, late_logits, late_weights
    pos = [i for i, a in enumerate(late) if a.label is not None]
    if pos:
        rows = torch.tensor(pos, device=ol.device)
        ys = torch.tensor([late[i].label for i in pos], dtype=torch.long, device=ol.device)
        if w is None:
            terms.append(F.cross_entropy(ol[rows], ys))
        else:
            terms.append((F.cross_entropy(ol[rows], ys, reduction="none") * w[rows]).mean())
    neg_rows = [i for i, a in enumerate(late) if a.not_label is not None]
    if neg_rows:
        rows = torch.tensor(neg_rows, device=ol.device)
        cs = torch.tensor([late[i].not_label for i in neg_rows], dtype=torch.long, device=ol.device)
        term = complementary_cross_entropy(ol[rows], cs)
        terms.append(term if w is None else term * w[rows].mean())
    return terms
