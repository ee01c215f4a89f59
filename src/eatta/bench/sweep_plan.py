"""A sweep's plan: its grid's runs (checked from the ``eatta-bench run`` options, without loading
data) and how ``--shards`` splits them; shard ``i`` writes to ``DIR/shard-i``.
See :mod:`eatta.bench.sweep`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from eatta.bench.grid import CellSpec, make_grid, make_jobs
from eatta.bench.grid import shard as shard_jobs

__all__ = ["SweepPlan", "finished_shards", "plan", "shard_dir"]


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _parse_run_argv(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed by ``eatta-bench run``'s own parser; a mistake is a ValueError."""
    from eatta.bench import commands

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
    """The grid's dataset names, as :func:`eatta.bench.api.load_benchmarks` would name them."""
    from eatta.bench.suites import DATASETS

    names = _csv(args.dataset)
    unknown = [d for d in names if d not in DATASETS]
    if unknown or not names:
        raise ValueError(f"run options: unknown dataset(s) {unknown}; choose from {list(DATASETS)}")
    if args.gradual and any(d not in ("digits-c", "imagenet-c") for d in names):
        raise ValueError("run options: --gradual needs severities (digits-c, imagenet-c)")
    out: list[str] = []
    for name in names:
        if name != "pacs":
            out.append(name)
            continue
        from eatta.data.pacs import PACS_LETTERS, parse_pacs_sequence

        letter = {v: k for k, v in PACS_LETTERS.items()}
        for seq in _csv(args.sequence):
            try:
                domains = parse_pacs_sequence(seq)
            except (KeyError, ValueError) as err:
                raise ValueError(f"run options: --sequence {seq!r}: {err}") from None
            out.append("pacs:" + "-".join(letter[d] for d in domains))
    return out


def _used(n: int, limit: int | None, batch_size: int) -> int:
    """Images of a domain of ``n`` that a run streams (see ``benchmark.prepare_domains``)."""
    if limit is not None:
        n = min(n, limit)
    return n - 1 if n % batch_size == 1 and n > 1 else n


def _stream_images(dataset: str, args: argparse.Namespace, rounds: int) -> tuple[int, str] | None:
    """Images that one run of ``dataset`` streams, with how they add up; None: unknown without
    loading the data (only digits-C is known: its test split, not its corrupted arrays)."""
    if dataset != "digits-c":
        return None
    from eatta.data.digits import DIGITS_C_CORRUPTIONS, digits_split

    per_domain = _used(len(digits_split()[1]), args.limit, args.batch_size)
    domains = len(DIGITS_C_CORRUPTIONS) * (9 if args.gradual else 1)
    how = f"{per_domain} x {domains} domains x {rounds} round{'s' if rounds > 1 else ''}"
    return per_domain * domains * rounds, how


@dataclass(frozen=True)
class SweepPlan:
    """A grid's runs and how ``count`` shards split them (what ``--dry-run`` prints)."""

    #: the run options (``eatta-bench run`` command line without ``--shard``/``--out``)
    argv: tuple[str, ...]
    #: number of shards
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
        if isinstance(count, bool) or not isinstance(count, int):
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
        total = 0
        for _, (cell, _seed) in self.shard(index):
            known = self.stream.get(cell.dataset)
            if known is None:
                return None
            total += known[0]
        return total

    def command(self, index: int, out: str | os.PathLike[str]) -> list[str]:
        """The ``eatta-bench`` arguments that shard ``index`` runs (sweep folder ``out``)."""
        return [
            "run",
            *self.argv,
            "--shard",
            f"{index}/{self.count}",
            "--out",
            str(shard_dir(out, index)),
        ]

    def describe(
        self, out: str | os.PathLike[str], finished: Sequence[int] = (), launcher: str = ""
    ) -> str:
        """The ``--dry-run`` listing: the grid, its shards with their size, their commands."""
        seeds = len(self.jobs) // max(self.cells, 1)
        known = [self.images(i) for i in range(self.count)]
        total = None if any(k is None for k in known) else sum(k or 0 for k in known)
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
        example = " ".join(shlex.quote(a) for a in self.command(0, out))
        lines += ["", f"shard 0 runs: eatta-bench {example}", ""]
        return "\n".join(lines)


def plan(
    run_argv: Sequence[str], shards: int | None = None, *, count_images: bool = True
) -> SweepPlan:
    """Check the run options ``run_argv`` (an ``eatta-bench run`` command line without
    ``--shard`` and ``--out``) and list the grid's runs in ``shards`` shards (None: one run per
    shard), without loading any data (``count_images``: count digits-C's images per run from its
    split; else every dataset's count is None). Bad options raise :class:`ValueError`."""
    from eatta.bench import api, commands

    if isinstance(run_argv, str) or not all(isinstance(a, str) for a in run_argv):
        raise TypeError(f"run_argv must be a list of strings, got {run_argv!r}")
    args = _parse_run_argv(run_argv)
    datasets = _grid_datasets(args)
    methods = api.method_names(args.methods)
    settings = [s.lower() for s in _csv(args.setting)]
    if any(k < 0 for k in args.labels) or any(n < 1 for n in args.every):
        raise ValueError("run options: --labels must be >= 0 and --every >= 1")
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"run options: --rounds must be >= 1, got {args.rounds}")
    if args.batch_size < 1 or (args.limit is not None and args.limit < 2):
        raise ValueError("run options: --batch-size must be >= 1 and --limit >= 2")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"run options: --threads must be >= 1, got {args.threads}")
    if args.seeds is not None and any(a == "--seed" or a.startswith("--seed=") for a in run_argv):
        raise ValueError("run options: give either --seed or --seeds, not both")
    if args.oracle == "model" and args.oracle_backbone is None:
        raise ValueError("run options: --oracle model needs --oracle-backbone")
    commands.parse_hparams(args.hp, methods)  # unknown keys or values: a ValueError naming --hp
    budgets = [(k, n) for k in args.labels for n in args.every]
    try:
        grid = make_grid(datasets, methods, settings, budgets, args.buffer)
    except ValueError as err:
        raise ValueError(f"run options: {err}") from None
    seeds = args.seeds if args.seeds is not None else [args.seed]
    jobs = tuple(make_jobs(grid, seeds))
    rounds = (
        args.rounds
        if args.rounds is not None
        else (api.DIGITS_ROUNDS if _csv(args.dataset) == ["digits-c"] else 1)
    )
    stream = {d: _stream_images(d, args, rounds) if count_images else None for d in datasets}
    base = SweepPlan(tuple(run_argv), len(jobs), jobs, len(grid), stream, not args.no_plot)
    return base if shards is None else base.with_count(shards)


def shard_dir(out: str | os.PathLike[str], index: int) -> Path:
    """The output folder of shard ``index`` in the sweep folder ``out``."""
    return Path(out) / f"shard-{index}"


def finished_shards(out: str | os.PathLike[str], count: int) -> list[int]:
    """The shards of ``out`` that have written their ``results.json``."""
    return [i for i in range(count) if (shard_dir(out, i) / "results.json").is_file()]
