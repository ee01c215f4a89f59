"""The LayerNorm model's rows: digits-C with ``--backbone digits-vit`` at batch sizes 1, 8 and 64.

Regenerates the section between the ``vit-batch-study`` markers of ``docs/benchmarks.md`` and
``benchmarks/results/vit_batch_study.json`` from :func:`eatta.bench.run` cells on the recurring
digits-C stream with the packaged vision transformer, at equal labels per sample: batch size ``B``
labels one sample every ``64 / B`` batches. Finished cells under ``--out`` are read back, so an
interrupted study resumes; ``--report-only`` rewrites the section from the JSON.

    python benchmarks/vit_batch_study.py --seeds 0-2 --rounds 10 --out runs/vit-batch-study
    python benchmarks/vit_batch_study.py --seeds 0 --rounds 2     # what fits a busy 2-core CPU
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS, Template, replace_section, run_part, study_parser, write_json
from _common import fmt_mean_std as fmt
from _common import markdown_table as table

from eatta.bench import StreamProtocol
from eatta.bench.flags import split_csv
from eatta.bench.results import CellResult
from eatta.methods import registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
JSON = RESULTS / "vit_batch_study.json"
BEGIN, END = "<!-- vit-batch-study: begin -->", "<!-- vit-batch-study: end -->"
#: The methods that apply to a LayerNorm model (all of them do; these are the main job's).
METHODS = ("source", "tent", "eta", "baseline", "eatta", "eatta-stable")
BATCH_SIZES = (64, 8, 1)
#: The bar: batch size 1 within this many points of batch size 64 (average error, seed mean).
BAR = 2.0
PAGE = Template("vit_batch")


def scaled_lr(methods: Sequence[str], batch: int, rule: str) -> dict[str, dict[str, float]]:
    """``--hp`` overrides at batch size ``batch``: rule ``linear``, each method's digits-C learning
    rate times ``batch / 64`` (SAR's rule for small batches); ``none``, no override."""
    if rule == "none" or batch == 64:
        return {}
    specs = {m: registry.get_spec(m) for m in methods}
    return {
        m: {"lr": float(spec.hparams("digits-c", {})["lr"]) * batch / 64}
        for m, spec in specs.items()
        if "lr" in spec.keys
    }


def summarize(results: dict[int, list[CellResult]]) -> dict[str, Any]:
    """Per method and batch size: average, first and last round error per seed, labels, CPU s."""
    out: dict[str, Any] = {}
    for batch, cells in results.items():
        for r in cells:
            got = {"avg": r.average_error, "first": r.round_errors[0], "last": r.round_errors[-1]}
            got |= {"labels": r.labels_used, "cpu_s": r.cpu_time_s}
            cell = out.setdefault(r.spec.method, {}).setdefault(str(batch), {})
            for k, v in got.items():
                cell.setdefault(k, []).append(v)
    return out


def render(data: dict[str, Any]) -> str:
    """The docs section (between the markers) from the summary."""
    meta, per = data["meta"], data["methods"]
    sizes = [str(b) for b in meta["batch_sizes"]]
    header = ["Method"] + [f"B = {b}" for b in sizes] + ["B=1 − B=64", f"within {BAR:g}?"]
    rows, first_last, holds, failing = [], [], [], []
    for method, cells in per.items():
        row = [method] + [fmt(cells[b]["avg"]) if b in cells else "-" for b in sizes]
        gap = None
        if "1" in cells and "64" in cells:
            gap = statistics.fmean(cells["1"]["avg"]) - statistics.fmean(cells["64"]["avg"])
        row += ["-", "-"] if gap is None else [f"{gap:+.1f}", "yes" if gap <= BAR else "**no**"]
        rows.append(row)
        if method == "source":
            continue
        if gap is not None and gap <= BAR:
            holds.append(f"`{method}`")
        elif gap is not None:
            failing.append(f"`{method}` ({gap:+.1f})")
        edges = [
            f"{fmt(c['first'])} → {fmt(c['last'])}" if (c := cells.get(b)) else "-" for b in sizes
        ]
        first_last.append([method, *edges])
    labels = {
        b: sorted({n for c in per.values() if b in c for n in c[b]["labels"] if n}) for b in sizes
    }
    seeds = ",".join(map(str, meta["seeds"]))
    limit, rule = meta.get("limit"), meta.get("lr_rule", "none")
    options = f"--seeds {seeds} --rounds {meta['rounds']} --lr-rule {rule}"
    options += "" if limit is None else f" --limit {limit}"
    options += "" if tuple(per) == METHODS else f" --methods {','.join(per)}"
    options += "" if sizes == list(map(str, BATCH_SIZES)) else f" --batch-sizes {','.join(sizes)}"
    verdict = ""
    if holds or failing:
        failed = PAGE("failing", failing=", ".join(failing)) if failing else ""
        holding = ", ".join(holds) or "none"
        verdict = "\n" + PAGE("verdict", bar=f"{BAR:g}", holds=holding, failing=failed) + "\n"
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


def main(argv: Sequence[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/vit-batch-study")
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
    args = p.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if bad := [b for b in sizes if b < 1 or 64 % b]:
        raise SystemExit(f"batch sizes must divide 64 (equal labels per sample), got {bad}")
    methods = split_csv(args.methods)
    torch.set_num_threads(1)
    if args.report_only:
        data = json.loads(JSON.read_text(encoding="utf-8"))
    else:
        meta = {k: getattr(args, k) for k in ("seeds", "rounds", "limit", "lr_rule")}
        meta.update(batch_sizes=sizes, cpu_capability=torch.backends.cpu.get_cpu_capability())
        results = {
            b: run_part(
                Path(args.out),
                f"b{b}",
                StreamProtocol(rounds=args.rounds),
                methods,
                args.seeds,
                backbone="digits-vit",
                batch_size=b,
                every=64 // b,
                window=None,  # each batch adapted on as given, what this study measures
                # (auto steps on a window of 64; off is refused at batch 1, for BatchNorm)
                limit=args.limit,
                hparams=scaled_lr(methods, b, args.lr_rule),
            )
            for b in sizes
        }
        data = {"meta": meta, "methods": summarize(results)}
        write_json(JSON, data)
    text = render(data)
    replace_section(DOC, BEGIN, END, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
