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


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return _common.markdown_table(header, rows, left=True).split("\n")


def _step_section(data: dict[str, Any]) -> list[str]:
    meta = data["meta"]
    env = meta.get("malloc_env") or {}
    head = PAGE(
        "step",
        device=meta["device"],
        tag=f", {meta['tag']}" if meta.get("tag") else "",
        machine=_meta_line(meta) + (PAGE("environment", env=env) if env else ""),
        repeats=meta["repeats"],
        warmup=meta["warmup"],
        memory=meta["memory_method"],
    )
    times = ("eatta", "eatta-approx", "reference-style", "two-backward floor")
    memories = ("eatta", "eatta-approx", "eatta-two-pass", "reference-style")
    header = ["model", "EATTA / TENT time", "approx / TENT time", "reference-style / TENT time"]
    header += ["two-backward floor / TENT", "EATTA / TENT peak memory"]
    header += ["approx / TENT peak memory", "EATTA two-pass / TENT peak memory"]
    header += ["reference-style / TENT peak memory"]
    rows = []
    for name, res in data["models"].items():
        tr, mr = res["time_ratios"], res.get("memory_ratios", {})
        t3 = [tr.get(f"{k}/tent") for k in times]
        rows.append(
            [f"{name} b{res['batch']}"]
            + [
                "–" if r is None else f"{r['median']:.2f} ({r['paired']:.2f} / {r['min']:.2f})"
                for r in t3
            ]
            + [_f(mr.get(f"{k}/tent")) for k in memories]
        )
    lines = [*head.split("\n"), "", *_table(header, rows)]
    for name, res in data["models"].items():
        v = res["variants"]
        inf, tent = v["inference"]["median_ms"], v["tent"]["median_ms"]
        tent_mb = v["tent"].get("peak_mb")
        rows = []
        for key in [k for k in ORDER if k in v] + [k for k in v if k not in ORDER]:
            s, mb = v[key], v[key].get("peak_mb")
            rows.append(
                [
                    key,
                    f"{s['median_ms']:.1f}",
                    f"{s['min_ms']:.1f}",
                    f"{s['q1_ms']:.1f}–{s['q3_ms']:.1f}",
                    f"{s['median_ms'] / inf:.2f}",
                    f"{s['median_ms'] / tent:.2f}",
                    _f(mb, 1),
                    _f(None if mb is None or not tent_mb else mb / tent_mb),
                    s.get("minor_faults_median", "–"),
                ]
            )
        header = ["variant", "median ms", "min ms", "IQR ms", "× inference", "× TENT", "peak MB"]
        lines += ["", f"### {name}, batch {res['batch']}, {res['resolution']} px, "
                  f"{res['num_classes']} classes", ""]  # fmt: skip
        lines += _table([*header, "× TENT memory", "page faults"], rows)
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
            names = list(prof)
            cats = list(dict.fromkeys(c for n in names for c in prof[n]["categories_ms"]))
            rows = [[c, *(_f(prof[n]["categories_ms"].get(c), 1) for n in names)] for c in cats]
            rows.append(["total", *(_f(prof[n]["total_ms"], 1) for n in names)])
            lines += ["", PAGE("profile"), "", *_table(["category", *names], rows)]
    growth = data.get("growth")
    if growth:
        header = ["batch", "labels", "EATTA ms", "TENT ms", "EATTA ms / image", "EATTA / TENT"]
        rows = [
            [
                row["batch"],
                row["labels"],
                f"{row['eatta_median_ms']:.1f}",
                f"{row['tent_median_ms']:.1f}",
                f"{row['eatta_ms_per_image']:.2f}",
                f"{row['ratio']:.2f} ({row['ratio_paired']:.2f} / {row['ratio_min']:.2f})",
            ]
            for row in growth["batch_size"] + growth["labels"]
        ]
        lines += ["", f"### Growth ({growth['model']})", "", *_table(header, rows)]
    return lines


def _loader_section(data: dict[str, Any]) -> list[str]:
    head = PAGE(
        "loader",
        machine=_meta_line(data["meta"]),
        images=data["images"],
        size=data["image_size"],
        kb=f"{data['mean_file_kb']:.0f}",
        batch=data["batch"],
    )
    rows = [
        [r["name"], f"{r['images_per_s']:.0f}", f"{r['first_epoch_images_per_s']:.0f}"]
        for r in data["loaders"]
    ]
    lines = [*head.split("\n"), "", *_table(["loader", "images/s", "first epoch images/s"], rows)]
    steps = [[r["name"], f"{r['images_per_s']:.1f}"] for r in data["steps"]]
    lines += ["", *_table(["step", "images/s"], steps)]
    return lines + (["", *data["notes"]] if data.get("notes") else [])


def render(folder: Path) -> Path:
    """Write ``folder/summary.md`` from ``step_benchmark_*.json`` and ``loader_benchmark*.json``."""
    lines = PAGE().split("\n")
    sections = {"step_benchmark_*.json": _step_section, "loader_benchmark*.json": _loader_section}
    for pattern, section in sections.items():
        for path in sorted(folder.glob(pattern)):
            data = _common.load_json(path)
            if data:
                lines += [*section(data), ""]
    out = folder / "summary.md"
    out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return out
