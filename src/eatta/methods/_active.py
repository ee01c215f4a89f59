"""Helpers shared by the active methods (EATTA, SimATTA, CEMA): selecting and asking safely,
synchronously (a callable oracle) or asynchronously (:class:`AsyncAsking`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from eatta.annotate.base import Annotator, is_asynchronous
from eatta.annotate.oracle import ABSTAIN, Oracle, OracleError, validate_labels
from eatta.annotate.pending import Arrived, PendingLabels
from eatta.annotate.requests import Answer, Feedback, check_feedback
from eatta.balance import ClassBalance, Selection
from eatta.selection.base import SelectionContext, Selector

__all__ = [
    "DEFAULT_LABEL_EXPIRY",
    "AsyncAsking",
    "ask_oracle",
    "check_annotator",
    "checked_selection",
    "commit_late",
    "current_answers",
    "select_and_ask",
    "split_answer",
]

#: Default steps a request may wait for its answer before it expires (see PendingLabels).
DEFAULT_LABEL_EXPIRY = 256


def ask_oracle(oracle: Oracle, x: Tensor, indices: Tensor, num_classes: int) -> Tensor | None:
    """The oracle's validated labels for ``x[indices]`` (None: abstained on all; no call if empty).

    Exceptions raised by the oracle are wrapped in :class:`~eatta.annotate.oracle.OracleError`.
    """
    if not len(indices):
        return None
    try:
        answer = oracle(x[indices.to(x.device, non_blocking=True)], indices.clone())
    except Exception as err:  # the annotator's own failure, reported as such
        raise OracleError(f"the oracle raised {type(err).__name__}: {err}") from err
    return validate_labels(answer, len(indices), num_classes)


def split_answer(indices: Tensor, labels: Tensor | None) -> tuple[Tensor, Tensor, Any]:
    """``(labelled indices, their labels, answered mask)`` from a validated answer."""
    if labels is None:
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty, torch.zeros(len(indices), dtype=torch.bool)
    answered = labels != ABSTAIN
    return indices[answered], labels[answered], answered


def checked_selection(
    selector: Selector,
    balance: ClassBalance,
    ctx: SelectionContext,
    k: int,
    check: Callable[[Selection], None] | None = None,
) -> Selection:
    """The selector's pick of up to ``k`` samples, checked (unique, in range, at most ``k``),
    then ``check`` (a method's own sanity check)."""
    selection = selector.select(ctx, k, balance)
    idx = selection.indices
    batch = ctx.inputs.shape[0]
    if idx.dim() != 1 or len(idx) > k or len(set(idx.tolist())) != len(idx):
        raise RuntimeError(f"selector returned invalid indices {idx.tolist()} for k={k}")
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= batch):
        raise RuntimeError(f"selector returned out-of-range indices {idx.tolist()}")
    if check is not None:
        check(selection)
    return selection


def select_and_ask(
    selector: Selector,
    balance: ClassBalance,
    ctx: SelectionContext,
    k: int,
    oracle: Oracle,
    check: Callable[[Selection], None] | None = None,
) -> tuple[Selection, Tensor | None]:
    """Select up to ``k`` samples and get the oracle's validated labels for them.

    If anything fails, the selector's state (its random generator, running statistics) is
    restored before the error propagates.
    """
    saved = selector.state_dict()
    try:
        selection = checked_selection(selector, balance, ctx, k, check)
        labels = ask_oracle(oracle, ctx.inputs, selection.indices, ctx.logits.shape[1])
    except BaseException:
        selector.load_state_dict(saved)
        raise
    return selection, labels


def check_annotator(
    oracle: object, method: str, *, binary: bool, label_expiry: int = DEFAULT_LABEL_EXPIRY
) -> Feedback | None:
    """The feedback kind of an asynchronous annotator (None for a synchronous callable).

    A :class:`TypeError` if it is neither, or gives yes/no answers to a method that cannot use
    them; a :class:`ValueError` for a ``label_expiry`` other than the default with a synchronous
    oracle (it would be ignored: nothing waits)."""
    if is_asynchronous(oracle):
        kind = check_feedback(getattr(oracle, "feedback", "label"))
        if kind == "binary" and not binary:
            raise TypeError(
                f"{method} learns from class labels only; yes/no annotators "
                "(feedback='binary') work with eatta, eatta-stable and baseline"
            )
        return kind
    if not callable(oracle):
        raise TypeError(
            f"oracle must be a callable oracle(inputs, indices) or an asynchronous annotator "
            f"(submit/collect/cancel), got {type(oracle).__name__}"
        )
    if label_expiry != DEFAULT_LABEL_EXPIRY:
        raise ValueError(
            f"label_expiry={label_expiry!r} applies to asynchronous annotators; {method}'s oracle "
            "answers at once"
        )
    return None


class AsyncAsking:
    """An active method's side of an asynchronous annotator.

    Per step: :meth:`begin` (expire old requests), :meth:`request` (select and submit),
    :meth:`collect` (the answers that arrived, split into this step's and earlier steps'), and
    after the update :meth:`committed` (tell the annotator which requests expired). If the step
    fails or is skipped, :meth:`rolled_back` cancels what this step submitted and keeps the
    answers it collected for the next step (answers to its own, cancelled, requests are then
    refused), so no answer an annotator delivered is lost.
    """

    def __init__(self, annotator: Annotator, feedback: Feedback, label_expiry: int) -> None:
        self.annotator = annotator
        self.feedback = feedback
        self.pending = PendingLabels(label_expiry)
        self._expired: list[str] = []
        self._sent: list[str] = []
        self._collected: list[Answer] = []

    def begin(self) -> None:
        self._expired = self.pending.begin_step()
        # what a failure before collect() must keep: the answers carried over, not yet resolved
        self._sent, self._collected = [], list(self.pending.carried)

    def request(
        self,
        selector: Selector,
        balance: ClassBalance,
        ctx: SelectionContext,
        k: int,
        check: Callable[[Selection], None] | None = None,
    ) -> Selection:
        """Select up to ``k`` samples and submit them (selector restored if anything fails)."""
        saved = selector.state_dict()
        try:
            selection = checked_selection(selector, balance, ctx, k, check)
            requests = self.pending.ask(selection, ctx.inputs, ctx.logits, self.feedback)
            if requests:
                try:
                    self.annotator.submit(requests)
                except Exception as err:  # the annotator's own failure, reported as such
                    name = type(err).__name__
                    raise OracleError(f"the annotator's submit raised {name}: {err}") from err
                self._sent = [r.id for r in requests]
        except BaseException:
            selector.load_state_dict(saved)
            raise
        return selection

    def collect(self) -> tuple[list[Arrived], list[Arrived]]:
        """The answers that arrived: ``(this step's, earlier steps')``."""
        try:
            answers = list(self.annotator.collect())
        except Exception as err:
            name = type(err).__name__
            raise OracleError(f"the annotator's collect raised {name}: {err}") from err
        bad = [a for a in answers if not isinstance(a, Answer)]
        if bad:
            name = type(bad[0]).__name__
            raise OracleError(f"the annotator's collect returned {name}, not Answer")
        self._collected = [*self.pending.carried, *answers]
        return self.pending.resolve(answers)

    @property
    def sent(self) -> int:
        """Requests submitted in this step."""
        return len(self._sent)

    def committed(self) -> None:
        if self._expired:
            self.annotator.cancel(list(self._expired))
        self._expired, self._sent, self._collected = [], [], []

    def rolled_back(self) -> None:
        """After the parts were restored: cancel this step's requests, and keep the answers it
        collected for the next step (an annotator delivers an answer once)."""
        if self._sent:
            self.annotator.cancel(list(self._sent))
        self.pending.carried = list(self._collected)
        self._expired, self._sent, self._collected = [], [], []

    def dropped(self) -> None:
        """After ``reset()``: cancel what the reset dropped."""
        if self.pending.dropped_ids:
            self.annotator.cancel(list(self.pending.dropped_ids))
            self.pending.dropped_ids = []


def current_answers(asked: Tensor, current: list[Arrived]) -> tuple[Tensor, Tensor, Tensor]:
    """``(labels, negatives, not_labels)`` for this step's asked samples: labels aligned with
    ``asked`` (``ABSTAIN`` where no class came), and the samples answered "no" with the class
    they are not."""
    by_index = {a.request.index: a for a in current}
    labels = torch.full((len(asked),), ABSTAIN, dtype=torch.long)
    negatives, not_labels = [], []
    for j, i in enumerate(asked.tolist()):
        a = by_index.get(i)
        if a is None:
            continue
        if a.label is not None:
            labels[j] = a.label
        elif a.not_label is not None:
            negatives.append(i)
            not_labels.append(a.not_label)
    return (
        labels,
        torch.tensor(negatives, dtype=torch.long),
        torch.tensor(not_labels, dtype=torch.long),
    )


def commit_late(
    balance: ClassBalance,
    selector: Selector,
    late: list[Arrived],
    ctx: SelectionContext | None,
) -> None:
    """Tell the class balance and the selector about late labels, as if they had come in their
    own step: the balance gets each label with the selection of the step that asked; the selector
    gets them with ``ctx``, the late samples' context (inputs, features, logits by the current
    model, rows in the order of ``late``'s labelled arrivals)."""
    labelled = [a for a in late if a.label is not None]
    for a in labelled:
        if a.selection is None:
            continue
        n = len(a.selection.indices)
        answered = [j == a.position for j in range(n)]
        labels = [a.label if j == a.position else ABSTAIN for j in range(n)]
        balance.commit(a.selection, answered, labels)  # type: ignore[arg-type]  # ints
    if labelled and ctx is not None:
        rows = torch.arange(len(labelled))
        selection = Selection(rows, [int(a.label) for a in labelled])  # type: ignore[arg-type]
        labels_t = torch.tensor([a.label for a in labelled], dtype=torch.long)
        selector.commit(ctx, selection, labels_t)
