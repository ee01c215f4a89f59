"""``eatta-bench sweep``: a grid's shards as one Slurm job array, or as local processes.

Every shard is one job that runs exactly ``eatta-bench run ARGV --shard i/n --out DIR/shard-i``
(:class:`ShardJob`), so it writes the same cell files as that command run by hand. The sweep
folder ``DIR`` holds ``sweep.json`` (the options and every submission with its job ids),
``shard-<i>/``, ``submitit/`` (job files and logs) and, once every shard has finished, the merged
outputs. submitit (the extra ``eatta[cluster]``) is imported inside functions only. The same
command again, or ``--resubmit``, submits only the shards without ``results.json``: they resume
from their checkpoints. See ``docs/guide/cluster.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch

import eatta
from eatta.bench import api, commands
from eatta.bench.flags import is_int, split_csv
from eatta.bench.grid import CellSpec, make_grid, make_jobs
from eatta.bench.grid import shard as shard_jobs
from eatta.bench.results import atomic_write_text
from eatta.bench.suites import DATASETS, digits_grid_name
from eatta.console import HelpFormatter
from eatta.data.digits import DIGITS_C_CORRUPTIONS, digits_split
from eatta.data.pacs import PACS_LETTERS, parse_pacs_sequence

if TYPE_CHECKING:
    import submitit

__all__ = ["ShardJob", "SlurmOptions", "launch", "main", "plan", "slurm_executor", "sweep_parser"]

#: Time limit of a Slurm job when ``--time`` is not given (minutes).
SLURM_DEFAULT_TIME_MIN = 240
#: A local job has no time limit unless ``--time`` is given (submitit's default is 2 minutes).
_LOCAL_NO_LIMIT_MIN = 60 * 24 * 365
LAUNCHERS = ("slurm", "local")
#: The sweep's record in its folder.
STATE_FILE = "sweep.json"
_STATE_FORMAT = 1
#: Slurm job states of a job that has not ended (it may still write its result).
_SLURM_ACTIVE = frozenset(
    "PENDING CONFIGURING RUNNING COMPLETING REQUEUED REQUEUE_FED REQUEUE_HOLD RESIZING "
    "SIGNALING STAGE_OUT SUSPENDED PREEMPTED".split()
)


@dataclass(frozen=True)
class ShardJob:
    """What one job runs: ``eatta-bench run ARGV --shard index/count --out out``.

    A callable for submitit; ``checkpoint`` (submitit's hook on a Slurm timeout or preemption)
    requeues the same job, which resumes from the run's own checkpoints."""

    argv: tuple[str, ...]
    index: int
    count: int
    out: str
    #: torch CPU threads for the job (None: the run's default)
    threads: int | None = None

    def command(self) -> list[str]:
        return ["run", *self.argv, "--shard", f"{self.index}/{self.count}", "--out", self.out]

    def __call__(self) -> str:
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        status = commands.run_main(self.command()[1:])
        if status != 0:
            raise RuntimeError(
                f"shard {self.index}/{self.count}: eatta-bench run exited with status {status} "
                "(its message is in this job's log)"
            )
        return self.out

    def checkpoint(self) -> Any:
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self)


def _require_submitit() -> None:
    """A ValueError naming the extra to install when submitit is missing."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ValueError(
            "the sweep launchers need submitit: pip install 'eatta[cluster]'"
        ) from None


def parse_time(text: str | int) -> int:
    """A Slurm time limit as minutes: ``90``, ``MM:SS``, ``H:MM:SS``, ``D-H``, ``D-H:MM``,
    ``D-H:MM:SS`` (seconds round up)."""
    if (m := re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", str(text).strip())) is None:
        raise ValueError(f"--time is minutes or [D-]H:MM:SS, got {text!r}")
    fields = [int(f) for f in m[2].split(":")]
    if m[1] is not None:  # D-H, D-H:MM, D-H:MM:SS
        fields[0] += int(m[1]) * 24
    elif len(fields) < 3:  # minutes, MM:SS
        fields.insert(0, 0)
    hours, mins, secs = [*fields, 0, 0][:3]
    minutes = hours * 60 + mins - (-secs // 60)
    if minutes < 1:
        raise ValueError(f"--time must be at least one minute, got {text!r}")
    return minutes


@dataclass(frozen=True)
class SlurmOptions:
    """What each Slurm job of the array asks for."""

    partition: str | None = None
    #: time limit in minutes
    time_min: int = SLURM_DEFAULT_TIME_MIN
    #: GPUs per job (0: none asked for)
    gpus: int = 0
    #: CPUs per job (None: the partition's default); also the job's torch threads
    cpus: int | None = None
    #: at most this many jobs of the array run at once (None: no limit)
    array_parallelism: int | None = None
    #: further ``#SBATCH`` options, e.g. ``{"account": "proj", "mem": "32G"}``
    sbatch: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.partition is not None and not self.partition.strip():
            raise ValueError("--partition is empty")
        for name, value, low in (
            ("time", self.time_min, 1),
            ("gpus", self.gpus, 0),
            ("cpus", self.cpus, 1),
            ("array-parallelism", self.array_parallelism, 1),
        ):
            if value is not None and not is_int(value):
                raise TypeError(f"--{name} must be an int, got {value!r}")
            if value is not None and value < low:
                raise ValueError(f"--{name} must be >= {low}, got {value}")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "sbatch": dict(self.sbatch)}


def _job_env(threads: int | None) -> dict[str, str]:
    """Environment changes for a job's process: its thread count, and the same ``eatta`` code
    (the folder of a source tree such as a checkout or ``PYTHONPATH=src`` first on its path)."""
    env: dict[str, str] = {}
    root = Path(eatta.__file__).resolve().parents[1]
    if root.name not in ("site-packages", "dist-packages"):
        old = os.environ.get("PYTHONPATH", "")
        if old.split(os.pathsep)[0] != str(root):
            env["PYTHONPATH"] = os.pathsep.join([str(root), *([old] if old else [])])
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def slurm_executor(folder: str | os.PathLike[str], options: SlurmOptions) -> submitit.SlurmExecutor:
    """A submitit Slurm executor configured for one shard per array job (submits nothing).

    ``folder``: submitit's job files and logs (``%j`` becomes the job id). Needs ``srun`` on the
    PATH (submitit checks); :func:`check_slurm` says more clearly what is missing."""
    _require_submitit()
    import submitit

    ex = submitit.SlurmExecutor(folder=str(folder))
    setup = [f"export {k}={shlex.quote(v)}" for k, v in _job_env(options.cpus).items()]
    params = {  # those left None are not asked for
        "job_name": "eatta-sweep",
        "time": options.time_min,
        "array_parallelism": options.array_parallelism or 100_000,
        "partition": options.partition,
        "gpus_per_node": options.gpus or None,
        "cpus_per_task": options.cpus,
        "setup": setup or None,
        "additional_parameters": dict(options.sbatch) or None,
    }
    ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return ex


def check_slurm(partition: str | None = None) -> list[str]:
    """The cluster's partitions; a ValueError when Slurm is not here or does not answer, or when
    ``partition`` is not among them."""
    if missing := [c for c in ("sbatch", "srun", "sinfo") if shutil.which(c) is None]:
        raise ValueError(
            f"--launcher slurm: no Slurm here ({', '.join(missing)} not on PATH); "
            "--launcher local runs the shards on this machine"
        )
    try:
        sinfo = ["sinfo", "--noheader", "--format=%P"]
        done = subprocess.run(sinfo, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", None) or err
        raise ValueError(f"--launcher slurm: Slurm does not answer (sinfo: {detail})") from None
    partitions = [p.strip().rstrip("*") for p in done.stdout.split() if p.strip()]
    if partition is not None and partition not in partitions:
        raise ValueError(
            f"--partition {partition!r} is not a partition of this cluster "
            f"({', '.join(partitions) or 'sinfo lists none'})"
        )
    return partitions


def _local_slots(jobs: int | None) -> tuple[int, int, int]:
    """(parallel jobs, GPUs, cores) for the local launcher."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    jobs = (gpus or cores) if jobs is None else jobs
    if not is_int(jobs) or jobs < 1:
        raise ValueError(f"--jobs must be an int >= 1, got {jobs!r}")
    return jobs, gpus, cores


def _parse_run_argv(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed by ``eatta-bench run``'s own parser; a mistake is a ValueError."""
    if any(a in ("-h", "--help") for a in argv):
        raise ValueError("run options: -h/--help shows help; see eatta-bench run --help")
    parser = commands.run_parser()

    def fail(message: str) -> NoReturn:
        raise ValueError(f"run options: {message}")

    parser.error = fail  # type: ignore[method-assign]
    args = parser.parse_args(list(argv))
    owned = {
        "shard": "the sweep gives every job its --shard",
        "out": "the sweep writes shard i to DIR/shard-i (give the sweep's --out DIR before --)",
        "rerun": "a sweep never recomputes finished cells; start a new sweep in another folder",
        "list": "see eatta-bench list",
    }
    for dest, why in owned.items():
        if getattr(args, dest) not in (None, False):
            raise ValueError(f"run options: --{dest} is not a sweep's run option: {why}")
    return args


def _grid_datasets(args: argparse.Namespace) -> list[str]:
    """The grid's dataset names, as :func:`eatta.bench.api.load_benchmarks` names them."""
    names = split_csv(args.dataset)
    unknown = [d for d in names if d not in DATASETS]
    if unknown or not names:
        raise ValueError(f"run options: unknown dataset(s) {unknown}; choose from {list(DATASETS)}")
    if args.gradual and any(d not in ("digits-c", "imagenet-c") for d in names):
        raise ValueError("run options: --gradual needs severities (digits-c, imagenet-c)")
    letter = {v: k for k, v in PACS_LETTERS.items()}
    out: list[str] = []
    for name in names:
        if name in api.EMBEDDED:
            try:
                out.append(digits_grid_name(args.backbone, name))
            except ValueError as err:
                raise ValueError(f"run options: --backbone: {err}") from None
        elif name == "pacs":
            for seq in split_csv(args.sequence):
                try:
                    domains = parse_pacs_sequence(seq)
                except (KeyError, ValueError) as err:
                    raise ValueError(f"run options: --sequence {seq!r}: {err}") from None
                out.append("pacs:" + "-".join(letter[d] for d in domains))
        else:
            out.append(name)
    return out


def _stream_images(dataset: str, args: argparse.Namespace, rounds: int) -> tuple[int, str] | None:
    """Images that one run of ``dataset`` streams, with how they add up; None: unknown without
    loading the data (only digits-C's count is known, from its test split)."""
    if dataset not in ("digits-c", "digits-c:vit"):
        return None
    per_domain = len(digits_split()[1])
    if args.limit is not None:
        per_domain = min(per_domain, args.limit)
    if per_domain % args.batch_size == 1 and per_domain > 1:  # as benchmark.prepare_domains
        per_domain -= 1
    domains = len(DIGITS_C_CORRUPTIONS) * (9 if args.gradual else 1)
    how = f"{per_domain} x {domains} domains x {rounds} round{'s' if rounds > 1 else ''}"
    return per_domain * domains * rounds, how


@dataclass(frozen=True)
class SweepPlan:
    """A grid's runs and how ``count`` shards split them (what ``--dry-run`` prints)."""

    #: the run options (``eatta-bench run`` command line without ``--shard``/``--out``)
    argv: tuple[str, ...]
    count: int
    #: every run of the grid, ``(cell, seed)`` in grid order (what :func:`grid.shard` splits)
    jobs: tuple[tuple[CellSpec, int], ...]
    #: number of grid cells (``len(jobs)`` divided by the seeds)
    cells: int
    #: images one run streams, per grid dataset, with how they add up (None: unknown)
    stream: Mapping[str, tuple[int, str] | None]
    #: the run options ask for the PNG plot (no ``--no-plot``)
    plot: bool = True

    def with_count(self, count: int) -> SweepPlan:
        """The same grid in ``count`` shards (1 <= count <= number of runs)."""
        if not is_int(count):
            raise TypeError(f"shards must be an int, got {count!r}")
        if not 1 <= count <= len(self.jobs):
            raise ValueError(
                f"--shards must be between 1 and the grid's {len(self.jobs)} runs "
                f"({self.cells} cells x {len(self.jobs) // max(self.cells, 1)} seeds), got {count}"
            )
        return dataclasses.replace(self, count=count)

    def shard(self, index: int) -> list[tuple[int, tuple[CellSpec, int]]]:
        """The ``(grid index, (cell, seed))`` runs of shard ``index``."""
        return shard_jobs(self.jobs, index, self.count)

    def images(self, index: int) -> int | None:
        """Images that shard ``index`` streams in all (None: unknown)."""
        sizes = [self.stream.get(cell.dataset) for _, (cell, _seed) in self.shard(index)]
        return sum(size[0] for size in sizes if size is not None) if None not in sizes else None

    def job(self, index: int, out: str | os.PathLike[str], threads: int | None = None) -> ShardJob:
        """The job of shard ``index`` (sweep folder ``out``)."""
        return ShardJob(self.argv, index, self.count, str(shard_dir(out, index)), threads)

    def describe(
        self, out: str | os.PathLike[str], finished: Sequence[int] = (), launcher: str = ""
    ) -> str:
        """The ``--dry-run`` listing: the grid, its shards with their size, their commands."""
        seeds = len(self.jobs) // max(self.cells, 1)
        known = [self.images(i) for i in range(self.count)]
        total = None if None in known else sum(k or 0 for k in known)
        lines = [
            f"sweep of {len(self.jobs)} runs ({self.cells} cells x {seeds} seeds) in "
            f"{self.count} shards{f' ({launcher})' if launcher else ''} -> {out}",
            "images per run: "
            + "; ".join(
                f"{d} {v[0]:,} ({v[1]})" if v is not None else f"{d} unknown (not loaded)"
                for d, v in self.stream.items()
            ),
            f"images in all (images x runs): {'unknown' if total is None else f'{total:,}'}",
            "",
            "| shard | runs | images | state | runs (cell, seed) |",
            "|---:|---:|---:|---|---|",
        ]
        for i in range(self.count):
            runs = ", ".join(f"{c.key} s{s}" for _, (c, s) in self.shard(i))
            size = "unknown" if known[i] is None else f"{known[i]:,}"
            state = "finished" if i in finished else "to run"
            lines.append(f"| {i} | {len(self.shard(i))} | {size} | {state} | {runs} |")
        example = " ".join(shlex.quote(a) for a in self.job(0, out).command())
        lines += ["", f"shard 0 runs: eatta-bench {example}", ""]
        return "\n".join(lines)


def plan(
    run_argv: Sequence[str], shards: int | None = None, *, count_images: bool = True
) -> SweepPlan:
    """Check the run options ``run_argv`` (``eatta-bench run`` options without ``--shard`` and
    ``--out``; bad ones raise :class:`ValueError`) and list the grid's runs in ``shards`` shards
    (None: one run per shard) without loading any data. ``count_images``: count digits-C's
    images per run from its split (else every count is None)."""
    if isinstance(run_argv, str) or not all(isinstance(a, str) for a in run_argv):
        raise TypeError(f"run_argv must be a list of strings, got {run_argv!r}")
    args = _parse_run_argv(run_argv)
    datasets = _grid_datasets(args)
    methods = api.method_names(args.methods)
    settings = [s.lower() for s in split_csv(args.setting)]
    budgets = [(k, n) for k in args.labels for n in args.every]
    try:
        commands.check_run_args(args, run_argv)
        grid = make_grid(datasets, methods, settings, budgets, args.buffer)
    except ValueError as err:
        raise ValueError(f"run options: {err}") from None
    commands.parse_hparams(args.hp, methods)  # unknown keys or values: a ValueError naming --hp
    seeds = args.seeds if args.seeds is not None else [args.seed]
    jobs = tuple(make_jobs(grid, seeds))
    rounds = args.rounds or (api.DIGITS_ROUNDS if split_csv(args.dataset) == ["digits-c"] else 1)
    stream = {d: _stream_images(d, args, rounds) if count_images else None for d in datasets}
    base = SweepPlan(tuple(run_argv), len(jobs), jobs, len(grid), stream, not args.no_plot)
    return base if shards is None else base.with_count(shards)


def shard_dir(out: str | os.PathLike[str], index: int) -> Path:
    """The output folder of shard ``index`` in the sweep folder ``out``."""
    return Path(out) / f"shard-{index}"


def finished_shards(out: str | os.PathLike[str], count: int) -> list[int]:
    """The shards of ``out`` that have written their ``results.json``."""
    return [i for i in range(count) if (shard_dir(out, i) / "results.json").is_file()]


def load_state(out: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``sweep.json`` of the sweep folder ``out`` (None: no sweep there)."""
    path = Path(out) / STATE_FILE
    if not path.is_file():
        return None
    state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if state.get("format") != _STATE_FORMAT:
        raise ValueError(f"{path}: not a sweep record this version of eatta reads")
    return state


def _save_state(out: Path, state: Mapping[str, Any]) -> None:
    atomic_write_text(out / STATE_FILE, json.dumps(state, indent=1))


@dataclass
class SweepResult:
    """What :func:`launch` did."""

    #: the sweep folder
    out: Path
    plan: SweepPlan
    launcher: str
    #: what each Slurm job asks for (None: the local launcher)
    slurm: SlurmOptions | None = None
    #: local: parallel jobs, given or recorded (None: one per GPU, else one per core)
    jobs: int | None = None
    #: a job's time limit in minutes, given or recorded (None: the launcher's default)
    time_min: int | None = None
    #: job id of every shard submitted by this call
    submitted: dict[int, str] = field(default_factory=dict)
    #: shards that failed (waited for), with why
    failed: dict[int, str] = field(default_factory=dict)
    #: whether the merged outputs of the whole grid were written to ``out``
    merged: bool = False

    @property
    def merge_command(self) -> str:
        """The command that merges the shards."""
        out = shlex.quote(str(self.out))
        plot = "" if self.plan.plot else " --no-plot"
        return f"eatta-bench merge {out}/shard-* --out {out}{plot}"

    @property
    def resubmit_command(self) -> str:
        """The command that submits the shards without results again."""
        return f"eatta-bench sweep --resubmit --out {shlex.quote(str(self.out))}"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _ended(
    result: SweepResult, index: int, job: submitit.Job[Any], state: str | None = None
) -> None:
    """Say how shard ``index`` ended; a failure goes into ``result.failed`` with why (``state``:
    the job's last state as Slurm's queue showed it; None: ask submitit)."""
    err = job.exception() if job.paths.result_pickle.exists() else None
    why = None
    if err is not None:
        lines = [ln for ln in str(err).splitlines() if ln.strip() and not ln.startswith("---")]
        tail = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")
        why = f"{tail.strip()} (log: {job.paths.stderr})"
    elif not (shard_dir(result.out, index) / "results.json").is_file():
        why = (
            f"ended without a result ({state or job.state}: cancelled, killed, out of memory or "
            f"out of time?); log: {job.paths.stderr}"
        )
    if why is not None:
        result.failed[index] = why
    _say(f"shard {index} (job {job.job_id}): " + ("finished" if why is None else f"FAILED: {why}"))


def slurm_queue(job_ids: Sequence[str]) -> dict[str, str] | None:
    """The state of each array task of ``job_ids`` that Slurm's queue still shows (a task it does
    not show has ended); None when ``squeue`` does not answer. Never ``sacct``, which fails on
    clusters without accounting."""
    arrays = ",".join(sorted({j.split("_")[0] for j in job_ids}))
    command = ["squeue", "--noheader", "--array", "--states=all", "--format=%i %T", "--jobs"]
    try:
        done = subprocess.run([*command, arrays], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:  # every job long gone: "Invalid job id specified"
        return {} if "invalid job id" in done.stderr.lower() else None
    rows = [line.strip().partition(" ") for line in done.stdout.splitlines()]
    return {job_id: state.strip().split(" ")[0].upper() for job_id, _, state in rows if job_id}


def _wait(result: SweepResult, jobs: Mapping[int, submitit.Job[Any]]) -> None:
    """Wait for the Slurm jobs ``jobs`` (shard -> job), the failed ones into ``result.failed``.

    A job has ended when it wrote its result or :func:`slurm_queue` shows it ended (submitit's
    ``done()`` asks ``sacct``, which never sees a cancelled job without accounting). It looks
    again after 0.5 s, then a quarter longer each time, at most every 30 s."""
    running = dict(jobs)
    pause = 0.5
    while running:
        queue = slurm_queue([job.job_id for job in running.values()])
        for i, job in list(running.items()):
            state = None if queue is None else queue.get(job.job_id, "GONE")
            if not job.paths.result_pickle.exists() and (state is None or state in _SLURM_ACTIVE):
                continue
            del running[i]
            _ended(result, i, job, "no longer in the queue" if state in (None, "GONE") else state)
        if running:
            time.sleep(pause)
            pause = min(30.0, pause * 1.25)


def _submit_slurm(result: SweepResult, pending: list[int], slurm: SlurmOptions, wait: bool) -> None:
    """Submit the pending shards as one Slurm job array; with ``wait``, wait for them."""
    ex = slurm_executor(result.out / "submitit" / "%j", slurm)
    with ex.batch():
        submitted = [ex.submit(result.plan.job(i, result.out, slurm.cpus)) for i in pending]
    jobs = dict(zip(pending, submitted, strict=True))
    _record(result, {i: job.job_id for i, job in jobs.items()})
    first = submitted[0].job_id.split("_")[0]
    print(f"submitted {len(pending)} shard(s) of {result.plan.count} as Slurm job {first}:")
    for i, job in jobs.items():
        print(f"  shard {i}: job {job.job_id}  log {job.paths.stderr}")
    if not wait:
        print(f"when they have finished: {result.merge_command}")
        print(f"failed or out of time: {result.resubmit_command} (finished cells are read back)")
        return
    try:
        _wait(result, jobs)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"stopped waiting: the Slurm jobs of {result.out} keep running (squeue shows them; "
            f"scancel {first} stops them); when they have finished: {result.merge_command}"
        ) from None


@contextlib.contextmanager
def _spawning(env: Mapping[str, str], log: Path) -> Iterator[None]:
    """``os.environ`` with ``env`` and file descriptor 2 appended to ``log``: what the controller
    process that submitit's local executor starts inherits. Only the changed keys are restored
    (other threads never see the environment emptied)."""
    saved = {k: os.environ.get(k) for k in env}
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    stderr = os.dup(2)
    os.environ.update(env)
    try:
        with open(log, "ab") as f:
            os.dup2(f.fileno(), 2)
        yield
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_local(result: SweepResult, pending: Sequence[int]) -> None:
    """Run the ``pending`` shards through submitit's local executor, ``result.jobs`` at a time;
    the failed ones go into ``result.failed``. Ctrl-C stops them."""
    import submitit

    out, count = result.out, result.plan.count
    parallel, gpus, cores = _local_slots(result.jobs)
    threads = max(1, cores // parallel)
    env = _job_env(None if gpus else threads)
    # one flat folder: with %j in it, submitit's local controller creates a folder named %j
    ex = submitit.LocalExecutor(folder=str(out / "submitit"))
    ex.update_parameters(timeout_min=result.time_min or _LOCAL_NO_LIMIT_MIN)
    queue = list(pending)
    free = list(range(min(parallel, len(queue))))
    running: dict[int, tuple[submitit.Job[Any], int]] = {}
    try:
        while queue or running:
            while queue and free:
                i, slot = queue.pop(0), free.pop(0)
                if gpus:
                    ex.update_parameters(gpus_per_node=1, visible_gpus=[slot % gpus])
                # the controller process writes to our stderr (a traceback when job.cancel()
                # interrupts it on Ctrl-C): it goes to a log instead
                with _spawning(env, out / "submitit" / "controllers.log"):
                    job = ex.submit(result.plan.job(i, out, threads))
                running[i] = (job, slot)
                _record(result, {i: job.job_id})
                where = f"GPU {slot % gpus}" if gpus else f"{threads} thread(s)"
                _say(f"shard {i}/{count}: local job {job.job_id} ({where})")
            time.sleep(0.2)
            for i, (job, slot) in list(running.items()):
                if job.done():
                    del running[i]
                    free.append(slot)
                    _ended(result, i, job)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"interrupted: {len(finished_shards(out, count))} of {count} shards finished (their "
            "results are kept; the others were stopped and resume from their checkpoints); "
            f"continue with: {result.resubmit_command}"
        ) from None
    finally:
        for job, _slot in running.values():  # interrupted: stop what still runs
            job.cancel()


def _settings(
    folder: Path,
    state: dict[str, Any] | None,
    run_argv: Sequence[str] | None,
    shards: int | None,
    launcher: str | None,
    slurm: SlurmOptions | None,
    jobs: int | None,
    time_min: int | None,
    resubmit: bool,
) -> tuple[Sequence[str], int | None, str, SlurmOptions | None, int | None, int | None]:
    """:func:`launch`'s options checked, and completed from the sweep recorded in ``folder``."""
    if resubmit and state is None:
        raise ValueError(f"--resubmit: {folder} holds no sweep ({STATE_FILE}); nothing to resubmit")
    recorded = state or {}
    if state is not None:
        stored = list(state["argv"])
        if run_argv is None or (resubmit and not run_argv):
            run_argv = stored
        if list(run_argv) != stored or (shards is not None and shards != state["shards"]):
            raise ValueError(
                f"{folder} holds a sweep of other options ({STATE_FILE}: {len(stored)} run "
                f"arguments {' '.join(stored)!r}, {state['shards']} shards); pass the same "
                "ones (or --resubmit alone) to finish it, or use another --out"
            )
        shards = int(state["shards"])
    elif run_argv is None:
        raise ValueError("no run options and no recorded sweep to resubmit")
    launcher = launcher or recorded.get("launcher") or "slurm"
    if launcher not in LAUNCHERS:
        raise ValueError(f"--launcher must be one of {LAUNCHERS}, got {launcher!r}")
    if launcher == "local" and slurm is not None:
        raise ValueError(
            "--partition, --gpus, --cpus, --array-parallelism and --sbatch are Slurm "
            "options; --launcher local runs one job per GPU or core (--jobs)"
        )
    if launcher == "slurm" and jobs is not None:
        raise ValueError("--jobs is for --launcher local; on Slurm use --array-parallelism")
    if recorded.get("launcher") == launcher:  # the options not given are the recorded ones
        if slurm is None and recorded.get("slurm"):
            slurm = SlurmOptions(**recorded["slurm"])
        jobs = jobs if jobs is not None else recorded.get("jobs")
        time_min = time_min if time_min is not None else recorded.get("time_min")
    if time_min is not None:
        time_min = parse_time(time_min)
    if launcher == "slurm":
        slurm = slurm or SlurmOptions()
        if time_min is not None:
            slurm = dataclasses.replace(slurm, time_min=time_min)
    return run_argv, shards, launcher, slurm, jobs, time_min


def _begin_submission(result: SweepResult, state: dict[str, Any] | None) -> None:
    """Write the sweep's record in ``result.out`` with a new submission (no job ids yet)."""
    submission = {
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "launcher": result.launcher,
        "job_ids": {},
    }
    result.out.mkdir(parents=True, exist_ok=True)
    _save_state(
        result.out,
        {
            "format": _STATE_FORMAT,
            "argv": list(result.plan.argv),
            "shards": result.plan.count,
            "launcher": result.launcher,
            "time_min": result.time_min,
            "slurm": result.slurm.to_dict() if result.slurm is not None else None,
            "jobs": result.jobs,
            "submissions": [*(state["submissions"] if state else []), submission],
        },
    )


def _record(result: SweepResult, job_ids: Mapping[int, str]) -> None:
    """Add the shards' job ids to the last submission in ``sweep.json`` (and to ``result``)."""
    state = json.loads((result.out / STATE_FILE).read_text(encoding="utf-8"))
    state["submissions"][-1]["job_ids"].update({str(i): j for i, j in job_ids.items()})
    _save_state(result.out, state)
    result.submitted.update(job_ids)


def launch(
    run_argv: Sequence[str] | None,
    out: str | os.PathLike[str],
    *,
    shards: int | None = None,
    launcher: str | None = None,
    slurm: SlurmOptions | None = None,
    jobs: int | None = None,
    time_min: int | None = None,
    wait: bool = False,
    resubmit: bool = False,
    dry_run: bool = False,
) -> SweepResult:
    """Run the grid of ``run_argv`` (``eatta-bench run`` options) as shards into the folder
    ``out``; see the module docstring. Bad input is a :class:`ValueError`, raised before anything
    is written or submitted.

    ``shards`` (default: ``jobs`` locally, one run per shard on Slurm), ``launcher`` (``"slurm"``
    or ``"local"``), ``slurm`` (what each array job asks for), ``jobs`` (local: parallel
    processes, default one per GPU else per core), ``time_min`` (a job's time limit). ``wait``:
    wait for the Slurm jobs and merge (the local launcher always waits). ``resubmit``: continue
    the sweep recorded in ``out`` (the options not given are the recorded ones); the same call
    without it does the same when its options match the record. Only shards without
    ``results.json`` are submitted. ``dry_run``: print the plan, nothing else.
    """
    folder = Path(out)
    state = load_state(folder)
    run_argv, shards, launcher, slurm, jobs, time_min = _settings(
        folder, state, run_argv, shards, launcher, slurm, jobs, time_min, resubmit
    )
    parallel = _local_slots(jobs)[0] if launcher == "local" else None
    sweep_plan = plan(list(run_argv), None, count_images=dry_run)
    runs = len(sweep_plan.jobs)
    if shards is None:  # local: one shard per parallel job; Slurm: one run per shard
        shards = min(parallel, runs) if parallel else runs
    result = SweepResult(folder, sweep_plan.with_count(shards), launcher, slurm, jobs, time_min)
    finished = finished_shards(folder, shards) if state is not None else []
    pending = [i for i in range(shards) if i not in finished]
    if dry_run:
        print(result.plan.describe(folder, finished, launcher))
        return result
    _require_submitit()  # the launcher is there, before anything is written
    if slurm is not None:
        check_slurm(slurm.partition)
    if not pending:
        _say(f"all {shards} shards of {folder} have finished; merging")
    else:
        _begin_submission(result, state)
        what = "resubmitting" if finished else "submitting"
        _say(f"{what} {len(pending)} of {shards} shards ({runs} runs) -> {folder} [{launcher}]")
        if slurm is None:
            _run_local(result, pending)
        else:
            _submit_slurm(result, pending, slurm, wait)
            if not wait:
                return result
        if result.failed:
            print(
                f"{len(result.failed)} shard(s) failed: {sorted(result.failed)}; resubmit them "
                f"with: {result.resubmit_command}"
            )
            return result
    dirs = [str(shard_dir(folder, i)) for i in range(shards)]
    plot = [] if result.plan.plot else ["--no-plot"]
    status = commands.merge_main([*dirs, "--out", str(folder), *plot])
    if status != 0:
        raise ValueError(f"merging {folder} failed (status {status})")
    result.merged = True
    return result


def sweep_parser() -> argparse.ArgumentParser:
    """The sweep's own options (``eatta-bench sweep``); the others are run options."""
    p = argparse.ArgumentParser(
        prog="eatta-bench sweep",
        description="Run a benchmark grid as shards: one Slurm job array through submitit, or "
        "local processes (--launcher local). Options not listed here are eatta-bench run "
        "options (everything after -- is); each shard runs 'eatta-bench run RUN-OPTIONS "
        "--shard i/n --out DIR/shard-i'.",
        allow_abbrev=False,
        formatter_class=HelpFormatter,
        usage="eatta-bench sweep --out DIR [sweep options] [--] [run options]",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the sweep folder")
    count = "number of shards (default: --jobs locally, one run per shard on Slurm)"
    p.add_argument("--shards", type=int, metavar="N", help=count)
    mine = "slurm or local processes (default: slurm; a recorded sweep keeps its own)"
    p.add_argument("--launcher", choices=LAUNCHERS, help=mine)
    for name, text in (
        ("dry-run", "list the runs and shards with their size; submit nothing"),
        ("wait", "wait for the Slurm jobs and merge (the local launcher always waits)"),
        ("resubmit", "continue the sweep recorded in DIR: submit the shards without results"),
    ):
        p.add_argument(f"--{name}", action="store_true", help=text)
    limit = f"time limit per job: minutes or [D-]H:MM:SS (default: {SLURM_DEFAULT_TIME_MIN} min "
    p.add_argument("--time", metavar="T", help=limit + "on Slurm, none locally)")
    g = p.add_argument_group("Slurm")
    g.add_argument("--partition", help="Slurm partition")
    for name, text in (
        ("gpus", "GPUs per job (default: 0)"),
        ("cpus", "CPUs per job (also its torch threads; default: the partition's)"),
        ("array-parallelism", "at most N jobs of the array at once (default: no limit)"),
    ):
        g.add_argument(f"--{name}", type=int, metavar="N", help=text)
    extra = "another #SBATCH option, e.g. --sbatch account=proj --sbatch mem=32G"
    g.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE", help=extra)
    jobs = "local processes at once (default: one per GPU, else one per core)"
    p.add_argument_group("local").add_argument("--jobs", type=int, metavar="N", help=jobs)
    return p


def main(argv: Sequence[str]) -> int:
    """``eatta-bench sweep ARGS`` (without the word ``sweep``); the exit status.

    Bad input raises :class:`ValueError` (``eatta-bench`` prints it and exits with status 2)."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # all after -- are run options
    args, run_argv = sweep_parser().parse_known_args(argv[:cut])
    run_argv += argv[cut + 1 :]
    names = ("partition", "gpus", "cpus", "array_parallelism")
    given: dict[str, Any] = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    if args.sbatch:
        given["sbatch"] = {}
        for item in args.sbatch:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--sbatch expects KEY=VALUE, got {item!r}")
            given["sbatch"][key.strip().lstrip("-")] = value
    slurm = None
    if given:  # over the recorded sweep's options, when it ran on Slurm
        state = load_state(args.out) or {}
        slurm = SlurmOptions(**{**(state.get("slurm") or {}), **given})
    same = {k: getattr(args, k) for k in ("shards", "launcher", "jobs", "wait", "resubmit")}
    time_min = parse_time(args.time) if args.time is not None else None
    done = launch(run_argv, args.out, slurm=slurm, time_min=time_min, dry_run=args.dry_run, **same)
    return 1 if done.failed else 0
