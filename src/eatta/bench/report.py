"""Benchmark outputs: markdown table, CSV, JSON, online-error plot, and merging of shard folders.

An output folder holds ``results.json`` (all cells, with per-batch online error), ``results.csv``
(one row per cell), ``results.md`` (the table printed on stdout), ``online_error.png``, and
``cells/`` (one JSON per finished cell, what :func:`load_results` merges) plus ``checkpoints/``
while a run is unfinished.
"""

from __future__ import annotations

import csv
import io
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eatta import __version__
from eatta.bench.runner import CellResult, _atomic_write_text

__all__ = [
    "DOMAIN_SHORT",
    "csv_text",
    "load_results",
    "markdown_table",
    "plot_online_error",
    "write_outputs",
]

#: Column headers for domains (the paper's abbreviations; PACS domains by letter).
DOMAIN_SHORT: dict[str, str] = {
    "gaussian_noise": "Gauss.",
    "shot_noise": "Shot",
    "impulse_noise": "Impul.",
    "defocus_blur": "Defoc.",
    "glass_blur": "Glass",
    "motion_blur": "Motion",
    "zoom_blur": "Zoom",
    "snow": "Snow",
    "frost": "Frost",
    "fog": "Fog",
    "brightness": "Brit.",
    "contrast": "Contr.",
    "elastic_transform": "Elastic",
    "pixelate": "Pixel",
    "jpeg_compression": "JPEG",
    "photo": "P",
    "art_painting": "A",
    "cartoon": "C",
    "sketch": "S",
}
_SETTING = {"ctta": "C", "ftta": "F", "-": "-"}


def _short(domain: str) -> str:
    return DOMAIN_SHORT.get(domain, domain)


def _ordered(results: Sequence[CellResult]) -> list[CellResult]:
    return sorted(results, key=lambda r: (r.grid_index, r.spec.key, r.fingerprint))


def _groups(results: Sequence[CellResult]) -> dict[str, list[CellResult]]:
    groups: dict[str, list[CellResult]] = {}
    for r in _ordered(results):
        groups.setdefault(r.spec.dataset, []).append(r)
    return groups


def _mem(r: CellResult) -> str:
    return "-" if r.peak_mem_mb is None else f"{r.peak_mem_mb:.0f}"


def markdown_table(results: Sequence[CellResult]) -> str:
    """One markdown table per dataset: error % per domain, average over domains, labels used,
    images/s, wall time and peak memory (MB; CPU: growth of the process's peak RSS, GPU: peak
    allocated)."""
    blocks = []
    for dataset, rows in _groups(results).items():
        domains = rows[0].domains
        head = [
            "Method",
            "Set.",
            *(_short(d) for d in domains),
            "Avg. Err.",
            "Labels",
            "img/s",
            "Wall s",
            "Peak MB",
        ]
        lines = [
            f"**{dataset}**: error % (lower is better), {rows[0].images} images in "
            f"{len(domains)} domains",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|",
        ]
        for r in rows:
            errs = (
                [f"{e:.1f}" for e in r.domain_errors]
                if r.domains == domains
                else ["?"] * len(domains)  # a row with other domains (merged from elsewhere)
            )
            cells = [
                r.spec.label,
                _SETTING.get(r.spec.setting, r.spec.setting),
                *errs,
                f"**{r.average_error:.1f}**",
                str(r.labels_used),
                f"{r.images_per_s:.0f}",
                f"{r.wall_time_s:.1f}",
                _mem(r),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


_CSV_FIXED = [
    "dataset",
    "method",
    "setting",
    "labels_per_batch",
    "every",
    "buffer",
    "label",
    "average_error",
    "overall_error",
    "labels_used",
    "images",
    "images_per_s",
    "wall_time_s",
    "peak_mem_mb",
    "max_rss_mb",
    "device",
    "fingerprint",
    "model_digest",
    "grid_index",
]


def csv_text(results: Sequence[CellResult]) -> str:
    """One row per cell; per-domain errors in columns ``err:<domain>`` (empty where a dataset
    has no such domain)."""
    ordered = _ordered(results)
    domain_cols: list[str] = []
    for r in ordered:
        for d in r.domains:
            if f"err:{d}" not in domain_cols:
                domain_cols.append(f"err:{d}")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_CSV_FIXED + domain_cols, lineterminator="\n")
    writer.writeheader()
    for r in ordered:
        row: dict[str, Any] = {
            "dataset": r.spec.dataset,
            "method": r.spec.method,
            "setting": r.spec.setting,
            "labels_per_batch": r.spec.labels,
            "every": r.spec.every,
            "buffer": "" if r.spec.buffer is None else r.spec.buffer,
            "label": r.spec.label,
            "average_error": f"{r.average_error:.4f}",
            "overall_error": f"{r.overall_error:.4f}",
            "labels_used": r.labels_used,
            "images": r.images,
            "images_per_s": f"{r.images_per_s:.2f}",
            "wall_time_s": f"{r.wall_time_s:.3f}",
            "peak_mem_mb": "" if r.peak_mem_mb is None else f"{r.peak_mem_mb:.1f}",
            "max_rss_mb": "" if r.max_rss_mb is None else f"{r.max_rss_mb:.1f}",
            "device": r.device,
            "fingerprint": r.fingerprint,
            "model_digest": r.model_digest,
            "grid_index": r.grid_index,
        }
        for d, e in zip(r.domains, r.domain_errors, strict=True):
            row[f"err:{d}"] = f"{e:.4f}"
        writer.writerow(row)
    return buf.getvalue()


def _windowed(online: Sequence[Sequence[int]], window: int) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray(online, dtype=np.float64).reshape(-1, 3)
    n, wrong = arr[:, 0], arr[:, 1]
    cn, cw = np.cumsum(n), np.cumsum(wrong)
    lo = np.maximum(np.arange(len(n)) - window, -1)
    prev_n = np.where(lo >= 0, cn[np.maximum(lo, 0)], 0.0)
    prev_w = np.where(lo >= 0, cw[np.maximum(lo, 0)], 0.0)
    return cn, 100.0 * (cw - prev_w) / np.maximum(cn - prev_n, 1.0)


def plot_online_error(results: Sequence[CellResult], path: str | os.PathLike[str]) -> Path:
    """PNG of the error along the stream (moving window of ~1/40 of the stream per dataset), one
    panel per dataset, a line per cell, dotted lines at domain boundaries."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    groups = _groups(results)
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(13, 3.4 * len(groups)), squeeze=False, constrained_layout=True
    )
    for ax, (dataset, rows) in zip(axes[:, 0], groups.items(), strict=True):
        ref = rows[0]
        window = max(1, round(len(ref.online) / 40))
        for r in rows:
            x, y = _windowed(r.online, window)
            setting = "" if r.spec.setting == "-" else f" [{r.spec.setting.upper()}]"
            ax.plot(x, y, linewidth=1.3, label=f"{r.spec.label}{setting}: {r.average_error:.1f}")
        cum = np.cumsum([b[0] for b in ref.online])
        starts = [0] + [int(cum[b - 1]) for b in ref.domain_first_batch[1:]]
        ends = [*starts[1:], int(cum[-1])]
        for s, e, d in zip(starts, ends, ref.domains, strict=True):
            if s:
                ax.axvline(s, color="0.6", linestyle=":", linewidth=1)
            ax.text(
                (s + e) / 2,
                1.01,
                _short(d),
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=7,
                rotation=45,
            )
        ax.set_xlim(0, max(1, int(cum[-1])))
        ax.set_ylim(0, 100)
        ax.set_xlabel("images seen")
        ax.set_ylabel(f"error % (last ~{window} batches)")
        ax.set_title(dataset, loc="left", fontsize=10, pad=22)
        ax.legend(
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            title="method: avg. err. %",
            title_fontsize=7,
        )
        ax.grid(alpha=0.3)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_outputs(
    results: Sequence[CellResult],
    out_dir: str | os.PathLike[str],
    meta: Mapping[str, Any] | None = None,
    *,
    plot: bool = True,
) -> dict[str, Path]:
    """Write ``results.json``, ``results.csv``, ``results.md`` and ``online_error.png``."""
    out = Path(out_dir)
    paths = {
        "json": out / "results.json",
        "csv": out / "results.csv",
        "markdown": out / "results.md",
    }
    ordered = _ordered(results)
    doc = {
        "eatta_version": __version__,
        "meta": dict(meta or {}),
        "results": [r.to_dict() for r in ordered],
    }
    _atomic_write_text(paths["json"], json.dumps(doc, indent=1, default=str))
    _atomic_write_text(paths["csv"], csv_text(ordered))
    _atomic_write_text(paths["markdown"], markdown_table(ordered))
    if plot and ordered:
        paths["plot"] = plot_online_error(ordered, out / "online_error.png")
    return paths


def load_results(dirs: Sequence[str | os.PathLike[str]]) -> list[CellResult]:
    """Finished cells of the output folders ``dirs`` (their ``cells/*.json``, else their
    ``results.json``), each (cell, fingerprint) once, in grid order."""
    found: dict[tuple[str, str], CellResult] = {}
    for d in dirs:
        root = Path(d)
        if not root.is_dir():
            raise FileNotFoundError(f"no output folder {str(root)!r}")
        files = sorted((root / "cells").glob("*.json"))
        if files:
            loaded = [CellResult.load(f) for f in files]
        elif (root / "results.json").is_file():
            doc = json.loads((root / "results.json").read_text(encoding="utf-8"))
            loaded = [CellResult.from_dict(x) for x in doc.get("results", [])]
        else:
            raise FileNotFoundError(
                f"{str(root)!r} holds no finished cells (cells/*.json) or results.json"
            )
        for r in loaded:
            key = (r.spec.key, r.fingerprint)
            if key in found:
                continue
            found[key] = r
    keys = [r.spec.key for r in found.values()]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        warnings.warn(
            f"cells run with different arguments (fingerprints) are all kept: {dupes}",
            stacklevel=2,
        )
    return _ordered(list(found.values()))
