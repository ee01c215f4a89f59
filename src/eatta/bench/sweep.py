"""``eatta-bench sweep``: a grid's shards as one Slurm job array, or as local processes.

Every shard is one job that runs exactly ``eatta-bench run ARGV --shard i/n --out DIR/shard-i``
(:class:`ShardJob` calls :func:`eatta.bench.commands.run_main` with that command line), so a
shard run by the sweep and the same shard run by hand write the same cell files. ``ARGV`` is the
``run`` subcommand's options, passed through untouched: ``eatta-bench sweep [sweep options] [--]
[run options]``; options the sweep does not know are run options, and everything after ``--`` is.

The sweep folder ``DIR`` (``--out``) holds ``sweep.json`` (the run options, the shard count, the
launcher and every submission with its job ids; written atomically), ``shard-<i>/`` (the output
folder of shard ``i``: ``results.json`` once it has finished, ``cells/`` and ``checkpoints/``
while it runs), ``submitit/`` (submitit's job files and logs) and, once every shard has finished,
the merged table, CSV, JSON and plot of the whole grid (``eatta-bench merge``).

Launchers: ``slurm`` submits the shards as one job array through ``submitit`` (the optional extra
``eatta[cluster]``); ``local`` runs them as processes of submitit's local executor, ``--jobs`` at
a time (default: one per GPU, else one per core). The same command run again into the same folder,
or ``--resubmit``, submits only the shards without ``results.json``: they resume from their
checkpoints and read their finished cells back. ``--dry-run`` lists the runs and shards with their
size and submits nothing. ``submitit`` is imported inside functions only.

Modules: :mod:`eatta.bench.sweep_plan` (the grid's runs and shards), :mod:`eatta.bench.sweep_jobs`
(the job and the executors), this one (the sweep's record, launching, waiting, merging, the
command line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eatta.bench.sweep_jobs import (
    SLURM_DEFAULT_TIME_MIN,
    ShardJob,
    SlurmOptions,
    _environment,
    _job_env,
    _local_slots,
    _require_submitit,
    check_slurm,
    local_executor,
    parse_time,
    slurm_executor,
)
from eatta.bench.sweep_plan import SweepPlan, finished_shards, plan, shard_dir

if TYPE_CHECKING:
    import submitit

__all__ = [
    "LAUNCHERS",
    "STATE_FILE",
    "ShardJob",
    "SlurmOptions",
    "SweepPlan",
    "SweepResult",
    "check_slurm",
    "finished_shards",
    "launch",
    "load_state",
    "local_executor",
    "main",
    "parse_time",
    "plan",
    "shard_dir",
    "slurm_executor",
    "slurm_queue",
    "sweep_parser",
]

#: ``slurm``: one job array through submitit; ``local``: submitit's local executor.
LAUNCHERS = ("slurm", "local")
#: The sweep's record in its folder.
STATE_FILE = "sweep.json"
_STATE_FORMAT = 1


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- state


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
    from eatta.bench.results import atomic_write_text

    atomic_write_text(out / STATE_FILE, json.dumps(state, indent=1))


# ----------------------------------------------------------------------------- launching


@dataclass
class SweepResult:
    """What :func:`launch` did."""

    #: the sweep folder
    out: Path
    plan: SweepPlan
    launcher: str
    #: job id of every shard submitted by this call
    submitted: dict[int, str] = field(default_factory=dict)
    #: shards that failed (waited for), with why
    failed: dict[int, str] = field(default_factory=dict)
    #: whether the merged outputs of the whole grid were written to ``out``
    merged: bool = False
    #: the command that merges the shards
    merge_command: str = ""


def _merge(out: Path, sweep_plan: SweepPlan) -> None:
    from eatta.bench import commands

    dirs = [str(shard_dir(out, i)) for i in range(sweep_plan.count)]
    plot = [] if sweep_plan.plot else ["--no-plot"]
    status = commands.merge_main([*dirs, "--out", str(out), *plot])
    if status != 0:
        raise ValueError(f"merging {out} failed (status {status})")


def _outcome(job: submitit.Job[Any], out: Path, index: int, state: str | None = None) -> str | None:
    """None when shard ``index`` finished; otherwise why not (``state``: the job's last state
    as Slurm's queue showed it; None: ask submitit)."""
    if job.paths.result_pickle.exists():
        err = job.exception()
        if err is not None:
            lines = [ln for ln in str(err).splitlines() if ln.strip() and not ln.startswith("---")]
            tail = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")
            return f"{tail.strip()} (log: {job.paths.stderr})"
    if (shard_dir(out, index) / "results.json").is_file():
        return None
    state = job.state if state is None else state
    return (
        f"ended without a result ({state}: cancelled, killed, out of memory or out of time?); "
        f"log: {job.paths.stderr}"
    )


#: Slurm job states of a job that has not ended (it may still write its result).
_SLURM_ACTIVE = frozenset(
    "PENDING CONFIGURING RUNNING COMPLETING REQUEUED REQUEUE_FED REQUEUE_HOLD RESIZING "
    "SIGNALING STAGE_OUT SUSPENDED PREEMPTED".split()
)


def slurm_queue(job_ids: Sequence[str], timeout_s: float = 60.0) -> dict[str, str] | None:
    """The state of each array task of ``job_ids`` that Slurm's queue still shows (``squeue``,
    never ``sacct``, which fails on clusters without accounting); a task it does not show has
    ended. None when ``squeue`` does not answer."""
    arrays = sorted({j.split("_")[0] for j in job_ids})
    try:
        done = subprocess.run(
            [
                "squeue",
                "--noheader",
                "--array",
                "--states=all",
                "--format=%i %T",
                "--jobs",
                ",".join(arrays),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:  # every job long gone: "Invalid job id specified"
        return {} if "invalid job id" in done.stderr.lower() else None
    states: dict[str, str] = {}
    for line in done.stdout.splitlines():
        job_id, _, state = line.strip().partition(" ")
        if job_id:
            states[job_id] = state.strip().split(" ")[0].upper()
    return states


def _wait(
    jobs: Mapping[int, submitit.Job[Any]],
    out: Path,
    poll_s: float | None,
    say: Callable[[str], None],
) -> dict[int, str]:
    """Wait for the Slurm jobs ``jobs`` (shard -> job); the failed shards with why.

    A job has ended when it wrote its result or Slurm's queue shows it ended (or no longer
    shows it). Only ``squeue`` is asked: submitit's own ``done()`` asks ``sacct``, which on a
    cluster without accounting fails (two warnings a call) and never reports a cancelled job.
    ``poll_s``: seconds between two looks (None: half a second, growing by a quarter each time
    up to 30 s)."""
    failed: dict[int, str] = {}
    running = dict(jobs)
    pause = poll_s if poll_s is not None else 0.5
    while running:
        queue = slurm_queue([job.job_id for job in running.values()])
        for i, job in list(running.items()):
            state = None if queue is None else queue.get(job.job_id, "GONE")
            if not job.paths.result_pickle.exists() and (state is None or state in _SLURM_ACTIVE):
                continue
            del running[i]
            gone = "no longer in the queue" if state in (None, "GONE") else state
            why = _outcome(job, out, i, gone)
            if why is None:
                say(f"shard {i} (job {job.job_id}): finished")
            else:
                failed[i] = why
                say(f"shard {i} (job {job.job_id}): FAILED: {why}")
        if running:
            time.sleep(pause)
            if poll_s is None:
                pause = min(30.0, pause * 1.25)
    return failed


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 appended to ``path`` (what a child process started inside inherits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as f:
            os.dup2(f.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _run_local(
    sweep_plan: SweepPlan,
    out: Path,
    pending: Sequence[int],
    parallel: int,
    time_min: int | None,
    record: Callable[[int, str], None],
    poll_s: float,
    say: Callable[[str], None],
) -> dict[int, str]:
    """Run the ``pending`` shards ``parallel`` at a time through submitit's local executor."""
    jobs, on_gpu, cores = _local_slots(parallel)
    gpus = 0
    if on_gpu:
        import torch

        gpus = torch.cuda.device_count()
    threads = max(1, cores // jobs)
    # one flat folder: with %j in it, submitit's local controller creates a folder named %j
    ex = local_executor(out / "submitit", time_min)
    queue = list(pending)
    free = list(range(min(jobs, len(queue))))
    running: dict[int, tuple[submitit.Job[Any], int]] = {}
    failed: dict[int, str] = {}
    env = _job_env(None if on_gpu else threads)
    try:
        while queue or running:
            while queue and free:
                i, slot = queue.pop(0), free.pop(0)
                if on_gpu:
                    ex.update_parameters(gpus_per_node=1, visible_gpus=[slot % gpus])
                task = ShardJob(
                    sweep_plan.argv, i, sweep_plan.count, str(shard_dir(out, i)), threads
                )
                # the controller process submitit starts writes to our stderr; on Ctrl-C,
                # job.cancel() interrupts it and it prints a traceback: send it to a log instead
                with _environment(env), _stderr_to(out / "submitit" / "controllers.log"):
                    job = ex.submit(task)
                running[i] = (job, slot)
                record(i, job.job_id)
                where = f"GPU {slot % gpus}" if on_gpu else f"{threads} thread(s)"
                say(f"shard {i}/{sweep_plan.count}: local job {job.job_id} ({where})")
            time.sleep(poll_s)
            for i, (job, slot) in list(running.items()):
                if job.done():
                    del running[i]
                    free.append(slot)
                    why = _outcome(job, out, i)
                    if why is None:
                        say(f"shard {i} (job {job.job_id}): finished")
                    else:
                        failed[i] = why
                        say(f"shard {i} (job {job.job_id}): FAILED: {why}")
    finally:
        for job, _slot in running.values():  # interrupted: stop what still runs
            job.cancel()
    return failed


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
    recorded_launcher = state.get("launcher") if state else None
    launcher = launcher or recorded_launcher or "slurm"
    if launcher not in LAUNCHERS:
        raise ValueError(f"--launcher must be one of {LAUNCHERS}, got {launcher!r}")
    if launcher == "local" and slurm is not None:
        raise ValueError(
            "--partition, --gpus, --cpus, --array-parallelism and --sbatch are Slurm "
            "options; --launcher local runs one job per GPU or core (--jobs)"
        )
    if launcher == "slurm" and jobs is not None:
        raise ValueError("--jobs is for --launcher local; on Slurm use --array-parallelism")
    if state and state.get("launcher") == launcher:
        if slurm is None and state.get("slurm"):
            kept = dict(state["slurm"])
            slurm = SlurmOptions(**{**kept, "sbatch": dict(kept.get("sbatch") or {})})
        jobs = jobs if jobs is not None else state.get("jobs")
        time_min = time_min if time_min is not None else state.get("time_min")
    if time_min is not None:
        time_min = parse_time(time_min)
    if launcher == "slurm":
        slurm = slurm or SlurmOptions()
        if time_min is not None:
            slurm = SlurmOptions(**{**slurm.to_dict(), "time_min": time_min})
    return run_argv, shards, launcher, slurm, jobs, time_min


def _submit_slurm(
    result: SweepResult,
    pending: list[int],
    shards: int,
    slurm: SlurmOptions,
    record: Callable[[int, str], None],
    wait: bool,
    poll_s: float | None,
    say: Callable[[str], None],
    show: Callable[[str], None],
) -> bool:
    """Submit the pending shards as a Slurm job array; with ``wait``, wait for them (filling
    ``result.failed``). Whether they were waited for."""
    ex = slurm_executor(result.out / "submitit" / "%j", slurm)
    tasks = [
        ShardJob(result.plan.argv, i, shards, str(shard_dir(result.out, i)), slurm.cpus)
        for i in pending
    ]
    with ex.batch():
        submitted = [ex.submit(t) for t in tasks]
    for i, job in zip(pending, submitted, strict=True):
        record(i, job.job_id)
    first = submitted[0].job_id.split("_")[0]
    show(f"submitted {len(pending)} shard(s) of {shards} as Slurm job {first}:")
    for i, job in zip(pending, submitted, strict=True):
        show(f"  shard {i}: job {job.job_id}  log {job.paths.stderr}")
    if not wait:
        show(f"when they have finished: {result.merge_command}")
        show(
            "failed or out of time: eatta-bench sweep --resubmit --out "
            f"{shlex.quote(str(result.out))} (finished cells are read back)"
        )
        return False
    try:
        result.failed = _wait(dict(zip(pending, submitted, strict=True)), result.out, poll_s, say)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"stopped waiting: the Slurm jobs of {result.out} keep running (squeue shows them; "
            f"scancel {first} stops them); when they have finished: {result.merge_command}"
        ) from None
    return True


def _recorder(
    folder: Path,
    state: dict[str, Any] | None,
    result: SweepResult,
    shards: int,
    time_min: int | None,
    slurm: SlurmOptions | None,
    jobs: int | None,
) -> Callable[[int, str], None]:
    """The sweep's record in ``folder`` with a new submission, written now; the function that
    adds each shard's job id to it (and to ``result``)."""
    launcher = result.launcher
    new_state: dict[str, Any] = {
        "format": _STATE_FORMAT,
        "argv": list(result.plan.argv),
        "shards": shards,
        "launcher": launcher,
        "time_min": time_min,
        "slurm": slurm.to_dict() if slurm is not None else None,
        "jobs": jobs if launcher == "local" else None,
        "submissions": list(state["submissions"]) if state else [],
    }
    submission: dict[str, Any] = {"at": _now(), "launcher": launcher, "job_ids": {}}
    new_state["submissions"].append(submission)
    folder.mkdir(parents=True, exist_ok=True)
    _save_state(folder, new_state)

    def record(index: int, job_id: str) -> None:
        submission["job_ids"][str(index)] = job_id
        result.submitted[index] = job_id
        _save_state(folder, new_state)

    return record


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
    poll_s: float | None = None,
    say: Callable[[str], None] = _say,
    show: Callable[[str], None] = print,
) -> SweepResult:
    """Run the grid of ``run_argv`` (``eatta-bench run`` options) as shards into the folder
    ``out``; see the module docstring. Everything is checked before anything is written or
    submitted (bad input: :class:`ValueError`).

    ``shards`` (default: ``jobs`` locally, one run per shard on Slurm), ``launcher`` (``"slurm"``
    or ``"local"``), ``slurm`` (what each array job asks for), ``jobs`` (local: parallel
    processes, default one per GPU else per core), ``time_min`` (a job's time limit). ``wait``:
    wait for the Slurm jobs and merge (the local launcher always waits). ``resubmit``: continue
    the sweep recorded in ``out`` (``run_argv``, ``shards`` and the launcher options default to
    the recorded ones); the same call without it does the same when its options match the record.
    Only shards without ``results.json`` are submitted. ``dry_run``: print the plan, nothing else.
    ``say`` receives progress lines, ``show`` what the command prints on stdout.
    """
    folder = Path(out)
    state = load_state(folder)
    run_argv, shards, launcher, slurm, jobs, time_min = _settings(
        folder, state, run_argv, shards, launcher, slurm, jobs, time_min, resubmit
    )
    parallel = 0
    if launcher == "local":
        parallel = _local_slots(jobs)[0]
    sweep_plan = plan(list(run_argv), None, count_images=dry_run)
    if shards is None:
        shards = (
            min(parallel, len(sweep_plan.jobs)) if launcher == "local" else len(sweep_plan.jobs)
        )
    sweep_plan = sweep_plan.with_count(shards)
    finished = finished_shards(folder, shards) if state is not None else []
    pending = [i for i in range(shards) if i not in finished]
    merge_command = (
        f"eatta-bench merge {shlex.quote(str(folder))}/shard-* --out {shlex.quote(str(folder))}"
        + ("" if sweep_plan.plot else " --no-plot")
    )
    result = SweepResult(folder, sweep_plan, launcher, merge_command=merge_command)
    if dry_run:
        show(sweep_plan.describe(folder, finished, launcher))
        return result

    # --- the launcher is there (before anything is written)
    _require_submitit()
    if launcher == "slurm":
        assert slurm is not None
        check_slurm(slurm.partition)
    if not pending:
        say(f"all {shards} shards of {folder} have finished; merging")
        _merge(folder, sweep_plan)
        result.merged = True
        return result

    record = _recorder(folder, state, result, shards, time_min, slurm, jobs)
    what = "resubmitting" if finished else "submitting"
    say(
        f"{what} {len(pending)} of {shards} shards ({len(sweep_plan.jobs)} runs) "
        f"-> {folder} [{launcher}]"
    )
    if launcher == "local":
        try:
            result.failed = _run_local(
                sweep_plan, folder, pending, parallel, time_min, record, poll_s or 0.2, say
            )
        except KeyboardInterrupt:
            done = len(finished_shards(folder, shards))
            raise KeyboardInterrupt(
                f"interrupted: {done} of {shards} shards finished (their results are kept; the "
                "others were stopped and resume from their checkpoints); continue with: "
                f"eatta-bench sweep --resubmit --out {shlex.quote(str(folder))}"
            ) from None
    else:
        assert slurm is not None
        if not _submit_slurm(result, pending, shards, slurm, record, wait, poll_s, say, show):
            return result
    if result.failed:
        show(
            f"{len(result.failed)} shard(s) failed: {sorted(result.failed)}; resubmit them with: "
            f"eatta-bench sweep --resubmit --out {shlex.quote(str(folder))}"
        )
        return result
    _merge(folder, sweep_plan)
    result.merged = True
    return result


# ----------------------------------------------------------------------------- command line


_DESCRIPTION = (
    "Run a benchmark grid as shards: one Slurm job array through submitit, or local processes "
    "(--launcher local). Options not listed here are eatta-bench run options (everything after "
    "-- is); each shard runs 'eatta-bench run RUN-OPTIONS --shard i/n --out DIR/shard-i'."
)


def sweep_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The sweep's own options (``eatta-bench sweep``); the others are run options."""
    p = argparse.ArgumentParser(
        prog="eatta-bench sweep",
        description=_DESCRIPTION,
        add_help=add_help,
        allow_abbrev=False,
        usage="eatta-bench sweep --out DIR [sweep options] [--] [run options]",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the sweep folder")
    p.add_argument(
        "--shards",
        type=int,
        default=None,
        metavar="N",
        help="number of shards (default: --jobs locally, one run per shard on Slurm)",
    )
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=None,
        help="slurm (default; a recorded sweep keeps its own) or local processes",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs and shards with their size; submit nothing",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the Slurm jobs and merge (the local launcher always waits)",
    )
    p.add_argument(
        "--resubmit",
        action="store_true",
        help="continue the sweep recorded in DIR: submit the shards without results",
    )
    p.add_argument(
        "--time",
        default=None,
        metavar="T",
        help=f"time limit per job: minutes or [D-]H:MM:SS (Slurm default "
        f"{SLURM_DEFAULT_TIME_MIN} min; local: none)",
    )
    g = p.add_argument_group("Slurm")
    g.add_argument("--partition", default=None, help="Slurm partition")
    g.add_argument("--gpus", type=int, default=None, metavar="N", help="GPUs per job (0)")
    g.add_argument(
        "--cpus",
        type=int,
        default=None,
        metavar="N",
        help="CPUs per job (also its torch threads; default: the partition's)",
    )
    g.add_argument(
        "--array-parallelism",
        type=int,
        default=None,
        metavar="N",
        help="at most N jobs of the array at once (default: no limit)",
    )
    g.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another #SBATCH option, e.g. --sbatch account=proj --sbatch mem=32G",
    )
    g = p.add_argument_group("local")
    g.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="local processes at once (default: one per GPU, else one per core)",
    )
    return p


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        k = argv.index("--")
        return argv[:k], argv[k + 1 :]
    return argv, []


def main(argv: Sequence[str]) -> int:
    """``eatta-bench sweep ARGS`` (without the word ``sweep``); the exit status.

    Bad input raises :class:`ValueError` (``eatta-bench`` prints it and exits with status 2)."""
    own, after = _split_argv(argv)
    args, run_argv = sweep_parser().parse_known_args(own)
    run_argv = [*run_argv, *after]
    given: dict[str, Any] = {
        k: getattr(args, k)
        for k in ("partition", "gpus", "cpus", "array_parallelism")
        if getattr(args, k) is not None
    }
    if args.sbatch:
        extra: dict[str, str] = {}
        for item in args.sbatch:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--sbatch expects KEY=VALUE, got {item!r}")
            extra[key.strip().lstrip("-")] = value
        given["sbatch"] = extra
    slurm: SlurmOptions | None = None
    if given:  # over the recorded sweep's options, when it ran on Slurm
        state = load_state(args.out)
        recorded = dict(state.get("slurm") or {}) if state else {}
        slurm = SlurmOptions(**{**recorded, **given})
    done = launch(
        run_argv if run_argv or not args.resubmit else None,
        args.out,
        shards=args.shards,
        launcher=args.launcher,
        slurm=slurm,
        jobs=args.jobs,
        time_min=parse_time(args.time) if args.time is not None else None,
        wait=args.wait,
        resubmit=args.resubmit,
        dry_run=args.dry_run,
    )
    return 1 if done.failed else 0
