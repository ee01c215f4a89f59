"""The adapter: it steps the method on the served batches, and serving never waits for it.

After the serving thread has predicted a batch (from the published snapshot), it offers the batch
to the :class:`Adapter` (:meth:`Adapter.offer`, which never blocks). While no step runs, the
adapter takes it: the batches it takes are gathered until they hold a window's samples, and the
method steps on them (one step, as a window steps every ``window`` samples; gathering costs no
forward pass). While a step runs, an offered batch is refused and skipped, as the real-time
protocol serves the batches that arrive during a step without adapting on them
(``eatta.realtime``). The step writes its serving model into a spare snapshot copy the adapter
reserved (:mod:`eatta.serve.snapshot`), which is then published. The samples gathered toward the
next step are in no checkpoint (fewer than a window's).

The method itself lives in a :class:`~eatta.serve.stepper.Stepper`, on one of two backends:

- :class:`ProcessBackend` (``eatta-serve``'s default): its own process, started with ``spawn``,
  at a lower priority (``nice`` +``Options.adapter_nice``), killed with the server (Linux
  ``PR_SET_PDEATHSIG``). A step then never holds the serving process's Python lock, and the
  snapshot copies live in shared memory;
- :class:`ThreadBackend`: a thread of the server's process (no second interpreter to start).
"""

from __future__ import annotations

import ctypes
import io
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from eatta.serve.options import Options
from eatta.serve.snapshot import Snapshots
from eatta.serve.state import StateDir, StateMismatch
from eatta.serve.stepper import Stepper

__all__ = ["Adapter", "AdapterStats", "ProcessBackend", "ThreadBackend"]


Parts = list[tuple[Tensor, list[tuple[str, int]]]]
#: ``(ok, copy written, what serves, steps, stats)``, or ``stats`` alone after a checkpoint
Done = Callable[[bool | None, int | None, str | None, int | None, dict[str, Any]], None]


@dataclass(frozen=True)
class AdapterStats:
    """What the adapter did, read by the metrics (a copy: safe from any thread)."""

    taken: int  # batches taken (gathered toward a step)
    skipped: int  # batches offered while a step ran
    steps: int  # steps the method took (a restored checkpoint's included)
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
    alive: bool  # whether the adapting side runs


def _raw_bytes(x: Tensor) -> bytes:
    x = x.detach().to("cpu").contiguous()
    return ctypes.string_at(x.data_ptr(), x.numel() * x.element_size())


def _gathered(parts: Parts) -> tuple[Tensor, list[tuple[str, int]]]:
    x = parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts])
    return x, [o for p in parts for o in p[1]]


class ThreadBackend:
    """The stepper on a thread of this process."""

    def __init__(self, stepper: Stepper, snapshots: Snapshots) -> None:
        self.stepper, self.snapshots = stepper, snapshots
        self._work: queue.SimpleQueue[tuple[Parts, int] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.stats = stepper.stats()

    def start(self, done: Done) -> None:
        self._thread = threading.Thread(target=self._run, args=(done,), daemon=True)
        self._thread.name = "eatta-serve-adapter"
        self._thread.start()

    def submit(self, parts: Parts, spare: int) -> None:
        self._work.put((parts, spare))

    def _run(self, done: Done) -> None:
        stepper = self.stepper
        while (item := self._work.get()) is not None:
            parts, spare = item
            x, origins = _gathered(parts)
            ok = stepper.step(x, origins, self.snapshots.copies()[spare])
            done(ok, spare, stepper.serving, stepper.steps, stepper.stats())
            if stepper.checkpoint_due():
                stepper.checkpoint()
                done(None, None, None, None, stepper.stats())
        stepper.close()
        done(None, None, None, None, stepper.stats())

    def stop(self, timeout: float) -> None:
        self._work.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self.stepper.close()


def _die_with_parent(parent: int) -> None:
    """Be killed when the server's process dies (Linux), ``kill -9`` included."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe ends the loop instead
        pass
    if os.getppid() != parent:  # the server died before the call above
        os._exit(1)


def _child(
    model_bytes: bytes,
    options: Options,
    state_path: str,
    classes: int,
    parent: int,
    work: Any,
    results: Any,
) -> None:
    """The adapter process: build the stepper, share the snapshot copies, step on request."""
    _die_with_parent(parent)
    os.nice(options.adapter_nice)
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    try:
        # the model came as torch.save's bytes: in shared memory (as a pickled tensor would come)
        # its steps ran several times slower
        model = torch.load(io.BytesIO(model_bytes), map_location="cpu", weights_only=False)
        stepper = Stepper(model, options, StateDir(state_path), classes)
        device = torch.device(options.device)
        snaps = Snapshots.of_method(stepper.method, device, version=stepper.steps)
        copies = snaps.copies()
        for m in copies:
            m.share_memory()
        given = snaps.given
        if given is not None:
            given.share_memory()
        results.put(
            (
                "ready",
                copies,
                given,
                stepper.serving,
                stepper.steps,
                stepper.resumed_steps,
                stepper.orphans,
                stepper.stats(),
            )
        )
    except Exception as err:
        kind = "mismatch" if isinstance(err, StateMismatch) else "failed"
        results.put((kind, f"{type(err).__name__}: {err}", traceback.format_exc()))
        return
    while True:
        item = work.get()
        if item[0] == "stop":
            stepper.close()
            results.put(("closed", stepper.stats()))
            return
        _, (raw, shape, dtype), origins, spare = item
        x = torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape)
        ok = stepper.step(x, origins, copies[spare])
        results.put(("stepped", ok, spare, stepper.serving, stepper.steps, stepper.stats()))
        if stepper.checkpoint_due():
            stepper.checkpoint()
            results.put(("stats", stepper.stats()))


class ProcessBackend:
    """The stepper in its own process (see the module docstring). Starting it waits until the
    process has built the method and shared its snapshot copies (:attr:`copies`,
    :attr:`given`); a :class:`~eatta.serve.state.StateMismatch` or a :class:`RuntimeError` with
    the process's error otherwise."""

    def __init__(
        self,
        model: nn.Module,
        options: Options,
        state: StateDir,
        classes: int,
        timeout: float = 600,
    ) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        buffer = io.BytesIO()
        torch.save(model, buffer)
        self._work, self._results = ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(
            target=_child,
            args=(
                buffer.getvalue(),
                options,
                str(state.path),
                classes,
                os.getpid(),
                self._work,
                self._results,
            ),
            name="eatta-serve-adapter",
            daemon=True,
        )
        # OpenMP threads that spin while they wait for work took the CPU the other process's
        # threads needed: steps ran about 3 times slower on 2 cores; passive ones sleep
        before = os.environ.get("OMP_WAIT_POLICY")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            self._proc.start()
        finally:
            if before is None:
                os.environ.pop("OMP_WAIT_POLICY", None)
        try:
            ready = self._results.get(timeout=timeout)
        except queue.Empty:
            self._proc.kill()
            raise RuntimeError(f"the adapter process did not start in {timeout:g} s") from None
        if ready[0] != "ready":
            self._proc.join(10)
            if ready[0] == "mismatch":
                raise StateMismatch(ready[1].split(": ", 1)[1])
            raise RuntimeError(f"the adapter process failed to start: {ready[1]}\n{ready[2]}")
        _, self.copies, self.given, self.serving, self.version, resumed, orphans, stats = ready
        self.resumed_steps: int | None = resumed
        self.orphans: int = orphans
        self.stats: dict[str, Any] = stats
        self._closed = threading.Event()
        self._receiver: threading.Thread | None = None
        #: the adapter process's id
        self.pid: int | None = self._proc.pid

    def start(self, done: Done) -> None:
        self._receiver = threading.Thread(target=self._receive, args=(done,), daemon=True)
        self._receiver.name = "eatta-serve-adapter-results"
        self._receiver.start()

    def submit(self, parts: Parts, spare: int) -> None:
        x, origins = _gathered(parts)
        # plain bytes: a tensor would cross in shared memory, a file handle passed per tensor
        # (several times slower than the step on small models)
        raw = (_raw_bytes(x), tuple(x.shape), str(x.dtype).removeprefix("torch."))
        self._work.put(("step", raw, origins, spare))  # a feeder thread writes it: never blocks

    def _receive(self, done: Done) -> None:
        while True:
            try:
                message = self._results.get(timeout=1.0)
            except queue.Empty:
                if not self._proc.is_alive():
                    print("eatta-serve: the adapter process died", file=sys.stderr)
                    done(False, None, None, None, {**self.stats, "alive": False})
                    self._closed.set()
                    return
                continue
            if message[0] == "stepped":
                _, ok, spare, serving, steps, stats = message
                self.stats = stats
                done(ok, spare, serving, steps, stats)
            elif message[0] in ("stats", "closed"):
                self.stats = message[1]
                done(None, None, None, None, message[1])
                if message[0] == "closed":
                    self._closed.set()
                    return

    def stop(self, timeout: float) -> None:
        """Let the step in progress end, then a last checkpoint; the process exits."""
        if self._proc.is_alive():
            self._work.put(("stop",))
            self._closed.wait(timeout)
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()


class Adapter:
    """The serving side's handle on the method (see the module docstring).

    Args:
        snapshots: where the steps' serving models are published.
        backend: the stepper's thread or process (None: a method that does not adapt).
        step_rows: samples a step adapts on (the window's size).
    """

    def __init__(
        self,
        snapshots: Snapshots,
        backend: ThreadBackend | ProcessBackend | None,
        step_rows: int,
    ) -> None:
        self.snapshots, self.backend, self.step_rows = snapshots, backend, max(1, step_rows)
        self._cond = threading.Condition()
        self._gathered: Parts = []
        self._gathered_rows = 0
        self._busy = False
        self._stopping = False
        self._alive = backend is not None
        self._taken = self._skipped = 0
        self._stats: dict[str, Any] = dict(backend.stats) if backend is not None else {}

    def start(self) -> None:
        if self.backend is not None:
            self.backend.start(self._done)

    def _done(
        self,
        ok: bool | None,
        spare: int | None,
        serving: str | None,
        steps: int | None,
        stats: dict[str, Any],
    ) -> None:
        """A step ended (``ok``: published or not) or the stats changed (``ok`` None)."""
        if spare is not None:
            if ok and serving is not None and steps is not None:
                self.snapshots.swap_in(spare, serving, steps)
            else:
                self.snapshots.release(spare)
        with self._cond:
            self._stats = stats
            if stats.get("alive") is False:
                self._alive = False
            if ok is not None:
                self._busy = False
            self._cond.notify_all()

    # -- the serving side --------------------------------------------------------------------
    def offer(self, x: Tensor, origins: list[tuple[str, int]]) -> bool:
        """Hand a served batch to the adapter: True if it takes it (gathered toward the next
        step, which starts once a window's samples are gathered), False if a step runs (the
        batch is skipped) or nothing adapts. Never blocks for a step."""
        if self.backend is None:
            return False
        with self._cond:
            if self._busy or self._stopping or not self._alive:
                self._skipped += 1
                return False
            self._taken += 1
            self._gathered.append((x, origins))
            self._gathered_rows += int(x.shape[0])
            if self._gathered_rows < self.step_rows:
                return True
            spare = self.snapshots.reserve()
            if spare is None:  # every copy is read: gather on, step at the next offer
                return True
            parts, self._gathered, self._gathered_rows = self._gathered, [], 0
            self._busy = True
        self.backend.submit(parts, spare)
        return True

    @property
    def stepping(self) -> bool:
        """Whether a step runs now."""
        with self._cond:
            return self._busy

    @property
    def idle(self) -> bool:
        """Whether no step runs (the next batch offered would be taken)."""
        with self._cond:
            return not (self._busy or self._stopping) and self._alive

    @property
    def stats(self) -> AdapterStats:
        with self._cond:
            s = self._stats
            return AdapterStats(
                taken=self._taken,
                skipped=self._skipped,
                steps=int(s.get("steps", 0)),
                errors=int(s.get("errors", 0)),
                checkpoints=int(s.get("checkpoints", 0)),
                checkpoint_time=float(s.get("checkpoint_time", 0.0)),
                checkpoint_seconds=float(s.get("checkpoint_seconds", 0.0)),
                checkpoint_bytes=int(s.get("checkpoint_bytes", 0)),
                annotation=dict(s.get("annotation", {})),
                labels_used=int(s.get("labels_used", 0)),
                budget=s.get("budget"),
                fallback=dict(s.get("fallback", {})),
                last_error=s.get("last_error"),
                alive=self._alive,
            )

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no step runs (tests, and a stop); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy or not self._alive, timeout)

    def stop(self, timeout: float = 60.0) -> None:
        """Refuse new batches, let the step in progress end, write a last checkpoint."""
        with self._cond:
            self._stopping = True
        if self.backend is not None:
            self.backend.stop(timeout)
