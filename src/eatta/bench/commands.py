"""The ``run``, ``merge`` and ``list`` subcommands of ``eatta-bench`` (shared by ``cli`` and
``sweep``)."""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from eatta.annotate.cost import AnnotatorCost
from eatta.bench import api, flags
from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.flags import LoadOptions, RunConfig, split_csv
from eatta.bench.monitoring import DEFAULT_AUDIT_SHARE, MonitorOptions
from eatta.bench.protocol import StreamProtocol
from eatta.bench.report import load_results, markdown_table, write_outputs
from eatta.bench.suites import DATASETS, LAYOUTS
from eatta.console import USAGE_ERROR, USER_ERRORS, HelpFormatter
from eatta.methods import registry

__all__ = [
    "check_run_args",
    "exit_status",
    "list_text",
    "loading_options",
    "merge",
    "merge_main",
    "merge_parser",
    "monitor_options",
    "parse_hparams",
    "run",
    "run_main",
    "run_parser",
]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


#: ``run``'s flag groups after "what to run", which takes :class:`RunConfig`'s grid fields.
_GRID = ("settings", "labels", "every", "buffers", "seeds")
_GROUPS: tuple[tuple[str, type], ...] = (
    ("stream protocol (any dataset, any method)", StreamProtocol),
    ("annotator (active methods; simulated from the ground truth)", AnnotatorOptions),
    ("audits and guard (every method; docs/guard.md)", MonitorOptions),
    ("models and data", LoadOptions),
    ("execution", RunConfig),
)


def run_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``eatta-bench run``'s options: the option dataclasses' flags and a few of its own."""
    p = argparse.ArgumentParser(
        prog="eatta-bench run",
        description="Benchmark test-time adaptation methods. Without --dataset: the long-term "
        "embedded digits-C benchmark (10 rounds, CPU, about 2.5 minutes on 2 cores; --rounds 1 "
        "for one pass).",
        formatter_class=HelpFormatter,
        add_help=add_help,
    )
    g = p.add_argument_group("what to run")
    g.add_argument("--dataset", default="digits-c", help=f"from {', '.join(DATASETS)}")
    g.add_argument(
        "--methods",
        default=",".join(api.DEFAULT_METHODS),
        help="registered methods, comma-separated, or 'all' (see --list)",
    )
    flags.add_flags(g, RunConfig, only=_GRID)
    g.add_argument("--seed", type=int, default=0, help="stream order and method randomness")
    g.add_argument(
        "--hp",
        action="append",
        default=[],
        metavar="[METHOD.]KEY=VALUE",
        help="hyperparameter override (Python literal), for all or one method",
    )
    for title, cls in _GROUPS:  # the command line's own flags join their groups
        g = p.add_argument_group(title)
        flags.add_flags(g, cls, skip=_GRID)
        if cls is AnnotatorOptions:
            for kind in ("label", "binary"):
                g.add_argument(
                    f"--seconds-per-{kind}",
                    type=float,
                    default=getattr(AnnotatorCost, f"seconds_per_{kind}"),
                    help=f"annotator seconds per {kind} answer (for the reported annotator time)",
                )
        if cls is LoadOptions:
            g.add_argument(
                "--oracle",
                choices=("gt", "model"),
                default="gt",
                help="annotator: ground truth, or a model (--oracle-backbone)",
            )
    g.add_argument(
        "--list", action="store_true", help="same as 'eatta-bench list': list methods and datasets"
    )
    return p


def merge_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The arguments of ``eatta-bench merge``."""
    p = argparse.ArgumentParser(
        prog="eatta-bench merge",
        description="Merge the finished cells of several output folders (e.g. --shard runs).",
        formatter_class=HelpFormatter,
        add_help=add_help,
    )
    p.add_argument("dirs", nargs="+", help="output folders")
    p.add_argument("--out", default="runs/merged", help="folder for the merged outputs")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    return p


def parse_hparams(items: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--hp`` items as validated overrides per method, checked before any data is loaded:
    ``METHOD.KEY=VALUE`` for one method, ``KEY=VALUE`` for each that declares the key."""
    common: dict[str, Any] = {}
    own: dict[str, dict[str, Any]] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--hp expects [METHOD.]KEY=VALUE, got {item!r}")
        lhs, text = item.split("=", 1)
        method, key = lhs.split(".", 1) if "." in lhs else ("*", lhs)
        method = method.strip().lower()
        if method != "*" and method not in methods:
            raise ValueError(f"--hp {item!r}: method {method!r} is not among {list(methods)}")
        try:
            value: Any = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text  # a bare word such as sgd or adam
        (common if method == "*" else own.setdefault(method, {}))[key.strip()] = value
    try:
        return registry.merge_overrides(methods, common, own)
    except (TypeError, ValueError) as err:  # unknown key, wrong type or value: a usage error
        raise ValueError(f"--hp: {err}") from None


def _roots(items: Sequence[str], datasets: Sequence[str]) -> dict[str, str]:
    roots: dict[str, str] = {}
    plain = []
    for item in items:
        name, sep, path = item.partition("=")
        if sep and name in datasets:
            roots[name] = path
        else:
            plain.append(item)
    if len(plain) > 1:
        raise ValueError("several --root values: write them as DATASET=PATH")
    return {**dict.fromkeys(datasets, plain[0]), **roots} if plain else roots  # named ones win


def loading_options(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's :class:`LoadOptions` keywords."""
    out = flags.values(LoadOptions, args)
    out["roots"] = _roots(args.root, split_csv(args.dataset))
    out["sequences"] = split_csv(args.sequence)
    if args.oracle != "model":
        out["oracle_backbone"] = None
    return out


def list_text() -> str:
    """What ``eatta-bench list`` prints: methods with their ``--hp`` keys, dataset layouts."""
    lines = [
        "methods (name, active = asks for labels, summary) and their --hp keys "
        "(KEY: type = default [per-dataset values]  meaning):"
    ]
    for name in registry.available():
        lines.extend("  " + line for line in registry.describe(name).splitlines())
    lines.append("datasets (layout under --root):")
    lines.extend(f"  {d:<11} {LAYOUTS[d]}" for d in DATASETS)
    return "\n".join(lines)


def check_run_args(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """The run options checked before anything loads, errors naming the flags (``sweep`` too)."""
    for what, low, why in (("labels", 0, ""), ("every", 1, " (label every N-th batch)")):
        if bad := [k for k in getattr(args, what) if k < low]:
            raise ValueError(f"--{what} must be >= {low}{why}, got {bad[0]}")
    for what, low in (("batch_size", 1), ("rounds", 1), ("threads", 1), ("limit", 2)):
        value = getattr(args, what)
        if value is not None and value < low:
            raise ValueError(f"--{what.replace('_', '-')} must be >= {low}, got {value}")
    if args.dirichlet is not None and not 0 < args.dirichlet < float("inf"):
        raise ValueError(f"--dirichlet must be a positive number, got {args.dirichlet}")
    if (args.gradual or args.ccc) and args.severity is not None:
        raise ValueError(
            f"--{'gradual' if args.gradual else 'ccc'} walks its own severities; leave out "
            f"--severity {args.severity}"
        )
    if args.seeds is not None and any(a == "--seed" or a.startswith("--seed=") for a in argv):
        raise ValueError("give either --seed or --seeds, not both")
    if args.oracle == "model" and args.oracle_backbone is None:
        raise ValueError("--oracle model needs --oracle-backbone")


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``eatta-bench run``: :func:`eatta.bench.run` with the options; prints the table."""
    if args.list:
        print(list_text())
        return 0
    methods = api.method_names(args.methods)
    check_run_args(args, argv)
    config = flags.values(RunConfig, args)
    config["seeds"] = args.seeds if args.seeds is not None else [args.seed]
    if args.jobs is None:  # every core for the embedded benchmarks on the CPU, else 1
        cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
        embedded = set(split_csv(args.dataset)) <= set(api.EMBEDDED)
        config["jobs"] = (os.cpu_count() or 1) if cpu and embedded else 1
    if not argv:  # the main job: the online error beside the offline one, at committed costs
        config.update(realtime="both", speeds=str(api.MAIN_JOB_SPEEDS))
    cost = AnnotatorCost(args.seconds_per_label, args.seconds_per_binary)
    done = api.run(
        split_csv(args.dataset),
        methods,
        protocol=StreamProtocol(**flags.values(StreamProtocol, args)),
        annotator=AnnotatorOptions(**flags.values(AnnotatorOptions, args), cost=cost),
        monitor=monitor_options(args),
        hparams=parse_hparams(args.hp, methods),
        log=_log,
        meta={"argv": list(argv)},
        **config,
        **loading_options(args),
    )
    print(done.table, end="")
    return 0


def merge(args: argparse.Namespace) -> int:
    """``eatta-bench merge``: the finished cells of several folders as one set of outputs."""
    if not (results := load_results(args.dirs)):
        raise ValueError("no finished cells found")
    paths = write_outputs(results, args.out, {"merged": list(args.dirs)}, plot=not args.no_plot)
    print(markdown_table(results), end="")
    _log("outputs: " + ", ".join(str(p) for p in paths.values()))
    return 0


#: What ``eatta-bench`` reports as a usage error: its options are checked with ValueError.
_USAGE_ERRORS: tuple[type[Exception], ...] = (ValueError, KeyError, *USER_ERRORS)


def exit_status(call: Callable[[], int]) -> int:
    """``call()``'s exit status: 2 for a usage error (a bad option value, missing data or
    weights), printed as ``eatta-bench: error: ...``; 130 for Ctrl-C. Other errors propagate."""
    try:
        return call()
    except KeyboardInterrupt as stop:
        print(f"eatta-bench: {stop if str(stop) else 'interrupted'}", file=sys.stderr)
        return 130
    except _USAGE_ERRORS as err:
        print(f"eatta-bench: error: {err}", file=sys.stderr)
        return USAGE_ERROR


def run_main(argv: Sequence[str]) -> int:
    """``eatta-bench run ARGV`` (without the word ``run``); the exit status."""
    return exit_status(lambda: run(run_parser().parse_args(list(argv)), argv))


def merge_main(argv: Sequence[str]) -> int:
    """``eatta-bench merge ARGV`` (without the word ``merge``); the exit status."""
    return exit_status(lambda: merge(merge_parser().parse_args(list(argv))))


def monitor_options(args: argparse.Namespace) -> MonitorOptions:
    """``--audit`` / ``--guard`` as :class:`MonitorOptions` (``--guard`` alone: default share)."""
    values = flags.values(MonitorOptions, args)
    if values["audit"] is None:
        values["audit"] = DEFAULT_AUDIT_SHARE if args.guard is not None else 0.0
    return MonitorOptions(**values)
