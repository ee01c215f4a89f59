"""One served model: its snapshots, its adapter (the method's thread or process), its batcher
and its numbers, started and stopped together.

A batch goes ``Batcher`` -> :meth:`Service.predict` (the published snapshot predicts it; the
adapter is offered it) -> each request's reply. A method that does not adapt (``source``) is
built here and served as it is; an adapting one lives in a
:class:`~eatta.serve.stepper.Stepper` on the adapter's backend (``Options.adapter``). The HTTP
side is :mod:`eatta.serve.app`.
"""

from __future__ import annotations

import itertools
import secrets

import torch
from torch import Tensor, nn

import eatta
from eatta.annotate.queue import LabelQueue
from eatta.methods.registry import get_spec
from eatta.serve.adapter import Adapter, ProcessBackend, ThreadBackend
from eatta.serve.batcher import Batch, Batcher
from eatta.serve.metrics import Metrics
from eatta.serve.model import num_classes
from eatta.serve.options import ADAPTERS, Options
from eatta.serve.protocol import ModelSpec
from eatta.serve.snapshot import Snapshot, Snapshots
from eatta.serve.state import StateDir
from eatta.serve.stepper import Stepper

__all__ = ["Options", "Service"]


class Service:
    """See the module docstring. ``model`` is wrapped (pass a copy to keep yours).

    Raises what ``eatta.create`` raises for a bad method or key, :class:`UsageError` for a model
    that does not take ``input_shape``, and :class:`~eatta.serve.state.StateMismatch` for a
    state written with other options, before anything starts.
    """

    def __init__(self, model: nn.Module, options: Options, state: StateDir) -> None:
        if options.adapter not in ADAPTERS:
            raise ValueError(f"adapter must be one of {ADAPTERS}, got {options.adapter!r}")
        self.options, self.state = options, state
        self.device = torch.device(options.device)
        model = model.to(self.device)
        classes = num_classes(model, options.input_shape, self.device)
        self.spec = ModelSpec(options.name, options.input_shape, classes, options.max_batch)
        state.claim(options.durable())
        self.stepper: Stepper | None = None  # the method, with the thread backend
        self.adapter_pid: int | None = None
        backend: ThreadBackend | ProcessBackend | None = None
        if not get_spec(options.method).adapts:
            method = eatta.create(options.method, model, dataset=options.dataset, **options.hparams)
            self.snapshots = Snapshots.of_method(method, self.device)
            self.resumed_steps: int | None = None
            self.orphans = 0
        elif options.adapter == "thread":
            self.stepper = Stepper(model, options, state, classes)
            self.snapshots = Snapshots.of_method(
                self.stepper.method, self.device, version=self.stepper.steps
            )
            backend = ThreadBackend(self.stepper, self.snapshots)
            self.resumed_steps, self.orphans = self.stepper.resumed_steps, self.stepper.orphans
        else:
            process = ProcessBackend(
                model.cpu() if options.device == "cpu" else model, options, state, classes
            )
            self.snapshots = Snapshots(
                process.copies, process.given, process.serving, process.version, self.device
            )
            backend = process
            self.resumed_steps, self.orphans = process.resumed_steps, process.orphans
        #: the adapter process's id (None: no process)
        self.adapter_pid = backend.pid if isinstance(backend, ProcessBackend) else None
        self.adapter = Adapter(self.snapshots, backend, options.window)
        self.queue = LabelQueue(state.queue)  # the page's side: its numbers for the metrics
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
        """Finish the waiting requests, then the step in progress; write a last checkpoint."""
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
            self.adapter.stats,
            self.queue.stats(),
            snap.serving,
            snap.version,
            waiting,
            stepping=self.adapter.stepping,
        )
