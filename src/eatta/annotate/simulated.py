"""Simulated annotators for benchmarks and tests: late, wrong, abstaining, yes/no, threaded.

:class:`SimulatedAnnotator` answers from the batch's true labels (``set_labels(y)`` or
``method(x, labels=y)``, as :class:`~eatta.annotate.oracle.GroundTruthOracle`) after a delay counted
in method steps: the answer to a request of step ``t`` is collected at step ``t + d``. It can flip
labels (uniformly to another class, or from a confusion matrix), abstain, answer yes/no instead of
a class, or never answer. Its draws use its own generator, so the method's random state is the
same with or without it. :class:`ThreadedAnnotator` answers from another thread after a wall-clock
delay (the live path: a person or a large model on another device).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any, Literal

import torch
from torch import Tensor

from eatta.annotate.base import QueuedAnnotator
from eatta.annotate.batch_labels import BatchLabels
from eatta.annotate.paced import DEFAULT_PATIENCE, Order, PersonPace, check_order, pace_from
from eatta.annotate.requests import Answer, AnswerError, Feedback, LabelRequest

__all__ = ["Delay", "SimulatedAnnotator", "ThreadedAnnotator", "parse_delay"]

#: A delay in steps: ``d``, a range ``(lo, hi)`` drawn uniformly per request, or ``"never"``.
Delay = int | tuple[int, int] | Literal["never"]


def parse_delay(delay: object) -> int | tuple[int, int] | None:
    """A checked delay: an int >= 0, a pair ``lo <= hi`` of them, or None for ``"never"``."""
    if delay == "never" or delay is None:
        return None
    if isinstance(delay, int) and not isinstance(delay, bool):
        if delay < 0:
            raise ValueError(f"label delay must be >= 0 steps or 'never', got {delay}")
        return delay
    if isinstance(delay, tuple | list) and len(delay) == 2:
        lo, hi = delay
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) and 0 <= lo <= hi:
            return (int(lo), int(hi))
    raise ValueError(
        f"label delay must be an int >= 0, a pair (lo, hi) with 0 <= lo <= hi, or 'never'; "
        f"got {delay!r}"
    )


def _probability(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number in [0, 1], got {value!r}")
    if not 0.0 <= float(value) <= 1.0 or math.isnan(float(value)):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


class SimulatedAnnotator(BatchLabels, QueuedAnnotator):
    """Answers from the true labels (given per batch as :class:`BatchLabels` says), as late,
    noisy and partial as configured.

    Args:
        delay: steps until an answer arrives: an int, ``(lo, hi)`` (uniform per request, so
            answers arrive out of order), or ``"never"``.
        noise: probability that a label is wrong, replaced by a uniformly drawn other class; or a
            ``[C, C]`` confusion matrix whose row ``c`` is the distribution of answers for class
            ``c``. A yes/no answer is wrong with the same probability (with a matrix: the drawn
            class is compared with the prediction).
        abstain: probability of skipping a request.
        feedback: ``"label"`` (a class) or ``"binary"`` (yes/no on the model's prediction).
        seed: seed of the annotator's own generator.
        capacity: a person's pace in answers per step, instead of a fixed ``delay``: one answer
            at a time, each ``1 / capacity`` steps (:class:`~eatta.annotate.paced.PersonPace`).
        stream_rate, seconds_per_answer: the pace in seconds instead: a stream of
            ``stream_rate`` batches per second and ``seconds_per_answer`` (default 11.7 for a
            label, 1.6 for a yes/no: :class:`~eatta.annotate.cost.AnnotatorCost`).
        order: with a pace, which waiting request is answered next: ``"newest"`` (default) or
            ``"oldest"``.
        patience: with a pace, steps a request waits before the person drops it (counted).

    ``stats()`` counts requests, answers, wrong answers and skips (and, with a pace, requests
    dropped unanswered).
    """

    def __init__(
        self,
        *,
        delay: Delay = 0,
        noise: float | Tensor = 0.0,
        abstain: float = 0.0,
        feedback: Feedback = "label",
        seed: int = 0,
        capacity: float | None = None,
        stream_rate: float | None = None,
        seconds_per_answer: float | None = None,
        order: Order | None = None,
        patience: int | None = None,
    ) -> None:
        super().__init__(feedback)
        self.delay = parse_delay(delay)
        pace = pace_from(
            capacity=capacity,
            stream_rate=stream_rate,
            seconds_per_answer=seconds_per_answer,
            feedback=self.feedback,
        )
        self.pace: PersonPace | None = None
        if pace is None:
            if order is not None or patience is not None:
                given = {"order": order, "patience": patience}
                raise ValueError(
                    f"{given} apply to a paced annotator; give capacity= or stream_rate="
                )
        else:
            if self.delay != 0:
                raise ValueError(
                    f"a paced annotator's delay follows from its load; got delay={delay!r} too"
                )
            self.pace = PersonPace(
                pace,
                check_order("newest" if order is None else order),
                DEFAULT_PATIENCE if patience is None else patience,
            )
        self.confusion: Tensor | None = None
        self.noise = 0.0
        if isinstance(noise, Tensor):
            m = noise.detach().to("cpu", torch.float64)
            if m.dim() != 2 or m.shape[0] != m.shape[1] or bool((m < 0).any()):
                raise ValueError("a confusion matrix must be square [C, C] with entries >= 0")
            sums = m.sum(1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
                raise ValueError("each row of the confusion matrix must sum to 1")
            self.confusion = m
        else:
            self.noise = _probability(noise, "label noise")
        self.abstain = _probability(abstain, "abstention rate")
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self._initial_rng = self.generator.get_state()
        self._labels: Tensor | None = None
        self._now = 0  # collects so far: the step being served
        self._scheduled: list[tuple[int, int, Answer]] = []  # (due step, order, answer)
        self._order = 0
        self.counts = {"requests": 0, "answers": 0, "wrong": 0, "skipped": 0}

    # -- answering ---------------------------------------------------------------------------
    def on_submit(self, requests: Sequence[LabelRequest]) -> None:
        if not requests:
            return
        labels = self._labels
        if labels is None:
            raise RuntimeError(
                "SimulatedAnnotator has no labels for this batch; call set_labels(y) before each "
                "batch or pass method(x, labels=y)"
            )
        for r in requests:
            if r.index >= len(labels):
                raise IndexError(f"request index {r.index} beyond {len(labels)} labels")
        for r in requests:
            truth = int(labels[r.index])
            self.counts["requests"] += 1
            answer, wrong = self._draw(r, truth)
            if answer.skip:
                self.counts["skipped"] += 1
            else:
                self.counts["answers"] += 1
                self.counts["wrong"] += int(wrong)
            if self.pace is not None:
                self.pace.add(self._now, self._order, answer)
                self._order += 1
                continue
            due = self._due()
            if due is not None:
                self._scheduled.append((due, self._order, answer))
                self._order += 1

    def _uniform(self) -> float:
        return float(torch.rand((), generator=self.generator, dtype=torch.float64))

    def _draw(self, r: LabelRequest, truth: int) -> tuple[Answer, bool]:
        if self.abstain and self._uniform() < self.abstain:
            return Answer(r.id, skip=True), False
        believed = truth
        if self.confusion is not None:
            row = self.confusion[truth]
            believed = int(torch.multinomial(row, 1, generator=self.generator))
        elif self.noise and self._uniform() < self.noise:
            other = int(torch.randint(r.num_classes - 1, (), generator=self.generator))
            believed = other + (other >= truth)
        if self.feedback == "label":
            return Answer(r.id, label=believed), believed != truth
        prediction = r.prediction
        right = truth == prediction
        said = believed == prediction
        if self.confusion is None and believed != truth:
            said = not right  # a flipped yes/no
        return Answer(r.id, correct=said), said != right

    def _due(self) -> int | None:
        if self.delay is None:
            return None
        if isinstance(self.delay, tuple):
            lo, hi = self.delay
            return self._now + int(torch.randint(lo, hi + 1, (), generator=self.generator))
        return self._now + self.delay

    def on_collect(self) -> None:
        if self.pace is not None:
            for answer in self.pace.release(self._now):
                if self.inbox.is_open(answer.id):
                    self.inbox.hand_in(answer)
        due = [s for s in self._scheduled if s[0] <= self._now]
        if due:
            self._scheduled = [s for s in self._scheduled if s[0] > self._now]
            for _, _, answer in sorted(due, key=lambda s: (s[0], s[1])):
                if self.inbox.is_open(answer.id):
                    self.inbox.hand_in(answer)
        self._now += 1

    def on_cancel(self, ids: Sequence[str]) -> None:
        gone = set(ids)
        self._scheduled = [s for s in self._scheduled if s[2].id not in gone]
        if self.pace is not None:
            self.pace.cancel(gone)

    def stats(self) -> dict[str, int]:
        if self.pace is not None:
            return {**self.counts, "scheduled": len(self.pace), "dropped": self.pace.dropped}
        return {**self.counts, "scheduled": len(self._scheduled)}

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        super().reset()
        self.generator.set_state(self._initial_rng)
        self._now, self._order, self._scheduled = 0, 0, []
        self.counts = dict.fromkeys(self.counts, 0)
        if self.pace is not None:
            self.pace.reset()

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "rng": self.generator.get_state(),
            "now": self._now,
            "order": self._order,
            "scheduled": [(d, o, a.to_dict()) for d, o, a in self._scheduled],
            "counts": dict(self.counts),
            **({} if self.pace is None else {"pace": self.pace.state_dict()}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.generator.set_state(state["rng"])
        self._now, self._order = int(state["now"]), int(state["order"])
        self._scheduled = [
            (int(d), int(o), Answer.from_mapping(a)) for d, o, a in state["scheduled"]
        ]
        self.counts = {k: int(v) for k, v in state["counts"].items()}
        if self.pace is not None:
            self.pace.load_state_dict(state["pace"])


#: What a threaded annotator's function returns: a class, a yes/no, None to skip, or an Answer.
AnswerValue = int | bool | None | Answer


class ThreadedAnnotator(QueuedAnnotator):
    """Answers each request from worker threads after ``delay_s`` seconds of wall-clock time.

    ``answer_fn(request)`` returns a class (``"label"`` feedback), a bool (``"binary"``), None to
    skip, or an :class:`Answer`. A request cancelled while it waits is not answered; an answer that
    arrives after its request expired is refused and counted in ``stats()["refused"]``; an
    exception from ``answer_fn`` is kept in :attr:`errors` (the request then expires). Use as a
    context manager, or call :meth:`close`, to stop the workers. In-flight work is not part of
    ``state_dict()``.
    """

    def __init__(
        self,
        answer_fn: Callable[[LabelRequest], AnswerValue],
        *,
        delay_s: float = 0.0,
        feedback: Feedback = "label",
        workers: int = 1,
    ) -> None:
        super().__init__(feedback)
        if not callable(answer_fn):
            raise TypeError(f"answer_fn must be callable, got {type(answer_fn).__name__}")
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float) or not delay_s >= 0:
            raise ValueError(f"delay_s must be a number of seconds >= 0, got {delay_s!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.answer_fn = answer_fn
        self.delay_s = float(delay_s)
        self.errors: list[BaseException] = []
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eatta-annotator")
        self._shut = False
        self._futures: list[Future[None]] = []
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self.counts = {"requests": 0, "answers": 0, "refused": 0, "errors": 0}

    def on_submit(self, requests: Sequence[LabelRequest]) -> None:
        due = time.monotonic() + self.delay_s
        with self._lock:
            self.counts["requests"] += len(requests)
            self._futures = [f for f in self._futures if not f.done()]
            for r in requests:
                self._futures.append(self._pool.submit(self._work, r, due))

    def _work(self, request: LabelRequest, due: float) -> None:
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with self._lock:
            if request.id in self._cancelled:
                return
        try:
            value = self.answer_fn(request)
            answer = self._as_answer(request, value)
        except BaseException as err:  # the annotator's own failure: kept, not raised in a thread
            with self._lock:
                self.errors.append(err)
                self.counts["errors"] += 1
            return
        try:
            self.inbox.hand_in(answer)
        except AnswerError:
            with self._lock:
                self.counts["refused"] += 1
            return
        with self._lock:
            self.counts["answers"] += 1

    @staticmethod
    def _as_answer(request: LabelRequest, value: AnswerValue) -> Answer:
        if isinstance(value, Answer):
            return value
        if value is None:
            return Answer(request.id, skip=True)
        if isinstance(value, bool):
            return Answer(request.id, correct=value)
        return Answer(request.id, label=value)

    def on_cancel(self, ids: Sequence[str]) -> None:
        with self._lock:
            self._cancelled.update(ids)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted request has been worked on; False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            futures = list(self._futures)
        for f in futures:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                f.result(timeout=left)
            except CancelledError:  # not started before close(): never worked on, nothing to wait
                continue
            except FuturesTimeout:  # not the builtin TimeoutError before Python 3.11
                return False
        return True

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def close(self) -> None:
        """Stop the workers (waiting requests are not answered)."""
        with self._lock:
            self._cancelled.update(self.inbox.open_ids)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._shut = True

    def __enter__(self) -> ThreadedAnnotator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # nothing to do once closed (or when __init__ failed before the pool existed); at
        # interpreter exit the modules this would use may already be torn down: stay silent
        if getattr(self, "_shut", True):
            return
        try:
            self._pool.shutdown(wait=False, cancel_futures=True)
        except Exception:  # interpreter shutdown: nothing left to report to
            pass
