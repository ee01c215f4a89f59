"""The never-worse study: ``eatta-safe`` against the source model, the label-free methods and
``eatta-stable``, at every kind of annotator; label-free methods with the fallback.

Regenerates the section of ``docs/safety.md`` between ``<!-- safety:begin -->`` and
``<!-- safety:end -->`` (and ``benchmarks/results/safety_study.md``, ``.json``). Every run is a
cell of :func:`eatta.bench.run` under ``--out`` (finished cells are read back, so an interrupted
study resumes). Parts, per stream (``STREAMS``), over ``--seeds``:

* ``references``: the source model (``source``) and the label-free methods TENT and ETA;
* ``annotators``: ``eatta-safe`` with labels at once, 16 and 64 batches late, at a person's
  pace (11.7 s an answer, a batch a second) and never, in requests of 64, 8 and 1 samples at one
  label per 64 samples (``--sizes``; under 64 through a window of 64 samples); ``eatta-stable``
  beside it at once and at a person's pace, in requests of 64;
* ``measure``: ``eatta-safe`` measuring only (``fallback=False``: requests drawn, the adapted
  model always served), with labels at once: what drawing the requests costs the adaptation;
* ``guard``: TENT and ETA with ``--fallback`` (one audit a batch, counted as labels).

What was chosen where: the fallback's constants (window 64 answers, level 0.05, 8 answers
before a decision, explore 0.25, 16 samples for the source model) were set once from the
arithmetic in docs/safety.md; one 10-round run of the recurring stream (seed 0) chose to leave
resets off for ``eatta-safe`` and on for label-free methods; the label-free signs' thresholds
were read off digits-C's corruptions (the collapse ratio 0.9, the recurring stream) and one
look at the CCC stream, seed 0 (the disagreement share 0.3, added after the collapse test alone
served the source model on a quarter of CCC's batches without answers). So the recurring stream
and CCC are tuning streams for the signs; mixed was not looked at before the study.

    python benchmarks/safety_study.py --seeds 0-2 --jobs 2 --out runs/safety
    python benchmarks/safety_study.py --report-only --out runs/safety
    python benchmarks/safety_study.py --plan annotators:recurring --seeds 1-2 --out runs/safety-b
    python benchmarks/safety_study.py --report-only --out runs/safety,runs/safety-b
    python benchmarks/safety_study.py --safe fallback_start=auto --plan annotators:mixed \
        --sizes 64 --out runs/safety-auto        # a variant (eatta-stable is not rerun)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    Template,
    load_study,
    parse_plan,
    replace_section,
    run_part,
    save_study,
    streams,
    study_parser,
    write_tables,
)
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from _study import each_part, merged, verdict, with_streams

from eatta.bench import AnnotatorOptions, StreamProtocol
from eatta.bench.monitoring import MonitorOptions
from eatta.bench.results import CellResult, domain_means
from eatta.bench.suites import digits_grid_name

SAFE, STABLE = "eatta-safe", "eatta-stable"
LABEL_FREE = ("tent", "eta")
REFERENCES = ("source", *LABEL_FREE)
#: Annotators: name -> options (None: labels at once, the synchronous path).
ANNOTATORS: dict[str, AnnotatorOptions | None] = {
    "instant": None,
    "delay 16": AnnotatorOptions(delay=16),
    "delay 64": AnnotatorOptions(delay=64),
    "person": AnnotatorOptions(stream_rate=1.0),
    "none": AnnotatorOptions(delay="never"),
}
PARTS = ("references", "annotators", "measure", "guard")
#: Annotators at which ``eatta-stable`` runs too, as the comparison (its other delays are in
#: the late-labels study, docs/real-annotators.md).
WITH_STABLE = ("instant", "person")
#: The source model's error below which a domain counts as easy (the issue's bar).
EASY = 10.0
#: A label-free gain over the source model under this many points leaves no gain to keep.
NO_GAIN = 0.5
#: The streams, in the order the study runs them (``mnist``: the MNIST test set; ``deployed``:
#: mostly clean held-out digits with corrupted stretches, in order and mixed within batches).
STREAM_NAMES = ("recurring", "mixed", "ccc", "mnist", "deployed", "deployed-mixed")
STREAMS = {
    **streams(*STREAM_NAMES[:4]),
    "deployed": StreamProtocol(rounds=1),
    "deployed-mixed": StreamProtocol(rounds=1, mixed=True),
}
#: The dataset of each stream (the rest are digits-C).
DATASETS = {"mnist": "mnist", "deployed": "digits-deployed", "deployed-mixed": "digits-deployed"}
#: Request sizes of the annotators part: 64 as given, smaller ones served through a window of
#: 64 samples with one label per window step, so labels per sample are equal at every size.
SIZES = (64, 8, 1)
#: Rounds of the recurring stream at request sizes under 64 (ten rounds of single requests
#: would take most of the study's time).
SMALL_ROUNDS = 2
#: The order the study runs in (most informative first: an interrupted study still reports).
PLAN = tuple(f"{p}:{s}" for s in STREAM_NAMES for p in PARTS)
PAGE = Template("safety")
BEGIN, END = "<!-- safety:begin -->", "<!-- safety:end -->"


def _key(size: int) -> str:
    """Where the annotators part keeps its runs at request size ``size``."""
    return "annotators" if size == 64 else f"annotators@{size}"


def cells(results: Sequence[CellResult], method: str) -> list[dict[str, Any]]:
    """What the report reads of each run of ``method`` (one per seed)."""
    return [
        {
            "seed": r.seed,
            "error": float(r.average_error),
            "rounds": [float(v) for v in (r.round_errors or [])],
            "domain_errors": domain_means([r]),
            "labels": int(r.labels_used),
            "batches": len(r.online),
            "cpu_s": float(r.cpu_time_s or 0.0),
            "fallback": (r.fallback or {}).get("stats"),
        }
        for r in results
        if r.spec.method == method
    ]


def _by_method(results: Sequence[CellResult], methods: Sequence[str]) -> dict[str, Any]:
    return {m: cells(results, m) for m in methods}


def study(
    out: Path,
    seeds: list[int],
    plan: Sequence[tuple[str, str]],
    annotators: Sequence[str] = tuple(ANNOTATORS),
    sizes: Sequence[int] = SIZES,
    jobs: int = 1,
    safe: dict[str, Any] | None = None,
    weight_anchor: float | None = None,
    backbone: str | None = None,
) -> dict[str, Any]:
    """Run ``plan``'s parts into ``out``, saving the study after each run (``backbone``: the
    source model of every stream, None: the digits CNN)."""
    data = load_study(out)
    data["seeds"] = seeds
    if backbone is not None:
        data["backbone"] = backbone
    safe = dict(safe or {})
    if weight_anchor is not None:
        data["safe"] = {**safe, "weight_anchor": weight_anchor}
    elif safe:
        data["safe"] = safe
    model = {} if backbone is None else {"backbone": backbone}
    for part, name, proto, s in each_part(data, plan, STREAMS):
        dataset = DATASETS.get(name, "digits-c")
        run = partial(run_part, out / name, seeds=seeds, dataset=dataset, jobs=jobs, **model)
        if part == "references":
            s["references"] = _by_method(run("references", proto, REFERENCES), REFERENCES)
        elif part == "annotators":
            for size, label in product(sizes, annotators):
                small = size < 64
                alone = small or "safe" in data  # eatta-stable runs in the default's study
                methods = [SAFE, STABLE] if label in WITH_STABLE and not alone else [SAFE]
                window = {"batch_size": size, "window": 64, "every": 64 // size}
                shape: dict[str, Any] = window if small else {}
                res = run(
                    f"ann-{label.replace(' ', '-')}" + (f"-{size}" if small else ""),
                    replace(proto, rounds=SMALL_ROUNDS) if small and name == "recurring" else proto,
                    methods,
                    annotator=ANNOTATORS[label],
                    hparams={SAFE: safe},
                    weight_anchor=weight_anchor,
                    **shape,
                )
                s.setdefault(_key(size), {})[label] = _by_method(res, methods)
                save_study(out, data)
        elif part == "measure":
            res = run("measure-only", proto, [SAFE], hparams={SAFE: {**safe, "fallback": False}})
            s["measure"] = cells(res, SAFE)
        elif part == "guard":
            res = run("guard", proto, LABEL_FREE, monitor=MonitorOptions(fallback=True))
            s["guard"] = _by_method(res, LABEL_FREE)
        save_study(out, data)
    return data


# -- the report --------------------------------------------------------------------------------


def _errors(runs: Sequence[dict[str, Any]]) -> list[float]:
    return [c["error"] for c in runs]


def _mean(runs: Sequence[dict[str, Any]]) -> float:
    return float(np.mean(_errors(runs))) if runs else float("nan")


def _num(v: float) -> str:
    """One decimal, or '-' for a figure that does not exist (no easy domain)."""
    return "-" if v != v else f"{v:.1f}"


def _easy(s: dict[str, Any], runs: Sequence[dict[str, Any]]) -> float:
    """Mean error over the domains where the source model errs under ``EASY`` %."""
    src = s["references"]["source"][0]["domain_errors"]
    easy = [d for d, e in src.items() if e < EASY]
    if not easy or not runs:
        return float("nan")
    return float(np.mean([np.mean([c["domain_errors"][d] for d in easy]) for c in runs]))


def _served(runs: Sequence[dict[str, Any]]) -> float:
    """Share of requests answered with the source model's predictions, mean over seeds."""
    shares = [
        c["fallback"].get("served_source", c["fallback"].get("served_given", 0)) / c["batches"]
        for c in runs
        if c["fallback"] and c["batches"]
    ]
    return float(np.mean(shares)) if shares else 0.0


def _worse_domains(s: dict[str, Any], runs: Sequence[dict[str, Any]]) -> float:
    """Domains (over the whole run) whose error is above the source model's, mean over seeds."""
    src = s["references"]["source"][0]["domain_errors"]
    return float(np.mean([sum(c["domain_errors"][d] > g for d, g in src.items()) for c in runs]))


def _row(s: dict[str, Any], label: str, runs: Sequence[dict[str, Any]], *extra: str) -> list[str]:
    """A method's row: its error, on the easy domains, its worse domains, then ``extra``."""
    easy, worse = _num(_easy(s, runs)), f"{_worse_domains(s, runs):.1f}"
    return [label, fmt(_errors(runs)), easy, worse, *extra]


def report(data: dict[str, Any]) -> str:
    """The section of docs/safety.md: ``templates/safety.md`` filled from the study."""
    blocks = [_stream_report(name, s) for name, s in data["streams"].items()]
    model = f"`{data['backbone']}`" if data.get("backbone") else "digits CNN"
    text = with_streams(PAGE, blocks, seeds=data.get("seeds", []), model=model)
    if data.get("safe"):
        settings = ", ".join(f"`{k}={v}`" for k, v in data["safe"].items())
        text = f"Variant: `{SAFE}` with {settings}.\n\n{text}"
    return text


def _stream_report(name: str, s: dict[str, Any]) -> str:
    """One stream's tables and the gain line ("" where the references did not run)."""
    refs = s.get("references")
    if not refs:
        return ""
    given = _mean(refs["source"])
    best = min(_mean(refs[m]) for m in LABEL_FREE)
    rows = [_row(s, f"{m} (given)" if m == "source" else m, refs[m], "", "") for m in REFERENCES]
    for m, runs in s.get("guard", {}).items():
        rounds = np.mean([c["rounds"] for c in runs], axis=0)
        rise = float(np.max(rounds - rounds[0])) if len(rounds) else float("nan")
        fb = [c["fallback"] for c in runs if c["fallback"]]
        resets = np.mean([f["resets"] for f in fb]) if fb else 0
        served = f"{100 * _served(runs):.0f} %, {resets:.1f} resets"
        labels = np.mean([c["labels"] / c["batches"] for c in runs])
        per_batch = f"{labels:.2f}; worst round {rise:+.1f} vs round 1"
        rows.append(_row(s, f"{m} + fallback (1 audit/batch)", runs, served, per_batch))
    if s.get("measure"):
        rows.append(_row(s, f"{SAFE}, measure only (instant)", s["measure"], "0 %", "1.00"))
    head = ["method", "error", "easy domains", "worse domains", "served given", "labels/batch"]
    out = [
        PAGE("stream", name=name, protocol=json.dumps(s["protocol"])),
        PAGE("source", given=f"{given:.1f}", best=f"{best:.1f}"),
        table(head, rows),
    ]
    for size in SIZES:
        out += _by_annotator(s, given, best, size)
    return "\n\n".join(out)


def _by_annotator(s: dict[str, Any], given: float, best: float, size: int) -> list[str]:
    """The stream's table by annotator at request size ``size``, and (at 64) the gain lines ([]
    where that part did not run)."""
    ann = {a: s[_key(size)][a] for a in ANNOTATORS if a in s.get(_key(size), {})}
    if not ann:
        return []
    safe = [ann[a][SAFE] for a in ann]
    methods = (SAFE, STABLE) if size == 64 else (SAFE,)
    rows = [[m, *(fmt(_errors(ann[a].get(m, []))) for a in ann)] for m in methods]
    given_easy = _num(_easy(s, s["references"]["source"]))
    limit = given + 0.5
    rows += [
        [
            f"bar: {SAFE} ≤ given + 0.5",
            *(f"{verdict(_mean(r) <= limit)} ({_mean(r) - limit:+.1f})" for r in safe),
        ],
        [f"easy domains: {SAFE} (given {given_easy})", *(_num(_easy(s, r)) for r in safe)],
        [f"worse domains: {SAFE}", *(f"{_worse_domains(s, r):.1f}" for r in safe)],
        [f"served given: {SAFE}", *(f"{100 * _served(r):.0f} %" for r in safe)],
    ]
    out = [PAGE("annotators", size=size), table(["method", *ann], rows)]
    return out + _gains(s, ann, given, best) if size == 64 else out


def _gains(s: dict[str, Any], ann: dict[str, Any], given: float, best: float) -> list[str]:
    """The lines under the table of requests of 64: what no answers keep, the gain over the best
    label-free method with answers at once and 16 batches late."""
    out = []
    if "none" in ann and given > 50 and given - best < NO_GAIN:
        out.append(PAGE("none-vacuous", gain=f"{given - best:.1f}"))
    elif "none" in ann and given > 50:
        kept = (given - _mean(ann["none"][SAFE])) / (given - best)
        out.append(PAGE("none", kept=f"{100 * kept:.0f}"))
    if STABLE not in ann.get("instant", {}):
        return out
    stable_error = _mean(ann["instant"][STABLE])
    stable_gain, safe_gain = best - stable_error, best - _mean(ann["instant"][SAFE])
    kept = safe_gain / stable_gain if stable_gain > 0 else float("nan")
    late, measure = ")", ""
    if "delay 16" in ann and safe_gain > 0:
        late_gain = best - _mean(ann["delay 16"][SAFE])
        share = f"{100 * late_gain / safe_gain:.0f}"
        late = PAGE(
            "late", late_gain=f"{late_gain:+.1f}", safe_gain=f"{safe_gain:+.1f}", share=share
        )
    if s.get("measure"):
        measure = PAGE(
            "measure", measure=f"{_mean(s['measure']):.1f}", stable=f"{stable_error:.1f}"
        )
    gain = PAGE(
        "gain",
        safe_gain=f"{safe_gain:+.1f}",
        stable_gain=f"{stable_gain:+.1f}",
        kept=f"{100 * kept:.0f}" if kept == kept else "-",
        late=late,
        measure=measure,
    )
    return [*out, gain]


def _markers(backbone: str) -> tuple[str, str]:
    """The markers of a backbone's own section of the page."""
    return f"<!-- safety-{backbone}:begin -->", f"<!-- safety-{backbone}:end -->"


def _value(text: str) -> Any:
    """A ``--safe`` value: JSON (numbers, true/false) or else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/safety", plan=PLAN, parts=PARTS)
    p.add_argument(
        "--annotators",
        default=",".join(ANNOTATORS),
        help=f"annotators of the annotators part, a subset of {', '.join(ANNOTATORS)}",
    )
    p.add_argument("--sizes", default="64,8,1", help="request sizes of the annotators part")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (one thread each)")
    p.add_argument(
        "--safe",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a setting of {SAFE} in every part (a variant's study: give it its own --out)",
    )
    p.add_argument(
        "--weight-anchor", type=float, help=f"{SAFE} with a weight anchor (a variant's study)"
    )
    p.add_argument(
        "--backbone",
        help="the source model of every stream (digits-vit: the LayerNorm ViT): a study of its "
        "own (give it its own --out and --tables); its section of --doc lies between "
        "<!-- safety-BACKBONE:begin --> and <!-- safety-BACKBONE:end -->",
    )
    p.add_argument("--tables", default="benchmarks/results/safety_study.md")
    p.add_argument("--doc", default="docs/safety.md")
    args = p.parse_args(argv)
    plan = parse_plan(args.plan, PARTS, STREAM_NAMES)
    if args.backbone is not None:
        try:
            digits_grid_name(args.backbone)
        except ValueError as err:
            raise SystemExit(f"--backbone: {err}") from None
    if args.report_only:
        data = merged(args.out, STREAM_NAMES)
    else:
        chosen = [a for a in args.annotators.split(",") if a]
        if any(a not in ANNOTATORS for a in chosen):
            raise SystemExit(f"--annotators must be among {', '.join(ANNOTATORS)}")
        sizes = [int(z) for z in args.sizes.split(",") if z]
        if any(z not in SIZES for z in sizes):
            raise SystemExit(f"--sizes must be among {', '.join(map(str, SIZES))}")
        safe = {k: _value(v) for k, _, v in (x.partition("=") for x in args.safe)}
        data = study(
            Path(args.out),
            args.seeds,
            plan,
            chosen,
            sizes,
            args.jobs,
            safe,
            args.weight_anchor,
            args.backbone,
        )
    text = report(data)
    write_tables(text, data, args.tables)
    if Path(args.doc).is_file():
        begin, end = (BEGIN, END) if not args.backbone else _markers(args.backbone)
        replace_section(Path(args.doc), begin, end, text)
        print(f"tables: {args.tables}; section of {args.doc} regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
