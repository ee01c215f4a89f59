"""Asynchronous annotators: requests go out, answers come back later, in any order, or never.

A method talks to an asynchronous annotator through three calls (:class:`Annotator`):
``submit(requests)`` when it selects samples, ``collect()`` once per step for the answers that
have arrived (never blocking), and ``cancel(ids)`` for requests it gave up on (expired, or dropped
by ``reset()``). A plain callable ``oracle(inputs, indices)`` stays the synchronous annotator.

:class:`AnswerInbox` is the hand-in point in-process annotators share: it knows which requests are
open and refuses, with :class:`~eatta.annotate.requests.AnswerError`, an answer for an unknown,
expired, already answered or cancelled request, or with a class out of range, before anything is
kept. It is thread-safe, so answers may come from other threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from typing_extensions import Protocol, runtime_checkable

from eatta.annotate.requests import Answer, AnswerError, Feedback, LabelRequest, check_feedback

__all__ = ["Annotator", "AnswerInbox", "QueuedAnnotator", "is_asynchronous"]


@runtime_checkable
class Annotator(Protocol):
    """An asynchronous annotator (see the module docstring)."""

    feedback: Feedback

    def submit(self, requests: Sequence[LabelRequest]) -> None: ...

    def collect(self) -> Sequence[Answer]: ...

    def cancel(self, ids: Sequence[str]) -> None: ...


def is_asynchronous(annotator: object) -> bool:
    """Whether ``annotator`` is an asynchronous :class:`Annotator` (not a plain callable)."""
    return all(callable(getattr(annotator, m, None)) for m in ("submit", "collect", "cancel"))


class AnswerInbox:
    """Open requests and the validated answers waiting to be collected (thread-safe).

    Closed ids (answered, expired, cancelled) are remembered, the most recent ``remember`` of
    them, so that a second answer is refused with the reason.
    """

    def __init__(self, remember: int = 65536) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}  # id -> number of classes
        self._closed: OrderedDict[str, str] = OrderedDict()  # id -> why it is closed
        self._ready: list[Answer] = []
        self._remember = remember

    def open(self, requests: Sequence[LabelRequest]) -> None:
        with self._lock:
            for r in requests:
                if r.id in self._open or r.id in self._closed:
                    raise ValueError(f"request id {r.id!r} was already used")
            for r in requests:
                self._open[r.id] = r.num_classes

    def hand_in(self, answer: Answer) -> None:
        """Keep ``answer`` for the next collect, or raise :class:`AnswerError` (nothing kept)."""
        if not isinstance(answer, Answer):
            raise AnswerError(f"expected an Answer, got {type(answer).__name__}")
        with self._lock:
            classes = self._open.get(answer.id)
            if classes is None:
                why = self._closed.get(answer.id)
                state = f"is {why}" if why else "is unknown"
                raise AnswerError(f"request {answer.id!r} {state}; the answer was not taken")
            answer.check(classes)
            del self._open[answer.id]
            self._close(answer.id, "already answered")
            self._ready.append(answer)

    def take(self) -> list[Answer]:
        """The answers handed in since the last call, in arrival order."""
        with self._lock:
            out, self._ready = self._ready, []
        return out

    def withdraw(self, ids: Sequence[str]) -> None:
        """Forget open ``ids`` as if they had never been opened (a submit that failed)."""
        with self._lock:
            for i in ids:
                self._open.pop(i, None)

    def close(self, ids: Sequence[str], why: str) -> None:
        """Stop accepting answers for ``ids`` (``why``: e.g. ``"expired"``, ``"cancelled"``)."""
        with self._lock:
            for i in ids:
                if self._open.pop(i, None) is not None:
                    self._close(i, why)

    def _close(self, rid: str, why: str) -> None:
        self._closed[rid] = why
        while len(self._closed) > self._remember:
            self._closed.popitem(last=False)

    def is_open(self, rid: str) -> bool:
        with self._lock:
            return rid in self._open

    @property
    def open_ids(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def clear(self) -> None:
        with self._lock:
            self._open.clear()
            self._closed.clear()
            self._ready.clear()

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "open": dict(self._open),
                "closed": dict(self._closed),
                "ready": [a.to_dict() for a in self._ready],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._open = {str(k): int(v) for k, v in state["open"].items()}
            self._closed = OrderedDict((str(k), str(v)) for k, v in state["closed"].items())
            self._ready = [Answer.from_mapping(a) for a in state["ready"]]


class QueuedAnnotator:
    """Base of in-process asynchronous annotators: an :class:`AnswerInbox` behind
    ``submit``/``collect``/``cancel``, and :meth:`answer` as the public hand-in point.

    Subclasses schedule answers in :meth:`on_submit` and release them in :meth:`on_collect` (called
    once per method step, before the inbox is emptied).
    """

    def __init__(self, feedback: Feedback = "label") -> None:
        self.feedback: Feedback = check_feedback(feedback)
        self.inbox = AnswerInbox()

    def submit(self, requests: Sequence[LabelRequest]) -> None:
        for r in requests:
            if r.kind != self.feedback:
                raise ValueError(
                    f"request {r.id!r} asks for {r.kind!r} feedback; this annotator gives "
                    f"{self.feedback!r}"
                )
        self.inbox.open(requests)
        try:
            self.on_submit(requests)
        except BaseException:  # not taken: the ids were never open, and may be used again
            self.inbox.withdraw([r.id for r in requests])
            raise

    def answer(
        self,
        request_id: str,
        label: int | None = None,
        *,
        correct: bool | None = None,
        skip: bool = False,
    ) -> None:
        """Hand in an answer (from any thread); :class:`AnswerError` if it cannot be taken."""
        self.inbox.hand_in(Answer(request_id, label=label, correct=correct, skip=skip))

    def collect(self) -> list[Answer]:
        self.on_collect()
        return self.inbox.take()

    def cancel(self, ids: Sequence[str]) -> None:
        self.inbox.close(ids, "expired or cancelled")
        self.on_cancel(ids)

    # -- for subclasses --------------------------------------------------------------------------
    def on_submit(self, requests: Sequence[LabelRequest]) -> None:
        """Called with each batch of new requests (schedule their answers here)."""

    def on_collect(self) -> None:
        """Called at each collect, before the inbox is emptied (release due answers here)."""

    def on_cancel(self, ids: Sequence[str]) -> None:
        """Called with ids the method gave up on."""

    def reset(self) -> None:
        self.inbox.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"inbox": self.inbox.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inbox.load_state_dict(state["inbox"])
