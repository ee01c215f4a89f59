"""Batches from single requests: concurrent requests gathered into one batch for the model.

:class:`Batcher` takes requests (``submit``: a ``[n, ...]`` tensor and a name for its rows) from
any thread and returns a :class:`concurrent.futures.Future` each. One worker thread gathers
them: a batch starts with the oldest waiting request and takes the next ones, in arrival order,
while they fit in ``max_batch`` rows and the first has waited less than ``max_wait`` seconds;
then it runs ``predict`` on the whole batch and gives each request its rows of the result. While
``predict`` runs, new requests wait for the next batch, so a busy model gathers bigger batches.

Nothing is dropped: a request is either refused at ``submit`` (:class:`Overloaded`, when
``max_queue`` rows already wait, or :class:`Closed` after :meth:`close`) or its future gets the
rows of the result, or ``predict``'s exception. :meth:`close` lets the waiting requests finish.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

__all__ = ["Batch", "Batcher", "Closed", "Overloaded"]

R = TypeVar("R")


class Overloaded(RuntimeError):
    """The batcher already holds ``max_queue`` rows: the request is refused (HTTP 503)."""


class Closed(RuntimeError):
    """The batcher is closing: no request is taken any more (HTTP 503)."""


@dataclass
class _Item:
    x: Tensor
    name: str
    arrived: float
    future: Future[tuple[Tensor, Any]] = field(default_factory=Future)


@dataclass(frozen=True)
class Batch:
    """A batch handed to ``predict``: the rows of its requests in order, each request's name
    and row count, and when its first request arrived (``time.monotonic``)."""

    x: Tensor
    names: tuple[str, ...]
    rows: tuple[int, ...]
    first_arrived: float

    def origins(self) -> list[tuple[str, int]]:
        """``(name, row)`` of each row of :attr:`x`: the request it came from, its row there."""
        return [(name, r) for name, n in zip(self.names, self.rows, strict=True) for r in range(n)]


class Batcher(Generic[R]):
    """See the module docstring.

    Args:
        predict: ``batch -> (logits [N, K], info)``; run by the worker thread, one batch at a
            time. ``info`` is given to every request of the batch.
        max_batch: the most rows a batch holds (a request holds at most as many).
        max_wait: seconds the first request of a batch may wait for others (0: a batch is what
            has arrived when the worker is free).
        max_queue: the most rows waiting; a request beyond is refused (:class:`Overloaded`).
    """

    def __init__(
        self,
        predict: Callable[[Batch], tuple[Tensor, R]],
        *,
        max_batch: int,
        max_wait: float,
        max_queue: int,
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
        if not isinstance(max_wait, int | float) or not 0 <= max_wait <= 60:
            raise ValueError(f"max_wait must be 0 to 60 seconds, got {max_wait!r}")
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < max_batch:
            raise ValueError(
                f"max_queue must be an int >= max_batch ({max_batch}), got {max_queue!r}"
            )
        self.predict = predict
        self.max_batch, self.max_wait, self.max_queue = max_batch, float(max_wait), max_queue
        self._waiting: collections.deque[_Item] = collections.deque()
        self._rows = 0  # rows waiting
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="eatta-serve-batcher", daemon=True)
        self._worker.start()

    @property
    def waiting_rows(self) -> int:
        """Rows waiting for a batch."""
        with self._cond:
            return self._rows

    def submit(self, x: Tensor, name: str) -> Future[tuple[Tensor, R]]:
        """Queue a request of ``x.shape[0]`` rows (1 to ``max_batch``); its future gets
        ``(its rows of the logits, the batch's info)``."""
        n = int(x.shape[0])
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"a request holds 1 to {self.max_batch} rows, got {n}")
        item = _Item(x, name, time.monotonic())
        with self._cond:
            if self._closed:
                raise Closed("the server is shutting down")
            if self._rows + n > self.max_queue:
                raise Overloaded(
                    f"{self._rows} rows wait already (at most {self.max_queue}); try again"
                )
            self._waiting.append(item)
            self._rows += n
            self._cond.notify()
        return item.future

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new requests, finish the waiting ones, stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._worker.join(timeout)

    # -- the worker ------------------------------------------------------------------------------
    def _gather(self) -> list[_Item] | None:
        """The next batch's requests (None: closed and nothing waits)."""
        with self._cond:
            while not self._waiting:
                if self._closed:
                    return None
                self._cond.wait()
            items = [self._waiting.popleft()]
            rows = items[0].x.shape[0]
            deadline = items[0].arrived + self.max_wait
            while rows < self.max_batch:
                if self._waiting:
                    if rows + self._waiting[0].x.shape[0] > self.max_batch:
                        break
                    items.append(self._waiting.popleft())
                    rows += items[-1].x.shape[0]
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    break
                self._cond.wait(left)
            self._rows -= rows
            return items

    def _run(self) -> None:
        while True:
            items = self._gather()
            if items is None:
                return
            self._serve(items)

    def _serve(self, items: Sequence[_Item]) -> None:
        try:
            x = items[0].x if len(items) == 1 else torch.cat([i.x for i in items])
            batch = Batch(
                x,
                tuple(i.name for i in items),
                tuple(int(i.x.shape[0]) for i in items),
                items[0].arrived,
            )
            logits, info = self.predict(batch)
        except BaseException as err:  # every request of the batch gets the error, none is lost
            for i in items:
                i.future.set_exception(err)
            if not isinstance(err, Exception):
                raise
            return
        start = 0
        for i in items:
            n = int(i.x.shape[0])
            i.future.set_result((logits[start : start + n], info))
            start += n
