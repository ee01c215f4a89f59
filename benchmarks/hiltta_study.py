"""HILTTA on digits-C beside EATTA, and what its label-driven choice of a learning rate is worth.

Regenerates the section of ``docs/hiltta.md`` between ``<!-- hiltta:begin -->`` and
``<!-- hiltta:end -->`` and ``benchmarks/results/hiltta_study.json`` (``--report-only``: from
that file). Every run is a cell of :func:`eatta.bench.run` under ``--out`` (finished cells are
read back, so an interrupted study resumes). Parts, per stream of :data:`STREAMS`: ``main``
(:data:`MAIN` at 1 and 3 labels a batch, TENT beside them), ``select`` (HILTTA's choice of TENT's
and ETA's learning rate alone against their fixed rate, :data:`SELECT`) and ``sar`` (HILTTA over
SAR with the base SGD's momentum as the authors' loop leaves it and as the chosen candidate left
it, SAR alone beside them, :data:`SAR`); CPU seconds per batch over TENT's on the same cells.
``--parts`` reruns some parts and keeps the others' numbers from the JSON (same protocol only).

    python benchmarks/hiltta_study.py --seeds 0-2 --rounds 1 --limit 128 --out runs/hiltta
    python benchmarks/hiltta_study.py --seeds 0-2 --rounds 1 --limit 128 --parts sar --jobs 1
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from _common import RESULTS, Template, replace_section, run_part, study_parser
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from _study import chosen

from eatta.bench import StreamProtocol
from eatta.bench.results import CellResult

DOC = Path(__file__).resolve().parents[1] / "docs" / "hiltta.md"
JSON = RESULTS / "hiltta_study.json"
#: The streams (their rounds: ``--rounds``).
STREAMS = {
    "recurring": StreamProtocol(),
    "mixed": StreamProtocol(mixed=True),
    "ccc": StreamProtocol(ccc="medium"),
}
MAIN = ("hiltta", "eatta", "eatta-stable")
#: select part: run name -> (methods, HILTTA's overrides)
SELECT: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "select-tent": (("tent", "hiltta"), {"active_lr": 0.0}),
    "select-eta": (("eta", "hiltta"), {"active_lr": 0.0, "base": "eta", "tune": "lr"}),
}
#: sar part: run name -> (methods, HILTTA's overrides)
SAR: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "sar-last": (("sar", "hiltta"), {"base": "sar", "sar_momentum": "last"}),
    "sar-chosen": (("hiltta",), {"base": "sar", "sar_momentum": "chosen"}),
}
PARTS = ("main", "select", "sar")
PAGE = Template("hiltta")


def per_label(results: Sequence[CellResult]) -> dict[str, dict[str, list[float]]]:
    """label -> {"error": per seed, "cpu_per_batch": per seed}."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in results:
        row = out.setdefault(r.label, {"error": [], "cpu_per_batch": []})
        row["error"].append(float(r.average_error))
        row["cpu_per_batch"].append(float(r.cpu_time_s or 0.0) / max(len(r.online), 1))
    return out


def study(
    out: Path,
    seeds: list[int],
    rounds: int,
    limit: int | None,
    jobs: int,
    parts: Sequence[str] = PARTS,
    kept: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``parts`` into ``out``; the other parts' numbers are ``kept``'s."""
    data: dict[str, Any] = {"protocol": {"rounds": rounds, "limit": limit, "seeds": seeds}}
    for part in PARTS:
        data[part] = kept.get(part, {}) if part not in parts and kept is not None else {}
    for stream, protocol in STREAMS.items():
        proto = replace(protocol, rounds=rounds)
        run = partial(run_part, out / stream, protocol=proto, seeds=seeds, jobs=jobs, limit=limit)
        if "main" in parts:
            rows = data["main"][stream] = per_label(run("tent", methods=["tent"]))
            for k in (1, 3):
                rows.update(per_label(run(f"k{k}", methods=MAIN, labels=k)))
        for part, runs in (("select", SELECT), ("sar", SAR)):  # select: not on recurring
            if part in parts and (part == "sar" or stream != "recurring"):
                data[part][stream] = {
                    name: per_label(run(name, methods=methods, labels=3, hparams={"hiltta": hp}))
                    for name, (methods, hp) in runs.items()
                }
    return data


def main(argv: Sequence[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/hiltta")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--limit", type=int, default=None, help="images per domain (reduced runs)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    p.add_argument("--parts", default=",".join(PARTS), help="parts to run (the others' are kept)")
    args = p.parse_args(argv)
    args.parts = chosen("--parts", args.parts, PARTS)
    if args.report_only:
        data = json.loads(JSON.read_text(encoding="utf-8"))
    else:
        kept = None
        if set(args.parts) != set(PARTS):  # the other parts' numbers come from the results file
            kept = json.loads(JSON.read_text(encoding="utf-8"))
            protocol = kept["protocol"]
            same = (protocol["rounds"], protocol["limit"]) == (args.rounds, args.limit)
            if not same or protocol["seeds"] not in (args.seeds, _span(args.seeds)):
                raise SystemExit(
                    f"--parts {','.join(args.parts)} keeps the other parts of {JSON.name}, run "
                    f"under {protocol}: run with the same --rounds, --limit and --seeds"
                )
        data = study(
            Path(args.out), args.seeds, args.rounds, args.limit, args.jobs, args.parts, kept
        )
        if kept is not None:
            data["protocol"] = kept["protocol"]
    JSON.write_text(json.dumps(data, indent=1), encoding="utf-8")
    replace_section(DOC, "<!-- hiltta:begin -->", "<!-- hiltta:end -->", "\n" + report(data) + "\n")
    print(report(data))
    return 0


def report(data: dict[str, Any]) -> str:
    """The section of docs/hiltta.md: ``templates/hiltta.md`` filled."""
    main = data["main"]
    rows = []
    for lab in sorted({lab for labels in main.values() for lab in labels}, key=_order):
        cells = [by_label.get(lab) for by_label in main.values()]
        ratios = [_cpu(s[lab]) / _cpu(s["tent"]) for s in main.values() if "tent" in s and lab in s]
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
    sar = ""
    if data.get("sar"):
        srows = []
        for s, parts in data["sar"].items():
            last, chosen = parts.get("sar-last", {}), parts.get("sar-chosen", {})
            alone = last.get("sar", {}).get("error", [])
            faithful = next((v["error"] for k, v in last.items() if k.startswith("hiltta")), [])
            restored = next((v["error"] for k, v in chosen.items() if k.startswith("hiltta")), [])
            srows.append([s, fmt(alone), fmt(faithful), fmt(restored)])
        head = [
            "stream",
            "SAR alone (lr 5e-3)",
            "HILTTA-SAR, last candidate's momentum (default)",
            "HILTTA-SAR, chosen candidate's momentum",
        ]
        sar = PAGE("sar", table=table(head, srows))
    proto = data["protocol"]
    seeds = proto["seeds"]  # "0-2" as committed; a list from a fresh run
    text = PAGE(
        rounds=proto["rounds"],
        images=proto["limit"] or "all",
        seeds=seeds if isinstance(seeds, str) else ",".join(map(str, seeds)),
        table=table(["method", *main, "CPU/batch vs TENT"], rows),
        select=select,
        sar=sar,
    )
    return text.removesuffix("\n")


def _span(seeds: Sequence[int]) -> str:
    """``[0, 1, 2]`` as the results file writes it, ``"0-2"``."""
    return f"{seeds[0]}-{seeds[-1]}" if list(seeds) == list(range(seeds[0], seeds[-1] + 1)) else ""


def _cpu(row: dict[str, list[float]]) -> float:
    return statistics.fmean(row["cpu_per_batch"])


def _order(label: str) -> tuple[int, str]:
    return (0 if label == "tent" else 1 if label.startswith("hiltta") else 2, label)


if __name__ == "__main__":
    raise SystemExit(main())
