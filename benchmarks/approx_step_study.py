#!/usr/bin/env python
"""The approximate EATTA step against the exact one (issue 32): accuracy study, docs page.

``eatta`` and ``eatta-stable`` run with ``grad_mode="auto"`` (exact) and ``"approx"`` (one
backward pass, :data:`APPROX`) on four digits-C streams, one label per batch: ``recurring`` (3
of the main job's 10 rounds; the tuning stream, where ``approx_proxy_study.py`` chose the
estimate), ``mixed`` (2 rounds), ``ccc`` (slow, 5 rounds) and ``dirichlet`` (δ = 0.1, 2 rounds).
Per stream and method the approximate step is "within" when its average error differs from the
exact one's by at most the larger of the seed standard deviations and 0.5 points. Every run is
a cell under ``--out`` (read back when finished). ``docs/approx-step.md`` is rendered from the
runs, ``approx_proxy_study.json`` (fidelity) and ``step_benchmark_cpu.json`` (cost).

    python benchmarks/approx_step_study.py --out runs/approx-step        # runs, then the page
    python benchmarks/approx_step_study.py --out runs/approx-step --report-only
    python benchmarks/approx_step_study.py --quick --out runs/approx-quick  # smoke run, no page
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, Template, run_part, save_study, streams
from _common import fmt_mean_std as fmt
from _common import markdown_table as table

from eatta.bench import StreamProtocol
from eatta.bench.flags import seed_list

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "approx-step.md"
DATA = RESULTS / "approx_step_study.json"
METHODS = ("eatta", "eatta-stable")
#: The approximate step's settings, chosen on the tuning stream (see the module docstring).
APPROX: dict[str, Any] = {
    "grad_mode": "approx",
    "approx_proxy": "last-norm",
    "approx_refresh": None,
}
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


def study_streams(quick: bool) -> dict[str, StreamProtocol]:
    """The study's streams (``quick``: CCC and recurring, short)."""
    if quick:
        return streams("ccc", "recurring", quick=True)
    return streams(*STREAM_NAMES, recurring=StreamProtocol(rounds=RECURRING_ROUNDS))


def study(out: Path, seeds: list[int], quick: bool, only: Sequence[str] = ()) -> dict[str, Any]:
    """Every stream, seed by seed (exact, then approximate), saved after each pair, so a cut
    study still pairs its seeds."""
    data: dict[str, Any] = {"seeds": seeds, "approx": APPROX, "tune_stream": TUNE_STREAM}
    data["streams"] = {}
    for name, proto in study_streams(quick).items():
        if only and name not in only:
            continue
        print(f"stream {name}: {proto.describe()}", flush=True)
        s: dict[str, Any] = {"protocol": proto.describe(), "seeds": []}
        for mode in MODES:
            s[mode] = {m: {"average": [], "last": [], "cpu_s": []} for m in METHODS}
        data["streams"][name] = s
        for seed in seeds:
            for mode, hp in MODES.items():
                hparams = {m: dict(hp) for m in METHODS}
                res = run_part(out / name, mode, proto, METHODS, [seed], hparams=hparams)
                for m in METHODS:
                    mine = sorted((r for r in res if r.spec.method == m), key=lambda r: r.seed)
                    s[mode][m]["average"] += [float(r.average_error) for r in mine]
                    s[mode][m]["last"] += [r.round_errors[-1] for r in mine]
                    s[mode][m]["cpu_s"] += [float(r.cpu_time_s) for r in mine]
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
            out[name][m] = {
                "diff": diff,
                "tolerance": tol,
                "within": abs(diff) <= tol,
                "paired": paired,
            }
    return out


def _ratio(ratios: dict[str, Any], key: str) -> str:
    r = ratios.get(key)
    return "-" if r is None else f"{r['median']:.2f}x"


def cost_table(bench: dict[str, Any]) -> str:
    """``step_benchmark.py``'s ratios to TENT per model and each model's verdict on the bar."""
    rows, verdicts = [], []
    nan = float("nan")
    for model, res in bench["models"].items():
        t, mem = res["time_ratios"], res.get("memory_ratios", {})
        lat = res.get("latency", {}).get("eatta-approx", {})
        rows.append(
            [model, *(_ratio(t, f"{k}/tent") for k in ("eatta", "eatta-approx", "eatta-no-gnd"))]
            + [f"{mem.get(f'{k}/tent', nan):.3f}" for k in ("eatta", "eatta-approx")]
            + [f"{lat.get('p50_ms', nan):.1f} / {lat.get('p99_ms', nan):.1f}"]
        )
        ta, ma = t.get("eatta-approx/tent"), mem.get("eatta-approx/tent")
        if ta is not None and ma is not None:
            time_met, memory_met = ta["median"] <= TIME_BAR, ma <= MEMORY_BAR
            verdicts.append(
                TEMPLATE(
                    "cost-verdict",
                    model=model,
                    time="met" if time_met else "missed",
                    time_ratio=f"{ta['median']:.2f}",
                    memory="met" if memory_met else "missed",
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


def fidelity_table(fid: dict[str, Any], model: str, keep: Sequence[str]) -> str:
    res = fid["models"][model]["agreement"]
    keys = ("corr", "bias", "mae", "gamma_corr", "gamma_bias")
    rows = [
        [name, *(f"{res[name][k]:+.3f}" if "bias" in k else f"{res[name][k]:.3f}" for k in keys)]
        for name in keep
    ]
    head = ["estimate", "corr(r)", "bias(r)", "MAE(r)", "corr(EMA γ_sup)", "bias(EMA γ_sup)"]
    return table(head, rows)


def accuracy_table(data: dict[str, Any], ver: dict[str, Any]) -> str:
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
            verdict = "within" if v["within"] else "**outside**"
            cells = [*errors, f"{v['diff']:+.2f}", per_seed, f"{v['tolerance']:.2f}", verdict]
            rows.append([f"{label}: `{m}`", *cells])
    head = ["stream: method", "exact", "approx", "approx - exact", "per seed", "tolerance"]
    return table([*head, "verdict"], rows)


def history_table(hist: dict[str, Any]) -> str:
    """``step_history.py``'s exact-step/TENT medians per revision, threads and kernels."""
    rows = []
    names = {v: k for k, v in hist["revs"].items()}
    for key, v in hist["summary"].items():
        rev, threads, kernels = key.split()
        rows.append(
            [f"{rev} ({names.get(rev, rev)})", threads.removeprefix("t"), kernels]
            + [f"{v[m]['ratio_median']:.2f}x" for m in ("digits-32", "resnet18-64")]
        )
    return table(["revision", "threads", "kernels", "digits-32", "resnet18-64"], rows)


def _best(fid: dict[str, Any], model: str) -> str:
    """The candidate whose EMA weight correlates best with the exact one (exact itself aside)."""
    res = {k: v for k, v in fid["models"][model]["agreement"].items() if not k.startswith("_")}
    res.pop("exact", None)
    name = max(res, key=lambda k: -1 if math.isnan(res[k]["gamma_corr"]) else res[k]["gamma_corr"])
    return f"`{name}` ({res[name]['gamma_corr']:.3f})"


def _history_section(hist: dict[str, Any]) -> str:
    """The revisions' table and what it says: the newest revision's ratios against the oldest's."""
    keys = list(hist["summary"])
    old, new = hist["summary"][keys[0]], hist["summary"][keys[-1]]
    diffs = ", ".join(
        f"{m} {new[m]['ratio_median']:.2f}x against {old[m]['ratio_median']:.2f}x" for m in old
    )
    worse = any(new[m]["ratio_median"] > old[m]["ratio_median"] for m in old)
    old_ratio = f"{old['resnet18-64']['ratio_median']:.2f}"
    verdict = TEMPLATE("slower") if worse else TEMPLATE("not-slower", old_ratio=old_ratio)
    finding = TEMPLATE(
        "finding", new=keys[-1].split()[0], old=keys[0].split()[0], diffs=diffs, verdict=verdict
    )
    rounds, repeats = hist["rounds"], hist["repeats"]
    return (
        TEMPLATE(
            "history", table=history_table(hist), rounds=rounds, repeats=repeats, finding=finding
        )
        + "\n"
    )


def render(data: dict[str, Any]) -> str:
    fid = json.loads((RESULTS / "approx_proxy_study.json").read_text())
    bench = json.loads((RESULTS / "step_benchmark_cpu.json").read_text())
    ver = verdicts(data)
    complete = set(ver) == set(STREAM_NAMES) and all(
        s["seeds"] == data["seeds"] for s in data["streams"].values()
    )
    everywhere = complete and all(v["within"] for s in ver.values() for v in s.values())
    seeds = data["seeds"]
    cases = "; ".join(
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
    )
    decision = (
        TEMPLATE("everywhere")
        if everywhere
        else TEMPLATE("outside", cases=cases)
        if complete
        else TEMPLATE("incomplete")
    )
    approx_hp = ", ".join(f"{k}={v!r}" for k, v in APPROX.items())
    hist_path = RESULTS / "step_history.json"
    hist = json.loads(hist_path.read_text()) if hist_path.is_file() else None
    return TEMPLATE(
        cost=cost_table(bench),
        fid_digits=fidelity_table(fid, "digits-32", FIDELITY_ROWS),
        fid_resnet=fidelity_table(fid, "resnet18-64", FIDELITY_ROWS),
        digits_steps=int(fid["models"]["digits-32"]["agreement"]["_steps"]["with_confident_set"]),
        resnet_steps=int(fid["models"]["resnet18-64"]["agreement"]["_steps"]["with_confident_set"]),
        accuracy=accuracy_table(data, ver),
        seeds=f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0]),
        decision=decision,
        approx_hp=approx_hp,
        tune=data["tune_stream"],
        best_digits=_best(fid, "digits-32"),
        best_resnet=_best(fid, "resnet18-64"),
        history="" if hist is None else _history_section(hist),
    )


TEMPLATE = Template("approx_step")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "approx-step")
    p.add_argument("--seeds", type=seed_list, default="0,1,2")
    p.add_argument("--quick", action="store_true", help="short streams, 2 seeds, no page")
    p.add_argument("--report-only", action="store_true", help="render from --out/study.json")
    p.add_argument("--streams", nargs="+", default=(), help="run only these streams")
    args = p.parse_args(argv)
    seeds = args.seeds[:2] if args.quick else args.seeds
    if args.report_only:
        data = json.loads((args.out / "study.json").read_text())
    else:
        data = study(args.out, seeds, args.quick, args.streams)
    if args.quick:
        print(json.dumps(verdicts(data), indent=1))
        return 0
    DATA.write_text(json.dumps({**data, "verdicts": verdicts(data)}, indent=1) + "\n")
    PAGE.write_text(render(data), encoding="utf-8")
    print(f"wrote {DATA} and {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
