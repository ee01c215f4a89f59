"""HILTTA on digits-C beside EATTA, and what its label-driven choice of a learning rate is worth.

Regenerates the section of ``docs/hiltta.md`` between ``<!-- hiltta:begin -->`` and
``<!-- hiltta:end -->`` and ``benchmarks/results/hiltta_study.json``. Every run is one
``eatta-bench run`` (its folder under ``--out``; ``--rerun`` is not passed, so finished cells
are read back and an interrupted study resumes). Parts, per stream (recurring, mixed, CCC):

* ``main``: ``hiltta`` (TENT base, the authors' lr grid), ``eatta`` and ``eatta-stable`` at
  1 and 3 labels a batch, over ``--seeds``; TENT beside them (no labels);
* ``select``: the selection alone (``active_lr=0``: no supervised step) over TENT's and ETA's
  learning rate, against TENT and ETA at their fixed digits-C rate (SGD 5e-3): does choosing
  the rate with the labels help the label-free method?
* ``cost``: CPU seconds per batch of each method over TENT's, on the same cells.

    python benchmarks/hiltta_study.py --seeds 0-2 --out runs/hiltta
    python benchmarks/hiltta_study.py --report-only --out runs/hiltta
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import RESULTS, Template, replace_section
from _common import fmt_mean_std as fmt
from _common import markdown_table as table

DOC = Path(__file__).resolve().parents[1] / "docs" / "hiltta.md"
STREAMS: dict[str, list[str]] = {"recurring": [], "mixed": ["--mixed"], "ccc": ["--ccc", "medium"]}
MAIN = "hiltta,eatta,eatta-stable"
#: select part: run name -> (methods, --hp overrides)
SELECT: dict[str, tuple[str, list[str]]] = {
    "select-tent": ("tent,hiltta", ["hiltta.active_lr=0.0"]),
    "select-eta": ("eta,hiltta", ["hiltta.active_lr=0.0", "hiltta.base='eta'", "hiltta.tune='lr'"]),
}
PAGE = Template("hiltta")


def bench(
    out: Path, methods: str, extra: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One ``eatta-bench run`` into ``out`` (skipped when its results exist); its cells."""
    results = out / "results.json"
    if not results.is_file() and not args.report_only:
        cmd = [
            sys.executable, "-m", "eatta.bench.cli", "run", "--methods", methods,
            "--rounds", str(args.rounds), "--seeds", args.seeds, "--no-plot", "--out", str(out),
            *(["--limit", str(args.limit)] if args.limit else []), *extra,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env)
    if not results.is_file():
        return []
    return list(json.loads(results.read_text())["results"])


def per_label(cells: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """label -> {"error": per seed, "cpu_per_batch": per seed}."""
    out: dict[str, dict[str, list[float]]] = {}
    for c in cells:
        row = out.setdefault(c["label"], {"error": [], "cpu_per_batch": []})
        row["error"].append(float(c["average_error"]))
        batches = len(c.get("online") or [])
        row["cpu_per_batch"].append(float(c["cpu_time_s"]) / max(batches, 1))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/hiltta")
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--limit", type=int, default=None, help="images per domain (reduced runs)")
    p.add_argument("--parts", default="main,select")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    data: dict[str, Any] = {
        "protocol": {"rounds": args.rounds, "limit": args.limit, "seeds": args.seeds},
        "main": {},
        "select": {},
    }
    for stream, flags in STREAMS.items():
        if "main" in args.parts:
            rows: dict[str, Any] = {}
            rows.update(per_label(bench(out / stream / "tent", "tent", flags, args)))
            for k in (1, 3):
                cells = bench(out / stream / f"k{k}", MAIN, [*flags, "--labels", str(k)], args)
                rows.update(per_label(cells))
            data["main"][stream] = rows
        if "select" in args.parts and stream != "recurring":
            for name, (methods, hps) in SELECT.items():
                hp = [a for h in hps for a in ("--hp", h)]
                cells = bench(out / stream / name, methods, [*flags, "--labels", "3", *hp], args)
                data["select"].setdefault(stream, {})[name] = per_label(cells)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "hiltta_study.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    replace_section(DOC, "<!-- hiltta:begin -->", "<!-- hiltta:end -->", "\n" + report(data) + "\n")
    print(report(data))
    return 0


def report(data: dict[str, Any]) -> str:
    """The section of docs/hiltta.md: ``templates/hiltta.md`` filled."""
    streams = list(data["main"])
    labels = sorted({lab for s in streams for lab in data["main"][s]}, key=_order)
    rows = []
    for lab in labels:
        cells = [data["main"][s].get(lab) for s in streams]
        ratios = [
            statistics.fmean(data["main"][s][lab]["cpu_per_batch"])
            / statistics.fmean(data["main"][s]["tent"]["cpu_per_batch"])
            for s in streams
            if "tent" in data["main"][s] and lab in data["main"][s]
        ]
        ratio = f"{statistics.fmean(ratios):.1f}×" if ratios else "-"
        rows.append([lab, *(fmt(c["error"]) if c else "-" for c in cells), ratio])
    select = ""
    if data["select"]:
        srows = []
        for s, parts in data["select"].items():
            for name, cells in parts.items():
                base = name.split("-")[1]
                fixed = cells.get(base, {}).get("error", [])
                chosen = next((v["error"] for k, v in cells.items() if k.startswith("hiltta")), [])
                srows.append([f"{base} ({s})", fmt(fixed), fmt(chosen)])
        head = ["label-free method", "fixed lr 5e-3", "lr chosen by HILTTA"]
        select = PAGE("select", table=table(head, srows))
    proto = data["protocol"]
    text = PAGE(
        rounds=proto["rounds"],
        images=proto["limit"] or "all",
        seeds=proto["seeds"],
        table=table(["method", *streams, "CPU/batch vs TENT"], rows),
        select=select,
    )
    return text.removesuffix("\n")


def _order(label: str) -> tuple[int, str]:
    return (0 if label == "tent" else 1 if label.startswith("hiltta") else 2, label)


if __name__ == "__main__":
    raise SystemExit(main())
