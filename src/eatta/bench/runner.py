"""Run registered methods on test streams: one grid cell at a time, checkpointed, resumable.

:func:`run_cell` streams a cell's dataset through the registry's method in the cell's setting
(``"ftta"`` resets at every domain change) and budget, and measures per-domain and online error,
labels, time and memory. Every ``checkpoint_every`` batches it saves everything a bit-identical
resume needs to ``<out>/checkpoints``; a finished cell is stored in ``<out>/cells``. Both file
names carry the cell's fingerprint, so changed arguments never resume another run's state.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader

import eatta.realtime as rt
from eatta.bench.annotation import annotation_summary
from eatta.bench.benchmark import BenchmarkData, prepare_domains
from eatta.bench.build import build_method
from eatta.bench.checkpoint import atomic_write, rng_state, seed_all, set_rng_state
from eatta.bench.fingerprint import fingerprint, model_digest
from eatta.bench.grid import CellSpec, is_static
from eatta.bench.monitoring import fallback_summary, monitor_summary
from eatta.bench.options import RunOptions
from eatta.bench.provenance import machine_provenance
from eatta.bench.results import CellResult
from eatta.budget import Budget
from eatta.data.stream import TestStream
from eatta.methods import registry
from eatta.methods.base import AdaptiveMethod
from eatta.monitor import SourceFallback
from eatta.window import SmallBatchWarning

__all__ = ["RunOptions", "measure_costs", "run_cell", "run_grid"]


def _serve(
    method: AdaptiveMethod,
    x: Tensor,
    y: Tensor,
    period: int,
    device: torch.device,
    annotators: tuple[Any, Any, Any, Any],
) -> tuple[Tensor, int]:
    """One batch through the method (annotators given its labels): which samples it got wrong,
    and the answers it spent (its own and its fallback's)."""
    gt, monitor, auditor, fallback_auditor = annotators
    if gt is not None:
        gt.set_labels(y)
    if monitor is not None:  # audits count for the round they were asked in
        monitor.period = period
        auditor.set_labels(y)  # set with the monitor
    if (fb := method.fallback) is not None:
        fb.period = period
    if fallback_auditor is not None:
        fallback_auditor.set_labels(y)
    before = _answers_so_far(method) + _audited(fb)
    logits = method(x.to(device, non_blocking=True))
    used = _answers_so_far(method) + _audited(fb) - before
    return logits.argmax(1).cpu() != y, used


def _show(bar: Any, error: float, domain: str) -> None:
    """The progress bar (if drawn) one batch further, with the running error and the domain."""
    if bar is not None:
        bar.update(1)
        bar.set_postfix(err=f"{error:.1f}%", domain=domain[:12])


def run_cell(
    spec: CellSpec,
    data: BenchmarkData,
    options: RunOptions,
    out_dir: str | os.PathLike[str],
    *,
    grid_index: int = 0,
    callback: Callable[[int, dict[str, Any]], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> CellResult:
    """Run, resume or read back one cell. ``callback(t, info)`` gets the running metrics after
    batch ``t`` (an exception it raises stops the run; the checkpoint stays). With
    ``options.progress``: a progress bar on a terminal, else a ``log`` line per domain (round)."""
    out = Path(out_dir)
    domains, notes = prepare_domains(data.domains, options.batch_size, options.limit, options.seed)
    fp = fingerprint(spec, data, options)
    result_path = out / "cells" / f"{spec.slug()}-{fp}.json"
    ckpt_path = out / "checkpoints" / f"{spec.slug()}-{fp}.pt"
    if result_path.is_file() and options.reuse:  # finished earlier: read back
        done = CellResult.load(result_path)
        done.grid_index, done.reused = grid_index, True
        return done
    run = _CellRun(spec, data, options, domains, fp, ckpt_path)
    run.stream(callback, log)
    result = run.result(grid_index, notes)
    result.save(result_path)
    ckpt_path.unlink(missing_ok=True)
    return result


class _CellRun:
    """One cell on its way through the stream: the method and its annotators, the online
    record, the clocks, the checkpoints (a resume continues bit for bit)."""

    def __init__(
        self,
        spec: CellSpec,
        data: BenchmarkData,
        options: RunOptions,
        domains: Any,
        fp: str,
        ckpt_path: Path,
    ) -> None:
        self.spec, self.data, self.options, self.fp, self.ckpt_path = (
            spec,
            data,
            options,
            fp,
            ckpt_path,
        )
        self.device = device = torch.device(options.device)
        self.stream_ = stream = _stream(domains, data, options, device)
        seed_all(options.seed)
        self.rss_before = _memory_start()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.built = built = build_method(spec, data, options, device)
        self.method, self.oracle = built.method, built.oracle
        # mixed streams: images and errors per (round, domain), counted per sample
        self.tally = (
            [[[0, 0] for _ in stream.domains] for _ in range(stream.rounds)] if stream.mixed else []
        )
        saved = (
            _resume(ckpt_path, fp, device, self.method, self.oracle, built.auditor)
            if options.reuse
            else None
        )
        # cpu: this thread's CPU seconds, which unlike wall time a busy machine does not inflate
        self.online: list[list[int]] = []  # per batch: images, errors, answers spent
        self.start, self.wall, self.cpu, self.sessions, self.peak_prev = 0, 0.0, 0.0, 1, None
        if saved is not None:
            self.start, self.online, self.tally = saved["position"], saved["online"], saved["tally"]
            self.wall, self.cpu = saved["wall_time_s"], saved["cpu_time_s"]
            self.peak_prev, self.sessions = saved["peak_mem_mb"], saved["sessions"] + 1
        if is_static(spec.method) and self.start == 0:  # predictions independent of the stream
            t_static, c_static = time.perf_counter(), time.thread_time()
            self.online = _static_online(self.method, stream, device, self.tally)
            self.start = len(stream)
            self.wall, self.cpu = time.perf_counter() - t_static, time.thread_time() - c_static
        self.batches = iter(stream.loader(self.start))  # creating the iterator draws from
        if saved is not None:  # torch's global RNG, so the saved states are restored only after
            set_rng_state(saved["rng"], device)
        self.cost = None if options.costs is None else options.costs[spec.method]
        self.ckpt_time = self.ckpt_cpu = 0.0

    def stream(
        self,
        callback: Callable[[int, dict[str, Any]], None] | None,
        log: Callable[[str], None] | None,
    ) -> None:
        """Every batch from where the cell stands to the end of the stream."""
        spec, stream, online = self.spec, self.stream_, self.online
        oracle, built = self.oracle, self.built
        gt, total = oracle if hasattr(oracle, "set_labels") else None, len(stream)
        annotators = (gt, built.monitor, built.auditor, built.fallback_auditor)
        n_seen, n_wrong = sum(b[0] for b in online), sum(b[1] for b in online)
        terminal = self.options.progress and _is_terminal()
        milestone_log = log if self.options.progress and not terminal else None
        bar = _progress_bar(spec, total, self.start) if terminal else None
        prev_domain = stream.locate(self.start - 1)[0] if self.start > 0 else None
        self.t0, self.cpu0 = time.perf_counter(), time.thread_time()
        try:
            for t in range(self.start, total):
                x, y = next(self.batches)
                k = stream.locate(t)[0]
                if spec.setting == "ftta" and prev_domain is not None and k != prev_domain:
                    self.method.reset(keep_monitor=True)  # the audits go on measuring the stream
                prev_domain = k
                wrong_each, used = self._batch(
                    t, x, torch.as_tensor(y, dtype=torch.long), annotators
                )
                wrong = int(wrong_each.sum())
                if self.tally:
                    _count_domains(stream, t, wrong_each, self.tally)
                online.append([len(wrong_each), wrong, used])
                n_seen += len(wrong_each)
                n_wrong += wrong
                _show(bar, 100 * n_wrong / n_seen, stream.visit_names[k])
                if milestone_log is not None and (line := _milestone(spec, stream, online, t)):
                    milestone_log(line)
                every = self.options.checkpoint_every
                if every and (t + 1) % every == 0 and t + 1 < total:  # none after the last batch
                    self._checkpoint(t + 1)
                if callback is not None:
                    callback(t, {"error": 100 * n_wrong / n_seen, "images": n_seen, "spec": spec})
        finally:
            if bar is not None:
                bar.close()
        self.wall += time.perf_counter() - self.t0 - self.ckpt_time
        self.cpu += time.thread_time() - self.cpu0 - self.ckpt_cpu

    def _batch(self, t: int, x: Tensor, y: Tensor, annotators: Any) -> tuple[Tensor, int]:
        """Batch ``t`` through the method, or served unadapted (online, between its steps):
        which samples it got wrong, and the answers it spent."""
        method, cost = self.method, self.cost
        if cost is not None and not rt.adapts_on(t, cost):  # online: its last step still runs
            rt.tick_annotator(self.oracle)  # an asynchronous annotator's clock runs on
            served = rt.serve_without_adapting(method, x.to(self.device))
            return served.argmax(1).cpu() != y, 0
        period = self.stream_.round_of_batch(t)
        if len(x) < self.options.batch_size:  # a domain's remainder, not a small-batch stream:
            with warnings.catch_warnings():  # a stream of small batches warns on its first
                warnings.simplefilter("ignore", SmallBatchWarning)
                return _serve(method, x, y, period, self.device, annotators)
        return _serve(method, x, y, period, self.device, annotators)

    def _checkpoint(self, position: int) -> None:
        """All a resume needs: the position, the method, annotators, RNGs, clocks and peak."""
        c0, cc0 = time.perf_counter(), time.thread_time()
        state: dict[str, Any] = {
            "fingerprint": self.fp,
            "spec": dataclasses.asdict(self.spec),
            "position": position,
        }
        state.update(online=self.online, tally=self.tally, sessions=self.sessions)
        state.update(method=self.method.state_dict(), annotator=_annotator_state(self.oracle))
        state.update(auditor=_annotator_state(self.built.auditor), rng=rng_state(self.device))
        state["wall_time_s"] = self.wall + (c0 - self.t0 - self.ckpt_time)
        state["cpu_time_s"] = self.cpu + (cc0 - self.cpu0 - self.ckpt_cpu)
        state["peak_mem_mb"] = _peak(self.device, self.rss_before, self.peak_prev)
        atomic_write(self.ckpt_path, partial(torch.save, state))
        self.ckpt_time += time.perf_counter() - c0
        self.ckpt_cpu += time.thread_time() - cc0

    def result(self, grid_index: int, notes: Any) -> CellResult:
        """The cell's result: errors per domain and round, labels, time, memory, its parts'."""
        spec, data, options, device = self.spec, self.data, self.options, self.device
        counts = _summarize(self.stream_, self.online, self.tally)
        wall = self.wall
        result = CellResult(
            spec=spec,
            grid_index=grid_index,
            fingerprint=self.fp,
            wall_time_s=wall,
            images_per_s=counts["images"] / wall if wall > 0 else math.inf,
            peak_mem_mb=None,
            max_rss_mb=None,
            device=str(device),
            model_digest="",
            hparams=self.built.hparams,
            notes=notes,
            seed=options.seed,
            cpu_time_s=self.cpu,
            sessions=self.sessions,
            protocol=_protocol(data, options),
            provenance={**data.provenance, **machine_provenance()},
            **counts,
        )
        method = self.method
        if self.built.monitor is not None:
            result.monitor = monitor_summary(self.built.monitor, result.rounds, options.annotator)
        if isinstance(method.fallback, SourceFallback):
            result.fallback = fallback_summary(method.fallback, result.rounds)
        if registry.get_spec(spec.method).active:
            result.annotation = annotation_summary(
                method, self.oracle, result.labels_used, options.annotator
            )
        result.peak_mem_mb = _peak(device, self.rss_before, self.peak_prev)
        result.max_rss_mb = _max_rss_mb()
        result.model_digest = model_digest(method.model)
        if self.cost is not None:
            result.realtime = {"cost": self.cost, **rt.batch_counts(len(self.stream_), self.cost)}
        return result


def _protocol(data: BenchmarkData, options: RunOptions) -> dict[str, Any]:
    """The stream protocol a result records."""
    return {
        "rounds": options.rounds,
        "dirichlet": options.dirichlet,
        "gradual": bool(data.config.get("gradual", False)),
        "mixed": options.mixed,
        "ccc": data.config.get("ccc"),
        **({"severity": data.config["severity"]} if data.config.get("severity") else {}),
        **({"annotator": options.annotator.describe()} if options.annotator.simulated else {}),
        **({"monitor": options.monitor.describe()} if options.monitor.active else {}),
        **({"online": True} if options.costs is not None else {}),
    }


def measure_costs(
    cells: Sequence[CellSpec], data: BenchmarkData, options: RunOptions
) -> dict[str, float]:
    """Each cell's method, built as the run builds it, timed on the stream's first batch against
    the source model (:func:`eatta.realtime.relative_costs`); the source model's r is 1."""
    device, w = torch.device(options.device), options.method_window()
    x, y = next(iter(DataLoader(data.domains[0][1], batch_size=options.batch_size)))
    # with a window: the requests of one window per timed call, r per request
    calls = -(-w // options.batch_size) if isinstance(w, int) and w > 1 else 1
    with torch.random.fork_rng(devices=[]):
        adapting = [s for s in cells if not is_static(s.method)]
        methods = {s.method: build_method(s, data, options, device).method for s in adapting}
        source = data.model_fn().to(device)
        y = torch.as_tensor(y)
        costs = rt.relative_costs(methods, source, x.to(device), labels=y, calls=calls)
    return {s.method: 1.0 for s in cells} | costs


def _resume(
    path: Path, fp: str, device: torch.device, method: Any, oracle: Any, auditor: Any
) -> dict[str, Any] | None:
    """This fingerprint's checkpoint, if any, with the method and annotators restored."""
    if not path.is_file():
        return None
    # our own file (trusted): its RNG and optimizer states need the full unpickler
    saved: dict[str, Any] = torch.load(path, map_location=device, weights_only=False)
    if saved.get("fingerprint") != fp:
        return None
    method.load_state_dict(saved["method"])
    if saved.get("annotator") is not None:
        oracle.load_state_dict(saved["annotator"])
    if saved.get("auditor") is not None:
        auditor.load_state_dict(saved["auditor"])
    return saved


def _stream(
    domains: Any, data: BenchmarkData, options: RunOptions, device: torch.device
) -> TestStream:
    """The cell's test stream; loader workers by default: none on the CPU, up to 8 on a GPU."""
    if (workers := options.workers) is None:
        workers = min(8, os.cpu_count() or 1) if device.type == "cuda" else 0
    return TestStream(
        domains,
        options.batch_size,
        seed=options.seed,
        rounds=options.rounds,
        dirichlet=options.dirichlet,
        **({"mixed": True} if options.mixed else {}),
        shuffle=not data.config.get("ccc"),  # a CCC walk is read in its order
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
    )


def _progress_bar(spec: CellSpec, total: int, start: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=start,
        desc=spec.label,
        unit="batch",
        leave=False,
        dynamic_ncols=True,
    )


def _audited(fallback: object) -> int:
    """Labels a fallback's own audits took (0 without one, and for ``eatta-safe``'s)."""
    return int(getattr(fallback, "requested", 0))


def _count_domains(stream: TestStream, t: int, wrong: Tensor, tally: list[list[list[int]]]) -> None:
    """Add batch ``t``'s images and errors to its round's per-domain counts (mixed streams)."""
    k = len(stream.domains)
    doms = torch.tensor(stream.sample_domains(t), dtype=torch.long)
    n = torch.bincount(doms, minlength=k).tolist()
    w = torch.bincount(doms, weights=wrong.to(torch.float64), minlength=k).tolist()
    row = tally[stream.round_of_batch(t)]
    for d in range(k):
        row[d][0] += int(n[d])
        row[d][1] += round(w[d])


@torch.no_grad()
def _static_online(
    method: AdaptiveMethod,
    stream: TestStream,
    device: torch.device,
    tally: list[list[list[int]]] | None = None,
) -> list[list[int]]:
    """The online record of a stream-independent method (the source model): every sample
    predicted once, in dataset order, then counted per batch of the stream."""
    data: ConcatDataset[Any] = ConcatDataset([d.dataset for d in stream.domains])
    wrong = torch.zeros(len(data), dtype=torch.bool)
    pos = 0
    for x, y in DataLoader(data, batch_size=max(stream.batch_size, 256)):
        pred = method(x.to(device)).argmax(1).cpu()
        wrong[pos : pos + len(y)] = pred != torch.as_tensor(y)
        pos += len(y)
    online = []
    for t in range(len(stream)):
        idx = stream.batch_indices(t)[1]
        online.append([len(idx), int(wrong[idx].sum()), 0])
        if tally:
            _count_domains(stream, t, wrong[idx], tally)
    return online


def _answers_so_far(method: AdaptiveMethod) -> int:
    """Labels used over the method's life (a reset clears ``labels_used``, not the budget's)."""
    budget = getattr(method, "budget", None)
    return budget.lifetime_used if isinstance(budget, Budget) else method.labels_used


def _annotator_state(oracle: object) -> dict[str, Any] | None:
    """A simulated annotator's state (its schedule and generator) for checkpoints."""
    save = getattr(oracle, "state_dict", None)
    return save() if callable(save) else None


def _peak(
    device: torch.device, start: tuple[float | None, bool], previous: float | None
) -> float | None:
    """Peak MB: GPU allocated, or CPU RSS over the start's; at least ``previous`` (sessions)."""
    if device.type == "cuda":
        now: float | None = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        before, reset = start
        after = _status_mb("VmHWM") if reset else _max_rss_mb()
        now = None if after is None or before is None else max(after - before, 0.0)
    if previous is None:
        return now
    return previous if now is None else max(now, previous)


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _milestone(spec: CellSpec, stream: TestStream, online: list[list[int]], t: int) -> str | None:
    """The log line of batch ``t`` if it ends a domain (one round) or a round (several)."""
    j, b = stream.locate(t)
    k = stream.visits_per_round
    ends = b + 1 == stream.batches_per_visit[j] and (stream.rounds == 1 or (j + 1) % k == 0)
    if not ends and t + 1 < len(stream):
        return None
    if stream.rounds == 1:
        lo, what = stream.visit_first_batch[j], f"domain {j + 1}/{k} {stream.visit_names[j]}"
    else:
        lo = stream.visit_first_batch[(j // k) * k]
        what = f"round {j // k + 1}/{stream.rounds}"
    rows = online[lo : t + 1]
    err = 100.0 * sum(r[1] for r in rows) / max(1, sum(r[0] for r in rows))
    where = f"batch {t + 1}/{len(stream)}"
    return f"  {spec.label} [{spec.setting}]: {what}: error {err:.1f}% ({where})"


def _summarize(
    stream: TestStream, online: list[list[int]], tally: list[list[list[int]]]
) -> dict[str, Any]:
    """A result's images, errors and labels per domain visit (mixed streams: per round and
    domain, counted per sample) and per round."""
    names = stream.visit_names
    first = list(stream.visit_first_batch)
    imgs, errs, labs = [], [], []
    for j in range(len(names)):
        rows = online[first[j] : first[j] + stream.batches_per_visit[j]]
        n = sum(r[0] for r in rows)
        imgs.append(n)
        errs.append(100.0 * sum(r[1] for r in rows) / n)
        labs.append(sum(r[2] for r in rows))
    k = len(stream.domains)
    if tally:  # labels per round
        names = [d.name for _ in range(stream.rounds) for d in stream.domains]
        first = [f for f in first for _ in range(k)]
        labs = [labs[j // k] if j % k == 0 else 0 for j in range(len(names))]
        imgs = [c[0] for row in tally for c in row]
        errs = [100.0 * c[1] / c[0] if c[0] else 0.0 for row in tally for c in row]
    return {
        "domains": list(names),
        "domain_images": imgs,
        "domain_errors": errs,
        "domain_labels": labs,
        "average_error": float(np.mean(errs)),
        "overall_error": 100.0 * sum(r[1] for r in online) / sum(imgs),
        "labels_used": sum(labs),
        "images": sum(imgs),
        "online": online,
        "domain_first_batch": first,
        "rounds": stream.rounds,
        "round_errors": [float(np.mean(errs[r * k : (r + 1) * k])) for r in range(stream.rounds)],
    }


def run_grid(
    cells: Sequence[tuple[int, CellSpec | tuple[CellSpec, int]]],
    data: Mapping[str, BenchmarkData],
    options: RunOptions,
    out_dir: str | os.PathLike[str],
    *,
    callback: Callable[[int, dict[str, Any]], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[CellResult]:
    """Run ``(grid index, cell)`` or ``(grid index, (cell, seed))`` pairs in order (see
    :func:`shard` and :func:`make_jobs`; a bare cell runs with ``options.seed``)."""
    results = []
    for i, (j, job) in enumerate(cells):
        spec, seed = job if isinstance(job, tuple) else (job, options.seed)
        if spec.dataset not in data:
            raise KeyError(f"cell {spec.key} names dataset {spec.dataset!r}, which is not loaded")
        opts = options if seed == options.seed else dataclasses.replace(options, seed=seed)
        r = run_cell(
            spec, data[spec.dataset], opts, out_dir, grid_index=j, callback=callback, log=log
        )
        if log is not None:
            log(f"[{i + 1}/{len(cells)}] {done_text(r)}")
        results.append(r)
    return results


def done_text(r: CellResult) -> str:
    """The log line of a finished cell: its error (first and last round), labels and time."""
    rounds = ""
    if r.rounds > 1:
        rounds = f", round 1 {r.round_errors[0]:.1f}% -> round {r.rounds} {r.round_errors[-1]:.1f}%"
    how = " (finished earlier: read back)" if r.reused else ""
    return (
        f"{r.spec.dataset} {r.spec.setting} {r.label} seed {r.seed}: avg error "
        f"{r.average_error:.1f}%{rounds}, {r.labels_used} labels, {r.wall_time_s:.1f} s{how}"
    )


def _status_mb(field: str) -> float | None:
    """``field`` (``VmRSS``, ``VmHWM``) of ``/proc/self/status`` in MB; None if unreadable."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _memory_start() -> tuple[float | None, bool]:
    """``(baseline MB, reset)``: on Linux the peak RSS is reset to the RSS now (``VmHWM`` then
    reads the cell's own peak); elsewhere the baseline is the lifetime peak (``ru_maxrss``)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return _max_rss_mb(), False
    rss = _status_mb("VmRSS")
    return (rss, True) if rss is not None and _status_mb("VmHWM") is not None else (None, False)


def _max_rss_mb() -> float | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
