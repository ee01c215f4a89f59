"""The never-worse study: ``eatta-safe`` against the source model, the label-free methods and
``eatta-stable``, at every kind of annotator; label-free methods with the fallback.

Regenerates the section of ``docs/safety.md`` between ``<!-- safety:begin -->`` and
``<!-- safety:end -->`` (and ``benchmarks/results/safety_study.md``, ``.json``). Parts, per
stream (``STREAMS``), over ``--seeds``: ``references`` (the source model, TENT, ETA);
``annotators`` (``eatta-safe`` at every one of ``ANNOTATORS``, in requests of 64, 8 and 1
samples at one label per 64 samples, under 64 through a window of 64; ``eatta-stable`` beside it
at ``WITH_STABLE`` in requests of 64); ``measure`` (``eatta-safe`` with ``fallback_acts=False``,
labels at once: what drawing the requests costs); ``guard`` (TENT and ETA with ``--fallback``, one
audit a batch). Every run is a cell of :func:`eatta.bench.run` under ``--out`` (finished cells are
read back, so a study resumes). What tuned what: docs/safety.md; besides, one 10-round recurring
run (seed 0) chose resets off for ``eatta-safe`` and on for label-free methods.

    python benchmarks/safety_study.py --seeds 0-2 --jobs 2 --out runs/safety
    python benchmarks/safety_study.py --plan annotators:recurring --seeds 1-2 --out runs/safety-b
    python benchmarks/safety_study.py --report-only --out runs/safety,runs/safety-b
    python benchmarks/safety_study.py --safe fallback_start=auto --plan annotators:mixed \
        --sizes 64 --out runs/safety-auto        # a variant (eatta-stable is not rerun)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
from _common import Template, load_study, parse_plan, run_part, save_study, streams, study_parser
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from _study import chosen, each_part, publish, saved, verdict, with_streams

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
PARTS = ("references", "annotators", "measure", "guard", "tradeoff")
#: ``eatta-safe``'s rules the annotators part runs: the default (the promise) and the lean rule
#: it replaced (``fallback_start="blend"``: measured, not guaranteed), by its row name.
RULES: dict[str, dict[str, Any]] = {SAFE: {}, f"{SAFE} (blend)": {"fallback_start": "blend"}}
#: The promise relaxed, at a person's pace in requests of 64: ``(level, tolerance)``.
TRADEOFF = ((0.2, 0.5), (0.05, 1.0), (0.2, 1.0))
#: The promise's default ``(level, tolerance)`` and the bar on the running excess.
PROMISE = (0.05, 0.5)
#: Annotators at which ``eatta-stable`` runs too, as the comparison (its other delays are in
#: the late-labels study, docs/real-annotators.md).
WITH_STABLE = ("instant", "person")
#: The source model's error below which a domain counts as easy (the issue's bar).
EASY = 10.0
#: A label-free gain over the source model under this many points leaves no gain to keep.
NO_GAIN = 0.5
#: The streams, in the order the study runs them (``mnist``: the MNIST test set; ``deployed``:
#: mostly clean held-out digits with corrupted stretches, in order and mixed within batches).
#: Built to mislead what serves without evidence (the adapted model worse, far from the given
#: one): ``mnist-far``, every method at 10x the learning rate; ``mnist-dir``, batches of mostly
#: one class (Dirichlet 0.01), where entropy minimization collapses.
STREAM_NAMES = ("recurring", "mixed", "ccc", "mnist", "deployed", "deployed-mixed", "mnist-far")
STREAM_NAMES += ("mnist-dir", "mild")
STREAMS = {
    **streams(*STREAM_NAMES[:4]),
    "deployed": StreamProtocol(rounds=1),
    "deployed-mixed": StreamProtocol(rounds=1, mixed=True),
    "mnist-far": StreamProtocol(rounds=5),
    "mnist-dir": StreamProtocol(rounds=5, dirichlet=0.01),
    "mild": StreamProtocol(rounds=2),
}
#: Loading options of a stream: ``mild`` is the deployed stream at severity 1 (clean held-out
#: digits with corrupted stretches at the lowest severity), two rounds: a shift where adapting
#: helps by a few points. Chosen from the references alone (no eatta-safe run): digits-C at
#: severity 1, tried first, is no mild shift here (the given model 36.5 % error, TENT 15.5).
LOADING: dict[str, dict[str, Any]] = {"mild": {"severity": 1}}
#: The dataset of each stream (the rest are digits-C), and a stream's own settings.
DATASETS = {"mnist": "mnist", "deployed": "digits-deployed", "deployed-mixed": "digits-deployed"}
DATASETS |= {"mnist-far": "mnist", "mnist-dir": "mnist", "mild": "digits-deployed"}
HPARAMS: dict[str, dict[str, Any]] = {"mnist-far": {"lr": 0.05}}
#: Request sizes of the annotators part: 64 as given, smaller ones served through a window of
#: 64 samples with one label per window step, so labels per sample are equal at every size.
SIZES = (64, 8, 1)
#: Rounds of the recurring stream at request sizes under 64 (ten rounds of single requests
#: would take most of the study's time).
SMALL_ROUNDS = 2
#: The order the study runs in (most informative first: an interrupted study still reports).
PLAN = tuple(f"{p}:{s}" for s in STREAM_NAMES for p in PARTS)
PAGE = Template("safety")
VARIANT = f"a setting of {SAFE} in every part (a variant's study: give it its own --out)"
BACKBONE = (
    "the source model of every stream (digits-vit: the LayerNorm ViT): a study of its own (give "
    "it its own --out; its tables default to its own file); its section of --doc: "
    "<!-- safety-BACKBONE:begin/end -->"
)


def _key(size: int) -> str:
    """Where the annotators part keeps its runs at request size ``size``."""
    return "annotators" if size == 64 else f"annotators@{size}"


def running_excess(served: Sequence[Sequence[int]], given: Sequence[Sequence[int]]) -> list[float]:
    """The largest and the last running excess of the served error over the given model's, in
    points, over every batch: ``100 (cum. served errors - cum. given errors) / cum. samples``
    (``served``, ``given``: the online records, ``[images, errors, ...]`` per batch, of the same
    stream at the same request size)."""
    if len(served) != len(given):
        raise ValueError(f"{len(served)} served batches against {len(given)} of the given model")
    worst, excess, seen = -math.inf, 0, 0
    for s, g in zip(served, given, strict=True):
        if s[0] != g[0]:
            raise ValueError("the served and the given records differ in their batches")
        excess, seen = excess + s[1] - g[1], seen + s[0]
        worst = max(worst, 100.0 * excess / seen)
    return [worst, 100.0 * excess / seen if seen else 0.0]


def by_method(
    results: Sequence[CellResult],
    methods: Sequence[str],
    given: dict[int, Sequence[Sequence[int]]] | None = None,
) -> dict[str, Any]:
    """What the report reads of each run, per method (one run per seed); ``given``: the given
    model's online record per seed, for each run's running excess over it."""
    return {
        m: [
            {
                "seed": r.seed,
                "error": float(r.average_error),
                "rounds": [float(v) for v in (r.round_errors or [])],
                "domain_errors": domain_means([r]),
                "labels": int(r.labels_used),
                "batches": len(r.online),
                "cpu_s": float(r.cpu_time_s or 0.0),
                "fallback": (r.fallback or {}).get("stats"),
                **({"excess": running_excess(r.online, given[r.seed])} if given else {}),
            }
            for r in results
            if r.spec.method == m
        ]
        for m in methods
    }


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
    model = {} if backbone is None else {"backbone": backbone}
    data = {**load_study(out), "seeds": seeds, **model}
    safe = safe or {}
    anchor = {} if weight_anchor is None else {"weight_anchor": weight_anchor}
    if safe or anchor:
        data["safe"] = {**safe, **anchor}
    for part, name, proto, s in each_part(data, plan, STREAMS):
        dataset = DATASETS.get(name, "digits-c")
        loading = LOADING.get(name, {})
        run = partial(
            run_part, out / name, seeds=seeds, dataset=dataset, jobs=jobs, **model, **loading
        )
        own = {"*": HPARAMS[name]} if name in HPARAMS else {}
        if part == "references":
            res = run("references", proto, REFERENCES, hparams=own)
            s["references"] = by_method(res, REFERENCES)
        elif part == "annotators":
            for size, label in product(sizes, annotators):
                small = size < 64
                stream = (
                    replace(proto, rounds=SMALL_ROUNDS) if small and name == "recurring" else proto
                )
                given = _given(run, stream, size)
                alone = small or "safe" in data  # eatta-stable runs in the default's study
                window: dict[str, Any] = {"batch_size": size, "window": 64, "every": 64 // size}
                got: dict[str, Any] = {}
                for rule, settings in RULES.items():
                    if rule != SAFE and "safe" in data:
                        continue  # a variant's study runs its own setting only
                    stable = label in WITH_STABLE and not alone and rule == SAFE
                    methods = [SAFE, STABLE] if stable else [SAFE]
                    suffix = "" if rule == SAFE else "-blend"
                    res = run(
                        f"ann-{label.replace(' ', '-')}" + (f"-{size}" if small else "") + suffix,
                        stream,
                        methods,
                        annotator=ANNOTATORS[label],
                        hparams={**own, SAFE: {**safe, **settings}},
                        weight_anchor=weight_anchor,
                        **(window if small else {}),
                    )
                    runs = by_method(res, methods, given)
                    got[rule] = runs[SAFE]
                    if stable:
                        got[STABLE] = runs[STABLE]
                s.setdefault(_key(size), {})[label] = got
                save_study(out, data)
        elif part == "tradeoff":
            given = _given(run, proto, 64)
            for level, tolerance in TRADEOFF:
                settings = {**safe, "level": level, "tolerance": tolerance}
                res = run(
                    f"tradeoff-{level}-{tolerance}",
                    proto,
                    [SAFE],
                    annotator=ANNOTATORS["person"],
                    hparams={**own, SAFE: settings},
                )
                s.setdefault("tradeoff", {})[f"{level},{tolerance}"] = by_method(
                    res, [SAFE], given
                )[SAFE]
                save_study(out, data)
        elif part == "measure":
            res = run(
                "measure-only",
                proto,
                [SAFE],
                hparams={**own, SAFE: {**safe, "fallback_acts": False}},
            )
            s["measure"] = by_method(res, [SAFE])[SAFE]
        elif part == "guard":
            res = run(
                "guard", proto, LABEL_FREE, monitor=MonitorOptions(fallback=True), hparams=own
            )
            s["guard"] = by_method(res, LABEL_FREE)
        save_study(out, data)
    return data


def _given(run: Any, stream: StreamProtocol, size: int) -> dict[int, Sequence[Sequence[int]]]:
    """The given model's online record per seed on ``stream`` in requests of ``size``."""
    res = run(f"given-{size}", stream, ["source"], **({"batch_size": size} if size < 64 else {}))
    return {r.seed: r.online for r in res}


# -- the report --------------------------------------------------------------------------------


def _errors(runs: Sequence[dict[str, Any]]) -> list[float]:
    return [c["error"] for c in runs]


def _mean(runs: Sequence[dict[str, Any]]) -> float:
    return float(np.mean(_errors(runs))) if runs else float("nan")


def _figures(s: dict[str, Any], runs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Means over seeds: the error on the easy domains (where the source model errs under
    ``EASY`` %; '-' where there are none), the domains (over the whole run) worse than the source
    model's, and the share of requests answered with the source model's predictions."""
    src = s["references"]["source"][0]["domain_errors"]
    easy = [d for d, e in src.items() if e < EASY]
    on_easy = [np.mean([c["domain_errors"][d] for d in easy]) for c in runs] if easy else []
    worse = [sum(c["domain_errors"][d] > e for d, e in src.items()) for c in runs]
    fb = [(c["fallback"], c["batches"]) for c in runs if c["fallback"]]
    given = [f["served_source"] / n for f, n in fb] or [0.0]
    # in part: the promise's part, or the lean rule's blend
    blend = [sum(f.get("served", {}).get(k, 0) for k in ("blend", "part")) / n for f, n in fb]
    blend = blend or [0.0]
    return {
        "easy": f"{np.mean(on_easy):.1f}" if on_easy else "-",
        "worse": f"{np.mean(worse):.1f}",
        "served": f"{100 * float(np.mean(given)):.0f} %",
        "blend": f"{100 * float(np.mean(blend)):.0f} %",
    }


def _row(s: dict[str, Any], label: str, runs: Sequence[dict[str, Any]], *extra: str) -> list[str]:
    """A method's row: its error, on the easy domains, its worse domains, then ``extra``."""
    figures = _figures(s, runs)
    return [label, fmt(_errors(runs)), figures["easy"], figures["worse"], *extra]


def report(data: dict[str, Any]) -> str:
    """The section of docs/safety.md: ``templates/safety.md`` filled from the study."""
    model = f"`{data['backbone']}`" if data.get("backbone") else "digits CNN"
    seeds = data.get("seeds", [])
    text = with_streams(PAGE, data["streams"], _stream_report, seeds=seeds, model=model)
    if promise := _promise_report(data["streams"]):
        text = f"{promise}\n\n{text}"
    if data.get("safe"):
        settings = ", ".join(f"`{k}={v}`" for k, v in data["safe"].items())
        text = f"{PAGE('variant', settings=settings)}\n\n{text}"
    return text


def _excess(runs: Sequence[dict[str, Any]]) -> list[float]:
    """Each run's largest running excess over the given model (points; runs without: none)."""
    return [c["excess"][0] for c in runs if "excess" in c]


def _kept(given: float, stable: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]]) -> str:
    """The share of ``eatta-stable``'s gain over the given model that ``runs`` keep ('-' where
    it gains under :data:`NO_GAIN` points)."""
    gain = given - _mean(stable) if stable else math.nan
    if not runs or not gain >= NO_GAIN:
        return "-"
    return f"{100 * (given - _mean(runs)) / gain:.0f} %"


def _promise_report(streams: dict[str, Any]) -> str:
    """The promise run by run: every cell's largest running excess over the given model (worst
    seed) for the default and the lean rule, the runs past the tolerance against the bar, the
    kept share of ``eatta-stable``'s gain, the trade-off ("" where no run has its excess)."""
    level, tolerance = PROMISE
    rows, counts = [], {rule: [0, 0] for rule in RULES}
    kept_rows, trade = [], {}
    for name, s in streams.items():
        for size in SIZES:
            cells = s.get(_key(size), {})
            cell = []
            for a in ANNOTATORS:
                shown = []
                for rule in RULES:
                    ex = _excess(cells.get(a, {}).get(rule, []))
                    counts[rule][0] += sum(e > tolerance for e in ex)
                    counts[rule][1] += len(ex)
                    shown.append(f"{max(ex):+.2f}" if ex else "-")
                cell.append(" / ".join(shown))
            if any(c != " / ".join(["-"] * len(RULES)) for c in cell):
                rows.append([name, str(size), *cell])
        refs, ann = s.get("references"), s.get(_key(64), {})
        if refs and ann:
            given = _mean(refs["source"])
            stable = {a: ann.get(a, {}).get(STABLE, []) for a in WITH_STABLE}
            kept_rows.append(
                [
                    name,
                    f"{given:.1f}",
                    *(
                        _kept(given, stable[a], ann.get(a, {}).get(rule, []))
                        for a in WITH_STABLE
                        for rule in RULES
                    ),
                ]
            )
            for setting, runs in {
                f"{level},{tolerance}": ann.get("person", {}).get(SAFE, []),
                **s.get("tradeoff", {}),
            }.items():
                trade.setdefault(setting, []).append((given, stable["person"], runs))
    if not rows:
        return ""
    bar = {rule: math.ceil(level * n) for rule, (_, n) in counts.items()}
    verdicts = ", ".join(
        f"{rule}: {over} of {n} runs past {tolerance} points (bar: at most {bar[rule]})"
        for rule, (over, n) in counts.items()
    )
    head = ["stream", "request", *ANNOTATORS]
    out = [PAGE("promise", tolerance=tolerance, rules=" / ".join(RULES)), table(head, rows)]
    out.append(PAGE("promise-count", verdicts=verdicts))
    kept_head = ["stream", "given"] + [f"{r}, {a}" for a in WITH_STABLE for r in RULES]
    out += [PAGE("kept"), table(kept_head, kept_rows)]
    trade_rows = []
    for setting, cells in trade.items():
        lv, tol = setting.split(",")
        shares = [
            (given - _mean(runs)) / (given - _mean(st))
            for given, st, runs in cells
            if runs and st and given - _mean(st) >= NO_GAIN
        ]
        worst = [e for _, _, runs in cells for e in _excess(runs)]
        trade_rows.append(
            [
                lv,
                tol,
                f"{100 * float(np.mean(shares)):.0f} %" if shares else "-",
                f"{max(worst):+.2f}" if worst else "-",
                f"{sum(e > float(tol) for e in worst)} of {len(worst)}",
            ]
        )
    head = ["level", "tolerance", "kept gain, a person (mean over streams)", "worst excess", "past"]
    out += [PAGE("tradeoff"), table(head, trade_rows)]
    return "\n\n".join(out)


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
        served = f"{_figures(s, runs)['served']}, {resets:.1f} resets"
        labels = np.mean([c["labels"] / c["batches"] for c in runs])
        per_batch = f"{labels:.2f}; worst round {rise:+.1f} vs round 1"
        rows.append(_row(s, f"{m} + fallback (1 audit/batch)", runs, served, per_batch))
    if s.get("measure"):
        rows.append(_row(s, f"{SAFE}, measure only (instant)", s["measure"], "0 %", "1.00"))
    head = ["method", "error", "easy domains", "worse domains", "served given", "labels/batch"]
    out = [
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
    given_easy = _figures(s, s["references"]["source"])["easy"]
    limit = given + 0.5
    figures = [_figures(s, r) for r in safe]
    rows += [
        [
            f"bar: {SAFE} ≤ given + 0.5",
            *(f"{verdict(_mean(r) <= limit)} ({_mean(r) - limit:+.1f})" for r in safe),
        ],
        [f"easy domains: {SAFE} (given {given_easy})", *(f["easy"] for f in figures)],
        [f"worse domains: {SAFE}", *(f["worse"] for f in figures)],
        [f"served given: {SAFE}", *(f["served"] for f in figures)],
        [f"served in part: {SAFE}", *(f["blend"] for f in figures)],
    ]
    if size == 64:
        vs = [
            f"{_mean(ann[a][SAFE]) - _mean(ann[a][STABLE]):+.1f}" if STABLE in ann[a] else "-"
            for a in ann
        ]
        rows.append([f"{SAFE} − {STABLE}", *vs])
    out = [PAGE("annotators", size=size), table(["method", *ann], rows)]
    return out + _gains(s, ann, given, best) if size == 64 else out


def _gains(s: dict[str, Any], ann: dict[str, Any], given: float, best: float) -> list[str]:
    """The lines under the table of requests of 64: what no answers keep, the gain with answers
    at once over the given model and over the best label-free method, and 16 batches late."""
    out = []
    if "none" in ann and given > 50 and given - best < NO_GAIN:
        out.append(PAGE("none-vacuous", gain=f"{given - best:.1f}"))
    elif "none" in ann and given > 50:
        kept = (given - _mean(ann["none"][SAFE])) / (given - best)
        out.append(PAGE("none", kept=f"{round(100 * kept)}"))
    if STABLE not in ann.get("instant", {}):
        return out
    stable_error = _mean(ann["instant"][STABLE])
    stable_gain, safe_gain = best - stable_error, best - _mean(ann["instant"][SAFE])
    kept = safe_gain / stable_gain if stable_gain > 0 else float("nan")
    late, measure = ")", ""
    if "delay 16" in ann and safe_gain > 0:
        late_gain = best - _mean(ann["delay 16"][SAFE])
        gains = {"late_gain": f"{late_gain:+.1f}", "safe_gain": f"{safe_gain:+.1f}"}
        late = PAGE("late", **gains, share=f"{100 * late_gain / safe_gain:.0f}")
    if s.get("measure"):
        errors = {"measure": f"{_mean(s['measure']):.1f}", "stable": f"{stable_error:.1f}"}
        measure = PAGE("measure", **errors)
    over = {"given_safe": given - _mean(ann["instant"][SAFE]), "given_stable": given - stable_error}
    shown = {k: f"{v:+.1f}" for k, v in over.items()}
    share = over["given_safe"] / over["given_stable"] if over["given_stable"] > 0 else math.nan
    gain = PAGE(
        "gain",
        **shown,
        given_kept=f"{100 * share:.0f}" if share == share else "-",
        safe_gain=f"{safe_gain:+.1f}",
        stable_gain=f"{stable_gain:+.1f}",
        kept=f"{100 * kept:.0f}" if kept == kept else "-",
        late=late,
        measure=measure,
    )
    return [*out, gain]


def _value(text: str) -> Any:
    """A ``--safe`` value: JSON (numbers, true/false) or else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def default_tables(backbone: str | None) -> str:
    """Where a study's tables go unless ``--tables`` says: another source model's study beside
    the CNN's, never over it (``digits-vit``: ``safety_study_vit.md``)."""
    suffix = "" if backbone is None else "_" + backbone.removeprefix("digits-")
    return f"benchmarks/results/safety_study{suffix}.md"


def main(argv: Sequence[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/safety", plan=PLAN, parts=PARTS)
    p.add_argument("--annotators", default=",".join(ANNOTATORS), help="of the annotators part")
    p.add_argument("--sizes", default="64,8,1", help="request sizes of the annotators part")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (one thread each)")
    p.add_argument("--safe", action="append", default=[], metavar="KEY=VALUE", help=VARIANT)
    p.add_argument("--weight-anchor", type=float, help="a weight anchor (a variant's study)")
    p.add_argument("--backbone", help=BACKBONE)
    p.add_argument("--tables", help="default: benchmarks/results/safety_study[_BACKBONE].md")
    p.add_argument("--doc", default="docs/safety.md")
    args = p.parse_args(argv)
    plan = parse_plan(args.plan, PARTS, STREAM_NAMES)
    args.tables = args.tables or default_tables(args.backbone)
    if args.backbone is not None:
        try:
            digits_grid_name(args.backbone)
        except ValueError as err:
            raise SystemExit(f"--backbone: {err}") from None
    if args.report_only:
        data = saved(args.out, STREAM_NAMES, Path(args.tables).with_suffix(".json"))
    else:
        annotators = chosen("--annotators", args.annotators, tuple(ANNOTATORS))
        sizes = chosen("--sizes", args.sizes, SIZES)
        safe = {k: _value(v) for k, _, v in (x.partition("=") for x in args.safe)}
        variant = {"safe": safe, "weight_anchor": args.weight_anchor, "backbone": args.backbone}
        data = study(Path(args.out), args.seeds, plan, annotators, sizes, args.jobs, **variant)
    markers = "safety" if args.backbone is None else f"safety-{args.backbone}"
    publish(report(data), data, args.tables, args.doc, markers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
