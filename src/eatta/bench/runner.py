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
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader

import eatta.realtime as rt
from eatta.annotate.oracle import Oracle
from eatta.bench.annotation import annotation_summary
from eatta.bench.benchmark import BenchmarkData, OnDevice, prepare_domains
from eatta.bench.checkpoint import atomic_write, rng_state, seed_all, set_rng_state
from eatta.bench.fingerprint import fingerprint, model_digest, to_plain
from eatta.bench.grid import STATIC_METHODS, CellSpec
from eatta.bench.monitoring import check_fallback_budget, fallback_summary, monitor_summary
from eatta.bench.options import RunOptions
from eatta.bench.provenance import machine_provenance
from eatta.bench.results import CellResult
from eatta.budget import Budget
from eatta.data.stream import TestStream
from eatta.methods import registry
from eatta.methods.base import AdaptiveMethod
from eatta.monitor import SourceFallback

__all__ = ["RunOptions", "measure_costs", "run_cell", "run_grid"]


def _build_method(
    spec: CellSpec, data: BenchmarkData, options: RunOptions, device: torch.device
) -> tuple[AdaptiveMethod, Oracle | None, dict[str, Any]]:
    spec_ = registry.get_spec(spec.method)
    model = data.model_fn().to(device)
    hp = options.overrides(spec.method)
    if "seed" in spec_.keys:  # only methods that draw random numbers declare a seed
        hp.setdefault("seed", options.seed)
    if spec.buffer is not None:
        hp["buffer"] = spec.buffer
    if spec.method == "eata" and "fishers" not in hp and "fisher_data" not in hp:
        if data.fisher_data is None:
            raise ValueError(
                f"EATA needs clean source data for its Fisher regularizer and {data.name!r} "
                "provides none (CLI: --fisher-root for ImageNet)"
            )
        hp["fisher_data"] = OnDevice(data.fisher_data(device), device)
    oracle: Oracle | None = None
    window = None if spec.method in STATIC_METHODS else options.method_window()
    labels: dict[str, Any] = {}  # a label-free method takes neither an oracle nor a budget
    if spec_.active:
        if data.oracle_fn is not None and options.annotator.simulated:
            raise ValueError(
                "label delay, noise and yes/no feedback are simulated from the ground truth; "
                f"{data.name!r} is annotated by a model (leave out the model annotator)"
            )
        if data.oracle_fn is not None:
            oracle = data.oracle_fn(device)
        else:
            oracle = options.annotator.build(options.seed)  # type: ignore[assignment]
        per_batch = spec.labels  # less the audits --fallback takes out of the budget
        if options.monitor.fallback:
            per_batch -= check_fallback_budget(spec.method, spec.labels, spec.every)
        budget = _budget(per_batch, spec.every, options.batch_size, window)
        labels = {"oracle": oracle, "budget": budget}
    if window is not None:
        labels["window"] = window
    if options.weight_anchor is not None and spec.method not in STATIC_METHODS:
        labels["weight_anchor"] = options.weight_anchor
    method = registry.create(spec.method, model, dataset=data.defaults_key, **labels, **hp)
    shown = {k: v for k, v in spec_.hparams(data.defaults_key, hp).items() if k != "fisher_data"}
    return method, oracle, to_plain(shown)


def _budget(labels: int, every: int, batch_size: int, window: int | bool | None) -> Budget:
    """``labels`` per ``every`` batches; with a window larger than the batch, the same rate per
    sample counted in window steps: ``labels · window / (every · batch_size)``, reduced."""
    if window is None or window is False or batch_size >= window:
        return Budget(labels, every=every)
    rate = Fraction(labels * int(window), every * batch_size)  # 0: Budget(0, every=1)
    return Budget(rate.numerator, every=rate.denominator)


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
        fb.period = period  # type: ignore[attr-defined]
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

    device = torch.device(options.device)
    stream = _stream(domains, data, options, device)
    seed_all(options.seed)
    rss_before = _memory_start()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    method, oracle, hparams = _build_method(spec, data, options, device)
    monitor, auditor, fallback_auditor = _attach_monitor(spec, data, options, method, device)

    # mixed streams: images and errors per (round, domain), counted per sample
    tally = [[[0, 0] for _ in stream.domains] for _ in range(stream.rounds)] if stream.mixed else []
    saved = _resume(ckpt_path, fp, device, method, oracle, auditor) if options.reuse else None
    # cpu: this thread's CPU seconds, which unlike wall time a busy machine does not inflate
    online: list[list[int]] = []  # to start from: batch, online record, wall s, session, peak MB
    start, wall, cpu, sessions, peak_prev = 0, 0.0, 0.0, 1, None
    if saved is not None:
        start, online, tally = saved["position"], saved["online"], saved["tally"]
        wall, cpu, peak_prev = saved["wall_time_s"], saved["cpu_time_s"], saved["peak_mem_mb"]
        sessions = saved["sessions"] + 1
    if spec.method in STATIC_METHODS and start == 0:  # predictions independent of the stream
        t_static, c_static = time.perf_counter(), time.thread_time()
        online, start = _static_online(method, stream, device, tally), len(stream)
        wall, cpu = time.perf_counter() - t_static, time.thread_time() - c_static
    batches = iter(stream.loader(start))  # creating the iterator draws from torch's global RNG,
    if saved is not None:  # so the saved generator states are restored only afterwards
        set_rng_state(saved["rng"], device)
    gt, total = oracle if hasattr(oracle, "set_labels") else None, len(stream)
    annotators = (gt, monitor, auditor, fallback_auditor)
    n_seen, n_wrong = sum(b[0] for b in online), sum(b[1] for b in online)
    terminal = options.progress and _is_terminal()
    milestone_log = log if options.progress and not terminal else None
    bar = _progress_bar(spec, total, start) if terminal else None
    prev_domain = stream.locate(start - 1)[0] if start > 0 else None
    cost = None if options.costs is None else options.costs[spec.method]
    t0, cpu0 = time.perf_counter(), time.thread_time()
    ckpt_time = ckpt_cpu = 0.0
    try:
        for t in range(start, total):
            x, y = next(batches)
            k = stream.locate(t)[0]
            if spec.setting == "ftta" and prev_domain is not None and k != prev_domain:
                method.reset(keep_monitor=True)  # the audits go on measuring the stream
            prev_domain = k
            y = torch.as_tensor(y, dtype=torch.long)
            if cost is not None and not rt.adapts_on(t, cost):  # online: its last step still runs
                rt.tick_annotator(oracle)  # an asynchronous annotator's clock runs on
                served = rt.serve_without_adapting(method, x.to(device))
                wrong_each, used = served.argmax(1).cpu() != y, 0
            else:
                period = stream.round_of_batch(t)
                wrong_each, used = _serve(method, x, y, period, device, annotators)
            wrong = int(wrong_each.sum())
            if tally:
                _count_domains(stream, t, wrong_each, tally)
            online.append([len(y), wrong, used])
            n_seen += len(y)
            n_wrong += wrong
            _show(bar, 100 * n_wrong / n_seen, stream.visit_names[k])
            if milestone_log is not None and (line := _milestone(spec, stream, online, t)):
                milestone_log(line)
            every = options.checkpoint_every
            if every and (t + 1) % every == 0 and t + 1 < total:  # none after the last batch
                c0, cc0 = time.perf_counter(), time.thread_time()
                # all a resume needs: the position, the method, annotators, RNGs, clocks and peak
                state = {"fingerprint": fp, "spec": dataclasses.asdict(spec), "position": t + 1}
                state.update(online=online, tally=tally, sessions=sessions)
                state.update(method=method.state_dict(), annotator=_annotator_state(oracle))
                state.update(auditor=_annotator_state(auditor), rng=rng_state(device))
                state["wall_time_s"] = wall + (c0 - t0 - ckpt_time)
                state["cpu_time_s"] = cpu + (cc0 - cpu0 - ckpt_cpu)
                state["peak_mem_mb"] = _peak(device, rss_before, peak_prev)
                atomic_write(ckpt_path, partial(torch.save, state))
                ckpt_time += time.perf_counter() - c0
                ckpt_cpu += time.thread_time() - cc0
            if callback is not None:
                callback(t, {"error": 100 * n_wrong / n_seen, "images": n_seen, "spec": spec})
    finally:
        if bar is not None:
            bar.close()
    wall += time.perf_counter() - t0 - ckpt_time
    cpu += time.thread_time() - cpu0 - ckpt_cpu
    counts = _summarize(stream, online, tally)
    result = CellResult(
        spec=spec,
        grid_index=grid_index,
        fingerprint=fp,
        wall_time_s=wall,
        images_per_s=counts["images"] / wall if wall > 0 else math.inf,
        peak_mem_mb=None,
        max_rss_mb=None,
        device=str(device),
        model_digest="",
        hparams=hparams,
        notes=notes,
        seed=options.seed,
        cpu_time_s=cpu,
        sessions=sessions,
        protocol=_protocol(data, options),
        provenance={**data.provenance, **machine_provenance()},
        **counts,
    )
    if monitor is not None:
        result.monitor = monitor_summary(monitor, result.rounds, options.annotator)
    if isinstance(method.fallback, SourceFallback):
        result.fallback = fallback_summary(method.fallback, result.rounds)
    if registry.get_spec(spec.method).active:
        result.annotation = annotation_summary(
            method, oracle, result.labels_used, options.annotator
        )
    result.peak_mem_mb = _peak(device, rss_before, peak_prev)
    result.max_rss_mb = _max_rss_mb()
    result.model_digest = model_digest(method.model)
    if cost is not None:
        result.realtime = {"cost": cost, **rt.batch_counts(total, cost)}
    result.save(result_path)
    ckpt_path.unlink(missing_ok=True)
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
        adapting = [s for s in cells if s.method not in STATIC_METHODS]
        methods = {s.method: _build_method(s, data, options, device)[0] for s in adapting}
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


def _attach_monitor(
    spec: CellSpec, data: BenchmarkData, options: RunOptions, method: Any, device: torch.device
) -> tuple[Any, Any, Any]:
    """The monitor, its auditor and the fallback's auditor (None where not asked for)."""
    monitor = auditor = fallback_auditor = None
    if options.monitor.active and spec.method not in STATIC_METHODS:
        with torch.random.fork_rng(devices=[]):  # the stream and method draw as without it
            source = data.model_fn().to(device)  # the model as trained: the monitor's reference
        given = (method, source, options.annotator, options.seed)
        if options.monitor.audit > 0.0:
            monitor, auditor = options.monitor.attach(*given)
        if options.monitor.fallback and method.fallback is None:
            fallback_auditor = options.monitor.attach_fallback(*given)
    return monitor, auditor, fallback_auditor


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
