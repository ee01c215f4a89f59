"""A person's pace: one answer at a time, at a fixed rate, from a queue served in a chosen order.

:class:`PersonPace` is the schedule a :class:`~eatta.annotate.simulated.SimulatedAnnotator` keeps
when it is given a capacity instead of a fixed delay. Time is counted in method steps (batches).
The person answers one request at a time, each taking ``1 / capacity`` steps; when free they take
the ``"newest"`` waiting request (the default) or the ``"oldest"``. An answer is delivered at the
first step at or after it is finished, so the delay of each answer follows from the load, as it
does with a person, and is at least one step. A request that has waited more than ``patience``
steps without being started is dropped on purpose (counted in ``dropped``): the person never
reaches it. Memory: at most ``patience + 1`` steps of requests wait.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from eatta.annotate.cost import AnnotatorCost
from eatta.annotate.requests import Answer, Feedback

__all__ = ["DEFAULT_PATIENCE", "ORDERS", "Order", "PersonPace", "check_order", "pace_from"]

#: Which waiting request a person answers next.
Order = Literal["newest", "oldest"]
ORDERS: tuple[str, ...] = get_args(Order)
#: Steps a request waits at a person before it is dropped (the method's own expiry is 256).
DEFAULT_PATIENCE = 64


def check_order(order: object) -> Order:
    """``order`` if it is ``"newest"`` or ``"oldest"``, else a ValueError naming it."""
    if order not in ORDERS:
        raise ValueError(f"unknown queue order {order!r}; use one of {', '.join(ORDERS)}")
    return order  # type: ignore[return-value]  # checked against the Literal's values


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number > 0, got {value!r}")
    if not 0 < float(value) < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def pace_from(
    *,
    capacity: float | None,
    stream_rate: float | None,
    seconds_per_answer: float | None,
    feedback: Feedback,
) -> float | None:
    """Answers per step from a capacity in steps, or from seconds per answer against a stream of
    ``stream_rate`` batches per second (seconds default to :class:`AnnotatorCost`'s for the
    feedback kind); None if neither is given. Both, or seconds without a rate, are errors."""
    if capacity is not None and (stream_rate is not None or seconds_per_answer is not None):
        raise ValueError(
            f"give the pace in steps (capacity={capacity!r}) or in seconds (stream_rate="
            f"{stream_rate!r}, seconds_per_answer={seconds_per_answer!r}), not both"
        )
    if capacity is not None:
        return _positive(capacity, "capacity (answers per step)")
    if stream_rate is None:
        if seconds_per_answer is not None:
            raise ValueError(
                f"seconds_per_answer={seconds_per_answer!r} needs a stream_rate (batches per "
                "second) to become a pace"
            )
        return None
    rate = _positive(stream_rate, "stream_rate (batches per second)")
    if seconds_per_answer is None:
        seconds = AnnotatorCost().per_request(feedback)
    else:
        seconds = _positive(seconds_per_answer, "seconds_per_answer")
    return 1.0 / (seconds * rate)


class PersonPace:
    """The queue and the clock of a person answering ``capacity`` requests per step."""

    def __init__(self, capacity: float, order: Order = "newest", patience: int = DEFAULT_PATIENCE):
        self.capacity = _positive(capacity, "capacity (answers per step)")
        self.order = check_order(order)
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"patience must be an int >= 0 steps, got {patience!r}")
        self.patience = patience
        self.waiting: list[tuple[int, int, Answer]] = []  # (step asked, order, answer)
        self.working: tuple[float, Answer] | None = None  # (finish time, answer)
        self.free_at = 0.0
        self.dropped = 0

    def add(self, step: int, order: int, answer: Answer) -> None:
        self.waiting.append((step, order, answer))

    def _expire(self, now: float) -> None:
        keep = [w for w in self.waiting if now - w[0] <= self.patience]
        self.dropped += len(self.waiting) - len(keep)
        self.waiting = keep

    def release(self, now: int) -> list[Answer]:
        """The answers finished by step ``now``, in the order they were finished."""
        done: list[Answer] = []
        per_answer = 1.0 / self.capacity
        while True:
            if self.working is not None:
                finish, answer = self.working
                if finish > now:
                    break
                done.append(answer)
                self.working, self.free_at = None, finish
            start = self.free_at
            self._expire(max(start, min((w[0] for w in self.waiting), default=start)))
            if not self.waiting:
                self.free_at = max(self.free_at, float(now))
                break
            first = min(w[0] for w in self.waiting)
            if first > start:  # idle until the next request was asked
                start = float(first)
                self._expire(start)
            ready = [w for w in self.waiting if w[0] <= start]
            pick = (max if self.order == "newest" else min)(ready, key=lambda w: (w[0], w[1]))
            self.waiting.remove(pick)
            self.working = (start + per_answer, pick[2])
        self._expire(float(now))
        return done

    def cancel(self, ids: set[str]) -> None:
        self.waiting = [w for w in self.waiting if w[2].id not in ids]
        if self.working is not None and self.working[1].id in ids:
            self.working = None  # the person stops; they are free from now on

    def __len__(self) -> int:
        return len(self.waiting) + (self.working is not None)

    def reset(self) -> None:
        self.waiting, self.working, self.free_at, self.dropped = [], None, 0.0, 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "waiting": [(s, o, a.to_dict()) for s, o, a in self.waiting],
            "working": None
            if self.working is None
            else (self.working[0], self.working[1].to_dict()),
            "free_at": self.free_at,
            "dropped": self.dropped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.waiting = [(int(s), int(o), Answer.from_mapping(a)) for s, o, a in state["waiting"]]
        w = state["working"]
        self.working = None if w is None else (float(w[0]), Answer.from_mapping(w[1]))
        self.free_at, self.dropped = float(state["free_at"]), int(state["dropped"])
