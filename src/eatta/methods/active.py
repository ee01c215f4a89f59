"""The active layer every active method shares: the annotator, the budget, and their state.

:class:`ActiveMethod` holds what EATTA, CEMA, SimATTA and HILTTA have in common: the ``oracle``
(a synchronous callable or an asynchronous annotator, asked through
:class:`~eatta.annotate.asking.Asking`), the per-batch :class:`~eatta.budget.Budget`,
``labels_used`` and ``annotation_stats``, the rollback of an asynchronous annotator's requests
when a step fails, and the annotator's pending answers in the method's state. The label-free
base (:mod:`eatta.methods.base`) knows nothing of annotators.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.asking import DEFAULT_LABEL_EXPIRY, AnswerRecord, Asking
from eatta.annotate.oracle import Oracle
from eatta.balance import ClassBalance, Selection
from eatta.budget import Budget
from eatta.methods.base import AdaptiveMethod, Options, unique_params
from eatta.selection.base import DeferredRead, SelectionContext, Selector

__all__ = ["ActiveMethod", "AnswerRecord"]


class ActiveMethod(AdaptiveMethod):
    """An adaptation method that asks an annotator for at most ``budget`` labels per batch.

    Args:
        model, optimizer: as :class:`~eatta.methods.base.AdaptiveMethod` (the optimizer is
            required: its parameters are the ones adapted).
        oracle: ``oracle(selected_inputs, indices) -> labels`` answering at once, or an
            asynchronous annotator (``submit``/``collect``/``cancel``) whose answers arrive in
            later steps; yes/no answers (``feedback="binary"``) only where
            :attr:`binary_feedback`.
        budget: labels per batch (int) or a :class:`~eatta.budget.Budget`. With an asynchronous
            annotator it counts requests (the annotator's time is spent when asked).
        label_expiry: steps an asynchronous request waits for its answer before it expires.
            options: what every method takes (:class:`~eatta.methods.base.Options`: the parts,
            ``split``, ``check_finite``, ``autocast``, ``channels_last``).
    """

    optimizer: torch.optim.Optimizer  # required here (the base allows None)
    needs_split = True  # the selector reads the features the classifier reads
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
        **options: Unpack[Options],
    ) -> None:
        name = type(self).__name__
        if optimizer is None:
            raise TypeError(f"{name} needs an optimizer over the parameters to adapt")
        asking = Asking(oracle, name, binary=self.binary_feedback, label_expiry=label_expiry)
        budget = Budget.coerce(budget)
        super().__init__(model, optimizer, **options)
        self.oracle = oracle
        self.asking = asking
        self.budget = budget
        self._train = unique_params(self.params)
        if not self._train:
            raise ValueError("the optimizer holds no parameters")

    # -- what the annotator did ----------------------------------------------------------------
    @property
    def labels_used(self) -> int:
        """Labels of the budget spent since the last reset: answers, with labels at once;
        requests, with an asynchronous annotator (its time is spent when asked)."""
        return self.budget.labels_used

    @property
    def labels_asked(self) -> int:
        """Samples the annotator was asked to label since the last reset."""
        return self.budget.asked

    @property
    def labels_answered(self) -> int:
        """Answers heard since the last reset (classes and yes/no; late ones when they land)."""
        return self.budget.answered

    def stats(self) -> dict[str, int]:
        """The label counts since the last reset: ``labels_used`` (the budget spent),
        ``labels_asked``, ``labels_answered``, and ``labels_pending`` (asked, not answered yet,
        with an asynchronous annotator)."""
        pending = self.asking.pending
        return {
            "labels_used": self.labels_used,
            "labels_asked": self.labels_asked,
            "labels_answered": self.labels_answered,
            "labels_pending": 0 if pending is None else len(pending),
        }

    @property
    def annotation_stats(self) -> dict[str, int]:
        """With an asynchronous annotator: requests sent, answers received, skipped, expired,
        refused, dropped by ``reset()``, and pending now (lifetime totals); else empty."""
        return self.asking.stats()

    @property
    def asynchronous(self) -> bool:
        """Whether the annotator answers in later steps."""
        return self.asking.asynchronous

    @property
    def request_step(self) -> int:
        """The asynchronous annotator's step counter (the step requests are asked at; 0 for a
        synchronous oracle)."""
        pending = self.asking.pending
        return 0 if pending is None else pending.step

    # -- asking --------------------------------------------------------------------------------
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
    ) -> AnswerRecord:
        """Select up to ``k`` samples of the batch ``x`` (features ``z``, logits ``o``) and ask
        (:meth:`eatta.annotate.asking.Asking.ask`); the record is kept with the request in
        progress, for the parts. The selector sees the given model's predictions when a part
        gave them (the fallback's), and ``deferred``: a flag it reads with the selection."""
        ctx = None
        if k > 0 or self.selects_every_batch:
            backbone, head = self._split or self.split
            batch = self.batch
            ctx = SelectionContext(
                inputs=x, features=z, logits=o, head=head, backbone=backbone, deferred=deferred,
                reference=None if batch is None else batch.reference,
                candidates=None if batch is None else batch.candidates,
            )  # fmt: skip
        record = self.asking.ask(ctx, k, selector, balance, check)
        if self.batch is not None:
            self.batch.asked.append(record)
        return record

    def charge(self, answers: AnswerRecord) -> None:
        """Spend the budget: the labels answered (synchronous) or the requests sent; count what
        was asked and what was answered (:attr:`labels_asked`, :attr:`labels_answered`)."""
        asked, answered = self.counts(answers)
        spent = asked if self.asking.pending is not None else len(answers.indices)
        self.budget.commit(spent, asked=asked, answered=answered)

    def counts(self, answers: AnswerRecord) -> tuple[int, int]:
        """``(asked, answered)`` in one step: samples sent to the annotator, and answers heard
        (with labels at once, the classes and "no"s to them; with a late annotator, every
        answer that arrived, to this step's requests or earlier ones)."""
        if self.asking.pending is not None:
            return answers.requested, len(answers.arrived)
        selection = answers.selection
        asked = len(answers.indices) if selection is None else len(selection.indices)
        return asked, len(answers.indices) + len(answers.negatives)

    def asking_parts(self) -> dict[str, Any]:
        """The state parts of this layer (merge into :meth:`state_parts`)."""
        return {"budget": self.budget, "pending": self.asking.pending}

    # -- transaction hooks ----------------------------------------------------------------------
    def restore_parts(self) -> None:
        """As the base's, then cancel the requests the failed step sent (its collected answers
        are kept for the next step)."""
        super().restore_parts()
        self.asking.rolled_back()

    def reset_method_state(self) -> None:
        super().reset_method_state()
        self.asking.dropped()

    # -- the annotator's state -------------------------------------------------------------------
    def get_extra_state(self) -> dict[str, Any]:
        state = super().get_extra_state()
        annotator = self.asking.annotator_state()
        if annotator is not None:
            state["annotator"] = annotator
        return state

    def set_extra_state(self, state: dict[str, Any]) -> None:
        super().set_extra_state(state)
        self.asking.load_annotator_state(state.get("annotator"))
