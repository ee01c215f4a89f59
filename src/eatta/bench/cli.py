"""``eatta-bench``: run test-time adaptation benchmarks and print a markdown table
(``docs/benchmarks.md``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from eatta.bench import commands
from eatta.bench.commands import run_parser
from eatta.console import HelpFormatter
from eatta.window import small_batch_advice

__all__ = ["COMMANDS", "main", "main_parser", "run_parser"]

#: The subcommands with their one-line help.
_HELP = {
    "run": "run a benchmark grid and print its table (the default)",
    "merge": "merge the output folders of --shard runs into one table",
    "list": "list methods (with their --hp keys) and dataset layouts",
    "sweep": "run a grid's shards as a Slurm job array or local processes, then merge",
}
COMMANDS = tuple(_HELP)


def main_parser() -> argparse.ArgumentParser:
    """``eatta-bench`` with its subcommands (``--help`` lists them)."""
    p = argparse.ArgumentParser(
        prog="eatta-bench",
        description="Benchmark test-time adaptation methods. Options without a subcommand (or "
        "no arguments at all: the long-term digits-C benchmark) mean 'run'.",
        formatter_class=HelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    parents = {"run": run_parser(add_help=False), "merge": commands.merge_parser(add_help=False)}
    for name, parent in parents.items():
        sub.add_parser(
            name,
            parents=[parent],
            help=_HELP[name],
            description=parent.description,
            formatter_class=parent.formatter_class,
        )
    sub.add_parser(
        "list",
        help=_HELP["list"],
        description="List the registered methods with their --hp keys and the datasets' layouts.",
        formatter_class=HelpFormatter,
    )
    # parsed by eatta.bench.sweep.main: its unknown options are run options
    sub.add_parser("sweep", help=_HELP["sweep"], add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eatta-bench``; the exit status. No subcommand (options first): ``run``."""
    with small_batch_advice("--window 64", "--window off"):  # a warning names these flags
        return _main(list(sys.argv[1:] if argv is None else argv))


def _main(argv: list[str]) -> int:
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["run", *argv]
    if argv[0] == "sweep":
        from eatta.bench import sweep

        return commands.exit_status(lambda: sweep.main(argv[1:]))
    args = main_parser().parse_args(argv)
    if args.command == "list":
        print(commands.list_text())
        return 0
    if args.command == "merge":
        return commands.exit_status(lambda: commands.merge(args))
    return commands.exit_status(lambda: commands.run(args, argv[1:]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
