"""The adapting side: the method, its label queue, where its samples came from, its checkpoints.

A :class:`Stepper` is built where the method lives (the adapter's thread, or its own process:
:mod:`eatta.serve.adapter`). It builds the method with ``eatta.create`` (the label queue as its
oracle, a window for small requests), resumes from the state folder's checkpoint when there is
one and expires the label requests the dead run made after it (the restored method will never
apply their answers), then steps on the batches it is given and writes each step's serving model
into the snapshot copy it is given (:func:`eatta.serve.snapshot.fill`). A checkpoint is written
after a step once ``checkpoint_s`` seconds have passed since the last, and at :meth:`close`.
"""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any

from torch import Tensor, nn

import eatta
from eatta.annotate.queue import LabelQueue
from eatta.methods.registry import get_spec
from eatta.serve.options import Options
from eatta.serve.origins import Origins
from eatta.serve.snapshot import fill, what_serves
from eatta.serve.state import StateDir

__all__ = ["Stepper"]


class Stepper:
    """See the module docstring. ``model`` is wrapped in place; ``classes``: its classes."""

    def __init__(self, model: nn.Module, options: Options, state: StateDir, classes: int) -> None:
        self.options, self.state = options, state
        spec = get_spec(options.method)
        window = options.window if spec.adapts else None
        self.origins = Origins(options.max_batch + (window or 0), window)
        saved = state.load(options.durable())
        self.queue = LabelQueue(
            state.queue, class_names=[str(k) for k in range(classes)], origin=self.origins.of
        )
        labels: dict[str, Any] = {}
        if spec.active:
            labels = {"oracle": self.queue, "budget": options.budget}
        parts: dict[str, Any] = {} if window is None else {"window": window}
        self.method = eatta.create(
            options.method, model, dataset=options.dataset, **options.hparams, **labels, **parts
        )
        self.steps = self.errors = self.checkpoints = self.checkpoint_bytes = 0
        self.checkpoint_time = self.checkpoint_seconds = 0.0
        self.last_error: str | None = None
        self.unsaved = 0
        self.resumed_steps: int | None = None
        if saved is not None:
            self.restore(saved)
        self.orphans = self.queue.expire_unawaited() if spec.active else 0

    @property
    def serving(self) -> str:
        return what_serves(self.method)

    def step(self, x: Tensor, origins: list[tuple[str, int]], into: nn.Module | None) -> bool:
        """One step of the method on ``x`` (a window's samples, or more; ``origins``: each
        row's request id and row), then its serving model written into ``into``; False when
        the step failed (the method's transaction put its state back)."""
        method = self.method
        self.origins.add(x, origins)
        try:
            method(x.to(method.device) if method.device is not None else x)
        except Exception as err:  # serving goes on with the last snapshot
            self.errors += 1
            self.last_error = f"{type(err).__name__}: {err}"
            print(f"eatta-serve: a step failed: {self.last_error}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            return False
        self.steps += 1
        self.unsaved += 1
        if into is not None:
            fill(into, method.serving_model)
        return True

    def checkpoint_due(self) -> bool:
        return (
            bool(self.unsaved) and time.time() - self.checkpoint_time >= self.options.checkpoint_s
        )

    def checkpoint(self) -> None:
        """Write the method's state, the origins of its window's samples and the options."""
        window = self.method.window
        held = 0 if window is None else window.filled
        t0 = time.perf_counter()
        self.checkpoint_bytes = self.state.save(
            {
                "method": self.method.state_dict(),
                "origins": self.origins.state_dict(held),
                "options": self.options.durable(),
                "steps": self.steps,
            }
        )
        self.checkpoints += 1
        self.checkpoint_time = time.time()
        self.checkpoint_seconds = time.perf_counter() - t0
        self.unsaved = 0

    def restore(self, state: dict[str, Any]) -> None:
        self.method.load_state_dict(state["method"])
        window = self.method.window
        samples = None if window is None or window.filled == 0 else window.contents()
        self.origins.load_state_dict(state.get("origins", {}), samples)
        self.steps = int(state.get("steps", 0))
        self.resumed_steps = self.steps

    def stats(self) -> dict[str, Any]:
        """What the metrics show of the adapting side (plain data: it crosses processes)."""
        method = self.method
        fallback = method.fallback
        budget = getattr(method, "budget", None)
        return {
            "steps": self.steps,
            "errors": self.errors,
            "last_error": self.last_error,
            "checkpoints": self.checkpoints,
            "checkpoint_time": self.checkpoint_time,
            "checkpoint_seconds": self.checkpoint_seconds,
            "checkpoint_bytes": self.checkpoint_bytes,
            "annotation": dict(getattr(method, "annotation_stats", {}) or {}),
            "labels_used": 0 if budget is None else int(budget.lifetime_used),
            "budget": None if budget is None else int(budget.per_batch),
            "fallback": {} if fallback is None else dict(fallback.stats()),
        }

    def close(self) -> None:
        """A last checkpoint (when a step came after the last one), then close the queue."""
        if self.method.adapts and (self.unsaved or not self.checkpoints):
            self.checkpoint()
        self.queue.close()
