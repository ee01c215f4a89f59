"""The online protocol's study: every registered method on one pass of digits-C at 1 label a
batch, offline and online at the committed CPU costs.

Regenerates the ``realtime-costs`` (the costs table) and ``realtime`` (the results table and the
ranking) sections of ``docs/realtime.md`` and the plot ``docs/img/realtime.svg``. The run is
``eatta-bench run --methods all --rounds 1 --protocol both --speeds
src/eatta/bench/speeds_digits_cpu.json`` (its costs fix the schedule, so every CPU gives the same
numbers under the same kernels: run it as ``ATEN_CPU_CAPABILITY=avx2``, like the main job); its
``results.json`` is kept as ``benchmarks/results/realtime.json``.

    python benchmarks/realtime_study.py                # run (runs/realtime), keep, write the page
    python benchmarks/realtime_study.py --report-only  # the page from the committed results
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import RESULTS as RESULTS_DIR
from _common import markdown_table, replace_section

import eatta.bench
from eatta.bench.api import MAIN_JOB_SPEEDS
from eatta.bench.report import pyplot

REPO = Path(__file__).resolve().parents[1]
RESULTS = RESULTS_DIR / "realtime.json"
PAGE = REPO / "docs" / "realtime.md"
PLOT = REPO / "docs" / "img" / "realtime.svg"
SPEEDS = REPO / "src" / "eatta" / "bench" / "speeds_digits_cpu.json"


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per method: its label, r, batches adapted and skipped, labels and errors both ways."""
    out = []
    for r in doc["results"]:
        rt, on = r["realtime"], r["realtime"]["online"]
        out.append({
            "label": r["label"], "cost": rt["cost"], "adapted": rt["adapted"],
            "skipped": rt["skipped"], "labels": r["labels_used"], "labels_on": on["labels_used"],
            "offline": r["average_error"], "online": on["average_error"],
        })  # fmt: skip
    return out


def ranks(values: list[float]) -> list[int]:
    """1 for the lowest error; ties (as printed, one decimal) share a rank."""
    shown = [round(v, 1) for v in values]
    return [1 + sum(w < v for w in shown) for v in shown]


def block(doc: dict[str, Any]) -> str:
    """The results section: the table, then where the ranking changes."""
    table = rows(doc)
    off, on = ranks([t["offline"] for t in table]), ranks([t["online"] for t in table])
    head = ["Method", "r", "Adapted", "Skipped", "Labels offline → online", "Offline err."]
    head += ["Online err.", "Δ", "Rank offline → online"]
    cells = []
    for t, a, b in sorted(zip(table, off, on, strict=True), key=lambda z: z[2]):
        delta = round(t["online"], 1) - round(t["offline"], 1)
        counts = [
            f"{t['cost']:.2f}",
            t["adapted"],
            t["skipped"],
            f"{t['labels']} → {t['labels_on']}",
        ]
        errors = [f"{t['offline']:.1f}", f"**{t['online']:.1f}**", f"{delta:+.1f}", f"{a} → {b}"]
        cells.append([t["label"], *counts, *errors])
    moved = [f"{t['label']} ({a} → {b})" for t, a, b in zip(table, off, on, strict=True) if a != b]
    changes = ", ".join(moved) + "." if moved else "none."
    sentence = "Ranking changes between the protocols (offline rank → online rank): "
    return f"{markdown_table(head, cells)}\n\n{sentence}{changes}"


def costs_block(speeds: dict[str, Any]) -> str:
    """The committed costs: r, and the batches served unadapted after each step."""
    costs = sorted(speeds["costs"].items(), key=lambda kv: (kv[1], kv[0]))
    lines = [[name, f"{r:.2f}", max(0, math.ceil(r) - 1)] for name, r in costs]
    return markdown_table(["Method", "r", "skipped after each step (⌈r⌉ − 1)"], lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    """Offline (x) against online (y) error per adapting method (the source model, on the
    diagonal by definition, left out), the diagonal dotted: above it, cost became error."""
    plt = pyplot()
    plt.rcParams["svg.hashsalt"] = "eatta"  # the same file from the same numbers
    table = [t for t in rows(doc) if t["cost"] > 1]  # the source model sits on the diagonal
    values = [v for t in table for v in (t["offline"], t["online"])]
    lo, hi = math.floor(min(values)) - 0.5, math.ceil(max(values)) + 0.5
    fig, ax = plt.subplots(figsize=(7.2, 6.0))
    ax.plot([lo, hi], [lo, hi], ":", color="0.5", lw=1)
    # labels fanned out to the right in order of online error, each joined to its point
    for i, t in enumerate(sorted(table, key=lambda t: (t["online"], t["offline"]))):
        ax.scatter(t["offline"], t["online"], s=14 + 4 * t["skipped"] ** 0.5, alpha=0.75)
        name = f"{t['label'].replace(' (1/batch)', '')}: r {t['cost']:.1f}, {t['skipped']} skipped"
        y = lo + (i + 0.5) * (hi - lo) / len(table)
        ax.annotate(name, (t["offline"], t["online"]), xytext=(hi + 0.3, y), fontsize=7,
                    textcoords="data", va="center", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": "0.7", "lw": 0.6})  # fmt: skip
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="offline error % (the stream waits)",
           ylabel="online error % (the stream does not wait)")  # fmt: skip
    ax.set_title("digits-C, one pass, 1 label a batch: above the diagonal, cost became error",
                 fontsize=9, loc="left")  # fmt: skip
    ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.09, right=0.62, top=0.93, bottom=0.09)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def render(doc: dict[str, Any]) -> None:
    """Write the page's generated sections and the plot."""
    speeds = json.loads(SPEEDS.read_text(encoding="utf-8"))
    for name, body in (("realtime-costs", costs_block(speeds)), ("realtime", block(doc))):
        replace_section(PAGE, f"<!-- {name}:begin -->", f"<!-- {name}:end -->", body)
    plot(doc, PLOT)
    print(f"wrote {PAGE.relative_to(REPO)} and {PLOT.relative_to(REPO)}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument(
        "--report-only", action="store_true", help="render from the committed results, run nothing"
    )
    p.add_argument("--out", default="runs/realtime", help="folder of the run")
    args = p.parse_args(argv)
    if not args.report_only:
        done = eatta.bench.run(
            "digits-c", "all", rounds=1, labels=1, realtime="both", speeds=str(MAIN_JOB_SPEEDS),
            out=args.out, plot=False, log=lambda m: print(m, file=sys.stderr),
        )  # fmt: skip
        print(done.table)
        shutil.copyfile(done.paths["json"], RESULTS)
    render(json.loads(RESULTS.read_text(encoding="utf-8")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
