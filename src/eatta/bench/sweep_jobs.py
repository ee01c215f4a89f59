"""How a sweep's shards run: :class:`ShardJob` (what one job calls) and the submitit executors of
the two launchers, Slurm (:func:`slurm_executor`, :class:`SlurmOptions`) and local processes
(:func:`local_executor`). ``submitit`` is imported inside functions only.
See :mod:`eatta.bench.sweep`."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import submitit

__all__ = [
    "SLURM_DEFAULT_TIME_MIN",
    "ShardJob",
    "SlurmOptions",
    "check_slurm",
    "local_executor",
    "parse_time",
    "slurm_executor",
]

#: Time limit of a Slurm job when ``--time`` is not given (minutes).
SLURM_DEFAULT_TIME_MIN = 240
#: A local job has no time limit unless ``--time`` is given (submitit's default is 2 minutes).
_LOCAL_NO_LIMIT_MIN = 60 * 24 * 365
_INSTALL = "pip install 'eatta[cluster]'"


@dataclass(frozen=True)
class ShardJob:
    """What one job runs: ``eatta-bench run ARGV --shard index/count --out out``.

    A callable for submitit; ``checkpoint`` (submitit's hook, called when Slurm signals a timeout
    or a preemption) requeues the same job, which resumes from the run's own checkpoints."""

    argv: tuple[str, ...]
    index: int
    count: int
    out: str
    #: torch CPU threads for the job (None: the run's default)
    threads: int | None = None

    def command(self) -> list[str]:
        return ["run", *self.argv, "--shard", f"{self.index}/{self.count}", "--out", self.out]

    def __call__(self) -> str:
        from eatta.bench import commands

        if self.threads is not None:
            import torch

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


# ----------------------------------------------------------------------------- executors


def _require_submitit() -> None:
    """A ValueError naming the extra to install when submitit is missing."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ValueError(f"the sweep launchers need submitit: {_INSTALL}") from None


def parse_time(text: str | int) -> int:
    """A Slurm time limit as minutes: ``90``, ``MM:SS``, ``H:MM:SS``, ``D-H``, ``D-H:MM``,
    ``D-H:MM:SS`` (seconds round up)."""
    if isinstance(text, int) and not isinstance(text, bool):
        minutes = text
    else:
        m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(text).strip())
        if m is None:
            raise ValueError(f"--time is minutes or [D-]H:MM:SS, got {text!r}")
        days, a, b, c = (int(g) if g is not None else None for g in m.groups())
        assert a is not None
        if days is not None:  # D-H, D-H:MM, D-H:MM:SS
            seconds = ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
        elif c is not None:  # H:MM:SS
            seconds = (a * 60 + (b or 0)) * 60 + c
        elif b is not None:  # MM:SS
            seconds = a * 60 + b
        else:  # minutes
            seconds = a * 60
        minutes = -(-seconds // 60)
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
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"--{name} must be an int, got {value!r}")
            if value is not None and value < low:
                raise ValueError(f"--{name} must be >= {low}, got {value}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "time_min": self.time_min,
            "gpus": self.gpus,
            "cpus": self.cpus,
            "array_parallelism": self.array_parallelism,
            "sbatch": dict(self.sbatch),
        }


def _source_root() -> Path | None:
    """The folder that holds the imported ``eatta`` package when it is a source tree (a
    checkout, ``PYTHONPATH=src``), so that jobs import the same code; None when installed."""
    import eatta

    root = Path(eatta.__file__).resolve().parents[1]
    return None if root.name in ("site-packages", "dist-packages") else root


def _job_env(threads: int | None) -> dict[str, str]:
    """Environment changes for a job's process: the same ``eatta`` code, its thread count."""
    env: dict[str, str] = {}
    root = _source_root()
    if root is not None:
        old = os.environ.get("PYTHONPATH", "")
        if old.split(os.pathsep)[0] != str(root):
            env["PYTHONPATH"] = os.pathsep.join([str(root), *([old] if old else [])])
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


@contextlib.contextmanager
def _environment(changes: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``changes`` (what submitit's local executor hands its jobs)."""
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def slurm_executor(folder: str | os.PathLike[str], options: SlurmOptions) -> submitit.SlurmExecutor:
    """A submitit Slurm executor configured for one shard per array job (submits nothing).

    ``folder``: submitit's job files and logs (``%j`` becomes the job id). Needs ``srun`` on the
    PATH (submitit checks); :func:`check_slurm` says more clearly what is missing."""
    _require_submitit()
    import submitit

    ex = submitit.SlurmExecutor(folder=str(folder))
    params: dict[str, Any] = {
        "job_name": "eatta-sweep",
        "time": options.time_min,
        "array_parallelism": options.array_parallelism or 100_000,
    }
    if options.partition is not None:
        params["partition"] = options.partition
    if options.gpus:
        params["gpus_per_node"] = options.gpus
    if options.cpus is not None:
        params["cpus_per_task"] = options.cpus
    setup = [f"export {k}={shlex.quote(v)}" for k, v in _job_env(options.cpus).items()]
    if setup:
        params["setup"] = setup
    if options.sbatch:
        params["additional_parameters"] = dict(options.sbatch)
    ex.update_parameters(**params)
    return ex


def check_slurm(partition: str | None = None, timeout_s: float = 60.0) -> list[str]:
    """The cluster's partitions; a ValueError when Slurm is not here or does not answer, or when
    ``partition`` is not among them."""
    missing = [c for c in ("sbatch", "srun", "sinfo") if shutil.which(c) is None]
    if missing:
        raise ValueError(
            f"--launcher slurm: no Slurm here ({', '.join(missing)} not on PATH); "
            "--launcher local runs the shards on this machine"
        )
    try:
        done = subprocess.run(
            ["sinfo", "--noheader", "--format=%P"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
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


def local_executor(
    folder: str | os.PathLike[str], time_min: int | None = None
) -> submitit.LocalExecutor:
    """A submitit local executor (jobs are processes of this machine; no time limit by
    default, where submitit's is two minutes)."""
    _require_submitit()
    import submitit

    ex = submitit.LocalExecutor(folder=str(folder))
    ex.update_parameters(timeout_min=time_min or _LOCAL_NO_LIMIT_MIN)
    return ex


def _local_slots(jobs: int | None) -> tuple[int, bool, int]:
    """(parallel jobs, on GPUs, cores) for the local launcher."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if jobs is None:
        jobs = gpus or cores
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be an int >= 1, got {jobs!r}")
    return jobs, gpus > 0, cores
