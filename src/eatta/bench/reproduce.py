"""Shared code of the reproduction scripts (``examples/reproduce_*.py``): a paper table is a
list of :class:`Row`, run like ``eatta-bench`` and shown beside the published numbers.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eatta.bench.benchmark import BenchmarkData
from eatta.bench.grid import GIVEN, CellSpec, parse_shard, shard
from eatta.bench.report import markdown_table, table_text, write_outputs
from eatta.bench.results import CellResult
from eatta.bench.runner import RunOptions, run_grid
from eatta.methods import registry

__all__ = [
    "Row",
    "add_common_args",
    "comparison_table",
    "options_from_args",
    "row_cells",
    "run_rows",
]


@dataclass(frozen=True)
class Row:
    """One row of a paper table: ``method`` None is not implemented here; ``published`` maps a
    setting to the published number (or numbers, for several columns)."""

    label: str
    method: str | None
    labels: int = 0
    buffer: int | None = None
    published: Mapping[str, Any] = field(default_factory=dict)


def row_cells(rows: Sequence[Row], dataset: str, setting: str) -> list[tuple[Row, CellSpec]]:
    """The cell that measures each implemented row in ``setting`` (source: setting ``"-"``)."""
    out = []
    for row in rows:
        if row.method is None or setting not in row.published:
            continue
        if row.method == GIVEN:
            spec = CellSpec(dataset, GIVEN, "-")
        elif row.labels or registry.get_spec(row.method).active:
            spec = CellSpec(dataset, row.method, setting, row.labels, 1, row.buffer)
        else:
            spec = CellSpec(dataset, row.method, setting)
        out.append((row, spec))
    return out


def _settings(text: str) -> str:
    """``--setting``: ctta, ftta or both, checked as argparse checks a type."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names or any(s not in ("ctta", "ftta") for s in names):
        raise argparse.ArgumentTypeError(f"settings are ctta, ftta or ctta,ftta, got {text!r}")
    return text


def _shard(text: str) -> str:
    """``--shard``: ``i/n`` or ``auto``, checked before anything loads."""
    if text.strip().lower() == "auto":
        return text  # read from the job array's environment when the rows run
    try:
        parse_shard(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Options every reproduction script shares with ``eatta-bench``."""
    p.add_argument("--setting", default="ctta,ftta", type=_settings, help="ctta, ftta or ctta,ftta")
    rows = "only rows of these methods, comma-separated (e.g. source,tent,eatta)"
    p.add_argument("--rows", help=rows)
    p.add_argument("--checkpoint", help="local model weights")
    smoke = "no pretrained weights (smoke tests only)"
    p.add_argument("--random-init", action="store_true", help=smoke)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, help="at most this many images per domain")
    p.add_argument("--image-size", type=int, default=224, help="input size (224 in the paper)")
    p.add_argument("--device", default="auto")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--shard", metavar="i/n", type=_shard, help="run only this shard of the rows")
    p.add_argument("--checkpoint-every", type=int, default=100)
    for flag in ("--no-progress", "--no-plot"):
        p.add_argument(flag, action="store_true")


def options_from_args(args: argparse.Namespace, hparams: dict[str, dict[str, Any]]) -> RunOptions:
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    same = {
        k: getattr(args, k) for k in ("batch_size", "seed", "limit", "workers", "checkpoint_every")
    }
    return RunOptions(**same, device=device, hparams=hparams, progress=not args.no_progress)


def run_rows(
    rows: Sequence[Row],
    data: Mapping[str, BenchmarkData],
    settings: Sequence[str],
    options: RunOptions,
    out: str | os.PathLike[str],
    *,
    shard_text: str | None = None,
    plot: bool = True,
    meta: Mapping[str, Any] | None = None,
    callback: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[tuple[Row, CellResult]]:
    """Run every implemented row on every dataset in every setting (this shard's part)."""
    row_of: dict[CellSpec, Row] = {}  # in grid order
    for name in data:
        for setting in settings:
            for row, spec in row_cells(rows, name, setting):
                row_of.setdefault(spec, row)  # source appears in both settings but runs once
    index = parse_shard(shard_text) if shard_text else (0, 1)
    mine = shard(list(row_of), *index)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if options.progress else None
    results = run_grid(mine, data, options, out, log=log, callback=callback)
    write_outputs(results, out, dict(meta or {}), plot=plot)
    by_spec = {r.spec: r for r in results}
    return [(row, by_spec[spec]) for spec, row in row_of.items() if spec in by_spec]


def comparison_table(
    rows: Sequence[Row],
    measured: Sequence[tuple[Row, CellResult]],
    settings: Sequence[str],
    datasets: Sequence[str],
    *,
    value: Callable[[CellResult], Sequence[float]],
    published: Callable[[Row, str, str], Sequence[float] | None],
    columns: Sequence[str],
    unit: str,
) -> str:
    """Markdown: published (``published``; None: not reported) and measured (``value``)
    numbers side by side per row, setting and dataset."""
    by_key = {(row.label, r.spec.dataset, r.spec.setting): r for row, r in measured}
    head = ["Method", "Set.", "Dataset", *[f"{c} paper / ours" for c in columns]]
    body: list[list[str]] = []
    for setting, dataset, row in itertools.product(settings, datasets, rows):
        if (pub := published(row, setting, dataset)) is None:
            continue
        res = by_key.get((row.label, dataset, "-" if row.method == GIVEN else setting))
        ours: Sequence[float | None] = [None] * len(columns)  # not measured or not implemented
        if res is not None and row.method is not None:
            ours = value(res)
        cells = [
            f"{p:.1f} / " + ("–" if o is None else f"{o:.1f}")
            for p, o in zip(pub, ours, strict=True)
        ]
        shown = row.label  # a preset that labels more per batch is named
        if res is not None and res.label != res.spec.label:
            shown = f"{row.label}: {res.label}"
        body.append([shown, setting.upper()[0], dataset, *cells])
    return f"{unit}: published / measured\n\n{table_text(head, body, left=3)}\n"


def print_results(results: Sequence[CellResult]) -> None:
    """The full per-domain table of what was measured."""
    if results:
        print(markdown_table(results))
