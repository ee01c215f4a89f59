"""How much torch's CPU kernels move the main job, against the spread over seeds.

    python benchmarks/kernel_spread.py --out runs/kernel-spread     # runs what is missing
    python benchmarks/kernel_spread.py --out runs/kernel-spread --table-only

Runs the main job's 10-round digits-C stream (``eatta-bench --methods METHODS --seed S``) in
fresh processes: seed 0 under ``ATEN_CPU_CAPABILITY`` unset (the CPU's own kernels), ``avx2`` and
``default`` (no vector kernels), and seeds 1 and 2 under the CPU's own kernels. A finished run is
reused (``eatta-bench`` resumes from its output folder). Prints the markdown table of
docs/benchmarks.md ("Same numbers on every machine") and writes it with the numbers to
``benchmarks/results/kernel_spread.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS, markdown_table, write_json

METHODS = "tent,baseline,eatta"
#: (ATEN_CPU_CAPABILITY, or None for the CPU's own kernels; seed)
RUNS = ((None, 0), ("avx2", 0), ("default", 0), (None, 1), (None, 2))


def _run(folder: Path, capability: str | None, seed: int, methods: str) -> dict[str, Any]:
    """The run's ``results.json``, the run made first if it is missing."""
    if not (folder / "results.json").exists():
        env = dict(os.environ)
        env.pop("ATEN_CPU_CAPABILITY", None)
        if capability is not None:
            env["ATEN_CPU_CAPABILITY"] = capability
        cmd = ["eatta-bench", "--methods", methods, "--seed", str(seed), "--out", str(folder)]
        subprocess.run([*cmd, "--no-progress", "--no-plot"], env=env, check=True)
    return json.loads((folder / "results.json").read_text())


def _cell(r: dict[str, Any]) -> str:
    rounds = r["round_errors"]
    return f"{r['average_error']:.1f} ({rounds[0]:.1f} → {rounds[-1]:.1f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/kernel-spread"))
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--table-only", action="store_true", help="only read finished runs")
    args = p.parse_args(argv)
    wanted = args.methods.split(",")
    columns: list[str] = []
    rows: dict[str, list[str]] = {}
    record: list[dict[str, Any]] = []
    for capability, seed in RUNS:
        own = capability is None
        folder = args.out / f"{capability or 'native'}-s{seed}"
        if args.table_only and not (folder / "results.json").exists():
            print(f"missing: {folder}", file=sys.stderr)
            return 1
        doc = _run(folder, capability, seed, args.methods)
        # a run made before results recorded its kernels: the CPU's own, read here (same machine)
        own_kernels = torch.backends.cpu.get_cpu_capability() if own else "?"
        kernels = doc["meta"].get("cpu_capability") or own_kernels
        columns.append(f"seed {seed}, {kernels}" + (" (own)" if own else ""))
        for r in (r for r in doc["results"] if r["spec"]["method"] in wanted):
            rows.setdefault(r["label"], []).append(_cell(r))
            where = {"seed": seed, "cpu_capability": kernels, "machine": doc["meta"].get("machine")}
            errors = {k: r[k] for k in ("average_error", "round_errors")}
            record.append({"method": r["label"], **where, **errors})
    table = markdown_table(["method", *columns], [[m, *cells] for m, cells in rows.items()])
    print(table)
    write_json(RESULTS / "kernel_spread.json", {"table": table, "runs": record})
    return 0


if __name__ == "__main__":
    sys.exit(main())
