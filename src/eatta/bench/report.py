"""Benchmark outputs: markdown table, CSV, JSON, online-error plot, and merging of shard folders.

An output folder holds ``results.json`` (all cells, with per-batch online error), ``results.csv``
(one row per cell and seed), ``results.md`` (the table printed on stdout), ``online_error.png``,
and ``cells/`` (one JSON per finished cell, what :func:`load_results` merges) plus
``checkpoints/`` while a run is unfinished.
"""

from __future__ import annotations

import csv
import io
import json
import os
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from eatta import __version__
from eatta.bench.grid import GIVEN
from eatta.bench.results import CellResult, atomic_write_text
from eatta.data.stream import base_domain_name

__all__ = [
    "KERNEL_SPREAD_POINTS",
    "collapse_notes",
    "covered_rounds",
    "csv_text",
    "load_results",
    "markdown_table",
    "summary",
    "table_text",
    "worse_than_source",
    "write_outputs",
]

#: Column headers for domains (the paper's abbreviations; PACS domains by letter).
DOMAIN_SHORT: dict[str, str] = {
    "gaussian_noise": "Gauss.", "shot_noise": "Shot", "impulse_noise": "Impul.",
    "defocus_blur": "Defoc.", "glass_blur": "Glass", "motion_blur": "Motion", "zoom_blur": "Zoom",
    "snow": "Snow", "frost": "Frost", "fog": "Fog", "brightness": "Brit.", "contrast": "Contr.",
    "elastic_transform": "Elastic", "pixelate": "Pixel", "jpeg_compression": "JPEG",
    "photo": "P", "art_painting": "A", "cartoon": "C", "sketch": "S",
}  # fmt: skip
_SETTING = {"ctta": "C", "ftta": "F"}

#: Without the source model in the run, a method "collapses" when its last round is at least
#: this many points worse than its first.
COLLAPSE_POINTS = 10.0

#: A cell whose last round is within this many points of its first (or better) holds.
HOLD_POINTS = 2.0

#: How far a verdict's number may move with the CPU's vector kernels alone, in points: on the main
#: job, 0.3 at most for the methods that hold (docs/benchmarks.md, "Same numbers on every
#: machine"). A verdict closer than this to its line is stated for this machine only.
KERNEL_SPREAD_POINTS = 1.0

#: The sentence under a table with the ``Worse`` column.
WORSE_NOTE = (
    "Worse: domains of the last round (of the stream, with one round) on which the method's "
    "error is higher than the unadapted source model's on the same domain, same seed; mean "
    "over seeds / domains compared."
)

#: Columns of the annotator's counts (shown when an annotator is simulated).
_ANNOTATION_HEAD = ["Asked", "Got", "Expired", "Pending", "Wrong", "Annot. min"]
_ANNOTATION_KEYS = ("requested", "received", "expired", "pending", "wrong")

#: Columns of the audits and the guard (shown with ``--audit``).
_MONITOR_HEAD = ["Audits", "Audit min", "Resets", "Covered"]

#: The CSV's fixed columns, in order (per-round and per-domain columns follow).
_CSV_FIXED = """
dataset method setting labels_per_batch every buffer label seed rounds dirichlet gradual
average_error first_round_error last_round_error overall_error worse_domains
compared_domains labels_used feedback label_delay label_noise requested received expired
pending skipped wrong annotator_seconds audit_share audits audit_seconds resets
covered_rounds images images_per_s wall_time_s cpu_time_s peak_mem_mb max_rss_mb device
fingerprint model_digest grid_index
""".split()
#: Columns copied from the cell and from the result, and the result's numbers by format.
_CSV_SPEC = "dataset method setting every buffer".split()
_CSV_PLAIN = (
    "label seed rounds labels_used images device fingerprint model_digest grid_index".split()
)
_CSV_NUMBERS = {
    ".4f": ("average_error", "overall_error"),
    ".2f": ("images_per_s",),
    ".3f": ("wall_time_s", "cpu_time_s"),
    ".1f": ("peak_mem_mb", "max_rss_mb"),
}


def _ordered(results: Sequence[CellResult]) -> list[CellResult]:
    return sorted(results, key=lambda r: (r.grid_index, r.spec.key, r.fingerprint))


def _groups(results: Sequence[CellResult]) -> dict[str, list[CellResult]]:
    """Results by dataset, each in grid order."""
    groups: dict[str, list[CellResult]] = {}
    for r in _ordered(results):
        groups.setdefault(r.spec.dataset, []).append(r)
    return groups


def _cells(rows: Sequence[CellResult]) -> list[list[CellResult]]:
    """Results grouped by cell (one entry per seed), in grid order, seeds ascending."""
    groups: dict[tuple[str, str], list[CellResult]] = {}
    for r in rows:
        groups.setdefault((r.spec.key, json.dumps(r.protocol, sort_keys=True)), []).append(r)
    return [sorted(g, key=lambda r: r.seed) for g in groups.values()]


def _mean_std(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else None}


def _fmt(values: Sequence[float], bold: bool = False) -> str:
    """``mean ± std`` with one decimal (``?`` for no values)."""
    if not values:
        return "?"
    stats = _mean_std(values)
    text = f"{stats['mean']:.1f}"
    if stats["std"] is not None:
        text += f" ± {stats['std']:.1f}"
    return f"**{text}**" if bold else text


def _pooled(r: CellResult, domain: Callable[[str], str] = str) -> dict[str, float]:
    """Mean error per domain of ``r`` in stream order, its visits in every round pooled (with
    ``domain=base_domain_name``, the gradual visits of a corruption too)."""
    pooled: dict[str, list[float]] = {}
    for name, err in zip(r.domains, r.domain_errors, strict=True):
        pooled.setdefault(domain(name), []).append(err)
    return {name: float(np.mean(errs)) for name, errs in pooled.items()}


def _seed_text(seeds: Sequence[int]) -> str:
    s = sorted(seeds)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"seeds {s[0]}-{s[-1]}"
    return ("seeds " if len(s) > 1 else "seed ") + ",".join(str(x) for x in s)


def _protocol_text(r: CellResult) -> str:
    """The stream's protocol in words, for a table's title."""
    p = r.protocol
    mon = p.get("monitor") or {}
    guard = f", guard {mon['guard']} at level {mon['guard_level']:g}" if mon.get("guard") else ""
    parts = [
        f"severity {p['severity']}" if p.get("severity") is not None else "",
        f"× {r.rounds} rounds (recurring, reshuffled each round)" if r.rounds > 1 else "",
        "gradual severities 1→5→1" if p.get("gradual") else "",
        f"label shift Dirichlet(δ={p['dirichlet']:g})" if p.get("dirichlet") is not None else "",
        "mixed domains (every batch across the round's domains)" if p.get("mixed") else "",
        f"CCC-style stream, {p['ccc']}" if p.get("ccc") else "",
        "online protocol (a step costing r skips ceil(r) - 1 batches)" if p.get("online") else "",
        _annotator_text(p["annotator"]) if p.get("annotator") else "",
        f"audit {mon['audit']:g} of the samples{guard}" if mon else "",
    ]
    return ", ".join(part for part in parts if part)


def _annotator_text(a: Mapping[str, Any]) -> str:
    """``annotator: labels 4 batches late, 10% wrong, ...``"""
    rate = a.get("stream_rate")
    bits = [
        f"labels {a['delay']} batches late" if a.get("delay") is not None else "",
        f"{100 * a['noise']:g}% wrong" if a.get("noise") else "",
        "yes/no answers" if a.get("feedback") == "binary" else "",
        f"a person answering {a['pace']:g} per batch" if a.get("pace") is not None else "",
        f"a person at {a.get('seconds_per_answer'):g} s an answer, {rate:g} batches/s"
        if rate is not None
        else "",
        f"{a['order']} request first" if a.get("order") is not None else "",
    ]
    return "annotator: " + (", ".join(bit for bit in bits if bit) or "simulated, at once")


def _source_key(r: CellResult) -> tuple[str, int, str]:
    return r.spec.dataset, r.seed, json.dumps(r.protocol, sort_keys=True)


def _sources(rows: Sequence[CellResult]) -> dict[tuple[str, int, str], CellResult]:
    """The unadapted source model's results among ``rows``, by dataset, seed and protocol."""
    return {_source_key(r): r for r in rows if r.spec.method == GIVEN}


def _source_last(rows: Sequence[CellResult]) -> float | None:
    """The unadapted source model's last-round error (mean over seeds), if it is in ``rows``."""
    for cell in _cells(rows):
        if cell[0].spec.method == GIVEN:
            return float(np.mean([c.round_errors[-1] for c in cell]))
    return None


def worse_than_source(r: CellResult, source: CellResult) -> tuple[int, int]:
    """``(worse, compared)``: of the domains of ``r``'s last round (every domain of a one-round
    stream; a mixed stream's per-domain counts), how many end with a higher error than the
    unadapted ``source`` model's on the same domain visit. Both must come from the same stream
    (seed and protocol): a :class:`ValueError` otherwise."""
    if r.domains != source.domains or r.rounds != source.rounds or r.seed != source.seed:
        raise ValueError(
            f"{r.label} and {source.label} ran on different streams; their domains cannot be "
            "compared"
        )
    per_round = len(r.domains) // max(1, r.rounds)
    last = slice(len(r.domains) - per_round, len(r.domains))
    pairs = zip(r.domain_errors[last], source.domain_errors[last], strict=True)
    return sum(int(mine > given) for mine, given in pairs), per_round


def _worse_counts(
    cell: Sequence[CellResult], sources: Mapping[tuple[str, int, str], CellResult]
) -> list[tuple[int, int]] | None:
    """:func:`worse_than_source` for every seed of a cell; None for the source model itself or
    when a seed has no source result to compare with."""
    found = [sources.get(_source_key(c)) for c in cell]
    if cell[0].spec.method == GIVEN or any(s is None for s in found):
        return None
    return [worse_than_source(c, s) for c, s in zip(cell, found, strict=True) if s is not None]


def _worse_cell(counts: list[tuple[int, int]] | None) -> str:
    """``3/15`` (the mean over seeds, one decimal when the seeds differ), or ``-``."""
    if not counts:
        return "-"
    worse = [w for w, _ in counts]
    mean = float(np.mean(worse))
    shown = f"{mean:.0f}" if len(set(worse)) == 1 else f"{mean:.1f}"
    return f"{shown}/{counts[0][1]}"


def _first_last(cell: Sequence[CellResult]) -> tuple[float, float] | None:
    """Mean first- and last-round error of a long-stream cell (None for one round)."""
    r = cell[0]
    if r.rounds < 2 or any(len(c.round_errors) != r.rounds for c in cell):
        return None
    first, last = (float(np.mean([c.round_errors[i] for c in cell])) for i in (0, -1))
    return first, last


def collapse_notes(results: Sequence[CellResult]) -> list[str]:
    """Plain sentences for cells that collapse: their last round is worse than the unadapted
    source model's (when the run has it), else at least :data:`COLLAPSE_POINTS` worse than their
    own first round (mean over seeds)."""
    notes = []
    for rows in _groups(results).values():
        source = _source_last(rows)
        for cell in _cells(rows):
            r, pair = cell[0], _first_last(cell)
            if pair is None or r.spec.method == GIVEN:
                continue
            first, last = pair
            if source is not None and last > source:
                why = f"worse than the unadapted source model's {source:.1f}%"
            elif source is None and last - first >= COLLAPSE_POINTS:
                why = "errors accumulate over the long stream"
            else:
                continue
            notes.append(
                f"{r.spec.dataset}: {r.label} collapses: its error grows from "
                f"{first:.1f}% in round 1 to {last:.1f}% in round {r.rounds} ({why})."
            )
    return notes


def stability_sentence(rows: Sequence[CellResult]) -> str | None:
    """One sentence over a dataset's long-stream cells: which collapse (end worse than the source
    model), degrade (last round over :data:`HOLD_POINTS` worse than the first) or hold; "on this
    machine" within :data:`KERNEL_SPREAD_POINTS` of a line. None for one-round runs."""
    source = _source_last(rows)
    collapse = "collapse"
    if source is not None:
        collapse += f", ending worse than the unadapted source model ({source:.1f})"
    verdicts: dict[str, list[str]] = {collapse: [], "degrade": [], "hold or improve": []}
    for cell in _cells(rows):
        if (pair := _first_last(cell)) is None:
            return None
        if cell[0].spec.method == GIVEN:
            continue
        first, last = pair
        near = abs(last - first - HOLD_POINTS) < KERNEL_SPREAD_POINTS
        if source is not None:
            near = near or abs(last - source) < KERNEL_SPREAD_POINTS
        where = ", on this machine" if near else ""
        if source is not None and last > source:
            verdict = collapse
        elif last - first > HOLD_POINTS:
            verdict = "degrade"
        else:
            verdict = "hold or improve"
        verdicts[verdict].append(f"{cell[0].label} ({first:.1f} → {last:.1f}{where})")
    parts = [f"{verdict}: {', '.join(texts)}" for verdict, texts in verdicts.items() if texts]
    if not parts:
        return None
    return "Over the rounds (error % in round 1 → last round), " + "; ".join(parts) + "."


def _kernels_text(rows: Sequence[CellResult]) -> str:
    """``"; torch CPU kernels AVX512 (x86_64)"``: what computed the rows (empty if unrecorded)."""
    seen = {
        f"{p['cpu_capability']} ({p.get('machine', '?')})"
        for p in (r.provenance for r in rows)
        if p.get("cpu_capability")
    }
    return f"; torch CPU kernels {' and '.join(sorted(seen))}" if seen else ""


def markdown_table(results: Sequence[CellResult]) -> str:
    """One markdown table per dataset: error % per domain (one round) or per round, the average,
    ``Worse`` (:func:`worse_than_source`), labels, speed and peak memory (MB; CPU: peak RSS over
    the RSS at the start, GPU: peak allocated); mean ± std over seeds; collapses under it."""
    blocks = [_dataset_table(dataset, rows) for dataset, rows in _groups(results).items()]
    return "\n\n".join(blocks) + "\n"


def _dataset_table(dataset: str, rows: Sequence[CellResult]) -> str:
    """The table of :func:`markdown_table` for one dataset: title, rows and the notes under it."""
    cells = _cells(rows)
    ref = cells[0][0]
    rounds = max(r.rounds for r in rows)
    domains = list(_pooled(ref, base_domain_name))
    many = any(len(c) > 1 for c in cells)
    annotated = any(r.protocol.get("annotator") for r in rows)
    monitored = any(r.monitor for r in rows)
    sources = _sources(rows)
    compared = bool(sources) and len(cells) > 1
    timed = all(r.realtime for r in rows)

    def row(cell: Sequence[CellResult]) -> list[tuple[str, str]]:
        """(column, text) pairs of one cell's row."""
        if rounds > 1:
            errs = [
                (f"R{i + 1}", _fmt([c.round_errors[i] for c in cell if i < len(c.round_errors)]))
                for i in range(rounds)
            ]
        else:
            per = [_pooled(c, base_domain_name) for c in cell]
            errs = [(DOMAIN_SHORT.get(d, d), _fmt([p[d] for p in per if d in p])) for d in domains]
        r = cell[0]
        out = [("Method", r.label), ("Set.", _SETTING.get(r.spec.setting, r.spec.setting)), *errs]
        out.append(("Avg. Err.", _fmt([c.average_error for c in cell], bold=True)))
        if timed:  # the online protocol: its error (beside an offline run), r, batches skipped
            rt = [c.realtime for c in cell if c.realtime]
            if "online" in rt[0]:
                out.append(("Online", _fmt([t["online"]["average_error"] for t in rt], bold=True)))
            out += [("r", f"{rt[0]['cost']:.2f}"), ("Skipped", str(rt[0]["skipped"]))]
        if compared:
            out.append(("Worse", _worse_cell(_worse_counts(cell, sources))))
        if many:
            out.append(("Seeds", str(len(cell))))
        out.append(("Labels", f"{np.mean([c.labels_used for c in cell]):.0f}"))
        if annotated:
            out += zip(_ANNOTATION_HEAD, _annotation_cells(cell), strict=True)
        if monitored:
            out += zip(_MONITOR_HEAD, _monitor_cells(cell), strict=True)
        cpus = [c.cpu_time_s for c in cell if c.cpu_time_s is not None]
        peaks = [c.peak_mem_mb for c in cell if c.peak_mem_mb is not None]
        return [
            *out,
            ("img/s", f"{np.mean([c.images_per_s for c in cell]):.0f}"),
            ("Wall s", f"{np.mean([c.wall_time_s for c in cell]):.1f}"),
            ("CPU s", "-" if not cpus else f"{np.mean(cpus):.1f}"),
            ("Peak MB", "-" if not peaks else f"{max(peaks):.0f}"),
        ]

    table = [row(cell) for cell in cells]
    proto = _protocol_text(ref)
    seeds = _seed_text(sorted({r.seed for r in rows}))
    title = (
        f"**{dataset}**: error % (lower is better), {ref.images // max(1, ref.rounds)} images in "
        f"{len(domains)} domains" + (f", {proto}" if proto else "")
    )
    title += f"; mean ± std over {seeds}" if many else f"; {seeds}"
    head = [column for column, _ in table[0]]
    body = [[text for _, text in texts] for texts in table]
    lines = [title + _kernels_text(rows), "", table_text(head, body, left=2)]
    notes = [WORSE_NOTE] if compared else []
    notes += collapse_notes(rows)
    if sentence := stability_sentence(rows):
        notes.append(sentence)
    if notes:
        lines += ["", *notes]
    if monitored:
        lines += ["", *monitor_table(cells, rounds)]
    return "\n".join(lines)


def _annotation_means(cell: Sequence[CellResult]) -> dict[str, float] | None:
    """What the annotator did, mean over a cell's seeds (None for a method that asks nobody)."""
    if not (notes := [c.annotation for c in cell if c.annotation]):
        return None
    keys = (*_ANNOTATION_KEYS, "skipped", "seconds")
    return {k: float(np.mean([n.get(k, 0) for n in notes])) for k in keys}


def _annotation_cells(cell: Sequence[CellResult]) -> list[str]:
    """The annotator's columns of a cell's row ("-" for a method that asks nobody)."""
    if (means := _annotation_means(cell)) is None:
        return ["-"] * len(_ANNOTATION_HEAD)
    return [f"{means[k]:.0f}" for k in _ANNOTATION_KEYS] + [f"{means['seconds'] / 60:.1f}"]


def covered_rounds(r: CellResult) -> tuple[int, int]:
    """``(rounds whose audited interval covers the true error, rounds with audits)``."""
    rounds = (r.monitor or {}).get("rounds", [])
    audited = [(e, true) for e, true in zip(rounds, r.round_errors, strict=False) if e["audits"]]
    return sum(e["low"] <= true <= e["high"] for e, true in audited), len(audited)


def _monitor_cells(cell: Sequence[CellResult]) -> list[str]:
    """Mean audits, audit minutes and resets over a cell's seeds; rounds covered (summed)."""
    if not (notes := [c.monitor for c in cell if c.monitor]):
        return ["-"] * len(_MONITOR_HEAD)
    cov = [covered_rounds(c) for c in cell if c.monitor]
    return [
        f"{np.mean([n['stats']['requested'] for n in notes]):.0f}",
        f"{np.mean([n['seconds'] for n in notes]) / 60:.0f}",
        f"{np.mean([len(n['resets']) for n in notes]):.1f}",
        f"{sum(h for h, _ in cov)}/{sum(t for _, t in cov)}",
    ]


def monitor_table(cells: Sequence[Sequence[CellResult]], rounds: int) -> list[str]:
    """Markdown lines: per monitored cell and round, the audited error estimate and its interval
    (means over seeds) beside the true error."""
    level = next((c.monitor["level"] for cell in cells for c in cell if c.monitor), 0.05)
    head = ["Method", *[f"R{i + 1}" for i in range(rounds)]] if rounds > 1 else ["Method", "All"]
    rows = []
    for cell in cells:
        if not (mon := [c.monitor for c in cell if c.monitor]):
            continue
        row = [cell[0].label]
        for i in range(len(head) - 1):
            ests = [m["rounds"][i] for m in mon if m["rounds"][i]["audits"]]
            true = np.mean([c.round_errors[i] for c in cell if c.monitor])
            if not ests:
                row.append(f"- / {true:.1f}")
                continue
            e, lo, hi = (np.mean([x[k] for x in ests]) for k in ("error", "low", "high"))
            row.append(f"{e:.1f} [{lo:.0f}, {hi:.0f}] / {true:.1f}")
        rows.append(row)
    return [
        f"Audited error % per round (uniform random audits: unbiased), estimate "
        f"[{100 * (1 - level):g} % anytime-valid interval] / true error; means over seeds:",
        "",
        table_text(head, rows),
    ]


def table_text(head: Sequence[str], rows: Iterable[Sequence[object]], left: int = 1) -> str:
    """A markdown table, its first ``left`` columns left-aligned and the others right-aligned."""
    rule = "|" + "|".join(["---"] * left + ["---:"] * (len(head) - left)) + "|"
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in (head, *rows)]
    return "\n".join([lines[0], rule, *lines[1:]])


def _number(value: float | None, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _annotation_csv(r: CellResult) -> dict[str, Any]:
    """The annotator's columns of one result's CSV row (a value left out or None is empty)."""
    proto, note = r.protocol.get("annotator") or {}, r.annotation or {}
    row = {k: note.get(k) for k in ("feedback", *_ANNOTATION_KEYS, "skipped")}
    row |= {"label_delay": proto.get("delay"), "label_noise": proto.get("noise")}
    row["annotator_seconds"] = _number(note.get("seconds"), ".1f")
    return row


def _monitor_csv(r: CellResult) -> dict[str, Any]:
    """The audits' columns of one result's CSV row (none without audits)."""
    if not (m := r.monitor):
        return {}
    hit, total = covered_rounds(r)
    row: dict[str, Any] = {
        "audit_share": (r.protocol.get("monitor") or {}).get("audit"),
        "audits": m["stats"]["requested"],
        "audit_seconds": f"{m['seconds']:.1f}",
        "resets": len(m["resets"]),
        "covered_rounds": f"{hit}/{total}",
    }
    for i, est in enumerate(m["rounds"]):
        if est["audits"]:
            for column, key in (("est", "error"), ("est_low", "low"), ("est_high", "high")):
                row[f"{column}_round:{i + 1}"] = f"{est[key]:.4f}"
    return row


def csv_text(results: Sequence[CellResult]) -> str:
    """One row per cell and seed; per-round errors in columns ``err_round:<r>`` and per-domain
    errors (averaged over rounds) in ``err:<domain>`` (empty where a row has none)."""
    ordered = _ordered(results)
    n_rounds = max((r.rounds for r in ordered), default=1)
    round_cols = [f"err_round:{i + 1}" for i in range(n_rounds)]
    if any(r.monitor for r in ordered):
        round_cols += [
            f"{k}_round:{i + 1}" for i in range(n_rounds) for k in ("est", "est_low", "est_high")
        ]
    domain_cols = list(dict.fromkeys(f"err:{d}" for r in ordered for d in r.domains))
    buf = io.StringIO()
    writer = csv.DictWriter(
        buf, fieldnames=_CSV_FIXED + round_cols + domain_cols, lineterminator="\n"
    )
    writer.writeheader()
    sources = _sources(ordered)
    for r in ordered:
        counts = _worse_counts([r], sources)
        worse, compared = counts[0] if counts else (None, None)
        row: dict[str, Any] = {  # None (and a column left out) is written empty
            **{k: getattr(r.spec, k) for k in _CSV_SPEC},
            **{k: getattr(r, k) for k in _CSV_PLAIN},
            **{k: _number(getattr(r, k), f) for f, keys in _CSV_NUMBERS.items() for k in keys},
            "labels_per_batch": r.spec.labels,
            "dirichlet": r.protocol.get("dirichlet"),
            "gradual": bool(r.protocol.get("gradual", False)),
            "first_round_error": f"{r.round_errors[0]:.4f}",
            "last_round_error": f"{r.round_errors[-1]:.4f}",
            "worse_domains": worse,
            "compared_domains": compared,
            **_annotation_csv(r),
            **_monitor_csv(r),
            **{f"err_round:{i + 1}": f"{e:.4f}" for i, e in enumerate(r.round_errors)},
            **{f"err:{d}": f"{e:.4f}" for d, e in _pooled(r).items()},
        }
        writer.writerow(row)
    return buf.getvalue()


def _moving_average(online: Sequence[Sequence[int]], span: int) -> tuple[np.ndarray, np.ndarray]:
    """Images seen after each batch, and the error % over the last ``span`` batches."""
    arr = np.asarray(online, dtype=np.float64).reshape(-1, 3)
    cn, cw = (np.concatenate([[0.0], np.cumsum(arr[:, i])]) for i in (0, 1))  # 0 before the first
    lo = np.maximum(np.arange(1, len(arr) + 1) - span, 0)
    return cn[1:], 100.0 * (cw[1:] - cw[lo]) / np.maximum(cn[1:] - cn[lo], 1.0)


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files only (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_online_error(results: Sequence[CellResult], path: str | os.PathLike[str]) -> Path:
    """PNG of the error along the stream (moving window of ~1/40 of it, or ~1/10 of a round), a
    panel per dataset, a line per cell (mean over seeds), lines at domain or round boundaries."""
    plt = pyplot()
    groups = _groups(results)
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(13, 3.4 * len(groups)), squeeze=False, constrained_layout=True
    )
    for ax, (dataset, rows) in zip(axes[:, 0], groups.items(), strict=True):
        ref = rows[0]
        per_round = len(ref.online) // max(1, ref.rounds)
        span = max(1, round(len(ref.online) / 40 if ref.rounds == 1 else per_round / 10))
        for cell in _cells(rows):
            r = cell[0]
            same = [c for c in cell if len(c.online) == len(r.online)]
            curves = [_moving_average(c.online, span) for c in same]
            y = np.mean([c[1] for c in curves], axis=0)
            setting = "" if r.spec.setting == "-" else f" [{r.spec.setting.upper()}]"
            seeds = f" ({len(same)} seeds)" if len(same) > 1 else ""
            avg = float(np.mean([c.average_error for c in cell]))
            ax.plot(curves[0][0], y, linewidth=1.3, label=f"{r.label}{setting}: {avg:.1f}{seeds}")
        # boundaries (images seen) of the domain visits, then of the rounds with several
        cum = np.cumsum([b[0] for b in ref.online])
        bounds = [0] + [int(cum[b - 1]) for b in ref.domain_first_batch[1:]] + [int(cum[-1])]
        names = [DOMAIN_SHORT.get(d, d) for d in ref.domains]
        if solid := ref.rounds > 1:
            k = len(ref.domains) // ref.rounds
            bounds = bounds[: ref.rounds * k + 1 : k]
            names = [f"round {i + 1}" for i in range(ref.rounds)]
        where = {"transform": ax.get_xaxis_transform(), "ha": "center", "va": "bottom"}
        for (start, end), name in zip(pairwise(bounds), names, strict=True):
            if start:
                ax.axvline(start, color="0.45" if solid else "0.6", ls="-" if solid else ":", lw=1)
            ax.text((start + end) / 2, 1.01, name, fontsize=7, rotation=0 if solid else 45, **where)
        ax.set(xlim=(0, max(1, int(cum[-1]))), ylim=(0, 100))
        ax.set(xlabel="images seen", ylabel=f"error % (last ~{span} batches)")
        ax.set_title(dataset, loc="left", fontsize=10, pad=22)
        legend = {"loc": "upper left", "bbox_to_anchor": (1.005, 1.0), "title_fontsize": 7}
        ax.legend(fontsize=7, title="method: avg. err. %", **legend)
        ax.grid(alpha=0.3)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary(results: Sequence[CellResult]) -> list[dict[str, Any]]:
    """Per cell (over its seeds): seeds, the annotator's mean counts, and mean / sample std of the
    average, first-round, last-round and every round's error; with the source model in the run,
    ``worse_than_source`` (per seed, mean, std, domains compared: :func:`worse_than_source`)."""
    out = []
    for rows in _groups(results).values():
        sources = _sources(rows)
        for cell in _cells(rows):
            r = cell[0]
            entry: dict[str, Any] = {
                "key": r.spec.key,
                "label": r.label,
                "protocol": r.protocol,
                "seeds": [c.seed for c in cell],
            }
            if (counts := _worse_counts(cell, sources)) is not None:
                worse = [w for w, _ in counts]
                entry["worse_than_source"] = {
                    "per_seed": worse,
                    **_mean_std(worse),
                    "domains": counts[0][1],
                }
            if annotation := _annotation_means(cell):
                entry["annotation"] = annotation
            entry["average_error"] = _mean_std([c.average_error for c in cell])
            entry["first_round_error"] = _mean_std([c.round_errors[0] for c in cell])
            entry["last_round_error"] = _mean_std([c.round_errors[-1] for c in cell])
            if all(len(c.round_errors) == r.rounds for c in cell):
                entry["round_errors"] = [
                    _mean_std([c.round_errors[i] for c in cell]) for i in range(r.rounds)
                ]
            out.append(entry)
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
        "summary": summary(ordered),
        "collapses": collapse_notes(ordered),
        "results": [r.to_dict() for r in ordered],
    }
    atomic_write_text(paths["json"], json.dumps(doc, indent=1, default=str))
    atomic_write_text(paths["csv"], csv_text(ordered))
    atomic_write_text(paths["markdown"], markdown_table(ordered))
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
        if files := sorted((root / "cells").glob("*.json")):
            loaded = [CellResult.load(f) for f in files]
        elif (root / "results.json").is_file():
            doc = json.loads((root / "results.json").read_text(encoding="utf-8"))
            loaded = [CellResult.from_dict(x) for x in doc.get("results", [])]
        else:
            raise FileNotFoundError(
                f"{str(root)!r} holds no finished cells (cells/*.json) or results.json"
            )
        for r in loaded:
            found.setdefault((r.spec.key, r.fingerprint), r)
    runs = Counter(
        f"{r.spec.key} seed {r.seed} {json.dumps(r.protocol, sort_keys=True)}"
        for r in found.values()
    )
    if dupes := sorted(run for run, n in runs.items() if n > 1):
        warnings.warn(
            f"cells run with different arguments (fingerprints) are all kept: {dupes}",
            stacklevel=2,
        )
    return _ordered(list(found.values()))
