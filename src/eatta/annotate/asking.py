"""Asking, synchronously or not: a method's side of its annotator, and what one step asked.

:class:`Asking` is what an active method (:class:`eatta.methods.active.ActiveMethod`) asks
through. Per step, :meth:`Asking.ask` selects up to ``k`` samples (the selector's pick through a
class balance, checked) and returns an :class:`AnswerRecord`:

- a synchronous oracle (a callable ``oracle(inputs, indices) -> labels``) answers at once, its
  labels validated;
- an asynchronous annotator (``submit`` / ``collect`` / ``cancel``) gets the requests, and the
  answers that arrived since the last step come back, this step's and earlier steps' (late).

Nothing but the selector's draw changes before the answers are validated, and the method's
transaction restores that if anything fails (the selector is one of its state parts). After the
update :meth:`Asking.committed` tells the annotator which requests expired; a failed or skipped step
calls :meth:`Asking.rolled_back`, which cancels what it submitted and keeps the answers it collected
for the next step (an annotator delivers an answer once, so none is lost).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from eatta.annotate.base import Annotator, is_asynchronous
from eatta.annotate.oracle import ABSTAIN, Oracle, OracleError, validate_labels
from eatta.annotate.pending import Arrived, PendingLabels
from eatta.annotate.requests import Answer, Feedback, LabelRequest, check_feedback
from eatta.balance import ClassBalance, Selection
from eatta.selection.base import SelectionContext, Selector

__all__ = [
    "DEFAULT_LABEL_EXPIRY",
    "AnswerRecord",
    "Asking",
    "check_annotator",
]

#: Default steps a request may wait for its answer before it expires (see PendingLabels).
DEFAULT_LABEL_EXPIRY = 256


def _empty() -> Tensor:
    return torch.empty(0, dtype=torch.long)


@dataclass
class AnswerRecord:
    """One step's selection and the annotator's answers (CPU indices and labels).

    ``indices``/``targets``: this batch's samples answered with a class, ``answered`` the mask
    over the selection; ``negatives``/``not_labels``: its samples answered "no" and the class
    each is not; ``late``: answers to earlier steps' requests; ``requests``: the requests sent
    now, and ``arrived`` every answer that arrived in this step, its own and earlier steps'
    (asynchronous). ``late_ctx`` (the late labelled samples' context) and ``late_weight``
    (the late labels' weights in all) are filled by the step that learns from late answers.
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
    requests: list[LabelRequest] = field(default_factory=list)
    arrived: list[Arrived] = field(default_factory=list)
    late_ctx: SelectionContext | None = None
    late_weight: float = 0.0
    _on_device: tuple[Tensor, Tensor] | None = field(default=None, repr=False)

    @property
    def requested(self) -> int:
        """Requests sent in this step (asynchronous)."""
        return len(self.requests)

    def on(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """``(indices, targets)`` on ``device``: the answer crosses once, in one copy that does
        not block the host (kept for the rest of the step)."""
        if self._on_device is None or self._on_device[0].device != device:
            both = torch.stack([self.indices, self.targets]).to(device, non_blocking=True)
            self._on_device = (both[0], both[1])
        return self._on_device


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


def _selected(
    selector: Selector,
    balance: ClassBalance,
    ctx: SelectionContext,
    k: int,
    check: Callable[[Selection], None] | None,
) -> Selection:
    """The selector's pick of up to ``k`` samples, checked (unique, in range, at most ``k``),
    then ``check`` (a method's own check)."""
    selection = selector.select(ctx, k, balance)
    idx = selection.indices
    if idx.dim() != 1 or len(idx) > k or len(set(idx.tolist())) != len(idx):
        raise RuntimeError(f"selector returned invalid indices {idx.tolist()} for k={k}")
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= ctx.inputs.shape[0]):
        raise RuntimeError(f"selector returned out-of-range indices {idx.tolist()}")
    if check is not None:
        check(selection)
    return selection


def _split(indices: Tensor, labels: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(labelled indices, their labels, answered mask)`` from a validated answer."""
    if labels is None:
        return _empty(), _empty(), torch.zeros(len(indices), dtype=torch.bool)
    answered = labels != ABSTAIN
    return indices[answered], labels[answered], answered


class Asking:
    """A method's side of its annotator (see the module docstring).

    Args:
        oracle: ``oracle(selected_inputs, indices) -> labels``, or an asynchronous annotator.
        method: the asking method's name, for messages.
        binary: whether the method learns from yes/no answers.
        label_expiry: steps an asynchronous request waits for its answer before it expires.
    """

    def __init__(
        self,
        oracle: Oracle,
        method: str,
        *,
        binary: bool,
        label_expiry: int = DEFAULT_LABEL_EXPIRY,
    ) -> None:
        feedback = check_annotator(oracle, method, binary=binary, label_expiry=label_expiry)
        self.oracle = oracle
        self.feedback = feedback
        #: the requests an asynchronous annotator has not answered yet (None: synchronous)
        self.pending = None if feedback is None else PendingLabels(label_expiry)
        self._expired: list[str] = []
        self._sent: list[str] = []
        self._collected: list[Answer] = []

    @property
    def asynchronous(self) -> bool:
        """Whether the annotator answers in later steps."""
        return self.pending is not None

    def ask(
        self,
        ctx: SelectionContext | None,
        k: int,
        selector: Selector,
        balance: ClassBalance,
        check: Callable[[Selection], None] | None = None,
    ) -> AnswerRecord:
        """Select up to ``k`` samples of ``ctx`` (None: nothing to select) and ask."""
        if self.pending is None:
            selection = labels = None
            if ctx is not None:  # a failure restores the selector with the method's transaction
                selection = _selected(selector, balance, ctx, k, check)
                labels = self._answer(ctx, selection.indices)
            asked = _empty() if selection is None else selection.indices
            indices, targets, answered = _split(asked, labels)
            return AnswerRecord(ctx, selection, labels, indices, targets, answered)
        self.begin()
        selection, requests = None, list[LabelRequest]()
        if ctx is not None:
            selection, requests = self._request(selector, balance, ctx, k, check)
        current, late = self.collect()
        asked = _empty() if selection is None else selection.indices
        labels, negatives, not_labels = _current(asked, current)
        indices, targets, answered = _split(asked, labels)
        return AnswerRecord(
            ctx, selection, labels, indices, targets, answered, negatives, not_labels, late,
            requests, current + late,
        )  # fmt: skip

    def _answer(self, ctx: SelectionContext, indices: Tensor) -> Tensor | None:
        """The oracle's validated labels for the selected samples (None: it abstained on all;
        no call if none is selected). The oracle's own failure is an :class:`OracleError`."""
        if not len(indices):
            return None
        x, oracle = ctx.inputs, self.oracle
        assert callable(oracle)  # synchronous: a callable
        try:
            answer = oracle(x[indices.to(x.device, non_blocking=True)], indices.clone())
        except Exception as err:  # the annotator's own failure, reported as such
            raise OracleError(f"the oracle raised {type(err).__name__}: {err}") from err
        return validate_labels(answer, len(indices), ctx.logits.shape[1])

    # -- an asynchronous annotator -------------------------------------------------------------
    @property
    def _annotator(self) -> Annotator:
        return self.oracle  # type: ignore[return-value]  # asynchronous: checked at creation

    def begin(self) -> None:
        """A new step of an asynchronous annotator: expire old requests."""
        assert self.pending is not None
        self._expired = self.pending.begin_step()
        # what a failure before collect() must keep: the answers carried over, not yet resolved
        self._sent, self._collected = [], list(self.pending.carried)

    def _request(
        self,
        selector: Selector,
        balance: ClassBalance,
        ctx: SelectionContext,
        k: int,
        check: Callable[[Selection], None] | None,
    ) -> tuple[Selection, list[LabelRequest]]:
        """Select up to ``k`` samples and submit them (a failure restores the selector with the
        method's transaction)."""
        assert self.pending is not None and self.feedback is not None
        selection = _selected(selector, balance, ctx, k, check)
        requests = self.pending.ask(selection, ctx.inputs, ctx.logits, self.feedback)
        if requests:
            try:
                self._annotator.submit(requests)
            except Exception as err:  # the annotator's own failure, reported as such
                name = type(err).__name__
                raise OracleError(f"the annotator's submit raised {name}: {err}") from err
            self._sent = [r.id for r in requests]
        return selection, requests

    def collect(self) -> tuple[list[Arrived], list[Arrived]]:
        """The answers that arrived: ``(this step's, earlier steps')``."""
        assert self.pending is not None
        try:
            answers = list(self._annotator.collect())
        except Exception as err:
            name = type(err).__name__
            raise OracleError(f"the annotator's collect raised {name}: {err}") from err
        bad = [a for a in answers if not isinstance(a, Answer)]
        if bad:
            name = type(bad[0]).__name__
            raise OracleError(f"the annotator's collect returned {name}, not Answer")
        self._collected = [*self.pending.carried, *answers]
        return self.pending.resolve(answers)

    def committed(self) -> None:
        """After the update: tell an asynchronous annotator which requests expired."""
        if self._expired:
            self._annotator.cancel(list(self._expired))
        self._expired, self._sent, self._collected = [], [], []

    def rolled_back(self) -> None:
        """After the method's parts were restored: cancel this step's requests, and keep the
        answers it collected for the next step (an annotator delivers an answer once)."""
        if self.pending is None:
            return
        if self._sent:
            self._annotator.cancel(list(self._sent))
        self.pending.carried = list(self._collected)
        self._expired, self._sent, self._collected = [], [], []

    def dropped(self) -> None:
        """After ``reset()``: cancel what the reset dropped."""
        if self.pending is not None and self.pending.dropped_ids:
            self._annotator.cancel(list(self.pending.dropped_ids))
            self.pending.dropped_ids = []

    def stats(self) -> dict[str, int]:
        """With an asynchronous annotator: requests sent, answers received, skipped, expired,
        refused, dropped by ``reset()``, and pending now (lifetime totals); else empty."""
        return {} if self.pending is None else self.pending.stats()

    def annotator_state(self) -> dict[str, Any] | None:
        """The asynchronous annotator's own state, saved with the method so that answers in
        flight are not lost on a resume (None: synchronous, or nothing pending); an error when
        requests are pending at an annotator that can neither save its state nor keep it itself
        (``durable``)."""
        if self.pending is None:
            return None
        save = getattr(self.oracle, "state_dict", None)
        if save is not None and getattr(self.oracle, "load_state_dict", None) is not None:
            state: dict[str, Any] = save()
            return state
        if len(self.pending) and not getattr(self.oracle, "durable", False):
            raise RuntimeError(
                f"{len(self.pending)} request(s) are pending at {type(self.oracle).__name__}, "
                "which has no state_dict()/load_state_dict() and does not keep its answers "
                "itself (durable): saving now would lose them. Give the annotator "
                "state_dict()/load_state_dict(), use a durable one (eatta.annotate.LabelQueue), "
                "or save when nothing is pending (method.annotation_stats['pending'] == 0)"
            )
        return None

    def load_annotator_state(self, state: dict[str, Any] | None) -> None:
        """Give the annotator back the state :meth:`annotator_state` saved."""
        if state is None:
            return
        load = getattr(self.oracle, "load_state_dict", None)
        if load is None:
            raise ValueError(
                f"this state holds the annotator's pending answers, and "
                f"{type(self.oracle).__name__} has no load_state_dict() to take them"
            )
        load(state)


def _current(asked: Tensor, current: list[Arrived]) -> tuple[Tensor, Tensor, Tensor]:
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
