"""The ``run``, ``merge`` and ``list`` subcommands of ``eatta-bench``: their options and what they
do. :mod:`eatta.bench.cli` dispatches to them; :mod:`eatta.bench.sweep` runs every shard through
:func:`run_main` and merges through :func:`merge_main`, so neither imports the other.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from eatta.annotate.cost import AnnotatorCost
from eatta.annotate.requests import FEEDBACK
from eatta.bench import api
from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.api import DEFAULT_METHODS, DIGITS_ROUNDS
from eatta.bench.benchmark import BenchmarkData
from eatta.bench.monitoring import DEFAULT_AUDIT_SHARE, DEFAULT_GUARD_LEVEL, MonitorOptions
from eatta.bench.protocol import CCC_SPEEDS, StreamProtocol
from eatta.methods import registry
from eatta.monitor import GUARD_POLICIES

__all__ = [
    "build_benchmarks",
    "exit_status",
    "list_text",
    "loading_options",
    "merge",
    "merge_main",
    "merge_parser",
    "parse_hparams",
    "run",
    "run_main",
    "run_parser",
]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None


def _seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,2,5"`` -> [0, 2, 5]; ranges and lists may mix."""
    out: list[int] = []
    try:
        for part in _csv(text):
            lo, sep, hi = part.partition("-")
            if sep and lo:
                a, b = int(lo), int(hi)
                if b < a:
                    raise argparse.ArgumentTypeError(f"empty seed range {part!r}")
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds are integers or ranges such as 0-4 or 0,1,2, got {text!r}"
        ) from None
    if not out or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"seeds must be distinct and non-empty, got {text!r}")
    return out


def _delay(text: str) -> int | str:
    if text.strip().lower() == "never":
        return "never"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"label delay is a number of batches >= 0 or 'never', got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"label delay must be >= 0 batches, got {value}")
    return value


def _severity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= 5:
        raise argparse.ArgumentTypeError(f"severity is an integer from 1 to 5, got {text!r}")
    return value


def _buffers(text: str) -> list[int | None]:
    out: list[int | None] = []
    for t in _csv(text):
        if t.lower() in ("default", "none", "-"):
            out.append(None)
        else:
            try:
                out.append(int(t))
            except ValueError:
                raise argparse.ArgumentTypeError(f"buffer sizes are integers, got {t!r}") from None
    return out


_RUN_DESCRIPTION = (
    "Benchmark test-time adaptation methods. Without --dataset: the long-term embedded "
    "digits-C benchmark (10 rounds, CPU, about 2.5 minutes on 2 cores; --rounds 1 for one pass)."
)


def run_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The options of ``eatta-bench run`` (also accepted without the word ``run``)."""
    from eatta.bench.suites import DATASETS

    p = argparse.ArgumentParser(
        prog="eatta-bench run",
        description=_RUN_DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        add_help=add_help,
    )
    g = p.add_argument_group("what to run")
    g.add_argument(
        "--dataset",
        default="digits-c",
        help=f"dataset(s), comma-separated, from {', '.join(DATASETS)}",
    )
    g.add_argument(
        "--root",
        action="append",
        default=[],
        metavar="[DATASET=]PATH",
        help="dataset folder; repeat as NAME=PATH for several datasets",
    )
    g.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help="registered methods, comma-separated, or 'all' (see --list)",
    )
    g.add_argument(
        "--setting",
        default="ctta",
        help="ctta (never reset), ftta (reset at each domain change), or both: ctta,ftta",
    )
    g.add_argument(
        "--labels",
        type=_ints,
        default="1",
        metavar="K[,K]",
        help="labels per batch for active methods",
    )
    g.add_argument(
        "--every", type=_ints, default="1", metavar="N[,N]", help="label only every N-th batch"
    )
    g.add_argument(
        "--buffer",
        type=_buffers,
        default="default",
        metavar="N[,N]",
        help="labelled-sample buffer size for active methods ('default': the method's own)",
    )
    g.add_argument(
        "--sequence",
        default="P-A-C-S",
        help="PACS sequence(s), comma-separated (P-A-C-S, A-C-P-S, C-A-S-P, S-C-P-A)",
    )
    g.add_argument(
        "--severity",
        type=_severity,
        default=None,
        metavar="1-5",
        help="corruption severity of digits-c and imagenet-c (default 5; other datasets have none)",
    )
    g.add_argument(
        "--subset",
        default="all",
        help="ImageNet-C images per corruption: all (the paper), a count, or a list file",
    )
    g = p.add_argument_group("stream protocol (any dataset, any method)")
    g.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"recurring: repeat the domain sequence R times, each round reshuffled "
        f"(default: {DIGITS_ROUNDS} for the digits-C main job, else 1)",
    )
    g.add_argument(
        "--gradual",
        action="store_true",
        help="gradual: severity 1,2,3,4,5,4,3,2,1 within each corruption (imagenet-c, digits-c)",
    )
    g.add_argument(
        "--dirichlet",
        type=float,
        default=None,
        metavar="DELTA",
        help="label shift: order each domain by a Dirichlet(DELTA) class process "
        "(0.1: strongly class-correlated batches)",
    )
    g.add_argument(
        "--mixed",
        action="store_true",
        help="mixed domains: every batch drawn across all domains of the round",
    )
    g.add_argument(
        "--ccc",
        choices=CCC_SPEEDS,
        default=None,
        help="CCC-style stream (digits-c): corruption pairs blended with a continuously "
        "changing mix and severity, at this speed",
    )
    g = p.add_argument_group("annotator (active methods; simulated from the ground truth)")
    g.add_argument(
        "--label-delay",
        type=_delay,
        default=None,
        metavar="D|never",
        help="labels arrive D batches after they are asked for ('never': they never come); "
        "0 gives the numbers of a run without it",
    )
    g.add_argument(
        "--label-pace",
        type=float,
        default=None,
        metavar="A",
        help="a person answering A requests per batch, one at a time (instead of --label-delay: "
        "the delay follows from the load)",
    )
    g.add_argument(
        "--stream-rate",
        type=float,
        default=None,
        metavar="R",
        help="a person at --seconds-per-label/--seconds-per-binary against a stream of R batches "
        "per second (the pace in seconds, instead of --label-pace)",
    )
    g.add_argument(
        "--label-order",
        default=None,
        metavar="newest|oldest",
        help="with a pace: which waiting request the person answers next (default newest)",
    )
    g.add_argument(
        "--label-patience",
        type=int,
        default=None,
        metavar="N",
        help="with a pace: batches a request waits before the person drops it (default 64)",
    )
    g.add_argument(
        "--label-noise",
        type=float,
        default=0.0,
        metavar="P",
        help="probability that an answer is wrong (a uniformly drawn other class, or a "
        "flipped yes/no)",
    )
    g.add_argument(
        "--feedback",
        choices=FEEDBACK,
        default="label",
        help="label: the annotator gives a class; binary: yes/no on the model's prediction",
    )
    g.add_argument(
        "--seconds-per-label",
        type=float,
        default=AnnotatorCost.seconds_per_label,
        help="annotator seconds per full label (for the reported annotator time)",
    )
    g.add_argument(
        "--seconds-per-binary",
        type=float,
        default=AnnotatorCost.seconds_per_binary,
        help="annotator seconds per yes/no answer",
    )
    g = p.add_argument_group("audits and guard (every method; docs/guard.md)")
    g.add_argument(
        "--audit",
        type=float,
        default=None,
        metavar="FRACTION",
        help="share of the stream's samples sent as audits (uniform random) to an auditor like "
        "the annotator: the monitor's accuracy of the adapted and the source model per round "
        f"(default with --guard: {DEFAULT_AUDIT_SHARE:g})",
    )
    g.add_argument(
        "--guard",
        nargs="?",
        const="paired",
        default=None,
        metavar="POLICY",
        help="reset to the source state when the audits show the model worse than the source "
        f"or than it was ({', '.join(GUARD_POLICIES)}; default paired: either)",
    )
    g.add_argument(
        "--guard-level",
        type=float,
        default=DEFAULT_GUARD_LEVEL,
        metavar="ALPHA",
        help="the guard's error level: chance of any reset over the stream where nothing "
        f"degrades (default {DEFAULT_GUARD_LEVEL:g}, tuned in docs/guard.md)",
    )
    g.add_argument(
        "--guard-window",
        type=int,
        default=MonitorOptions.window,
        metavar="N",
        help="audits per block of the guard's test",
    )
    g.add_argument(
        "--fallback",
        action="store_true",
        help="the given model beside every adapting method: one audit a batch (drawn where the "
        "two disagree) decides which predictions are served and resets a method found worse "
        "(eatta-safe has its own, measured by its own requests; docs/guard.md)",
    )
    g = p.add_argument_group("models and annotator")
    g.add_argument(
        "--backbone",
        default=None,
        help="digits-cnn (digits-C default, BatchNorm), digits-vit (digits-C, LayerNorm); "
        "resnet50_bn (ImageNet default), resnet50_gn, vit_b_16; resnet18 (PACS)",
    )
    g.add_argument(
        "--checkpoint",
        default=None,
        help="local weights; for PACS '{source}' becomes the source domain letter",
    )
    g.add_argument(
        "--random-init", action="store_true", help="no pretrained weights (smoke tests only)"
    )
    g.add_argument(
        "--oracle",
        choices=("gt", "model"),
        default="gt",
        help="annotator: ground truth, or a model (--oracle-backbone)",
    )
    g.add_argument("--oracle-backbone", default=None, help="the annotating model's backbone")
    g.add_argument("--oracle-checkpoint", default=None, help="the annotating model's weights")
    g.add_argument(
        "--fisher-root",
        default=None,
        help="clean ImageNet images (<wnid>/*) for EATA's Fisher regularizer",
    )
    g.add_argument(
        "--hp",
        action="append",
        default=[],
        metavar="[METHOD.]KEY=VALUE",
        help="hyperparameter override (Python literal), for all or one method",
    )
    g = p.add_argument_group("execution")
    g.add_argument("--batch-size", type=int, default=64, help="images per batch (64 in the paper)")
    g.add_argument(
        "--window",
        type=_window,
        default="auto",
        metavar="auto|off|N",
        help="batches smaller than N samples are served on robust statistics and adapted on as a "
        "window of the last N, one step every N samples, labels per sample as --labels/--every "
        "give them (docs/small-batches.md); auto: N = 64 for batches under 64 on BatchNorm models",
    )
    g.add_argument("--seed", type=int, default=0, help="stream order and method randomness")
    g.add_argument(
        "--seeds",
        type=_seeds,
        default=None,
        metavar="0-4|0,1,2",
        help="run every cell once per seed and report mean ± std (replaces --seed)",
    )
    g.add_argument(
        "--limit",
        type=int,
        default=None,
        help="at most this many images per domain (seeded subset; smoke runs)",
    )
    g.add_argument(
        "--image-size",
        type=int,
        default=224,
        help="input size for ImageNet-R/K/A and PACS (224; smaller for smoke tests)",
    )
    g.add_argument(
        "--shard",
        default=None,
        metavar="i/n|auto",
        help="run only grid cells j with j mod n == i (0 <= i < n); auto: i and n from a Slurm "
        "job array (sbatch --array=0-<n-1>) or EATTA_SHARD=i/n",
    )
    g.add_argument("--out", default=None, help="output folder (default ./runs/<name>)")
    g.add_argument("--name", default=None, help="run name for the default output folder")
    g.add_argument(
        "--workers",
        type=int,
        default=None,
        help="data-loading worker processes (default: 0 on the CPU, up to 8 on a GPU)",
    )
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, or auto")
    g.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="cells run in parallel processes of one thread each (default: every core for "
        "digits-C on the CPU, else 1); results are identical to a serial run",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 for digits-C and mnist, whose tiny convolutions only "
        "lose from intra-op parallelism, else torch's default)",
    )
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=100,
        metavar="BATCHES",
        help="save a resumable checkpoint every this many batches (0: never)",
    )
    g.add_argument(
        "--cache-dir",
        default=None,
        help="digits-C cache (default $EATTA_CACHE/digits-c or ~/.cache/eatta/digits-c)",
    )
    g.add_argument(
        "--rerun",
        action="store_true",
        help="ignore finished cells and checkpoints in the output folder",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    g.add_argument(
        "--list", action="store_true", help="same as 'eatta-bench list': list methods and datasets"
    )
    return p


_MERGE_DESCRIPTION = "Merge the finished cells of several output folders (e.g. --shard runs)."


def merge_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The arguments of ``eatta-bench merge``."""
    p = argparse.ArgumentParser(
        prog="eatta-bench merge", description=_MERGE_DESCRIPTION, add_help=add_help
    )
    p.add_argument("dirs", nargs="+", help="output folders")
    p.add_argument("--out", default="runs/merged", help="folder for the merged outputs")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    return p


# ----------------------------------------------------------------------------- helpers


def parse_hparams(items: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--hp`` items as validated overrides per method (see :func:`registry.merge_overrides`).

    ``METHOD.KEY=VALUE`` must be a key of that method; ``KEY=VALUE`` (or ``*.KEY=VALUE``) applies
    to every selected method that declares the key and is an error only if none does. An unknown
    key or a value of the wrong type is a usage error (exit status 2), raised before any data is
    loaded.
    """
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
    if plain:
        for d in datasets:
            roots.setdefault(d, plain[0])
    return roots


def _subset(text: str) -> int | str | None:
    if text.lower() == "all":
        return None
    return int(text) if text.isdigit() else text


def _default_jobs(args: argparse.Namespace) -> int:
    """Every core for the embedded benchmarks (digits-C, MNIST) on the CPU (one thread per
    cell), else 1."""
    import torch

    cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    return (os.cpu_count() or 1) if cpu and set(_csv(args.dataset)) <= set(api.EMBEDDED) else 1


def loading_options(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's keywords of :func:`eatta.bench.api.load_benchmarks` (those that
    :func:`eatta.bench.run` passes on)."""
    datasets = _csv(args.dataset)
    return dict(
        roots=_roots(args.root, datasets),
        sequences=_csv(args.sequence),
        severity=args.severity,
        subset=_subset(args.subset),
        image_size=args.image_size,
        backbone=args.backbone,
        checkpoint=args.checkpoint,
        pretrained=not args.random_init,
        oracle_backbone=args.oracle_backbone if args.oracle == "model" else None,
        oracle_checkpoint=args.oracle_checkpoint,
        fisher_root=args.fisher_root,
        cache_dir=args.cache_dir,
    )


def build_benchmarks(args: argparse.Namespace) -> dict[str, BenchmarkData]:
    """The datasets named on the command line, loaded by :func:`eatta.bench.api.load_benchmarks`
    (fails fast on layout or weights)."""
    return api.load_benchmarks(
        _csv(args.dataset),
        gradual=args.gradual,
        ccc=args.ccc,
        workers=args.workers,
        log=_log,
        **loading_options(args),
    )


def list_text() -> str:
    """What ``eatta-bench list`` prints: methods with their ``--hp`` keys, dataset layouts."""
    from eatta.bench.suites import DATASETS, LAYOUTS

    lines = [
        "methods (name, active = asks for labels, summary) and their --hp keys "
        "(KEY: type = default [per-dataset values]  meaning):"
    ]
    for name in registry.available():
        lines.extend("  " + line for line in registry.describe(name).splitlines())
    lines.append("datasets (layout under --root):")
    for d in DATASETS:
        lines.append(f"  {d:<11} {LAYOUTS[d]}")
    return "\n".join(lines)


def _window(text: str) -> int | str:
    """``--window``: auto, off, or a number of samples >= 2."""
    if text in ("auto", "off"):
        return text
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--window must be auto, off or a number of samples, got {text!r}"
        ) from None
    if size < 2:
        raise argparse.ArgumentTypeError(f"--window must hold at least 2 samples, got {size}")
    return size


# ----------------------------------------------------------------------------- commands


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``eatta-bench run``: the command line's options checked and passed to
    :func:`eatta.bench.run`; prints the table."""
    if args.list:
        print(list_text())
        return 0
    methods = api.method_names(args.methods)
    # checks worded with the command's option names (eatta.bench.run checks them again)
    bad_labels = [k for k in args.labels if k < 0]
    if bad_labels:
        raise ValueError(f"--labels must be >= 0, got {bad_labels[0]}")
    bad_every = [n for n in args.every if n < 1]
    if bad_every:
        raise ValueError(f"--every must be >= 1 (label every N-th batch), got {bad_every[0]}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.dirichlet is not None and not 0 < args.dirichlet < float("inf"):
        raise ValueError(f"--dirichlet must be a positive number, got {args.dirichlet}")
    if (args.gradual or args.ccc) and args.severity is not None:
        raise ValueError(
            f"--{'gradual' if args.gradual else 'ccc'} walks its own severities; leave out "
            f"--severity {args.severity}"
        )
    if args.seeds is not None and any(a == "--seed" or a.startswith("--seed=") for a in argv):
        raise ValueError("give either --seed or --seeds, not both")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.oracle == "model" and args.oracle_backbone is None:
        raise ValueError("--oracle model needs --oracle-backbone")
    done = api.run(
        _csv(args.dataset),
        methods,
        settings=args.setting,
        labels=args.labels,
        every=args.every,
        buffers=args.buffer,
        seeds=args.seeds if args.seeds is not None else [args.seed],
        protocol=StreamProtocol(
            rounds=args.rounds,
            gradual=args.gradual,
            dirichlet=args.dirichlet,
            mixed=args.mixed,
            ccc=args.ccc,
        ),
        annotator=AnnotatorOptions(
            delay=args.label_delay,
            noise=args.label_noise,
            feedback=args.feedback,
            cost=AnnotatorCost(args.seconds_per_label, args.seconds_per_binary),
            pace=args.label_pace,
            stream_rate=args.stream_rate,
            order=args.label_order,
            patience=args.label_patience,
        ),
        monitor=monitor_options(args),
        jobs=args.jobs if args.jobs is not None else _default_jobs(args),
        hparams=parse_hparams(args.hp, methods),
        batch_size=args.batch_size,
        window=args.window,
        limit=args.limit,
        device=args.device,
        workers=args.workers,
        threads=args.threads,
        checkpoint_every=args.checkpoint_every,
        shard=args.shard,
        out=args.out,
        name=args.name,
        reuse=not args.rerun,
        progress=not args.no_progress,
        plot=not args.no_plot,
        log=_log,
        meta={"argv": list(argv)},
        **loading_options(args),
    )
    print(done.table, end="")
    return 0


def merge(args: argparse.Namespace) -> int:
    """``eatta-bench merge``: the finished cells of several folders as one set of outputs."""
    from eatta.bench.report import load_results, markdown_table, write_outputs

    results = load_results(args.dirs)
    if not results:
        raise ValueError("no finished cells found")
    paths = write_outputs(results, args.out, {"merged": list(args.dirs)}, plot=not args.no_plot)
    print(markdown_table(results), end="")
    _log("outputs: " + ", ".join(str(p) for p in paths.values()))
    return 0


def exit_status(call: Callable[[], int]) -> int:
    """``call()``'s exit status; a usage error (bad input, missing data or weights) is printed as
    ``eatta-bench: error: ...`` and gives status 2; Ctrl-C says what was kept and gives 130.
    Other errors propagate."""
    try:
        return call()
    except KeyboardInterrupt as stop:
        print(f"eatta-bench: {stop if str(stop) else 'interrupted'}", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, KeyError, TypeError, RuntimeError) as err:
        from eatta.bench.models import WeightsUnavailableError

        if isinstance(err, (RuntimeError, TypeError)) and not isinstance(
            err, WeightsUnavailableError
        ):
            raise
        print(f"eatta-bench: error: {err}", file=sys.stderr)
        return 2


def run_main(argv: Sequence[str]) -> int:
    """``eatta-bench run ARGV`` (without the word ``run``); the exit status."""
    return exit_status(lambda: run(run_parser().parse_args(list(argv)), argv))


def merge_main(argv: Sequence[str]) -> int:
    """``eatta-bench merge ARGV`` (without the word ``merge``); the exit status."""
    return exit_status(lambda: merge(merge_parser().parse_args(list(argv))))


def monitor_options(args: argparse.Namespace) -> MonitorOptions:
    """``--audit`` / ``--guard`` as :class:`MonitorOptions` (``--guard`` alone audits
    :data:`~eatta.bench.monitoring.DEFAULT_AUDIT_SHARE`; ``--audit 0 --guard`` is an error)."""
    audit = args.audit
    if audit is None:
        audit = DEFAULT_AUDIT_SHARE if args.guard is not None else 0.0
    return MonitorOptions(
        audit=audit,
        guard=args.guard,
        guard_level=args.guard_level,
        window=args.guard_window,
        fallback=args.fallback,
    )
