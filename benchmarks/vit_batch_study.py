"""The LayerNorm model's rows: digits-C with ``--backbone digits-vit`` at batch sizes 1, 8 and 64.

Regenerates the section "A LayerNorm model: batch sizes 1, 8 and 64" of ``docs/benchmarks.md``
(between its ``vit-batch-study`` markers) and ``benchmarks/results/vit_batch_study.json`` from
runs of :func:`eatta.bench.run` on the recurring digits-C stream with the packaged vision
transformer (:mod:`eatta.models.digits_vit`), at equal labels per sample: batch size ``B`` labels
one sample every ``64 / B`` batches (``--every 64/B``), one label per 64 samples throughout.

Every run is a cell under ``--out`` (finished cells are read back, so an interrupted study
resumes); ``--render-only`` rewrites the section and the JSON from them.

    python benchmarks/vit_batch_study.py --seeds 0-2 --rounds 10 --out runs/vit-batch-study
    python benchmarks/vit_batch_study.py --seeds 0 --rounds 2     # what fits a busy 2-core CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _common import Template, replace_section
from _common import fmt_mean_std as fmt
from _common import markdown_table as table

import eatta.bench
from eatta.bench.flags import seed_list
from eatta.bench.results import CellResult
from eatta.methods import registry

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
JSON = REPO / "benchmarks" / "results" / "vit_batch_study.json"
BEGIN, END = "<!-- vit-batch-study: begin -->", "<!-- vit-batch-study: end -->"
#: The methods that apply to a LayerNorm model (all of them do; these are the main job's).
METHODS = ("source", "tent", "eta", "baseline", "eatta", "eatta-stable")
BATCH_SIZES = (64, 8, 1)
#: The bar: batch size 1 within this many points of batch size 64 (average error, seed mean).
BAR = 2.0


def scaled_lr(methods: Sequence[str], batch: int, rule: str) -> dict[str, dict[str, float]]:
    """``--hp`` overrides for batch size ``batch``: with rule ``linear``, each method's digits-C
    learning rate times ``batch / 64`` (the same step size per sample as at batch 64, the rule
    SAR uses for small batches); ``none``: no override."""
    if rule == "none" or batch == 64:
        return {}
    out = {}
    for m in methods:
        spec = registry.get_spec(m)
        if "lr" in spec.keys:
            out[m] = {"lr": float(spec.hparams("digits-c", {})["lr"]) * batch / 64}
    return out


def run(out: Path, batch: int, args: argparse.Namespace) -> list[CellResult]:
    """One batch size's cells (read back where finished)."""
    started = time.perf_counter()
    done = eatta.bench.run(
        "digits-c",
        args.methods,
        backbone="digits-vit",
        batch_size=batch,
        every=64 // batch,
        window=None,  # each batch adapted on as given, what this study measures (auto would
        # step on a window of 64; "off" is refused at batch size 1, for BatchNorm's sake)
        rounds=args.rounds,
        limit=args.limit,
        hparams=scaled_lr(args.methods, batch, args.lr_rule),
        seeds=args.seeds,
        jobs=1,
        threads=1,
        out=out / f"b{batch}",
        progress=False,
        plot=False,
    )
    took = time.perf_counter() - started
    print(f"  batch {batch}: {len(done.results)} runs, {took:.0f} s", flush=True)
    return done.results


def summarize(results: dict[int, list[CellResult]]) -> dict[str, Any]:
    """Per method and batch size: average, first and last round error per seed, labels used."""
    out: dict[str, Any] = {}
    for batch, rs in results.items():
        for r in rs:
            m = out.setdefault(r.spec.method, {}).setdefault(
                str(batch), {"avg": [], "first": [], "last": [], "labels": [], "cpu_s": []}
            )
            got = (r.average_error, r.round_errors[0], r.round_errors[-1], r.labels_used)
            for k, v in zip(m, (*got, r.cpu_time_s), strict=True):
                m[k].append(v)
    return out


def render(data: dict[str, Any]) -> str:
    """The docs section (between the markers) from the summary."""
    meta, per = data["meta"], data["methods"]
    sizes = [str(b) for b in meta["batch_sizes"]]
    header = ["Method"] + [f"B = {b}" for b in sizes] + ["B=1 − B=64", f"within {BAR:g}?"]
    rows, first_last, verdicts = [], [], []
    for method, cells in per.items():
        row = [method] + [fmt(cells[b]["avg"]) if b in cells else "-" for b in sizes]
        gap = None
        if "1" in cells and "64" in cells:
            gap = statistics.fmean(cells["1"]["avg"]) - statistics.fmean(cells["64"]["avg"])
        row += ["-", "-"] if gap is None else [f"{gap:+.1f}", "yes" if gap <= BAR else "**no**"]
        rows.append(row)
        if method == "source":
            continue
        if gap is not None:
            verdicts.append((method, gap <= BAR, gap))
        first_last.append(
            [method]
            + [
                f"{fmt(c['first'])} → {fmt(c['last'])}" if (c := cells.get(b)) else "-"
                for b in sizes
            ]
        )
    labels = {
        b: sorted({n for c in per.values() if b in c for n in c[b]["labels"] if n}) for b in sizes
    }
    seeds = ",".join(map(str, meta["seeds"]))
    limit = meta.get("limit")
    rule = meta.get("lr_rule", "none")
    options = f"--seeds {seeds} --rounds {meta['rounds']} --lr-rule {rule}"
    options += "" if limit is None else f" --limit {limit}"
    options += "" if tuple(per) == METHODS else f" --methods {','.join(per)}"
    verdict = ""
    if verdicts:
        holds = ", ".join(f"`{m}`" for m, ok, _ in verdicts if ok) or "none"
        failing = ", ".join(f"`{m}` ({g:+.1f})" for m, ok, g in verdicts if not ok)
        failing = PAGE("failing", failing=failing) if failing else ""
        verdict = "\n" + PAGE("verdict", bar=f"{BAR:g}", holds=holds, failing=failing) + "\n"
    return PAGE(
        "section",
        rounds=meta["rounds"],
        limit="" if limit is None else PAGE("limit", limit=limit),
        seeds=seeds,
        std=PAGE("std") if len(meta["seeds"]) > 1 else "",
        lr=PAGE("lr-linear" if rule == "linear" else "lr-none"),
        options=options,
        table=table(header, rows),
        first_last=table(["Method"] + [f"B = {b}" for b in sizes], first_last),
        labels=", ".join(f"B = {b}: {'/'.join(map(str, labels[b])) or '-'}" for b in sizes),
        kernels=meta["cpu_capability"],
        verdict=verdict,
    )


PAGE = Template("vit_batch")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=seed_list, default="0-2", help="seeds, e.g. 0-2 or 0")
    p.add_argument("--rounds", type=int, default=10, help="recurring rounds (10: the main job's)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    p.add_argument("--limit", type=int, default=None, help="images per domain (default: all 898)")
    p.add_argument(
        "--lr-rule",
        choices=("linear", "none"),
        default="linear",
        help="learning rate at batch B: the digits-C default times B/64 (linear), or the default",
    )
    p.add_argument("--out", default="runs/vit-batch-study", type=Path)
    p.add_argument("--render-only", action="store_true", help="only read finished cells back")
    args = p.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    bad = [b for b in sizes if b < 1 or 64 % b]
    if bad:
        raise SystemExit(f"batch sizes must divide 64 (equal labels per sample), got {bad}")
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    torch.set_num_threads(1)
    if args.render_only:
        data = json.loads(JSON.read_text(encoding="utf-8"))
    else:
        meta = {k: getattr(args, k) for k in ("seeds", "rounds", "limit", "lr_rule")}
        meta.update(batch_sizes=sizes, cpu_capability=torch.backends.cpu.get_cpu_capability())
        data = {"meta": meta, "methods": summarize({b: run(args.out, b, args) for b in sizes})}
        JSON.parent.mkdir(parents=True, exist_ok=True)
        JSON.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    text = render(data)
    replace_section(DOC, BEGIN, END, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
