"""Render ``summary.md`` from the benchmark JSON files found in a results folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _common

ORDER = (
    "inference",
    "tent",
    "eatta",
    "eatta-async-0",
    "eatta-two-pass",
    "eatta-batched",
    "eatta-approx",
    "eatta-no-gnd",
    "reference-style",
    "two-backward floor",
)


PAGE = _common.Template("summary")


def _f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _meta_line(meta: dict[str, Any]) -> str:
    load = f"load average {meta.get('loadavg_start')} → {meta.get('loadavg_end')}"
    dev = meta.get("gpu") or meta.get("cpu")
    return (
        f"{meta.get('date')}, torch {meta.get('torch')}, {dev} ({meta.get('cpu_count')} cores), "
        f"{meta.get('torch_threads')} torch threads, {load}; `{meta.get('command')}`"
    )


def _step_section(data: dict[str, Any]) -> list[str]:
    meta = data["meta"]
    tag = f", {meta['tag']}" if meta.get("tag") else ""
    env = meta.get("malloc_env") or {}
    head = PAGE(
        "step",
        device=meta["device"],
        tag=tag,
        machine=_meta_line(meta) + (PAGE("environment", env=env) if env else ""),
        repeats=meta["repeats"],
        warmup=meta["warmup"],
        memory=meta["memory_method"],
    )
    lines = [
        *head.split("\n"),
        "",
        "| model | EATTA / TENT time | approx / TENT time | reference-style / TENT time "
        "| two-backward floor / TENT | EATTA / TENT peak memory | approx / TENT peak memory "
        "| EATTA two-pass / TENT peak memory | reference-style / TENT peak memory |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, res in data["models"].items():
        tr, mr = res["time_ratios"], res.get("memory_ratios", {})

        def t3(key: str, tr: dict[str, Any] = tr) -> str:
            r = tr.get(key)
            return "–" if r is None else f"{r['median']:.2f} ({r['paired']:.2f} / {r['min']:.2f})"

        lines.append(
            f"| {name} b{res['batch']} | {t3('eatta/tent')} | {t3('eatta-approx/tent')} "
            f"| {t3('reference-style/tent')} "
            f"| {t3('two-backward floor/tent')} | {_f(mr.get('eatta/tent'))} "
            f"| {_f(mr.get('eatta-approx/tent'))} "
            f"| {_f(mr.get('eatta-two-pass/tent'))} | {_f(mr.get('reference-style/tent'))} |"
        )
    for name, res in data["models"].items():
        lines += [
            "",
            f"### {name}, batch {res['batch']}, {res['resolution']} px, "
            f"{res['num_classes']} classes",
            "",
            "| variant | median ms | min ms | IQR ms | × inference | × TENT | peak MB "
            "| × TENT memory | page faults |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        v = res["variants"]
        inf, tent = v["inference"]["median_ms"], v["tent"]["median_ms"]
        tent_mb = v["tent"].get("peak_mb")
        for key in [k for k in ORDER if k in v] + [k for k in v if k not in ORDER]:
            s = v[key]
            mb = s.get("peak_mb")
            lines.append(
                f"| {key} | {s['median_ms']:.1f} | {s['min_ms']:.1f} "
                f"| {s['q1_ms']:.1f}–{s['q3_ms']:.1f} | {s['median_ms'] / inf:.2f} "
                f"| {s['median_ms'] / tent:.2f} | {_f(mb, 1)} "
                f"| {_f(None if mb is None or not tent_mb else mb / tent_mb)} "
                f"| {s.get('minor_faults_median', '–')} |"
            )
        lat = res.get("latency", {})
        if lat:
            shown = ", ".join(f"{k} {v['p50_ms']:.1f} / {v['p99_ms']:.1f}" for k, v in lat.items())
            lines += ["", PAGE("latency", repeats=meta["repeats"], shown=shown)]
        par = res.get("parity_max_abs_diff", {})
        if par:
            shown = ", ".join(f"{k} {val:.1e}" for k, val in par.items())
            lines += ["", PAGE("parity", shown=shown)]
        prof = res.get("profile")
        if prof:
            lines += _profile_table(prof)
    growth = data.get("growth")
    if growth:
        lines += [
            "",
            f"### Growth ({growth['model']})",
            "",
            "| batch | labels | EATTA ms | TENT ms | EATTA ms / image | EATTA / TENT |",
            "|---|---|---|---|---|---|",
        ]
        for row in growth["batch_size"] + growth["labels"]:
            lines.append(
                f"| {row['batch']} | {row['labels']} | {row['eatta_median_ms']:.1f} "
                f"| {row['tent_median_ms']:.1f} | {row['eatta_ms_per_image']:.2f} "
                f"| {row['ratio']:.2f} ({row['ratio_paired']:.2f} / {row['ratio_min']:.2f}) |"
            )
    return lines


def _profile_table(prof: dict[str, Any]) -> list[str]:
    names = list(prof)
    cats: list[str] = []
    for n in names:
        cats += [c for c in prof[n]["categories_ms"] if c not in cats]
    lines = [
        "",
        PAGE("profile"),
        "",
        "| category | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for c in cats:
        row = " | ".join(_f(prof[n]["categories_ms"].get(c), 1) for n in names)
        lines.append(f"| {c} | {row} |")
    lines.append("| total | " + " | ".join(_f(prof[n]["total_ms"], 1) for n in names) + " |")
    return lines


def _loader_section(data: dict[str, Any]) -> list[str]:
    meta = data["meta"]
    head = PAGE(
        "loader",
        machine=_meta_line(meta),
        images=data["images"],
        size=data["image_size"],
        kb=f"{data['mean_file_kb']:.0f}",
        batch=data["batch"],
    )
    lines = [
        *head.split("\n"),
        "",
        "| loader | images/s | first epoch images/s |",
        "|---|---|---|",
    ]
    for row in data["loaders"]:
        lines.append(
            f"| {row['name']} | {row['images_per_s']:.0f} | {row['first_epoch_images_per_s']:.0f} |"
        )
    lines += ["", "| step | images/s |", "|---|---|"]
    for row in data["steps"]:
        lines.append(f"| {row['name']} | {row['images_per_s']:.1f} |")
    if data.get("notes"):
        lines += ["", *data["notes"]]
    return lines


def render(folder: Path) -> Path:
    """Write ``folder/summary.md`` from ``step_benchmark_*.json`` and ``loader_benchmark*.json``."""
    lines = [*PAGE().split("\n")]
    for path in sorted(folder.glob("step_benchmark_*.json")):
        data = _common.load_json(path)
        if data:
            lines += [*_step_section(data), ""]
    for path in sorted(folder.glob("loader_benchmark*.json")):
        data = _common.load_json(path)
        if data:
            lines += [*_loader_section(data), ""]
    out = folder / "summary.md"
    out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return out
