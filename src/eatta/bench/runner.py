"""Run registered methods on test streams: one grid cell at a time, checkpointed, resumable.

A *cell* (:class:`CellSpec`) is one method on one dataset in one setting with one labelling budget:

* setting ``"ctta"`` (continual: never reset) or ``"ftta"`` (``method.reset()`` at every domain
  change, restoring model, optimizer and method state);
* budget ``labels`` per batch on every ``every``-th batch (``eatta.Budget(labels, every=every)``);
* ``buffer``: the labelled-sample buffer size passed to the method (None: the method's default).

:func:`run_cell` streams the dataset (:class:`eatta.data.TestStream`, seeded order) through the
method built by the registry, and measures per-domain error, labels used, wall time, images/s, peak
memory and the per-batch (online) error. Every ``checkpoint_every`` batches it saves the method's
``state_dict()``, the stream position, the metrics so far and the random-number generators' states
to ``<out>/checkpoints``; run again with the same arguments it resumes there and reaches the same
result bit for bit (a finished cell is stored in ``<out>/cells`` and not run again). Both file names
carry a fingerprint of everything that determines the result, so changed arguments never resume
someone else's run. :func:`make_grid` and :func:`shard` build and split a grid deterministically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, Subset

from eatta import __version__
from eatta.budget import Budget
from eatta.data.stream import Domain, TestStream
from eatta.methods import registry
from eatta.methods.base import AdaptiveMethod
from eatta.oracle import GroundTruthOracle, Oracle

__all__ = [
    "SETTINGS",
    "BenchmarkData",
    "CellResult",
    "CellSpec",
    "RunOptions",
    "code_digest",
    "fingerprint",
    "make_grid",
    "make_jobs",
    "parse_shard",
    "prepare_domains",
    "row_label",
    "run_cell",
    "run_grid",
    "shard",
]

SETTINGS = ("ctta", "ftta")
_J = TypeVar("_J")
#: Methods whose predictions do not depend on the setting (nothing to reset).
STATIC_METHODS = frozenset({"source"})
_RESULT_VERSION = 1


# ----------------------------------------------------------------------------- specifications


@dataclass(frozen=True)
class CellSpec:
    """One grid cell: ``method`` on ``dataset`` in ``setting`` with a labelling budget."""

    dataset: str
    method: str
    setting: str = "ctta"
    labels: int = 0
    every: int = 1
    buffer: int | None = None

    def __post_init__(self) -> None:
        if self.setting not in (*SETTINGS, "-"):
            raise ValueError(f"setting must be one of {SETTINGS}, got {self.setting!r}")
        if self.labels < 0 or self.every < 1:
            raise ValueError(f"need labels >= 0 and every >= 1, got {self.labels}, {self.every}")
        if self.buffer is not None and self.buffer < 0:
            raise ValueError(f"buffer must be >= 0 or None, got {self.buffer}")

    @property
    def key(self) -> str:
        """Stable identifier, e.g. ``digits-c/eatta/ctta/k1-n1``."""
        key = f"{self.dataset}/{self.method}/{self.setting}/k{self.labels}-n{self.every}"
        return key if self.buffer is None else f"{key}-bfs{self.buffer}"

    @property
    def label(self) -> str:
        """Row label for tables and plots, e.g. ``eatta (1/batch, BFS=300)``."""
        parts = []
        if self.labels:
            per = "batch" if self.every == 1 else f"{self.every} batches"
            parts.append(f"{self.labels}/{per}")
        if self.buffer is not None:
            parts.append(f"BFS={self.buffer}")
        return f"{self.method} ({', '.join(parts)})" if parts else self.method

    def slug(self) -> str:
        return self.key.replace("/", "_").replace(":", "-")


@dataclass
class BenchmarkData:
    """A dataset ready to run: its domains in stream order and a factory for its source model.

    Args:
        name: the dataset's name in the grid (``"digits-c"``, ``"pacs:P-A-C-S"``).
        defaults_key: which per-dataset defaults of the method registry apply (``"pacs"``).
        domains: ``(name, dataset)`` pairs in adaptation order; items are ``(x, y)``.
        model_fn: returns a fresh source model (called once per cell, after seeding).
        fisher_data: clean source batches for EATA's Fisher regularizer, if available.
        oracle_fn: builds the annotator for a device; None means the ground truth.
        config: what else determines the results (paths, backbone, ...), for the fingerprint.
        provenance: digests of what the results depend on beyond the code (``"data_sha256"``,
            ``"model_sha256"``), recorded in every result; ``expected_provenance`` the digests
            of the reference build (a mismatch is reported: results may differ from the docs).
    """

    name: str
    defaults_key: str
    domains: Sequence[Domain | tuple[str, Dataset[Any]]]
    model_fn: Callable[[], nn.Module]
    fisher_data: Callable[[torch.device], Iterable[Any]] | None = None
    oracle_fn: Callable[[torch.device], Oracle] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    expected_provenance: dict[str, Any] | None = None

    def provenance_mismatch(self) -> list[str]:
        """Entries of ``provenance`` that differ from ``expected_provenance`` (empty if none is
        expected): a different data build or source model than the reference numbers used."""
        if not self.expected_provenance:
            return []
        return [
            k
            for k, v in self.expected_provenance.items()
            if k in self.provenance and self.provenance[k] != v
        ]


@dataclass
class RunOptions:
    """How cells are run (identical options give identical results).

    ``reuse=False`` ignores finished results and checkpoints in the output folder (runs afresh).
    """

    batch_size: int = 64
    seed: int = 0
    limit: int | None = None
    device: str = "cpu"
    workers: int | None = None  # None: 0 on the CPU, up to 8 worker processes on a GPU
    checkpoint_every: int = 100
    hparams: dict[str, dict[str, Any]] = field(default_factory=dict)
    progress: bool = True
    reuse: bool = True
    rounds: int = 1
    dirichlet: float | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 2:
            raise ValueError(
                f"batch size must be >= 2 (BatchNorm adapts on batches), got {self.batch_size}"
            )
        if self.limit is not None and self.limit < 2:
            raise ValueError(f"limit must be >= 2 images per domain, got {self.limit}")
        if self.checkpoint_every < 0 or (self.workers is not None and self.workers < 0):
            raise ValueError("checkpoint_every and workers must be >= 0")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {self.rounds!r}")
        if self.dirichlet is not None and not (
            isinstance(self.dirichlet, int | float)
            and not isinstance(self.dirichlet, bool)
            and 0 < self.dirichlet < math.inf
        ):
            raise ValueError(f"dirichlet must be a finite number > 0, got {self.dirichlet!r}")

    def overrides(self, method: str) -> dict[str, Any]:
        """Hyperparameter overrides for ``method``: those for all (``"*"``), then its own."""
        out = dict(self.hparams.get("*", {}))
        out.update(self.hparams.get(method, {}))
        return out


# ----------------------------------------------------------------------------- grid


def make_grid(
    datasets: Sequence[str],
    methods: Sequence[str],
    settings: Sequence[str] = ("ctta",),
    budgets: Sequence[tuple[int, int]] = ((1, 1),),
    buffers: Sequence[int | None] = (None,),
) -> list[CellSpec]:
    """All cells in canonical order (dataset, setting, method, budget, buffer).

    Budgets and buffers apply to active methods only; a non-active method gets one cell per
    setting, and ``source`` one cell per dataset (setting ``"-"``): their results do not depend
    on what they would ignore.
    """
    for s in settings:
        if s not in SETTINGS:
            raise ValueError(f"unknown setting {s!r}; choose from {SETTINGS}")
    cells: list[CellSpec] = []
    seen: set[CellSpec] = set()
    for ds in datasets:
        for setting in settings:
            for method in methods:
                spec_ = registry.get_spec(method)
                name = spec_.name.lower()
                if name in STATIC_METHODS:
                    candidates = [CellSpec(ds, name, "-")]
                elif not spec_.active:
                    candidates = [CellSpec(ds, name, setting)]
                else:
                    candidates = [
                        CellSpec(ds, name, setting, k, n, b) for k, n in budgets for b in buffers
                    ]
                for c in candidates:
                    if c not in seen:
                        seen.add(c)
                        cells.append(c)
    return cells


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (0 <= i < n) -> ``(i, n)``."""
    try:
        i_text, n_text = text.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        raise ValueError(f"shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard i/n needs 0 <= i < n, got {text!r}")
    return i, n


def shard(cells: Sequence[_J], index: int, count: int) -> list[tuple[int, _J]]:
    """The ``(grid index, cell)`` pairs of shard ``index`` of ``count``: cell ``j`` goes to shard
    ``j mod count`` (round robin, so expensive methods spread over the shards)."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"need 0 <= index < count, got {index}/{count}")
    return [(j, c) for j, c in enumerate(cells) if j % count == index]


# ----------------------------------------------------------------------------- data


def prepare_domains(
    domains: Sequence[Domain | tuple[str, Dataset[Any]]],
    batch_size: int,
    limit: int | None = None,
    seed: int = 0,
) -> tuple[list[Domain], list[str]]:
    """Apply ``limit`` (a seeded random subset of each domain, kept in dataset order) and make sure
    no batch holds a single image (BatchNorm cannot adapt on one): a domain of ``m·B + 1`` images
    loses its last one. Returns the domains and notes on what was changed."""
    out: list[Domain] = []
    notes: list[str] = []
    for k, (name, ds) in enumerate(domains):
        n = len(ds)  # type: ignore[arg-type]
        idx: list[int] | None = None
        if limit is not None and n > limit:
            g = torch.Generator().manual_seed(seed * 1000003 + k)
            idx = sorted(torch.randperm(n, generator=g)[:limit].tolist())
            n = limit
        if n % batch_size == 1 and n > 1:
            idx = (idx if idx is not None else list(range(n)))[:-1]
            notes.append(f"{name}: dropped 1 image so that no batch holds a single image")
        out.append(Domain(name, ds if idx is None else Subset(ds, idx)))
    return out, notes


class _OnDevice:
    """Re-iterable view of ``batches`` with every tensor moved to ``device``."""

    def __init__(self, batches: Iterable[Any], device: torch.device) -> None:
        self.batches = batches
        self.device = device

    def __iter__(self) -> Any:
        for b in self.batches:
            if isinstance(b, Tensor):
                yield b.to(self.device)
            else:
                yield tuple(t.to(self.device) if isinstance(t, Tensor) else t for t in b)


# ----------------------------------------------------------------------------- results


@dataclass
class CellResult:
    """Everything measured for one cell (one seed). Errors are percentages; ``online`` lists per
    batch ``[images, errors, labels]``. ``domains`` and the ``domain_*`` lists have one entry per
    domain *visit* (``rounds`` × the domain sequence); ``round_errors[r]`` is the average error
    over round ``r``'s domains, and ``average_error`` their mean."""

    spec: CellSpec
    grid_index: int
    fingerprint: str
    domains: list[str]
    domain_images: list[int]
    domain_errors: list[float]
    domain_labels: list[int]
    average_error: float
    overall_error: float
    labels_used: int
    images: int
    wall_time_s: float
    images_per_s: float
    peak_mem_mb: float | None
    max_rss_mb: float | None
    device: str
    online: list[list[int]]
    domain_first_batch: list[int]
    model_digest: str
    hparams: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    sessions: int = 1
    seed: int = 0
    rounds: int = 1
    round_errors: list[float] = field(default_factory=list)
    #: stream protocol: ``{"rounds": R, "dirichlet": δ or None, "gradual": bool}``
    protocol: dict[str, Any] = field(default_factory=dict)
    #: digests of the data and source model the cell ran on (see ``BenchmarkData.provenance``)
    provenance: dict[str, Any] = field(default_factory=dict)
    #: True when this result was read back from an earlier finished run (not stored).
    reused: bool = field(default=False, compare=False)

    @property
    def label(self) -> str:
        """Row label: the cell's, naming a method preset and the labels a batch really gets
        (e.g. ``eatta reference (2/batch)``: the reference preset labels once per step)."""
        return row_label(self.spec, self.hparams)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("reused")
        d["spec"] = dataclasses.asdict(self.spec)
        d["key"] = self.spec.key
        d["label"] = self.label
        d["format_version"] = _RESULT_VERSION
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CellResult:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["spec"] = CellSpec(**d["spec"])
        if not kw.get("round_errors"):  # results written before rounds existed: one round
            kw["round_errors"] = [float(d["average_error"])]
        return cls(**kw)

    def save(self, path: Path) -> None:
        _atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CellResult:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def row_label(spec: CellSpec, hparams: Mapping[str, Any]) -> str:
    """:attr:`CellSpec.label`, adjusted for hyperparameters that change what a row is: a
    ``preset`` is named, and EATTA's ``steps`` (each labelling) multiply the labels per batch."""
    preset = hparams.get("preset")
    steps = hparams.get("steps", 2 if preset == "reference" else 1)
    if spec.method != "eatta" or not isinstance(steps, int) or isinstance(steps, bool):
        steps = 1  # EATTA re-selects (and labels) at every step; other methods label once
    steps = max(steps, 1)
    if not preset and steps == 1:
        return spec.label
    shown = dataclasses.replace(spec, labels=spec.labels * steps)
    label = shown.label
    if preset:
        label = label.replace(spec.method, f"{spec.method} {preset}", 1)
    return label


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(value: Any, depth: int = 0) -> Any:
    """JSON-able, stable description of a hyperparameter value: plain values as they are; other
    objects by their type and configuration (dataclass fields or public attributes; tensors by
    shape and content digest), so a changed component changes the cell's fingerprint."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v, depth) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth) for k, v in value.items()}
    if isinstance(value, Tensor):
        blob = value.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()
        digest = hashlib.sha256(blob).hexdigest()[:12]
        return f"<tensor {list(value.shape)} {value.dtype} {digest}>"
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, nn.Module):
        return {"type": kind, "state": _model_digest(value)}
    if isinstance(value, type) or inspect.isroutine(value):
        name = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
        code = getattr(value, "__code__", None)
        if code is not None:  # a function: its body too (two lambdas differ)
            body = code.co_code + repr(code.co_consts).encode()
            name += " " + hashlib.sha256(body).hexdigest()[:8]
        return f"<{name}>"
    if depth >= 4:
        return f"<{kind}>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        attrs = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    elif hasattr(value, "__dict__"):
        attrs = {k: v for k, v in vars(value).items() if not k.startswith("_")}
    else:
        text = repr(value)
        return f"<{kind}>" if " at 0x" in text else text
    return {"type": kind, **{k: _plain(v, depth + 1) for k, v in attrs.items()}}


_CODE_DIGEST: str | None = None


def code_digest() -> str:
    """Digest of the ``eatta`` package's source files (computed once per process): part of every
    cell's fingerprint, so results of edited code are never read back as finished."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
        _CODE_DIGEST = h.hexdigest()[:16]
    return _CODE_DIGEST


def fingerprint(spec: CellSpec, data: BenchmarkData, options: RunOptions) -> str:
    """Short hash of everything that determines a cell's result (the code included)."""
    spec_ = registry.get_spec(spec.method)
    payload = {
        "spec": dataclasses.asdict(spec),
        "config": _plain(data.config),
        "defaults_key": data.defaults_key,
        "domains": [(name, len(ds)) for name, ds in data.domains],  # type: ignore[arg-type]
        "hparams": _plain(spec_.hparams(data.defaults_key, options.overrides(spec.method))),
        "batch_size": options.batch_size,
        "seed": options.seed,
        "limit": options.limit,
        "rounds": options.rounds,
        "dirichlet": options.dirichlet,
        "provenance": _plain(data.provenance),
        "oracle": "ground-truth" if data.oracle_fn is None else "model",
        "version": __version__,
        "code": code_digest(),
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def _model_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        if isinstance(t, Tensor):
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(t.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- memory, RNG


def _max_rss_mb() -> float | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - methods may draw from numpy's global RNG
    torch.manual_seed(seed)


def _rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------- running


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
        hp["fisher_data"] = _OnDevice(data.fisher_data(device), device)
    oracle: Oracle | None = None
    if spec_.active:
        oracle = data.oracle_fn(device) if data.oracle_fn is not None else GroundTruthOracle()
    budget = Budget(spec.labels, every=spec.every) if spec_.active else Budget(0)
    method = registry.create(
        spec.method, model, dataset=data.defaults_key, oracle=oracle, budget=budget, **hp
    )
    shown = {k: v for k, v in spec_.hparams(data.defaults_key, hp).items() if k != "fisher_data"}
    return method, oracle, _plain(shown)


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
    """Run (or resume, or load the finished result of) one cell; see the module docstring.

    ``callback(t, info)`` is called after batch ``t`` (and after any checkpoint of it) with the
    running metrics; an exception it raises stops the run (the checkpoint stays for resuming).
    With ``options.progress``, a progress bar is drawn when stderr is a terminal; otherwise
    ``log`` (if given) gets one line per domain (per round when there are several rounds).
    """
    out = Path(out_dir)
    domains, notes = prepare_domains(data.domains, options.batch_size, options.limit, options.seed)
    fp = fingerprint(spec, data, options)
    result_path = out / "cells" / f"{spec.slug()}-{fp}.json"
    ckpt_path = out / "checkpoints" / f"{spec.slug()}-{fp}.pt"
    if result_path.is_file() and options.reuse:
        done = CellResult.load(result_path)
        done.grid_index = grid_index
        done.reused = True
        return done

    device = torch.device(options.device)
    workers = options.workers
    if workers is None:  # keep an accelerator fed; on the CPU decoding competes with the step
        workers = min(8, os.cpu_count() or 1) if device.type == "cuda" else 0
    stream = TestStream(
        domains,
        options.batch_size,
        seed=options.seed,
        rounds=options.rounds,
        dirichlet=options.dirichlet,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
    )
    _seed_all(options.seed)
    rss_before = _max_rss_mb()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    method, oracle, hparams = _build_method(spec, data, options, device)

    start, online, wall, sessions, peak_prev = 0, [], 0.0, 1, None
    saved = None
    if ckpt_path.is_file() and options.reuse:
        # written by run_cell itself into this output folder: trusted, holds RNG states and
        # optimizer state that the weights-only unpickler rejects
        saved = torch.load(ckpt_path, map_location=device, weights_only=False)
        if saved.get("fingerprint") != fp:
            saved = None
    if saved is not None:
        method.load_state_dict(saved["method"])
        start, online, wall = saved["position"], saved["online"], saved["wall_time_s"]
        sessions, peak_prev = saved["sessions"] + 1, saved["peak_mem_mb"]
    batches = iter(stream.loader(start))  # creating the iterator draws from torch's global RNG,
    if saved is not None:  # so the saved generator states are restored only afterwards
        _set_rng_state(saved["rng"], device)

    gt = oracle if isinstance(oracle, GroundTruthOracle) else None
    total = len(stream)
    n_seen = sum(b[0] for b in online)
    n_wrong = sum(b[1] for b in online)
    bar = None
    terminal = options.progress and _is_terminal()
    milestone_log = log if options.progress and not terminal else None
    if terminal:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=total,
            initial=start,
            desc=spec.label,
            unit="batch",
            leave=False,
            dynamic_ncols=True,
            file=sys.stderr,
        )
    prev_domain = stream.locate(start - 1)[0] if start > 0 else None
    t0 = time.perf_counter()
    ckpt_time = 0.0
    try:
        for t in range(start, total):
            x, y = next(batches)
            k = stream.locate(t)[0]
            if spec.setting == "ftta" and prev_domain is not None and k != prev_domain:
                method.reset()
            prev_domain = k
            x = x.to(device, non_blocking=True)
            y = torch.as_tensor(y, dtype=torch.long)
            if gt is not None:
                gt.set_labels(y)
            before = method.labels_used
            logits = method(x)
            used = method.labels_used - before
            wrong = int((logits.argmax(1).cpu() != y).sum())
            online.append([len(y), wrong, used])
            n_seen += len(y)
            n_wrong += wrong
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    err=f"{100 * n_wrong / n_seen:.1f}%",
                    domain=domains[k % len(domains)].name[:12],
                )
            if milestone_log is not None and _milestone(stream, t):
                milestone_log(_milestone_text(spec, stream, online, t))
            if (
                options.checkpoint_every
                and (t + 1) % options.checkpoint_every == 0
                and t + 1 < total
            ):
                c0 = time.perf_counter()
                _atomic_save(
                    {
                        "fingerprint": fp,
                        "spec": dataclasses.asdict(spec),
                        "position": t + 1,
                        "online": online,
                        "method": method.state_dict(),
                        "rng": _rng_state(device),
                        "wall_time_s": wall + (c0 - t0 - ckpt_time),
                        "sessions": sessions,
                        "peak_mem_mb": _peak(device, rss_before, peak_prev),
                    },
                    ckpt_path,
                )
                ckpt_time += time.perf_counter() - c0
            if callback is not None:
                callback(t, {"error": 100 * n_wrong / n_seen, "images": n_seen, "spec": spec})
    finally:
        if bar is not None:
            bar.close()
    wall += time.perf_counter() - t0 - ckpt_time

    result = _summarize(spec, stream, online, grid_index, fp, wall, device, notes, hparams)
    result.seed = options.seed
    result.protocol = {
        "rounds": options.rounds,
        "dirichlet": options.dirichlet,
        "gradual": bool(data.config.get("gradual", False)),
    }
    result.provenance = dict(data.provenance)
    result.peak_mem_mb = _peak(device, rss_before, peak_prev)
    result.max_rss_mb = _max_rss_mb()
    result.model_digest = _model_digest(method.model)
    result.sessions = sessions
    result.save(result_path)
    ckpt_path.unlink(missing_ok=True)
    return result


def _peak(device: torch.device, rss_before: float | None, previous: float | None) -> float | None:
    if device.type == "cuda":
        now: float | None = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        after = _max_rss_mb()
        now = None if after is None or rss_before is None else max(after - rss_before, 0.0)
    if previous is None:
        return now
    return previous if now is None else max(now, previous)


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _milestone(stream: TestStream, t: int) -> bool:
    """Whether batch ``t`` ends a domain (one round) or a round (several rounds)."""
    if t + 1 == len(stream):
        return True
    j, b = stream.locate(t)
    if b + 1 < stream.batches_per_visit[j]:
        return False
    return stream.rounds == 1 or (j + 1) % len(stream.domains) == 0


def _milestone_text(spec: CellSpec, stream: TestStream, online: list[list[int]], t: int) -> str:
    j, _ = stream.locate(t)
    k = len(stream.domains)
    if stream.rounds == 1:
        lo, what = stream.visit_first_batch[j], f"domain {j + 1}/{k} {stream.domains[j].name}"
    else:
        lo = stream.visit_first_batch[(j // k) * k]
        what = f"round {j // k + 1}/{stream.rounds}"
    rows = online[lo : t + 1]
    err = 100.0 * sum(r[1] for r in rows) / max(1, sum(r[0] for r in rows))
    where = f"batch {t + 1}/{len(stream)}"
    return f"  {spec.label} [{spec.setting}]: {what}: error {err:.1f}% ({where})"


def _summarize(
    spec: CellSpec,
    stream: TestStream,
    online: list[list[int]],
    grid_index: int,
    fp: str,
    wall: float,
    device: torch.device,
    notes: list[str],
    hparams: dict[str, Any],
) -> CellResult:
    names = stream.visit_names
    first = list(stream.visit_first_batch)
    imgs, errs, labs = [], [], []
    for j in range(len(names)):
        rows = online[first[j] : first[j] + stream.batches_per_visit[j]]
        n = sum(r[0] for r in rows)
        imgs.append(n)
        errs.append(100.0 * sum(r[1] for r in rows) / n)
        labs.append(sum(r[2] for r in rows))
    images = sum(imgs)
    k = len(stream.domains)
    round_errors = [float(np.mean(errs[r * k : (r + 1) * k])) for r in range(stream.rounds)]
    return CellResult(
        spec=spec,
        grid_index=grid_index,
        fingerprint=fp,
        domains=list(names),
        domain_images=imgs,
        domain_errors=errs,
        domain_labels=labs,
        average_error=float(np.mean(errs)),
        overall_error=100.0 * sum(r[1] for r in online) / images,
        labels_used=sum(labs),
        images=images,
        wall_time_s=wall,
        images_per_s=images / wall if wall > 0 else math.inf,
        peak_mem_mb=None,
        max_rss_mb=None,
        device=str(device),
        online=online,
        domain_first_batch=first,
        model_digest="",
        hparams=hparams,
        notes=notes,
        rounds=stream.rounds,
        round_errors=round_errors,
    )


def make_jobs(cells: Sequence[CellSpec], seeds: Sequence[int] = (0,)) -> list[tuple[CellSpec, int]]:
    """Every cell once per seed (cell-major), the list that :func:`shard` splits."""
    if not seeds:
        raise ValueError("need at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    return [(c, s) for c in cells for s in seeds]


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
            how = " (finished earlier: read back)" if r.reused else ""
            rounds = ""
            if r.rounds > 1:
                rounds = (
                    f", round 1 {r.round_errors[0]:.1f}% -> round {r.rounds} "
                    f"{r.round_errors[-1]:.1f}%"
                )
            log(
                f"[{i + 1}/{len(cells)}] {spec.dataset} {spec.setting} {r.label} seed {seed}: "
                f"avg error {r.average_error:.1f}%{rounds}, {r.labels_used} labels, "
                f"{r.wall_time_s:.1f} s{how}"
            )
        results.append(r)
    return results
