"""The guard study: audited accuracy, its intervals, and the guard that resets on evidence.

Regenerates ``docs/guard.md`` (and ``benchmarks/results/guard_study.json``) from runs of
:func:`eatta.bench.run` on the recurring, mixed and CCC digits-C streams, mean ± std over seeds.
Parts: ``tune`` (audit share, guard level and block chosen on the recurring stream with
``TUNE_SEED`` only: TENT's and the faithful EATTA's last round closest to their first, the
cheaper on a tie); ``audit`` and ``guard`` (``METHODS`` audited without and with the guard);
``delay`` (the guard with every answer ``DELAY`` batches late, on mixed and CCC). Every run is a
cell under ``--out`` (read back when finished, so the study resumes); ``--report-only`` rewrites
the page from them (from the committed JSON where ``--out`` holds no study).

    python benchmarks/guard_study.py --seeds 0-2 --out runs/guard-study
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, Template, load_json, run_part, save_study, streams, study_parser
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from _study import saved, verdict

from eatta.bench import AnnotatorOptions
from eatta.bench.monitoring import MonitorOptions
from eatta.bench.report import covered_rounds, load_results
from eatta.bench.results import CellResult

DOC = Path(__file__).resolve().parents[1] / "docs" / "guard.md"
JSON = RESULTS / "guard_study.json"
STREAM_NAMES = ("recurring", "mixed", "ccc")
METHODS = ("tent", "eatta", "eatta-stable")
NAMES = {"tent": "TENT", "eatta": "`eatta` (faithful)", "eatta-stable": "`eatta-stable`"}
TUNE_SEED = 10
TUNE_METHODS = ("tent", "eatta")
#: (audit share, guard level, audits per block) tried on the tuning stream.
CONFIGS: tuple[tuple[float, float, int], ...] = ((0.2, 0.05, 2000), (0.2, 0.2, 1000))
DELAY = 16
DELAY_STREAMS = ("mixed", "ccc")
#: The arms (audits alone, with the guard, with the guard and late answers): their rows'
#: label suffixes, and their folders under a stream's.
ARMS = {"audit": "", "guard": " + guard", "delay": " + guard"}
FOLDERS = {"audit": "audit", "guard": "guard", "delay": f"guard-delay-{DELAY}"}
#: The order the arms run in (most important first).
ORDER = (
    ("recurring", "guard"),
    *((name, arm) for name in DELAY_STREAMS for arm in ("audit", "guard")),
    ("recurring", "audit"),
    *((name, "delay") for name in DELAY_STREAMS),
)
PAGE = Template("guard")


def summary(rs: Sequence[CellResult]) -> dict[str, Any]:
    """Per method: first/last round, average, resets, audits, annotator hours, coverage."""
    out: dict[str, Any] = {}
    for r in rs:
        lists = {k: [] for k in "first last avg resets audits hours".split()}
        m = out.setdefault(r.spec.method, {**lists, "covered": [0, 0], "rounds": [], "labels": []})
        got = {"first": r.round_errors[0], "last": r.round_errors[-1], "avg": r.average_error}
        got |= {"rounds": list(r.round_errors), "labels": r.labels_used}
        m.setdefault("round1_domains", []).append(_first_round(r))
        if r.monitor:
            m.setdefault("reset_steps", []).append([e["step"] for e in r.monitor["resets"]])
            got |= {"resets": len(r.monitor["resets"]), "audits": r.monitor["stats"]["requested"]}
            got["hours"] = r.monitor["seconds"] / 3600
            rounds = r.monitor["rounds"]
            m.setdefault("widths", []).extend(e["high"] - e["low"] for e in rounds if e["audits"])
            m["covered"] = [a + b for a, b in zip(m["covered"], covered_rounds(r), strict=True)]
        for key, value in got.items():
            m[key].append(value)
    return out


def _first_round(r: CellResult) -> list[tuple[str, float]]:
    """The run's first round: (domain, error) in order."""
    k = len(r.domains) // max(r.rounds, 1)
    return list(zip(r.domains[:k], r.domain_errors[:k], strict=True))


def _tune_names(share: float, level: float, window: int) -> tuple[str, str]:
    """A tuning configuration's key in the study and its folder."""
    return f"share {share:g}, level {level:g}, block {window}", f"s{share:g}-a{level:g}-w{window}"


def _guarded(share: float, level: float, window: int) -> MonitorOptions:
    return MonitorOptions(audit=share, guard="paired", guard_level=level, block=window)


def study(out: Path, seeds: list[int], quick: bool) -> dict[str, Any]:
    """Run the parts in order of importance (the study saved in ``out`` before the arms, so a
    cut-short one reports what finished); the numbers are :func:`collect`'s."""
    protos = streams(*STREAM_NAMES, quick=quick)
    for config in CONFIGS:  # on the recurring stream with TUNE_SEED only
        folder, monitor = _tune_names(*config)[1], _guarded(*config)
        run_part(
            out / "tune", folder, protos["recurring"], TUNE_METHODS, [TUNE_SEED], monitor=monitor
        )
    tune = _tuned(out)
    key = min(tune, key=lambda k: (round(_drift(tune[k]), 1), tune[k]["config"][0]))
    share, level, window = tune[key]["config"]
    print(f"chosen on recurring seed {TUNE_SEED}: {key}", flush=True)
    chosen = {"share": share, "level": level, "window": window, "key": key}
    data: dict[str, Any] = {"seeds": seeds, "tune_seed": TUNE_SEED, "chosen": chosen, "streams": {}}
    for name, proto in protos.items():
        src = run_part(out / name, "source", proto, ["source"], seeds[:1])
        data["streams"][name] = {"protocol": proto.describe(), "source": src[0].round_errors}
    save_study(out, data)
    for name, arm in ORDER:
        monitor = MonitorOptions(audit=share) if arm == "audit" else _guarded(share, level, window)
        late = AnnotatorOptions(delay=DELAY) if arm == "delay" else None
        run_part(
            out / name, FOLDERS[arm], protos[name], METHODS, seeds, monitor=monitor, annotator=late
        )
    return collect(out, data)


def _drift(tuned: dict[str, Any]) -> float:
    """How far TENT's and the faithful EATTA's last round ended above their first, on average."""
    return float(np.mean([tuned[m]["last"][0] - tuned[m]["first"][0] for m in TUNE_METHODS]))


def _finished(folder: Path) -> list[CellResult]:
    """The finished cells in ``folder`` (none if it has none)."""
    return load_results([folder]) if (folder / "cells").is_dir() else []


def _tuned(out: Path) -> dict[str, Any]:
    """The tuning runs finished in ``out``: their configuration and summary, by key."""
    tune = {}
    for config in CONFIGS:
        key, folder = _tune_names(*config)
        if results := _finished(out / "tune" / folder):
            tune[key] = {"config": list(config), **summary(results)}
    return tune


def collect(out: Path, old: dict[str, Any]) -> dict[str, Any]:
    """The study's numbers computed from the finished cells in ``out`` (``old`` gives the seeds,
    the chosen configuration and the source rows); an arm whose runs are not all finished is
    left out (and named under Limits)."""
    seeds, expected = old["seeds"], len(METHODS) * len(old["seeds"])
    data = {k: old[k] for k in ("seeds", "tune_seed", "chosen")}
    data.update(tune=_tuned(out), streams={}, partial=[])
    for name, s in old["streams"].items():
        new = data["streams"][name] = {"protocol": s["protocol"], "source": s["source"]}
        if src := _finished(out / name / "source"):
            new["source_domains"] = _first_round(src[0])
        for arm, folder in FOLDERS.items():
            rs = [r for r in _finished(out / name / folder) if r.seed in seeds and r.monitor]
            rs = [r for r in rs if r.spec.method in METHODS]
            if len(rs) == expected:
                new[arm] = summary(rs)
            elif rs:
                data["partial"].append(f"{name} {arm} ({len(rs)} of {expected})")
    return data


# -- the page ----------------------------------------------------------------------------------


def _gaps(before: Sequence[float], after: Sequence[float]) -> list[float]:
    return [b - a for a, b in zip(before, after, strict=True)]


def _per_seed(gaps: Sequence[float]) -> dict[str, str]:
    """A bar's gaps over seeds: their mean ± std and each seed's."""
    return {"gap": fmt(gaps), "per_seed": ", ".join(f"{g:+.1f}" for g in gaps)}


def _stream_block(name: str, s: dict[str, Any]) -> str:
    """One stream's tables: with and without the guard, per round, with late answers."""
    src, rounds = float(np.mean(s["source"])), len(s["source"])
    cols = ["method", "first round", "last round", "average", "resets", "rounds covered"]
    rows, per_round, late = [], [], []
    for m in METHODS:
        for arm in (a for a in ARMS if a in s):
            x, label = s[arm][m], f"{NAMES[m]}{ARMS[arm]}"
            row = [label, *(fmt(x[k]) for k in ("first", "last", "avg", "resets"))]
            row.append(f"{x['covered'][0]}/{x['covered'][1]}")
            if arm == "delay":
                late.append(row)
                continue
            rows.append([*row, f"{np.mean(x['audits']):.0f}", f"{np.mean(x['hours']):.0f}"])
            if len(x["rounds"][0]) > 1:
                per_round.append([label, *(f"{v:.1f}" for v in np.mean(x["rounds"], axis=0))])
    count = f"{rounds} round{'s' if rounds > 1 else ''}"
    parts = [PAGE("stream", name=name, rounds=count, source=f"{src:.1f}")]
    parts.append(table([*cols, "audits", "audit hours"], rows))
    if per_round:
        r_cols = [f"R{i + 1}" for i in range(len(per_round[0]) - 1)]
        parts += [PAGE("per-round"), table(["method", *r_cols], per_round)]
    if late:
        parts += [PAGE("delay", delay=DELAY), table(cols, late)]
    return "\n\n".join(parts)


def _bar(data: dict[str, Any], hit: int, total: int, widths: list[float]) -> str:
    """The bar's items: the guard on the recurring stream, its cost elsewhere, coverage."""
    rec = data["streams"]["recurring"]
    src = float(np.mean(rec["source"]))
    items = []
    if "guard" not in rec:
        items.append(PAGE("bar-none"))
        rec = {"guard": {m: {"first": [], "last": []} for m in METHODS}}
    t, e = rec["guard"]["tent"], rec["guard"]["eatta"]
    tent_gap, eatta_gap = _gaps(t["first"], t["last"]), _gaps(e["first"], e["last"])
    ok = all(v <= src for v in t["last"]) and all(g <= 5 for g in tent_gap)
    tent = {"last": fmt(t["last"]), "source": f"{src:.1f}", "verdict": verdict(ok)}
    items.append(PAGE("bar-tent", **tent, **_per_seed(tent_gap)))
    ok = all(g <= 2 for g in eatta_gap)
    items.append(PAGE("bar-eatta", verdict=verdict(ok), **_per_seed(eatta_gap)))
    for name in DELAY_STREAMS:
        s = data["streams"][name]
        if "audit" not in s or "guard" not in s:
            items.append(PAGE("bar-stream-none", name=name))
            continue
        cost = _gaps(s["audit"]["eatta-stable"]["avg"], s["guard"]["eatta-stable"]["avg"])
        ok, resets = all(v <= 0.3 for v in cost), fmt(s["guard"]["eatta-stable"]["resets"])
        stream = {"name": name, "cost": fmt(cost, 2), "resets": resets}
        items.append(PAGE("bar-stream", **stream, verdict=verdict(ok)))
    wide = "."
    if widths:
        low, high = f"{min(widths):.1f}", f"{max(widths):.1f}"
        wide = PAGE("widths", mean=f"{np.mean(widths):.1f}", low=low, high=high)
    percent = f"{100 * hit / max(total, 1):.1f}"
    cover = {"hit": hit, "total": total, "percent": percent, "verdict": verdict(hit >= 0.9 * total)}
    return "\n".join([*items, PAGE("bar-coverage", **cover, widths=wide)])


def _resets(data: dict[str, Any]) -> str:
    """When the guard reset on the recurring stream, and why (empty if it never did)."""
    rec = data["streams"].get("recurring", {})
    if rec.get("protocol", {}).get("rounds") != 10 or "guard" not in rec:
        return ""  # a smoke run's short stream, or the guard did not run
    steps = [st for m in METHODS for run in rec["guard"][m].get("reset_steps", []) for st in run]
    if not steps:
        return ""
    rise = gains = ""
    if "audit" in rec:
        runs = [rec["audit"][m]["rounds"] for m in METHODS]
        value = max(float(np.mean([r[1] - r[0] for r in rounds])) for rounds in runs)
        rise = PAGE("resets-rise", rise=f"{value:.1f}")
    if "source_domains" in rec and "guard" in rec:
        per = []
        for j, (dom, src_err) in enumerate(rec["source_domains"]):
            errs = [run[j][1] for m in METHODS for run in rec["guard"][m]["round1_domains"]]
            per.append(f"{dom.split('@')[0]} {src_err - float(np.mean(errs)):.0f}")
        gains = PAGE("resets-gains", gains=", ".join(per))
    batches = data["chosen"]["window"] / (64 * data["chosen"]["share"])
    text = PAGE(
        "resets",
        count=len(steps),
        early=sum(st <= 450 for st in steps),
        rise=rise,
        gains=gains,
        steps=", ".join(str(st) for st in sorted(steps)),
        batches=f"{batches:.0f}",
        corruptions=f"{batches / 15:.0f}",
    )
    return text + "\n\n"


def _compute() -> str:
    """The step benchmark's cost of audits, if it has been measured."""
    if (bench := load_json(RESULTS / "step_benchmark_cpu_audit.json")) is None:
        return ""
    rows = []
    for model, r in bench["models"].items():
        tr, mr = r.get("time_ratios", {}), r.get("memory_ratios", {})
        for key in (k for k in ("tent+audit/tent", "eatta+audit/eatta") if k in tr):
            mem = mr.get(key)
            time_text = f"{tr[key]['median']:.3f} (paired {tr[key]['paired']:.3f})"
            rows.append([model, key, time_text, "-" if mem is None else f"{mem:.3f}"])
    return PAGE("compute", table=table(["model", "ratio", "time", "peak memory"], rows)) + "\n\n"


def _false_resets(data: dict[str, Any]) -> dict[str, Any]:
    """The page's table and counts of resets with no degradation and degradations with none."""
    rows = []
    counts = dict.fromkeys(("false_resets", "runs_nd", "missed", "runs_d"), 0)
    for name, s in data["streams"].items():
        srcv = float(np.mean(s["source"]))
        if "audit" not in s or "guard" not in s:
            continue
        for m in METHODS:
            a, g = s["audit"][m], s["guard"][m]
            deg = 0
            for first, last, resets in zip(a["first"], a["last"], g["resets"], strict=True):
                if last > first + 1 or last > srcv:
                    deg += 1
                    counts["runs_d"] += 1
                    counts["missed"] += int(resets == 0)
                else:
                    counts["runs_nd"] += 1
                    counts["false_resets"] += int(resets > 0)
            rows.append([f"{name}: {NAMES[m]}", f"{deg}/{len(a['first'])}", fmt(g["resets"])])
    cols = ["stream: method", "seeds where it degrades", "resets per guarded run"]
    return {"false_table": table(cols, rows), **counts}


def _missing(data: dict[str, Any]) -> str:
    """The Limits item naming the arms that did not finish ("" when all did)."""
    missing = [
        f"{name} {arm}"
        for name, s in data["streams"].items()
        for arm in ("audit", "guard", *(("delay",) if name in DELAY_STREAMS else ()))
        if arm not in s
    ]
    if not missing:
        return ""
    partial = data.get("partial") or []
    runs = PAGE("partial", runs=", ".join(partial)) if partial else ""
    return PAGE("missing", missing=", ".join(missing), partial=runs)


def render(data: dict[str, Any]) -> str:
    """docs/guard.md: ``templates/guard.md`` filled from the study's numbers (and
    ``data["coverage"]``, ``data["false_resets"]`` set on the way)."""
    c = data["chosen"]
    rows = []
    for key, t in data["tune"].items():
        runs = [
            f"{t[m]['first'][0]:.1f} → {t[m]['last'][0]:.1f} ({t[m]['resets'][0]} resets)"
            for m in TUNE_METHODS
        ]
        rows.append([key, *runs, f"{np.mean([t[m]['hours'][0] for m in TUNE_METHODS]):.0f}"])
    cols = ["audit share, guard level, block", "TENT R1 → R10", "eatta R1 → R10", "audit hours"]
    arms = [x for s in data["streams"].values() for a in ARMS for x in s.get(a, {}).values()]
    hit, total = sum(x["covered"][0] for x in arms), sum(x["covered"][1] for x in arms)
    data["coverage"] = [hit, total]
    widths = [w for x in arms for w in x.get("widths", [])]
    false_resets = _false_resets(data)
    data["false_resets"] = [false_resets["false_resets"], false_resets["runs_nd"]]
    late = [x for st in data["streams"].values() for x in st.get("delay", {}).values()]
    return PAGE(
        seeds=",".join(map(str, data["seeds"])),
        tune_seed=data["tune_seed"],
        tune_table=table(cols, rows),
        key=c["key"],
        share=f"{c['share']:g}",
        level=f"{c['level']:g}",
        window=c["window"],
        streams="\n\n".join(_stream_block(n, s) for n, s in data["streams"].items()),
        bar=_bar(data, hit, total, widths),
        resets=_resets(data),
        per_batch=f"{64 * c['share']:.1f}",
        compute=_compute(),
        **false_resets,
        answers=f"{64 * c['share']:.0f}",
        no_reset="" if any(sum(x["resets"]) for x in late) else PAGE("no-reset"),
        missing=_missing(data),
    )


def main(argv: list[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/guard-study")
    p.add_argument("--quick", action="store_true", help="smoke run: short streams, no docs")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        data = saved(args.out, STREAM_NAMES, JSON)
        data = collect(out, data) if out.is_dir() else data
    else:
        data = study(out, args.seeds, args.quick)
    text = render(data)
    if args.quick:
        print(text)
        return 0
    JSON.write_text(json.dumps(data, indent=1))
    DOC.write_text(text)
    print(f"wrote {JSON} and {DOC}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
