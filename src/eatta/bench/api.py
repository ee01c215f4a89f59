"""``eatta.bench.run``: the benchmark as a Python call (what the ``eatta-bench run`` command does).

Example (the one-pass digits-C table for two methods and two seeds, outputs under ``runs/demo``)::

    import eatta.bench

    done = eatta.bench.run("digits-c", ["tent", "eatta"], rounds=1, seeds=[0, 1], out="runs/demo")
    print(done.table)                     # the markdown table the command prints
    errors = [r.average_error for r in done.results]

Every option is checked before anything is loaded or written: an unknown name or a value out of
range is a :class:`ValueError`, a wrong type or unknown keyword a :class:`TypeError`.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from eatta.bench import suites
from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.benchmark import BenchmarkData
from eatta.bench.fingerprint import code_digest
from eatta.bench.flags import LoadOptions, RunConfig, is_int
from eatta.bench.grid import GIVEN, SETTINGS, CellSpec, is_static, make_grid, make_jobs, parse_shard
from eatta.bench.grid import shard as shard_jobs
from eatta.bench.monitoring import MonitorOptions, check_fallback_budget
from eatta.bench.options import RunOptions
from eatta.bench.protocol import StreamProtocol
from eatta.bench.provenance import COMPUTED_WITH, machine_provenance
from eatta.bench.report import markdown_table, write_outputs
from eatta.bench.results import CellResult
from eatta.bench.runner import done_text, measure_costs, run_cell, run_grid
from eatta.methods import registry
from eatta.normalization import has_batchnorm
from eatta.realtime import read_costs, write_costs

__all__ = [
    "DEFAULT_METHODS",
    "DIGITS_ROUNDS",
    "EMBEDDED",
    "MAIN_JOB_SPEEDS",
    "BenchmarkRun",
    "RunInterrupted",
    "load_benchmarks",
    "method_names",
    "run",
]

#: The methods of the default run: the source model, the label-free anchors (TENT, ETA and
#: RDumb, ETA reset to the source every 1,000 steps) and one label per batch (the Baseline, the
#: faithful EATTA, eatta-stable for long streams, eatta-safe, the one recommended for deployment).
DEFAULT_METHODS = tuple("source tent eta rdumb baseline eatta eatta-stable eatta-safe".split())
#: Rounds of the default (digits-C) run: long enough for TENT's collapse to show.
DIGITS_ROUNDS = 10
#: The datasets built into the package (the digits CNN's): one thread a cell by default.
EMBEDDED = ("digits-c", "mnist", "digits-deployed")
#: The main job's online costs: every method's r on a CPU, measured once and committed
MAIN_JOB_SPEEDS = Path(__file__).with_name("speeds_digits_cpu.json")
#: The keywords of :func:`run` for the grid and for :func:`load_benchmarks` (the flags' fields)
_RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig))
_LOADING = tuple(f.name for f in dataclasses.fields(LoadOptions))
#: The fields :class:`RunOptions` takes from :class:`RunConfig` as they are
_SAME = "batch_size window weight_anchor limit workers checkpoint_every progress reuse".split()


@dataclass
class BenchmarkRun:
    """What :func:`run` returns: the results (in grid order) and where they were written."""

    #: one result per (cell, seed) of this run's shard
    results: list[CellResult]
    #: the output folder (``cells/`` and ``checkpoints/`` inside, next to the summary files)
    out: Path
    #: the summary files written: ``"json"``, ``"csv"``, ``"markdown"`` and, if plotted, ``"plot"``
    paths: dict[str, Path]
    #: the markdown table of the results (what ``eatta-bench`` prints)
    table: str


def _names(value: str | Sequence[str], what: str) -> list[str]:
    """A comma-separated string or a sequence of strings as a list of stripped names."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise TypeError(f"{what} must be a string or a sequence of strings, got {value!r}")
    if not (out := [v.strip() for v in items if v.strip()]):
        raise ValueError(f"{what} is empty")
    return out


def method_names(value: str | Sequence[str]) -> list[str]:
    """Registered method names (lower case); ``"all"``: every method, the given model's first."""
    if isinstance(value, str) and value.strip().lower() == "all":
        return sorted(registry.available(), key=lambda m: (m != GIVEN, m))
    names = [m.lower() for m in _names(value, "methods")]
    known = set(registry.available())
    if bad := [m for m in names if m not in known]:
        raise ValueError(f"unknown method(s) {bad}; registered: {sorted(known)}")
    return names


def _ints(value: int | Sequence[int], what: str, low: int) -> list[int]:
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, Sequence) or not items or not all(map(is_int, items)):
        raise TypeError(f"{what} must be an int or a non-empty sequence of ints, got {value!r}")
    if any(v < low for v in items):
        raise ValueError(f"{what} must be >= {low}, got {list(items)}")
    return list(items)


def _buffers(value: int | Sequence[int | None] | None) -> list[int | None]:
    items = [value] if value is None or isinstance(value, int) else value
    if not isinstance(items, Sequence) or not items:
        raise TypeError(f"buffers must be an int, None or a sequence of them, got {value!r}")
    for b in items:
        if b is not None and not is_int(b):
            raise TypeError(f"buffers must be ints or None, got {b!r}")
        if b is not None and b < 0:
            raise ValueError(f"buffers must be >= 0, got {b}")
    return list(items)


def _device(text: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"device must be a string such as 'cpu', 'cuda' or 'auto', got {text!r}")
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {text}: CUDA is not available")
    try:
        torch.device(text)
    except RuntimeError:
        raise ValueError(f"device {text!r} is not a torch device") from None
    return text


def _hparams(
    hparams: Mapping[str, Mapping[str, Any]] | None, methods: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Validated overrides per method: ``{"*": {...}}`` for every method that declares a key,
    ``{"tent": {...}}`` for one (see :func:`eatta.methods.registry.merge_overrides`)."""
    if hparams is None:
        return {m: {} for m in methods}
    if not isinstance(hparams, Mapping) or not all(
        isinstance(v, Mapping) for v in hparams.values()
    ):
        raise TypeError(f"hparams must map method names (or '*') to dicts, got {hparams!r}")
    own: dict[str, dict[str, Any]] = {}
    for method, values in hparams.items():
        name = method.lower()
        if name != "*" and name not in methods:
            raise ValueError(f"hparams names method {method!r}, which is not among {methods}")
        own[name] = dict(values)
    return registry.merge_overrides(methods, own.pop("*", {}), own)  # "*": every method's


def load_benchmarks(
    datasets: str | Sequence[str],
    *,
    gradual: bool = False,
    ccc: str | None = None,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
    **options: Any,
) -> dict[str, BenchmarkData]:
    """Load datasets of :data:`eatta.bench.suites.DATASETS`, failing fast on a missing folder,
    layout or weights. ``options``: the fields of :class:`~eatta.bench.flags.LoadOptions`
    (``roots``: one folder for all or one per dataset; ``severity``: 1-5 where defined;
    ``backbone``: ``digits-cnn`` or ``digits-vit`` for the digits, a ``MODELS`` name otherwise)."""
    names = _names(datasets, "datasets")
    if unknown := [d for d in names if d not in suites.DATASETS]:
        raise ValueError(f"unknown dataset(s) {unknown}; choose from {list(suites.DATASETS)}")
    o = LoadOptions(**options)
    severity_of = {name: suites.check_severity(name, o.severity) for name in names}
    roots, cache_dir, backbone = o.roots, o.cache_dir, o.backbone
    if roots is None:
        root_of: dict[str, str] = {}
    elif isinstance(roots, str | os.PathLike):
        root_of = dict.fromkeys(names, os.fspath(roots))
    else:
        root_of = {k: os.fspath(v) for k, v in roots.items()}
    shared = ("checkpoint", "pretrained", "image_size", "oracle_backbone", "oracle_checkpoint")
    model_options = {k: getattr(o, k) for k in shared}  # what PACS and the ImageNet family share
    model_options["workers"] = workers or 0
    out: dict[str, BenchmarkData] = {}
    for name in names:
        if gradual and name not in ("digits-c", "imagenet-c"):
            raise ValueError(f"gradual needs severities; {name} has none (digits-c, imagenet-c)")
        if ccc is not None and name != "digits-c":
            raise ValueError(f"the CCC-style stream is built for digits-c, not {name}")
        if name in EMBEDDED and o.oracle_backbone is not None:  # annotated by the ground truth
            raise ValueError(f"{name} has no model annotator; use the ground truth")
        if name not in EMBEDDED and name not in root_of:
            raise ValueError(
                f"{name} needs a root folder (layout: {suites.LAYOUTS[name]}); "
                f"for several datasets give one per dataset ({name}=PATH)"
            )
        level = severity_of[name]
        if name == "pacs":
            for seq in _names(o.sequences, "sequences"):
                b = suites.pacs_benchmark(
                    root_of[name], seq, backbone=backbone or "resnet18", **model_options
                )
                out[b.name] = b
            continue
        if name == "mnist":
            b = suites.mnist_benchmark(root_of.get(name), cache_dir, log=log, backbone=backbone)
        elif name == "digits-deployed":
            b = suites.deployed_benchmark(
                cache_dir, log=log, severity=level or 2, backbone=backbone
            )
        elif name == "digits-c":
            b = suites.digits_c_benchmark(
                cache_dir, log=log, gradual=gradual, ccc=ccc, severity=level or 5, backbone=backbone
            )
        else:
            b = suites.imagenet_benchmark(
                name,
                root_of[name],
                backbone=backbone or "resnet50_bn",
                severity=level or 5,
                gradual=gradual,
                subset=o.subset,
                fisher_root=o.fisher_root,
                **model_options,
            )
        out[b.name] = b
    return out


def run(
    datasets: str | Sequence[str] | Mapping[str, BenchmarkData] = "digits-c",
    methods: str | Sequence[str] = DEFAULT_METHODS,
    *,
    rounds: int | None = None,
    gradual: bool = False,
    dirichlet: float | None = None,
    protocol: StreamProtocol | None = None,
    annotator: AnnotatorOptions | None = None,
    monitor: MonitorOptions | None = None,
    hparams: Mapping[str, Mapping[str, Any]] | None = None,
    log: Callable[[str], None] | None = None,
    meta: Mapping[str, Any] | None = None,
    load: Callable[[list[str]], Mapping[str, BenchmarkData]] | None = None,
    **given: Any,
) -> BenchmarkRun:
    """Run a benchmark grid and write its outputs; the ``eatta-bench run`` command calls this.

    Args:
        datasets: dataset names (``"digits-c"``, ``"imagenet-c,pacs"``; see ``eatta-bench list``)
            loaded by :func:`load_benchmarks` with the loading keywords, or ready
            :class:`~eatta.bench.benchmark.BenchmarkData` by grid name.
        methods: registered method names, or ``"all"``.
        rounds, gradual, dirichlet: shorthands for the same fields of ``protocol``.
        protocol: how the domains are streamed (:class:`StreamProtocol`; rounds: 10 for
            digits-C alone, else 1); give it or the shorthands, not both.
        annotator: who answers the active methods (default: the ground truth, at once).
        monitor: audits and the guard (default: none).
        hparams: overrides, ``{"*": {key: value}}`` for every method declaring the key and
            ``{"tent": {...}}`` for one; checked against each method's configuration.
        log: receives progress and summary lines (None: quiet).
        meta: extra entries for the run description in ``results.json``.
        load: loads dataset names instead of :func:`load_benchmarks` (your own datasets, or
            loading options prepared elsewhere); called only after every option is checked.
        given: the fields of :class:`~eatta.bench.flags.RunConfig` (``settings``, ``labels``,
            ``seeds``, ``jobs``, ``out``, ...: the flags of ``eatta-bench run``) and, with dataset
            names, of :class:`~eatta.bench.flags.LoadOptions` (``roots``, ``backbone``, ...).

    Returns:
        The results and the files written (see :class:`BenchmarkRun`).
    """
    started = time.perf_counter()
    say = log if log is not None else (lambda _msg: None)
    config = RunConfig(**{k: given.pop(k) for k in _RUN_KEYS if k in given})
    protocol = _stream(protocol, rounds, gradual, dirichlet)
    annotator = _typed(annotator, AnnotatorOptions, "annotator")
    monitor = _typed(monitor, MonitorOptions, "monitor")
    plan = _plan(datasets, methods, config, protocol, monitor, given, load)
    options = _run_options(config, plan, protocol, annotator, monitor, hparams)
    costs = _costs(config, monitor, plan.methods)  # "offline", "measure" or the costs
    shard_ix = _shard(config.shard)
    embedded = set(plan.requested) <= set(EMBEDDED)
    threads = _threads(config.threads, options.device == "cpu" and embedded)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        data = _data(plan, protocol, config.workers, log, given, load)
        _check_single_requests(options, data)
        for b in data.values():
            for line in provenance_notes(b):
                say(line)
        grid = make_grid(list(data), plan.methods, plan.settings, plan.budgets, plan.buffers)
        all_jobs = make_jobs(grid, plan.seeds)
        cells = shard_jobs(all_jobs, *shard_ix)
        out_dir = _out_dir(config, plan.requested, shard_ix)
        say(
            f"{len(cells)} of {len(all_jobs)} runs ({len(grid)} cells x {len(plan.seeds)} seeds) "
            f"on {options.device} (batch size {options.batch_size}, "
            f"{_stream_text(options, protocol, plan.seeds)}) -> {out_dir}"
        )
        jobs = min(config.jobs or 1, len(cells)) if cells else 1
        if costs == "measure":  # before the run, with its threads; kept beside it as a table
            costs = measure_costs([c for _, (c, _) in cells], data[cells[0][1][0].dataset], options)
            write_costs(out_dir / "speeds.json", costs, options.batch_size, options.device)
        online = options if isinstance(costs, str) else dataclasses.replace(options, costs=costs)
        try:
            fork = "fork" in multiprocessing.get_all_start_methods() and options.device == "cpu"
            run_ = _run_parallel if jobs > 1 and fork else lambda *a: run_grid(*a[:4], log=log)
            first = online if config.realtime == "online" else options
            results = run_(cells, data, first, out_dir, jobs, log)
            if config.realtime == "both":  # the online twins in their own folder
                twins = run_(cells, data, online, out_dir / "online", jobs, log)
                for r, twin in zip(results, twins, strict=True):
                    r.realtime = {**(twin.realtime or {}), "online": _twin(twin)}
                    r.save(out_dir / "cells" / f"{r.spec.slug()}-{r.fingerprint}.json")  # merge
        except KeyboardInterrupt:
            raise RunInterrupted(out_dir, len(cells)) from None
        run_meta = {**dict(meta or {}), "shard": list(shard_ix), "grid_size": len(grid)}
        if not isinstance(costs, str):
            run_meta.update(protocol=config.realtime, speeds=config.speeds, costs=costs)
        description = _description(run_meta, options, protocol, plan.seeds, jobs, data)
        paths = write_outputs(results, out_dir, description, plot=config.plot)
    finally:
        torch.set_num_threads(before)
    table = markdown_table(results)
    say("outputs: " + ", ".join(str(p) for p in paths.values()))
    say(f"total wall time {time.perf_counter() - started:.1f} s")
    return BenchmarkRun(results=results, out=out_dir, paths=dict(paths), table=table)


@dataclass
class _Plan:
    """What :func:`run` was asked for, checked before anything is loaded or written."""

    requested: list[str]
    given_data: dict[str, BenchmarkData] | None
    methods: list[str]
    settings: list[str]
    budgets: list[tuple[int, int]]
    buffers: list[int | None]
    seeds: list[int]


def _run_options(
    config: RunConfig,
    plan: _Plan,
    protocol: StreamProtocol,
    annotator: AnnotatorOptions,
    monitor: MonitorOptions,
    hparams: Mapping[str, Mapping[str, Any]] | None,
) -> RunOptions:
    """How every cell runs (the first seed's; the others replace it)."""
    options = RunOptions(
        **{k: getattr(config, k) for k in _SAME},
        seed=plan.seeds[0],
        rounds=protocol.rounds or (DIGITS_ROUNDS if plan.requested == ["digits-c"] else 1),
        **{k: getattr(protocol, k) for k in ("dirichlet", "mixed")},
        annotator=annotator,
        monitor=monitor,
        device=_device(config.device),
        hparams=_hparams(hparams, plan.methods),
    )
    if options.weight_anchor is not None and all(is_static(m) for m in plan.methods):
        raise ValueError(
            f"weight_anchor pulls an adapting method's weights; {', '.join(plan.methods)} "
            "adapts none"
        )
    return options


def _costs(
    config: RunConfig, monitor: MonitorOptions, methods: list[str]
) -> dict[str, float] | str:
    """The online protocol's costs (``"measure"``: timed once the data is loaded), or
    ``"offline"``, every option checked: the online protocol skips batches, so audits cannot run."""
    speeds, protocol = config.speeds, config.realtime or "offline"
    if protocol not in ("offline", "online", "both"):
        raise ValueError(f"--protocol must be offline, online or both, got {protocol!r}")
    if (speeds is None) != (protocol == "offline"):
        raise ValueError(
            "--speeds gives the online protocol's costs: give --speeds measure|FILE with "
            f"--protocol online or both, and neither for offline (got --protocol {protocol})"
        )
    if speeds is not None and monitor.active:
        raise ValueError(
            f"--protocol {protocol}: --audit, --guard and --fallback ask for labels on every "
            "batch, and a skipped batch asks for none; leave them out"
        )
    if speeds == "measure" and config.shard is not None:
        raise ValueError("--speeds measure with --shard: time once, then give --speeds FILE")
    config.realtime = protocol
    if speeds is None or speeds == "measure":
        return speeds or protocol
    return read_costs(speeds, methods, "--speeds")


def _twin(r: CellResult) -> dict[str, Any]:
    """What a run's online twin measured: errors, labels, times."""
    keys = ("average_error", "overall_error", "round_errors", "labels_used", "cpu_time_s")
    return {"fingerprint": r.fingerprint, **{k: getattr(r, k) for k in keys}}


def _check_single_requests(options: RunOptions, data: Mapping[str, BenchmarkData]) -> None:
    """Requests of 1 with the window off, refused before anything is written where the model
    normalizes with BatchNorm (a batch of 1 has no statistics); a LayerNorm model steps on each."""
    if options.window != "off" or options.batch_size != 1:
        return
    for name, b in data.items():
        if has_batchnorm(b.model_fn()):
            raise ValueError(
                f"batch size 1 with --window off: {name}'s model normalizes with BatchNorm, "
                "which cannot normalize a batch of 1 (use --window auto or a window of samples)"
            )


def _typed(value: Any, cls: type, what: str) -> Any:
    """``value``, or ``cls()`` for None; a TypeError for anything else."""
    value = cls() if value is None else value
    if not isinstance(value, cls):
        raise TypeError(f"{what} must be {cls.__name__}, got {type(value).__name__}")
    return value


def _stream(
    protocol: StreamProtocol | None, rounds: int | None, gradual: bool, dirichlet: float | None
) -> StreamProtocol:
    """The stream protocol, given whole or by its shorthands (not both)."""
    if protocol is None:
        return StreamProtocol(rounds=rounds, gradual=gradual, dirichlet=dirichlet)
    shorthand = {"rounds": rounds, "gradual": gradual, "dirichlet": dirichlet}
    if both := [k for k, v in shorthand.items() if v not in (None, False)]:
        raise TypeError(f"give protocol= or {both}, not both")
    if not isinstance(protocol, StreamProtocol):
        raise TypeError(f"protocol must be a StreamProtocol, got {type(protocol).__name__}")
    return protocol


def _benchmark_data(data: Mapping[str, Any], what: str) -> dict[str, BenchmarkData]:
    """``data`` as a dict, refused (``what``, a TypeError) if empty or not all BenchmarkData."""
    out = dict(data)
    bad = [k for k, v in out.items() if not isinstance(v, BenchmarkData)]
    if bad or not out:
        raise TypeError(f"{what} (bad: {bad})")
    return out


def _plan(
    datasets: str | Sequence[str] | Mapping[str, BenchmarkData],
    methods: str | Sequence[str],
    config: RunConfig,
    protocol: StreamProtocol,
    monitor: MonitorOptions,
    loading: dict[str, Any],
    load: Callable[[list[str]], Mapping[str, BenchmarkData]] | None,
) -> _Plan:
    """Every option of :func:`run` checked, before anything is loaded or written."""
    if config.jobs is not None and not (is_int(config.jobs) and config.jobs >= 1):
        raise ValueError(f"jobs must be an int >= 1, got {config.jobs!r}")
    for switch in ("reuse", "progress", "plot"):  # gradual: checked by StreamProtocol
        if not isinstance(value := getattr(config, switch), bool):
            raise TypeError(f"{switch} must be True or False, got {value!r}")
    preloaded = isinstance(datasets, Mapping)
    if load is not None and (preloaded or loading):
        raise TypeError("load= loads dataset names; give neither loaded data nor loading options")
    given_data = None
    if isinstance(datasets, Mapping):  # ready data by grid name
        if loading:
            raise TypeError(
                f"loading options {sorted(loading)} apply to dataset names, not to loaded data"
            )
        given_data = _benchmark_data(datasets, "datasets must map names to BenchmarkData")
        requested = list(given_data)
    else:
        requested = _names(datasets, "datasets")
        if unknown := sorted(set(loading) - set(_LOADING)):
            raise TypeError(f"run() got unknown option(s) {unknown}")
    chosen = method_names(methods)
    setting_list = [s.lower() for s in _names(config.settings, "settings")]
    if bad := [s for s in setting_list if s not in SETTINGS]:
        raise ValueError(f"unknown setting(s) {bad}; choose from {list(SETTINGS)}")
    labels, every = _ints(config.labels, "labels", 0), _ints(config.every, "every", 1)
    budgets = [(k, n) for k in labels for n in every]
    seed_list = _ints(config.seeds, "seeds", 0)
    if len(set(seed_list)) != len(seed_list):
        raise ValueError(f"seeds must be distinct, got {seed_list}")
    if not preloaded:
        for dataset in requested:  # before anything is loaded or written
            suites.check_severity(dataset, loading.get("severity"))
    if (protocol.gradual or protocol.ccc) and loading.get("severity") is not None:
        stream = "gradual" if protocol.gradual else "CCC-style"
        raise ValueError(
            f"severity {loading['severity']}: the {stream} stream walks its own severities; "
            "leave out severity"
        )
    if monitor.fallback:  # the audits come out of an active method's label budget
        for k, n in budgets:
            for m in chosen:
                check_fallback_budget(registry.get_spec(m), k, n)
    buffers = _buffers(config.buffers)
    return _Plan(requested, given_data, chosen, setting_list, budgets, buffers, seed_list)


def _shard(shard: str | tuple[int, int] | None) -> tuple[int, int]:
    if shard is None:
        return (0, 1)
    if isinstance(shard, str):
        return parse_shard(shard)
    if isinstance(shard, tuple) and len(shard) == 2:
        return parse_shard("/".join(map(str, shard)))
    raise TypeError(f"shard must be 'i/n' or a pair (i, n), got {shard!r}")


def _threads(threads: int | None, embedded_on_cpu: bool) -> int | None:
    """The torch threads of the run: 1 for the embedded datasets on the CPU by default."""
    if threads is None and embedded_on_cpu:
        threads = 1
    if threads is not None and not is_int(threads):
        raise TypeError(f"threads must be an int, got {threads!r}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return threads


def _data(
    plan: _Plan,
    protocol: StreamProtocol,
    workers: int | None,
    log: Callable[[str], None] | None,
    loading: dict[str, Any],
    load: Callable[[list[str]], Mapping[str, BenchmarkData]] | None,
) -> dict[str, BenchmarkData]:
    """The data (fails fast on layouts and weights), checked against the stream and methods."""
    if plan.given_data is not None:
        data = plan.given_data
    elif load is not None:
        data = _benchmark_data(load(plan.requested), "load() must return BenchmarkData by name")
    else:
        data = load_benchmarks(
            plan.requested,
            gradual=protocol.gradual,
            ccc=protocol.ccc,
            workers=workers,
            log=log,
            **loading,
        )
    if protocol.mixed:
        if single := [n for n, b in data.items() if len(b.domains) < 2]:
            raise ValueError(f"mixed domains need at least two domains; {single} has one")
    for m in (m for m in plan.methods if "fisher_data" in registry.get_spec(m).needs):
        if missing := [n for n, b in data.items() if b.fisher_data is None]:
            raise ValueError(f"{m} needs clean source data (fisher_root) for {missing}")
    return data


def _out_dir(config: RunConfig, requested: list[str], shard_ix: tuple[int, int]) -> Path:
    if config.out is not None:
        return Path(config.out)
    run_name = config.name or "+".join(requested)
    if config.shard is not None:
        run_name += f"-shard{shard_ix[0]}of{shard_ix[1]}"
    return Path("runs") / run_name


def _stream_text(options: RunOptions, protocol: StreamProtocol, seeds: list[int]) -> str:
    """The seeds and the stream, annotator and monitor in words (the run's first log line)."""
    parts = [
        f"seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0]}",
        f"{options.rounds} rounds" if options.rounds > 1 else "",
        "gradual" if protocol.gradual else "",
        "mixed domains" if protocol.mixed else "",
        f"CCC {protocol.ccc}" if protocol.ccc else "",
        options.annotator.text() if options.annotator.simulated else "",
        f"Dirichlet {options.dirichlet:g}" if options.dirichlet is not None else "",
        options.monitor.text() if options.monitor.active else "",
    ]
    return ", ".join(p for p in parts if p)


def _description(
    meta: dict[str, Any],
    options: RunOptions,
    protocol: StreamProtocol,
    seeds: list[int],
    jobs: int,
    data: Mapping[str, BenchmarkData],
) -> dict[str, Any]:
    """The run's description in ``results.json``: options, code, machine and data."""
    annotator, monitor = options.annotator, options.monitor
    return {
        **meta,
        "batch_size": options.batch_size,
        "seeds": seeds,
        **{k: getattr(options, k) for k in ("rounds", "dirichlet")},
        "gradual": bool(protocol.gradual),
        **{k: getattr(protocol, k) for k in ("mixed", "ccc")},
        "annotator": {**annotator.describe(), "cost": vars(annotator.cost)},
        **({"monitor": monitor.describe()} if monitor.active else {}),
        "jobs": jobs,
        "code_digest": code_digest(),
        "git_commit": _git_commit(),
        "provenance": {
            n: {"found": b.provenance, "expected": b.expected_provenance} for n, b in data.items()
        },
        **{k: getattr(options, k) for k in ("limit", "device")},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        **machine_provenance(),
    }


def provenance_notes(b: BenchmarkData) -> list[str]:
    """How a benchmark's inputs differ from the reference table's: a warning per data or model
    digest, or one note when only the CPU kernels differ."""
    expected = b.expected_provenance or {}
    inputs = [k for k in b.provenance_mismatch() if k not in COMPUTED_WITH]
    kernels = [k for k in b.provenance_mismatch() if k in COMPUTED_WITH]
    lines = [
        f"warning: {b.name}: {key} is {b.provenance[key]}, not the reference "
        f"{expected[key]}: results may differ from the published table (see "
        "docs/benchmarks.md, 'Same numbers on every machine')"
        for key in inputs
    ]
    if kernels and not inputs:
        here = ", ".join(str(b.provenance[k]) for k in kernels)
        there = ", ".join(str(expected[k]) for k in kernels)
        lines.append(
            f"note: {b.name}: same data and model as the reference table, computed here with "
            f"torch CPU kernels {here} (the table: {there}); last digits can differ "
            "(docs/benchmarks.md, 'Same numbers on every machine')"
        )
    return lines


def _git_commit() -> str | None:
    """The checkout's commit (with ``+dirty`` if it has changes), or None outside a checkout."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout.strip()

    try:
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


class RunInterrupted(KeyboardInterrupt):
    """A run stopped with Ctrl-C while its cells ran; what it leaves in ``out`` resumes it."""

    def __init__(self, out: Path, runs: int) -> None:
        self.out = Path(out)
        #: runs of the grid (or shard) this run had to do
        self.runs = runs
        #: finished runs, saved in ``out/cells`` (read back by the same command)
        self.finished = len(list((self.out / "cells").glob("*.json")))
        ckpt = self.out / "checkpoints"
        super().__init__(  # what was kept and how to resume
            f"interrupted: {self.finished} of {runs} runs finished and saved in "
            f"{self.out / 'cells'}; {len(list(ckpt.glob('*.pt')))} unfinished run(s) "
            f"checkpointed in {ckpt}. The same command again resumes: finished runs are read "
            "back, checkpointed ones continue from their checkpoint (every --checkpoint-every "
            "batches)."
        )


# -- parallel cells: forked processes that inherit the loaded datasets ---------------------------

_WORKER_DATA: dict[str, BenchmarkData] = {}


def _cell_process(
    send: Connection,
    grid_index: int,
    spec: CellSpec,
    seed: int,
    options: RunOptions,
    out_dir: Path,
) -> None:
    """A cell's own process: run it, send ``(result, None)`` or ``(None, (error, traceback))``."""
    import signal
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the cells
    torch.set_num_threads(1)
    try:
        opts = dataclasses.replace(options, seed=seed, progress=False)
        result = run_cell(spec, _WORKER_DATA[spec.dataset], opts, out_dir, grid_index=grid_index)
        send.send((result, None))
    except BaseException as err:  # sent to the parent, which raises it
        send.send((None, (err, traceback.format_exc())))
    finally:
        send.close()


def _run_parallel(
    cells: Sequence[tuple[int, tuple[CellSpec, int]]],
    data: Mapping[str, BenchmarkData],
    options: RunOptions,
    out_dir: Path,
    jobs: int,
    log: Callable[[str], None] | None,
) -> list[CellResult]:
    """Run the cells ``jobs`` at a time, each in a fresh fork of this one-thread process (it
    inherits ``data``, and every cell's peak memory is measured alike); same results as serial.
    A cell's error is raised here; a process that dies without a result is a RuntimeError."""
    _WORKER_DATA.clear()
    _WORKER_DATA.update(data)
    context = multiprocessing.get_context("fork")
    todo = list(enumerate(cells))
    done: dict[int, CellResult] = {}
    running: dict[int, tuple[Any, Connection]] = {}
    try:
        while todo or running:
            while todo and len(running) < jobs:
                n, (j, (spec, seed)) = todo.pop(0)
                receive, send = context.Pipe(duplex=False)
                args = (send, j, spec, seed, options, out_dir)
                proc = context.Process(target=_cell_process, args=args, daemon=True)
                proc.start()
                send.close()
                running[n] = (proc, receive)
            wait([c for _, c in running.values()] + [p.sentinel for p, _ in running.values()])
            for n, (proc, receive) in list(running.items()):
                if not receive.poll() and proc.is_alive():
                    continue
                try:
                    result, failure = receive.recv()
                except EOFError:  # died without a word: killed, out of memory
                    proc.join()
                    spec = cells[n][1][0]
                    raise RuntimeError(
                        f"the process of cell {spec.key} ended with exit code {proc.exitcode} "
                        "and no result (killed or out of memory?)"
                    ) from None
                proc.join()
                del running[n]
                receive.close()
                if failure is not None:
                    err, text = failure
                    raise err from RuntimeError(f"in the cell's process:\n{text}")
                done[n] = result
                if log is not None:
                    log(f"[{len(done)}/{len(cells)}] {done_text(result)}")
        results = [done[n] for n in range(len(cells))]
    finally:
        for proc, receive in running.values():  # interrupted or failed: stop the others
            proc.terminate()
            proc.join()
            receive.close()
        _WORKER_DATA.clear()
    return results
