"""Render ``summary.md`` from the benchmark JSON files found in a results folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _common

#: The variants' order in a model's table (others follow in their own order).
ORDER = "inference tent eatta eatta-async-0 eatta-two-pass eatta-batched eatta-approx".split()
ORDER += ["eatta-no-gnd", "reference-style", "two-backward floor"]
#: The ratio table's columns: time ratios to TENT, then peak-memory ratios to TENT.
TIME_COLUMNS = {
    "eatta": "EATTA / TENT time",
    "eatta-approx": "approx / TENT time",
    "reference-style": "reference-style / TENT time",
    "two-backward floor": "two-backward floor / TENT",
}
MEMORY_COLUMNS = {
    "eatta": "EATTA / TENT peak memory",
    "eatta-approx": "approx / TENT peak memory",
    "eatta-two-pass": "EATTA two-pass / TENT peak memory",
    "reference-style": "reference-style / TENT peak memory",
}

PAGE = _common.Template("summary")


def _f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _ratio(r: dict[str, float] | None) -> str:
    """A time ratio as median (median of per-round ratios / min)."""
    return "–" if r is None else f"{r['median']:.2f} ({r['paired']:.2f} / {r['min']:.2f})"


def _meta_line(meta: dict[str, Any]) -> str:
    load = f"load average {meta.get('loadavg_start')} → {meta.get('loadavg_end')}"
    dev = meta.get("gpu") or meta.get("cpu")
    return (
        f"{meta.get('date')}, torch {meta.get('torch')}, {dev} ({meta.get('cpu_count')} cores), "
        f"{meta.get('torch_threads')} torch threads, {load}; `{meta.get('command')}`"
    )


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["", *_common.markdown_table(header, rows, left=True).split("\n")]


def _variants_table(variants: dict[str, dict[str, Any]]) -> list[str]:
    """One model's variants: times, their ratios, peak memory and page faults."""
    inf, tent = variants["inference"]["median_ms"], variants["tent"]["median_ms"]
    tent_mb = variants["tent"].get("peak_mb")
    rows = []
    for key in [k for k in ORDER if k in variants] + [k for k in variants if k not in ORDER]:
        s, mb = variants[key], variants[key].get("peak_mb")
        times = [
            f"{s['median_ms']:.1f}",
            f"{s['min_ms']:.1f}",
            f"{s['q1_ms']:.1f}–{s['q3_ms']:.1f}",
        ]
        ratios = [f"{s['median_ms'] / inf:.2f}", f"{s['median_ms'] / tent:.2f}"]
        memory = [_f(mb, 1), _f(None if mb is None or not tent_mb else mb / tent_mb)]
        rows.append([key, *times, *ratios, *memory, s.get("minor_faults_median", "–")])
    header = ["variant", "median ms", "min ms", "IQR ms", "× inference", "× TENT", "peak MB"]
    return _table([*header, "× TENT memory", "page faults"], rows)


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
    rows = [
        [f"{name} b{res['batch']}"]
        + [_ratio(res["time_ratios"].get(f"{k}/tent")) for k in TIME_COLUMNS]
        + [_f(res.get("memory_ratios", {}).get(f"{k}/tent")) for k in MEMORY_COLUMNS]
        for name, res in data["models"].items()
    ]
    header = ["model", *TIME_COLUMNS.values(), *MEMORY_COLUMNS.values()]
    lines = [*head.split("\n"), *_table(header, rows)]
    for name, res in data["models"].items():
        lines += ["", f"### {name}, batch {res['batch']}, {res['resolution']} px, "
                  f"{res['num_classes']} classes"]  # fmt: skip
        lines += _variants_table(res["variants"])
        if lat := res.get("latency"):
            shown = ", ".join(f"{k} {v['p50_ms']:.1f} / {v['p99_ms']:.1f}" for k, v in lat.items())
            lines += ["", PAGE("latency", repeats=meta["repeats"], shown=shown)]
        if par := res.get("parity_max_abs_diff"):
            shown = ", ".join(f"{k} {val:.1e}" for k, val in par.items())
            lines += ["", PAGE("parity", shown=shown)]
        if prof := res.get("profile"):
            names = list(prof)
            cats = list(dict.fromkeys(c for n in names for c in prof[n]["categories_ms"]))
            rows = [[c, *(_f(prof[n]["categories_ms"].get(c), 1) for n in names)] for c in cats]
            rows.append(["total", *(_f(prof[n]["total_ms"], 1) for n in names)])
            lines += ["", PAGE("profile"), *_table(["category", *names], rows)]
    if growth := data.get("growth"):
        header = ["batch", "labels", "EATTA ms", "TENT ms", "EATTA ms / image", "EATTA / TENT"]
        rows = []
        for r in growth["batch_size"] + growth["labels"]:
            ms = [f"{r['eatta_median_ms']:.1f}", f"{r['tent_median_ms']:.1f}"]
            ratio = f"{r['ratio']:.2f} ({r['ratio_paired']:.2f} / {r['ratio_min']:.2f})"
            rows.append([r["batch"], r["labels"], *ms, f"{r['eatta_ms_per_image']:.2f}", ratio])
        lines += ["", f"### Growth ({growth['model']})", *_table(header, rows)]
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
    lines = [*head.split("\n"), *_table(["loader", "images/s", "first epoch images/s"], rows)]
    steps = [[r["name"], f"{r['images_per_s']:.1f}"] for r in data["steps"]]
    lines += _table(["step", "images/s"], steps)
    return lines + (["", *data["notes"]] if data.get("notes") else [])


def page(folder: Path) -> str:
    """``summary.md`` of ``folder``'s ``step_benchmark_*.json`` and ``loader_benchmark*.json``."""
    lines = PAGE().split("\n")
    sections = {"step_benchmark_*.json": _step_section, "loader_benchmark*.json": _loader_section}
    for pattern, section in sections.items():
        for path in sorted(folder.glob(pattern)):
            if data := _common.load_json(path):
                lines += [*section(data), ""]
    return "\n".join(lines).rstrip() + "\n"


def render(folder: Path) -> Path:
    """Write ``folder/summary.md`` (:func:`page`)."""
    out = folder / "summary.md"
    out.write_text(page(folder), encoding="utf-8")
    return out
