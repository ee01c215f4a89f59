"""The adapter thread: it steps the method on the served batches, and serving never waits for it.

After the serving thread has predicted a batch (from the published snapshot), it offers the batch
to the :class:`Adapter` (:meth:`Adapter.offer`, which never blocks). While no step runs, the
adapter takes it: the batches it takes are gathered until they hold a window's samples
(``window``), and the method steps on them (``method(x)`` on a batch of at least its window's
size: one step, as the window steps every ``window`` samples). While a step runs, an offered batch
is refused and skipped, as the real-time protocol serves the batches that arrive during a step
without adapting on them (``eatta.realtime``). Gathering costs no forward pass: the adapter's time
goes to steps, not to re-predicting what was served. After a step the adapter publishes a new
snapshot (:mod:`eatta.serve.snapshot`) and writes a checkpoint when one is due
(:mod:`eatta.serve.state`): at most one every ``checkpoint_s`` seconds, and one at
:meth:`Adapter.stop`. The samples gathered toward the next step are not in a checkpoint (fewer
than a window's).

The method's label requests go to its oracle, the label queue; their answers come back through
the queue at the method's next steps, as they do in a user's own loop.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from eatta.methods.base import AdaptiveMethod
from eatta.serve.origins import Origins
from eatta.serve.snapshot import Snapshots

__all__ = ["Adapter", "AdapterStats"]


@dataclass(frozen=True)
class AdapterStats:
    """What the adapter did, read by the metrics (a copy: safe from any thread)."""

    taken: int  # batches taken (gathered toward a step)
    skipped: int  # batches offered while a step ran
    steps: int  # steps the method took
    errors: int  # steps that raised (the method's transaction put its state back)
    checkpoints: int
    checkpoint_time: float  # time.time() of the last checkpoint (0: none yet)
    checkpoint_seconds: float  # how long the last one took to write
    checkpoint_bytes: int
    annotation: dict[str, int]  # the method's annotation_stats (requested, received, pending...)
    labels_used: int  # labels (requests) the budget granted, resets of the method included
    budget: int | None  # labels per step (None: a label-free method)
    fallback: dict[str, Any]  # the fallback's stats (empty without one)
    last_error: str | None


class Adapter:
    """See the module docstring.

    Args:
        method: the method, owned by the adapter thread from :meth:`start` on.
        snapshots: where what serves is published.
        origins: where each sample given to the method came from (for its label requests).
        save: writes a checkpoint (the state's :meth:`~eatta.serve.state.StateDir.save`).
        options: the server's options, saved in every checkpoint.
        checkpoint_s: the least seconds between two checkpoints (0: after every step).
    """

    def __init__(
        self,
        method: AdaptiveMethod,
        snapshots: Snapshots,
        origins: Origins,
        save: Callable[[dict[str, Any]], int],
        options: dict[str, Any],
        *,
        checkpoint_s: float,
    ) -> None:
        self.method, self.snapshots, self.origins = method, snapshots, origins
        self._save, self.options, self.checkpoint_s = save, dict(options), float(checkpoint_s)
        self._cond = threading.Condition()
        window = method.window
        #: samples a step adapts on (the window's size; 1: each batch, without a window)
        self.step_rows = 1 if window is None else window.size
        self._gathered: list[tuple[Tensor, list[tuple[str, int]]]] = []
        self._gathered_rows = 0
        self._next: list[tuple[Tensor, list[tuple[str, int]]]] | None = None
        self._busy = False
        self._stopping = False
        self._taken = self._skipped = self._steps = self._errors = 0
        self._checkpoints, self._ckpt_time, self._ckpt_seconds, self._ckpt_bytes = 0, 0.0, 0.0, 0
        self._unsaved = 0  # steps since the last checkpoint
        self._last_error: str | None = None
        self._version = 0
        self._read_method()
        self._thread = threading.Thread(target=self._run, name="eatta-serve-adapter", daemon=True)

    # -- the serving side --------------------------------------------------------------------
    def start(self) -> None:
        if self.method.adapts:
            self._thread.start()

    def offer(self, x: Tensor, origins: list[tuple[str, int]]) -> bool:
        """Hand a served batch to the adapter: True if it takes it (gathered toward the next
        step, which starts once a window's samples are gathered), False if a step runs (the
        batch is skipped) or the method does not adapt. Never blocks for a step."""
        if not self.method.adapts:
            return False
        with self._cond:
            if self._busy or self._stopping:
                self._skipped += 1
                return False
            self._taken += 1
            self._gathered.append((x, origins))
            self._gathered_rows += int(x.shape[0])
            if self._gathered_rows >= self.step_rows:
                self._next, self._gathered, self._gathered_rows = self._gathered, [], 0
                self._busy = True
                self._cond.notify()
        return True

    @property
    def idle(self) -> bool:
        """Whether the next batch offered would be taken (no batch in progress)."""
        with self._cond:
            return not (self._busy or self._stopping) and self.method.adapts

    @property
    def stats(self) -> AdapterStats:
        with self._cond:
            return AdapterStats(
                taken=self._taken,
                skipped=self._skipped,
                steps=self._steps,
                errors=self._errors,
                checkpoints=self._checkpoints,
                checkpoint_time=self._ckpt_time,
                checkpoint_seconds=self._ckpt_seconds,
                checkpoint_bytes=self._ckpt_bytes,
                last_error=self._last_error,
                **self._method_stats,
            )

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the batch in progress, then write a last checkpoint (adapting methods)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.method.adapts and not self._thread.is_alive():
            self.checkpoint()

    # -- the adapter thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._stopping:
                    self._cond.wait()
                if self._next is None:
                    return
                parts = self._next
            x = parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts])
            origins = [o for p in parts for o in p[1]]
            try:
                self._adapt(x, origins)
            finally:
                self._read_method()
                with self._cond:
                    self._next = None
                    self._busy = False
            if self._unsaved and time.time() - self._ckpt_time >= self.checkpoint_s:
                self.checkpoint()

    def _adapt(self, x: Tensor, origins: list[tuple[str, int]]) -> None:
        """One step of the method on ``x`` (a window's samples, or more), then publish."""
        method = self.method
        self.origins.add(x, origins)
        try:
            method(x.to(method.device) if method.device is not None else x)
        except Exception as err:  # the method's transaction restored its state; serving goes on
            self._errors += 1
            self._last_error = f"{type(err).__name__}: {err}"
            print(f"eatta-serve: a step failed: {self._last_error}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            return
        self._steps += 1
        self._unsaved += 1
        self._version += 1
        self.snapshots.publish(method, self._version)

    def checkpoint(self) -> None:
        """Write the method's state, the origins of its window's samples and the options."""
        window = self.method.window
        held = 0 if window is None else window.filled
        t0 = time.perf_counter()
        size = self._save(
            {
                "method": self.method.state_dict(),
                "origins": self.origins.state_dict(held),
                "options": self.options,
                "steps": self._steps,
            }
        )
        with self._cond:
            self._checkpoints += 1
            self._ckpt_time = time.time()
            self._ckpt_seconds = time.perf_counter() - t0
            self._ckpt_bytes = size
            self._unsaved = 0

    def restore(self, state: dict[str, Any]) -> None:
        """Load a checkpoint (before :meth:`start`), and publish what it serves."""
        self.method.load_state_dict(state["method"])
        window = self.method.window
        samples = None if window is None or window.filled == 0 else window.contents()
        self.origins.load_state_dict(state.get("origins", {}), samples)
        self._steps = int(state.get("steps", 0))
        self._version += 1
        self.snapshots.publish(self.method, self._version)
        self._read_method()

    def _read_method(self) -> None:
        """Read what the metrics show of the method (on the thread that owns it), keep a copy."""
        method = self.method
        fallback = method.fallback
        budget = getattr(method, "budget", None)
        found: dict[str, Any] = {
            "annotation": dict(getattr(method, "annotation_stats", {}) or {}),
            "labels_used": 0 if budget is None else int(budget.lifetime_used),
            "budget": None if budget is None else int(budget.per_batch),
            "fallback": {} if fallback is None else dict(fallback.stats()),
        }
        with self._cond:
            self._method_stats = found
