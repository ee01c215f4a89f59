"""One served model: its method, durable state, snapshots, adapter, batcher and numbers.

:class:`Service` builds them from a model and :class:`Options`, resumes from the state folder's
checkpoint when there is one (and expires the label requests the dead run made after it: the
restored method will never apply their answers), and starts and stops them together. A batch goes
``Batcher`` -> :meth:`Service.predict` (the published snapshot predicts it; the adapter is
offered it) -> each request's reply. The HTTP side is :mod:`eatta.serve.app`.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

import eatta
from eatta.annotate.queue import LabelQueue
from eatta.methods.registry import get_spec
from eatta.serve.adapter import Adapter
from eatta.serve.batcher import Batch, Batcher
from eatta.serve.metrics import Metrics
from eatta.serve.model import num_classes
from eatta.serve.origins import Origins
from eatta.serve.protocol import ModelSpec
from eatta.serve.snapshot import Snapshot, Snapshots
from eatta.serve.state import StateDir

__all__ = ["Options", "Service"]


@dataclass(frozen=True)
class Options:
    """What ``eatta-serve`` is started with (the command's flags, checked)."""

    model: str
    method: str = "eatta-safe"
    dataset: str = "default"
    name: str = "model"
    input_shape: tuple[int, ...] = (3, 32, 32)
    window: int = 64
    budget: int = 1
    max_batch: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 4096
    checkpoint_s: float = 1.0
    device: str = "cpu"
    order: str = "newest"

    def durable(self) -> dict[str, Any]:
        """The options a checkpoint must have been written with to be loaded."""
        return {
            k: v
            for k, v in asdict(self).items()
            if k in ("model", "method", "dataset", "input_shape", "window", "budget")
        }


class Service:
    """See the module docstring. ``model`` is wrapped in place (pass a copy to keep yours).

    Raises what ``eatta.create`` raises for a bad method or key, :class:`UsageError` for a model
    that does not take ``input_shape``, and :class:`~eatta.serve.state.StateMismatch` for a
    state written with other options, before anything starts.
    """

    def __init__(self, model: nn.Module, options: Options, state: StateDir) -> None:
        self.options, self.state = options, state
        self.device = torch.device(options.device)
        model = model.to(self.device)
        classes = num_classes(model, options.input_shape, self.device)
        self.spec = ModelSpec(options.name, options.input_shape, classes, options.max_batch)
        method_spec = get_spec(options.method)
        window = options.window if method_spec.adapts else None
        self.origins = Origins(options.max_batch + (window or 0), window)
        saved = state.load(options.durable())
        self.queue = LabelQueue(
            state.queue, class_names=[str(k) for k in range(classes)], origin=self.origins.of
        )
        labels: dict[str, Any] = {}
        if method_spec.active:
            labels = {"oracle": self.queue, "budget": options.budget}
        parts: dict[str, Any] = {} if window is None else {"window": window}
        self.method = eatta.create(
            options.method, model, dataset=options.dataset, **labels, **parts
        )
        self.snapshots = Snapshots(self.method, self.device)
        self.adapter = Adapter(
            self.method,
            self.snapshots,
            self.origins,
            state.save,
            options.durable(),
            checkpoint_s=options.checkpoint_s,
        )
        self.resumed_steps: int | None = None
        self.orphans = 0
        if saved is not None:
            self.adapter.restore(saved)
            self.resumed_steps = int(saved.get("steps", 0))
        if method_spec.active:
            self.orphans = self.queue.expire_unawaited()
        self.metrics = Metrics()
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)
        self.batcher: Batcher[Snapshot] | None = None

    def start(self) -> None:
        """Start the adapter and the batcher."""
        self.adapter.start()
        self.batcher = Batcher(
            self.predict,
            max_batch=self.options.max_batch,
            max_wait=self.options.max_wait_ms / 1000.0,
            max_queue=self.options.max_queue,
        )

    def stop(self) -> None:
        """Finish the waiting requests, then the adapter's batch; write a last checkpoint."""
        if self.batcher is not None:
            self.batcher.close()
        self.adapter.stop()
        self.queue.close()

    def new_id(self) -> str:
        """An id for a request that gave none (unique across restarts)."""
        return f"{self._prefix}-{next(self._ids)}"

    def predict(self, batch: Batch) -> tuple[Tensor, Snapshot]:
        """The batcher's ``predict``: the published snapshot's logits; then the adapter is
        offered the batch (it takes it unless a step runs)."""
        logits, snap = self.snapshots.predict(batch.x)
        self.metrics.batch(int(batch.x.shape[0]), snap.serving)
        self.adapter.offer(batch.x, batch.origins())
        return logits, snap

    def metrics_text(self) -> str:
        """``GET /metrics``."""
        snap = self.snapshots.current
        waiting = 0 if self.batcher is None else self.batcher.waiting_rows
        return self.metrics.render(
            self.adapter.stats, self.queue.stats(), snap.serving, snap.version, waiting
        )
