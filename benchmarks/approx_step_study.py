#!/usr/bin/env python
"""The approximate EATTA step against the exact one (issue 32): accuracy study, docs page.

``eatta`` and ``eatta-stable`` with the exact step and the approximate one (:data:`APPROX`) on
four digits-C streams, one label per batch: ``recurring`` (3 rounds; the tuning stream, where
``approx_proxy_study.py`` chose the estimate), ``mixed``, ``ccc`` and ``dirichlet``. The
approximate step is "within" where the average errors differ by at most the larger of the seed
standard deviations and 0.5 points. ``docs/approx-step.md`` is rendered from the runs (cells
under ``--out``), ``approx_proxy_study.json`` (fidelity) and ``step_benchmark_cpu.json`` (cost).

    python benchmarks/approx_step_study.py --out runs/approx-step        # runs, then the page
    python benchmarks/approx_step_study.py --report-only  # from --out, else the committed JSON
    python benchmarks/approx_step_study.py --quick --out runs/approx-quick  # smoke run, no page
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    RESULTS,
    Template,
    load_json,
    run_part,
    save_study,
    streams,
    study_parser,
    write_json,
)
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from _study import saved, verdict
from approx_proxy_study import estimates, fidelity_table

from eatta.bench import StreamProtocol

PAGE = Path(__file__).resolve().parent.parent / "docs" / "approx-step.md"
DATA = RESULTS / "approx_step_study.json"
METHODS = ("eatta", "eatta-stable")
#: The approximate step's settings, chosen on the tuning stream (see the module docstring).
APPROX = {"grad_mode": "approx", "approx_proxy": "last-norm", "approx_refresh": None}
#: Each mode's hyperparameters, in the order the study runs them.
MODES: dict[str, dict[str, Any]] = {"exact": {"grad_mode": "auto"}, "approx": APPROX}
TUNE_STREAM = "recurring"
#: Rounds of the recurring stream: 3 of the main job's 10, cut so the study fit one session on a
#: shared 2-core machine (each 10-round run took about 5 minutes there).
RECURRING_ROUNDS = 3
#: Issue 32's cost bar: the approximate step's time and peak memory over TENT's.
TIME_BAR = 1.10
MEMORY_BAR = 1.05
#: A difference within this many points (or the seed spread, if larger) is no difference.
MIN_TOLERANCE = 0.5
#: The estimates whose fidelity the page shows.
FIDELITY_ROWS = ("last-norm", "head", "stale-16", "last-norm+refresh-16", "head+refresh-16")
FIDELITY_ROWS += ("last-norm+refresh-64",)
#: The streams, the short ones first (the 10-round tuning stream takes as long as the three
#: others together, so on a shared machine it runs last, seed by seed).
STREAM_NAMES = ("ccc", "mixed", "dirichlet", "recurring")
TEMPLATE = Template("approx_step")


def study(out: Path, seeds: list[int], quick: bool, only: Sequence[str] = ()) -> dict[str, Any]:
    """Every stream (``quick``: CCC and recurring, short), seed by seed (exact, then
    approximate), saved after each pair, so a cut study still pairs its seeds."""
    if quick:
        protocols = streams("ccc", "recurring", quick=True)
    else:
        protocols = streams(*STREAM_NAMES, recurring=StreamProtocol(rounds=RECURRING_ROUNDS))
    data = {"seeds": seeds, "approx": APPROX, "tune_stream": TUNE_STREAM, "streams": {}}
    for name, proto in protocols.items():
        if only and name not in only:
            continue
        print(f"stream {name}: {proto.describe()}", flush=True)
        s = data["streams"][name] = {"protocol": proto.describe(), "seeds": []}
        for mode in MODES:
            s[mode] = {m: {"average": [], "last": [], "cpu_s": []} for m in METHODS}
        for seed in seeds:
            for mode, hp in MODES.items():
                hparams = {m: dict(hp) for m in METHODS}
                res = run_part(out / name, mode, proto, METHODS, [seed], hparams=hparams)
                for r in res:
                    got = s[mode][r.spec.method]
                    got["average"].append(float(r.average_error))
                    got["last"].append(r.round_errors[-1])
                    got["cpu_s"].append(float(r.cpu_time_s))
            s["seeds"].append(seed)
            save_study(out, data)
    return data


def _sd(v: Sequence[float]) -> float:
    return statistics.stdev(v) if len(v) > 1 else 0.0


def verdicts(data: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per stream and method: the difference approx - exact, the tolerance, within or not."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, s in data["streams"].items():
        if not s["seeds"]:
            continue
        out[name] = {}
        for m in METHODS:
            e, a = s["exact"][m]["average"], s["approx"][m]["average"]
            diff = statistics.fmean(a) - statistics.fmean(e)
            tol = max(_sd(e), _sd(a), MIN_TOLERANCE)
            paired = [x - y for x, y in zip(a, e, strict=True)]
            within = abs(diff) <= tol
            out[name][m] = {"diff": diff, "tolerance": tol, "within": within, "paired": paired}
    return out


def cost_table(bench: dict[str, Any]) -> str:
    """``step_benchmark.py``'s ratios to TENT per model and each model's verdict on the bar."""
    rows, verdicts = [], []
    nan = float("nan")
    for model, res in bench["models"].items():
        t, mem = res["time_ratios"], res.get("memory_ratios", {})
        lat = res.get("latency", {}).get("eatta-approx", {})
        times = [t.get(f"{k}/tent") for k in ("eatta", "eatta-approx", "eatta-no-gnd")]
        rows.append(
            [model, *("-" if r is None else f"{r['median']:.2f}x" for r in times)]
            + [f"{mem.get(f'{k}/tent', nan):.3f}" for k in ("eatta", "eatta-approx")]
            + [f"{lat.get('p50_ms', nan):.1f} / {lat.get('p99_ms', nan):.1f}"]
        )
        ta, ma = t.get("eatta-approx/tent"), mem.get("eatta-approx/tent")
        if ta is not None and ma is not None:
            verdicts.append(
                TEMPLATE(
                    "cost-verdict",
                    model=model,
                    time=verdict(ta["median"] <= TIME_BAR),
                    time_ratio=f"{ta['median']:.2f}",
                    memory=verdict(ma <= MEMORY_BAR),
                    memory_ratio=f"{ma:.3f}",
                )
            )
    head = ["model", *(f"{k} / TENT (time)" for k in ("exact", "approx", "no GND"))]
    head += [f"{k} / TENT (peak mem)" for k in ("exact", "approx")] + ["approx p50 / p99 ms"]
    return TEMPLATE(
        "cost",
        table=table(head, rows),
        time_bar=f"{TIME_BAR:.2f}",
        memory_bar=f"{MEMORY_BAR:.2f}",
        verdicts="; ".join(verdicts),
        load=bench["meta"].get("loadavg_start"),
    )


def accuracy_table(data: dict[str, Any], ver: dict[str, Any]) -> str:
    """Per stream and method: each mode's error, their difference and its verdict."""
    rows = []
    for name, s in data["streams"].items():
        if name not in ver:
            continue
        label = f"{name} (tuning)" if name == data["tune_stream"] else name
        label += f", seeds {','.join(map(str, s['seeds']))}"
        for m in METHODS:
            v = ver[name][m]
            errors = [fmt(s[mode][m]["average"]) for mode in MODES]
            per_seed = " / ".join(f"{d:+.2f}" for d in v["paired"])
            within = "within" if v["within"] else "**outside**"
            cells = [*errors, f"{v['diff']:+.2f}", per_seed, f"{v['tolerance']:.2f}", within]
            rows.append([f"{label}: `{m}`", *cells])
    head = ["stream: method", "exact", "approx", "approx - exact", "per seed", "tolerance"]
    return table([*head, "verdict"], rows)


def history_section(hist: dict[str, Any]) -> str:
    """``step_history.py``'s exact-step/TENT medians per revision, threads and kernels, and
    what they say: the newest revision's ratios against the oldest's."""
    rows = []
    names = {v: k for k, v in hist["revs"].items()}
    for key, v in hist["summary"].items():
        rev, threads, kernels = key.split()
        rows.append(
            [f"{rev} ({names.get(rev, rev)})", threads.removeprefix("t"), kernels]
            + [f"{v[m]['ratio_median']:.2f}x" for m in ("digits-32", "resnet18-64")]
        )
    keys = list(hist["summary"])
    old, new = hist["summary"][keys[0]], hist["summary"][keys[-1]]
    diffs = ", ".join(
        f"{m} {new[m]['ratio_median']:.2f}x against {old[m]['ratio_median']:.2f}x" for m in old
    )
    if any(new[m]["ratio_median"] > old[m]["ratio_median"] for m in old):
        said = TEMPLATE("slower")
    else:
        said = TEMPLATE("not-slower", old_ratio=f"{old['resnet18-64']['ratio_median']:.2f}")
    finding = TEMPLATE(
        "finding", new=keys[-1].split()[0], old=keys[0].split()[0], diffs=diffs, verdict=said
    )
    head = ["revision", "threads", "kernels", "digits-32", "resnet18-64"]
    section = TEMPLATE(
        "history",
        table=table(head, rows),
        rounds=hist["rounds"],
        repeats=hist["repeats"],
        finding=finding,
    )
    return section + "\n"


def _best(agreement: dict[str, Any]) -> str:
    """The candidate whose EMA weight correlates best with the exact one (exact itself aside)."""
    corr = {k: agreement[k]["gamma_corr"] for k in estimates(agreement)}
    name = max(corr, key=lambda k: -1 if math.isnan(corr[k]) else corr[k])
    return f"`{name}` ({corr[name]:.3f})"


def render(data: dict[str, Any]) -> str:
    """The page from the study and the committed fidelity, cost and history results."""
    models = load_json(RESULTS / "approx_proxy_study.json")["models"]
    fid = {k: v["agreement"] for k, v in models.items()}
    ver = verdicts(data)
    complete = set(ver) == set(STREAM_NAMES) and all(
        s["seeds"] == data["seeds"] for s in data["streams"].values()
    )
    if not complete:
        decision = TEMPLATE("incomplete")
    elif all(v["within"] for s in ver.values() for v in s.values()):
        decision = TEMPLATE("everywhere")
    else:
        cases = [
            TEMPLATE(
                "case",
                method=m,
                stream=name,
                diff=f"{v['diff']:+.2f}",
                direction="lower error" if v["diff"] < 0 else "higher error",
                tolerance=f"{v['tolerance']:.2f}",
            )
            for name, rows in ver.items()
            for m, v in rows.items()
            if not v["within"]
        ]
        decision = TEMPLATE("outside", cases="; ".join(cases))
    seeds = data["seeds"]
    hist = load_json(RESULTS / "step_history.json")
    return TEMPLATE(
        cost=cost_table(load_json(RESULTS / "step_benchmark_cpu.json")),
        fid_digits=fidelity_table(fid["digits-32"], FIDELITY_ROWS),
        fid_resnet=fidelity_table(fid["resnet18-64"], FIDELITY_ROWS),
        digits_steps=int(fid["digits-32"]["_steps"]["with_confident_set"]),
        resnet_steps=int(fid["resnet18-64"]["_steps"]["with_confident_set"]),
        accuracy=accuracy_table(data, ver),
        seeds=f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0]),
        decision=decision,
        approx_hp=", ".join(f"{k}={v!r}" for k, v in APPROX.items()),
        tune=data["tune_stream"],
        best_digits=_best(fid["digits-32"]),
        best_resnet=_best(fid["resnet18-64"]),
        history="" if hist is None else history_section(hist),
    )


def main(argv: list[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/approx-step")
    p.add_argument("--quick", action="store_true", help="short streams, 2 seeds, no page")
    p.add_argument("--streams", nargs="+", default=(), help="run only these streams")
    args = p.parse_args(argv)
    if args.report_only:
        data = saved(args.out, STREAM_NAMES, DATA)
    else:
        seeds = args.seeds[:2] if args.quick else args.seeds
        data = study(Path(args.out), seeds, args.quick, args.streams)
    if args.quick:
        print(json.dumps(verdicts(data), indent=1))
        return 0
    write_json(DATA, {**data, "verdicts": verdicts(data)})
    PAGE.write_text(render(data), encoding="utf-8")
    print(f"wrote {DATA} and {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
