"""``eatta-bench``: run test-time adaptation benchmarks and print a markdown table.

Without arguments it runs the long-term embedded digits-C benchmark on the CPU: the packaged
digits source model, the corrupted test split in the 15-corruption CTTA order repeated for 10
rounds (each reshuffled), batches of 64, comparing source, tent, eta, baseline (1 label/batch) and
eatta (1 label/batch) round by round; ``--rounds 1`` gives the one-pass table. Stream protocols:
``--rounds`` (recurring), ``--gradual`` (severity 1→5→1), ``--dirichlet`` (label shift);
``--seeds 0-4`` repeats every cell per seed and reports mean ± std.
``eatta-bench merge DIR...`` merges the output folders of ``--shard`` runs into one table.
See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eatta.bench.runner import (
    SETTINGS,
    BenchmarkData,
    RunOptions,
    make_grid,
    make_jobs,
    parse_shard,
    run_grid,
    shard,
)
from eatta.methods import registry

__all__ = ["DEFAULT_METHODS", "build_benchmarks", "main", "run_parser"]

DEFAULT_METHODS = ("source", "tent", "eta", "baseline", "eatta")
#: Rounds of the default (digits-C) run: long enough for TENT's collapse to show.
DIGITS_ROUNDS = 10


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


def run_parser() -> argparse.ArgumentParser:
    from eatta.bench.suites import DATASETS

    p = argparse.ArgumentParser(
        prog="eatta-bench",
        description=(
            "Benchmark test-time adaptation methods. Without --dataset: the long-term embedded "
            "digits-C benchmark (10 rounds, CPU, about 5 minutes; --rounds 1 for one pass). "
            "'eatta-bench merge DIR...' merges --shard outputs."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
    g.add_argument("--severity", type=int, default=5, help="ImageNet-C severity")
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
    g = p.add_argument_group("models and annotator")
    g.add_argument(
        "--backbone",
        default=None,
        help="resnet50_bn (ImageNet default), resnet50_gn, vit_b_16, resnet18 (PACS)",
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
        metavar="i/n",
        help="run only grid cells j with j mod n == i (0 <= i < n)",
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
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 for digits-C, whose tiny convolutions only "
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
    g.add_argument("--list", action="store_true", help="list methods and datasets, then exit")
    return p


def merge_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eatta-bench merge",
        description="Merge the finished cells of several output folders (e.g. --shard runs).",
    )
    p.add_argument("dirs", nargs="+", help="output folders")
    p.add_argument("--out", default="runs/merged", help="folder for the merged outputs")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    return p


# ----------------------------------------------------------------------------- helpers


def _parse_hparams(items: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
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


def _device(text: str) -> str:
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: CUDA is not available")
    return text


def _subset(text: str) -> int | str | None:
    if text.lower() == "all":
        return None
    return int(text) if text.isdigit() else text


def build_benchmarks(args: argparse.Namespace) -> dict[str, BenchmarkData]:
    """The datasets named on the command line, loaded (fails fast on layout or weights)."""
    from eatta.bench import suites

    names = _csv(args.dataset)
    unknown = [d for d in names if d not in suites.DATASETS]
    if unknown:
        raise ValueError(f"unknown dataset(s) {unknown}; choose from {list(suites.DATASETS)}")
    roots = _roots(args.root, names)
    oracle_backbone = args.oracle_backbone if args.oracle == "model" else None
    if args.oracle == "model" and oracle_backbone is None:
        raise ValueError("--oracle model needs --oracle-backbone")
    out: dict[str, BenchmarkData] = {}
    for name in names:
        if args.gradual and name not in ("digits-c", "imagenet-c"):
            raise ValueError(f"--gradual needs severities; {name} has none (digits-c, imagenet-c)")
        if name == "digits-c":
            if oracle_backbone is not None:
                raise ValueError("digits-C has no model annotator; use --oracle gt")
            b = suites.digits_c_benchmark(args.cache_dir, log=_log, gradual=args.gradual)
            out[b.name] = b
            continue
        if name not in roots:
            raise ValueError(
                f"{name} needs --root (layout: {suites.LAYOUTS[name]}); "
                f"for several datasets write --root {name}=PATH"
            )
        if name == "pacs":
            for seq in _csv(args.sequence):
                b = suites.pacs_benchmark(
                    roots[name],
                    seq,
                    backbone=args.backbone or "resnet18",
                    checkpoint=args.checkpoint,
                    pretrained=not args.random_init,
                    image_size=args.image_size,
                    oracle_backbone=oracle_backbone,
                    oracle_checkpoint=args.oracle_checkpoint,
                    workers=args.workers or 0,
                )
                out[b.name] = b
        else:
            b = suites.imagenet_benchmark(
                name,
                roots[name],
                backbone=args.backbone or "resnet50_bn",
                checkpoint=args.checkpoint,
                pretrained=not args.random_init,
                severity=args.severity,
                gradual=args.gradual,
                subset=_subset(args.subset),
                image_size=args.image_size,
                fisher_root=args.fisher_root,
                oracle_backbone=oracle_backbone,
                oracle_checkpoint=args.oracle_checkpoint,
                workers=args.workers or 0,
            )
            out[b.name] = b
    return out


def _list() -> str:
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


def _methods(text: str) -> list[str]:
    if text.strip().lower() == "all":  # source first (the reference row), then by name
        return sorted(registry.available(), key=lambda m: (m != "source", m))
    names = [m.lower() for m in _csv(text)]
    known = set(registry.available())
    bad = [m for m in names if m not in known]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; registered: {sorted(known)}")
    return names


# ----------------------------------------------------------------------------- commands


def _run(argv: Sequence[str]) -> int:

    args = run_parser().parse_args(argv)
    if args.list:
        print(_list())
        return 0
    started = time.perf_counter()
    methods = _methods(args.methods)
    settings = [s.lower() for s in _csv(args.setting)]
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        raise ValueError(f"unknown setting(s) {bad}; choose from {list(SETTINGS)}")
    if any(k < 0 for k in args.labels) or any(n < 1 for n in args.every):
        raise ValueError("--labels must be >= 0 and --every >= 1")
    budgets = [(k, n) for k in args.labels for n in args.every]
    datasets = _csv(args.dataset)
    rounds = args.rounds
    if rounds is None:
        rounds = DIGITS_ROUNDS if datasets == ["digits-c"] else 1
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    if args.dirichlet is not None and not 0 < args.dirichlet < float("inf"):
        raise ValueError(f"--dirichlet must be a positive number, got {args.dirichlet}")
    if args.gradual and args.severity != 5:
        raise ValueError("--gradual runs severities 1 to 5; leave out --severity")
    if args.seeds is not None and any(a == "--seed" or a.startswith("--seed=") for a in argv):
        raise ValueError("give either --seed or --seeds, not both")
    seeds = args.seeds if args.seeds is not None else [args.seed]
    options = RunOptions(
        batch_size=args.batch_size,
        seed=seeds[0],
        rounds=rounds,
        dirichlet=args.dirichlet,
        limit=args.limit,
        device=_device(args.device),
        workers=args.workers,
        checkpoint_every=args.checkpoint_every,
        hparams=_parse_hparams(args.hp, methods),
        progress=not args.no_progress,
        reuse=not args.rerun,
    )
    shard_ix = parse_shard(args.shard) if args.shard else (0, 1)
    threads = args.threads
    if threads is None and options.device == "cpu" and _csv(args.dataset) == ["digits-c"]:
        threads = 1
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_grid(args, argv, options, methods, settings, budgets, shard_ix, started, seeds)
    finally:
        torch.set_num_threads(before)


def _run_grid(
    args: argparse.Namespace,
    argv: Sequence[str],
    options: RunOptions,
    methods: list[str],
    settings: list[str],
    budgets: list[tuple[int, int]],
    shard_ix: tuple[int, int],
    started: float,
    seeds: list[int],
) -> int:
    from eatta.bench.report import markdown_table, write_outputs

    data = build_benchmarks(args)
    if "eata" in methods:
        missing = [n for n, b in data.items() if b.fisher_data is None]
        if missing:
            raise ValueError(f"eata needs clean source data (--fisher-root) for {missing}")
    for b in data.values():
        for key in b.provenance_mismatch():
            _log(
                f"warning: {b.name}: {key} is {b.provenance[key]}, not the reference "
                f"{(b.expected_provenance or {})[key]}: results may differ from the published "
                "table (see docs/benchmarks.md, 'Same numbers on every machine')"
            )
    grid = make_grid(list(data), methods, settings, budgets, args.buffer)
    jobs = make_jobs(grid, seeds)
    cells = shard(jobs, *shard_ix)
    name = args.name or "+".join(_csv(args.dataset))
    if args.shard:
        name += f"-shard{shard_ix[0]}of{shard_ix[1]}"
    out = Path(args.out) if args.out else Path("runs") / name
    proto = f", {options.rounds} rounds" if options.rounds > 1 else ""
    if args.gradual:
        proto += ", gradual"
    if options.dirichlet is not None:
        proto += f", Dirichlet {options.dirichlet:g}"
    seed_text = f"seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0]}"
    _log(
        f"{len(cells)} of {len(jobs)} runs ({len(grid)} cells x {len(seeds)} seeds) on "
        f"{options.device} (batch size {options.batch_size}, {seed_text}{proto}) -> {out}"
    )
    results = run_grid(cells, data, options, out, log=_log)
    meta = {
        "argv": list(argv),
        "shard": list(shard_ix),
        "grid_size": len(grid),
        "batch_size": options.batch_size,
        "seeds": seeds,
        "rounds": options.rounds,
        "dirichlet": options.dirichlet,
        "gradual": bool(args.gradual),
        "provenance": {
            n: {"found": b.provenance, "expected": b.expected_provenance} for n, b in data.items()
        },
        "limit": options.limit,
        "device": options.device,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    paths = write_outputs(results, out, meta, plot=not args.no_plot)
    print(markdown_table(results), end="")
    _log("outputs: " + ", ".join(str(p) for p in paths.values()))
    _log(f"total wall time {time.perf_counter() - started:.1f} s")
    return 0


def _merge(argv: Sequence[str]) -> int:
    from eatta.bench.report import load_results, markdown_table, write_outputs

    args = merge_parser().parse_args(argv)
    results = load_results(args.dirs)
    if not results:
        raise ValueError("no finished cells found")
    paths = write_outputs(results, args.out, {"merged": list(args.dirs)}, plot=not args.no_plot)
    print(markdown_table(results), end="")
    _log("outputs: " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eatta-bench``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "merge":
            return _merge(argv[1:])
        return _run(argv)
    except (ValueError, FileNotFoundError, KeyError, TypeError, RuntimeError) as err:
        from eatta.bench.models import WeightsUnavailableError

        if isinstance(err, (RuntimeError, TypeError)) and not isinstance(
            err, WeightsUnavailableError
        ):
            raise
        print(f"eatta-bench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
