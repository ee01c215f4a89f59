"""``eatta-bench``: run test-time adaptation benchmarks and print a markdown table.

Subcommands: ``run`` (the default: options without a subcommand, or none at all, the long-term
digits-C benchmark; a thin layer over :func:`eatta.bench.run`), ``merge`` (the output folders of
``--shard`` runs as one table), ``list`` (methods with their ``--hp`` keys, dataset layouts) and
``sweep`` (a grid's shards as a Slurm job array or local processes). See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from eatta.bench import commands
from eatta.bench.commands import (
    build_benchmarks,
    list_text,
    loading_options,
    merge_parser,
    run_parser,
)

__all__ = [
    "COMMANDS",
    "build_benchmarks",
    "list_text",
    "loading_options",
    "main",
    "main_parser",
    "merge_parser",
    "run_parser",
    "sweep_parser",
]

#: The subcommands; a command line that starts with an option (or is empty) means ``run``.
COMMANDS = ("run", "merge", "list", "sweep")

_RUN_DESCRIPTION = commands._RUN_DESCRIPTION
_MERGE_DESCRIPTION = commands._MERGE_DESCRIPTION


def sweep_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The sweep's own options (``eatta-bench sweep``; the others are run options)."""
    from eatta.bench.sweep import sweep_parser as parser

    return parser(add_help)


def main_parser() -> argparse.ArgumentParser:
    """``eatta-bench`` with its subcommands (``--help`` lists them)."""
    p = argparse.ArgumentParser(
        prog="eatta-bench",
        description="Benchmark test-time adaptation methods. Options without a subcommand (or "
        "no arguments at all: the long-term digits-C benchmark) mean 'run'.",
    )
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    sub.add_parser(
        "run",
        parents=[run_parser(add_help=False)],
        help="run a benchmark grid and print its table (the default)",
        description=_RUN_DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub.add_parser(
        "merge",
        parents=[merge_parser(add_help=False)],
        help="merge the output folders of --shard runs into one table",
        description=_MERGE_DESCRIPTION,
    )
    sub.add_parser(
        "list",
        help="list methods (with their --hp keys) and dataset layouts",
        description="List the registered methods with their --hp keys and the datasets' layouts.",
    )
    sub.add_parser(  # parsed by eatta.bench.sweep.main: its unknown options are run options
        "sweep",
        help="run a grid's shards as a Slurm job array or local processes, then merge",
        add_help=False,
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eatta-bench``; returns the exit status.

    ``eatta-bench`` alone and ``eatta-bench --rounds 3 ...`` (options first) mean ``run``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["run", *argv]
    if argv[0] == "sweep":
        from eatta.bench import sweep

        return commands.exit_status(lambda: sweep.main(argv[1:]))
    args = main_parser().parse_args(argv)
    if args.command == "list":
        print(list_text())
        return 0
    if args.command == "merge":
        return commands.exit_status(lambda: commands.merge(args))
    return commands.exit_status(lambda: commands.run(args, argv[1:]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
