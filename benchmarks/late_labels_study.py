"""The late-labels study: labels weighed by staleness, a person's pace, the newest request first.

Regenerates the section of ``docs/real-annotators.md`` between ``<!-- late-labels:begin -->`` and
``<!-- late-labels:end -->`` (and ``benchmarks/results/late_labels.md``, ``.json``) on the digits-C
streams. Parts: ``mechanisms`` (every late-label rule of ``eatta-stable``, on ``TUNE_STREAM`` at
delays 4, 16 and never, elsewhere at 16), ``paced`` (a person at 11.7 s a label or 1.6 s a yes/no
against streams of 1, 4 and 16 batches a second, newest against oldest request first) and
``delay`` (the default ``eatta-stable`` at every delay, TENT and ETA beside it, over
``--seeds``). Every run is a cell of :func:`eatta.bench.run` under ``--out`` (finished cells are
read back, so a study resumes).

    python benchmarks/late_labels_study.py --seeds 0-2 --out runs/late-labels
    python benchmarks/late_labels_study.py --plan delay:mixed --out runs/late-labels-b
    python benchmarks/late_labels_study.py --report-only --out runs/late-labels,runs/late-labels-b
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
from _common import Template, load_study, parse_plan, run_part, save_study, streams, study_parser
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from _study import chosen, each_part, errors, publish, saved, verdict, with_streams

from eatta.annotate import Feedback
from eatta.bench import AnnotatorOptions

METHOD = "eatta-stable"
REFERENCES = ("tent", "eta")
DELAYS: tuple[int | str, ...] = (0, 1, 4, 16, 64, "never")
DELAY_KEYS = [str(d) for d in DELAYS]
#: The stream the mechanisms' defaults were chosen on; nothing was tuned on the others.
TUNE_STREAM = "ccc"
DEFAULT = "default: similarity + ETA fallback (anchor 0.1)"


def _late(weight: str, **more: Any) -> dict[str, Any]:
    """A late-label rule of ``eatta-stable`` with its entropy filter off."""
    return {"late_weight": weight, "late_entropy_filter": "none", **more}


#: Mechanisms: ``eatta-stable`` overrides. "today" is the rule before this study.
MECHANISMS: dict[str, dict[str, Any]] = {
    "today: full weight": _late("full"),
    "age (half-life 2 steps)": _late("age"),
    "drift, scale 1": _late("drift", late_drift_scale=1.0),
    "drift, scale 0.25": _late("drift"),
    "IWMS-like nearest replay (4 of 64)": _late("full", late_replay=4),
    DEFAULT: {},
}
#: At ``never`` no label arrives: the weighting and the replay change nothing, only the fallback.
NEVER_ROWS = ("today: full weight", DEFAULT)
MECH_DELAYS_TUNE: tuple[int | str, ...] = (4, 16, "never")
MECH_DELAYS_OTHER: tuple[int | str, ...] = (16,)
#: A person's pace: seconds per answer (AnnotatorCost's defaults) against batches per second.
RATES = (1, 4, 16)
ORDERS = ("newest", "oldest")
#: Feedback kinds of the paced part: (name, seconds per answer, how the table calls it).
FEEDBACK: tuple[tuple[Feedback, float, str], ...] = (
    ("label", 11.7, "label"),
    ("binary", 1.6, "yes/no"),
)
PACED_STREAMS = ("ccc",)
PARTS = ("mechanisms", "paced", "delay")
#: The order the study runs in (most informative first: an interrupted study still reports).
PLAN = "mechanisms:ccc,paced:ccc,delay:ccc,mechanisms:mixed,delay:mixed,delay:recurring".split(",")
#: Seeds per part (the delay part takes --seeds; the others seed 0 only, for time).
ONE_SEED = [0]
#: The streams, in the order the study runs them.
STREAM_NAMES = ("ccc", "mixed", "recurring")
#: The streams where the bar asks for half the delay-0 gain over ETA at delays 1 and 4.
HALF_GAIN_STREAMS = ("recurring", "mixed")
PAGE = Template("late_labels")


def study(
    out: Path,
    seeds: list[int],
    plan: Sequence[tuple[str, str]],
    delays: Sequence[int | str] = DELAYS,
) -> dict[str, Any]:
    """Run ``plan``'s parts into ``out``, saving the study after each run."""
    data = load_study(out)
    data["seeds"] = seeds
    for part, name, proto, s in each_part(data, plan, streams(*STREAM_NAMES)):
        run = partial(run_part, out / name, protocol=proto, methods=[METHOD], seeds=ONE_SEED)
        if part == "mechanisms":
            m = s.setdefault("mechanisms", {})
            here = MECH_DELAYS_TUNE if name == TUNE_STREAM else MECH_DELAYS_OTHER
            for (label, hp), d in product(MECHANISMS.items(), here):
                if d == "never" and label not in NEVER_ROWS:
                    continue  # no label arrives: the same run as today's
                opts = AnnotatorOptions(delay=d)
                res = run(f"mech-{_slug(label)}-{d}", annotator=opts, hparams={METHOD: hp})
                m.setdefault(label, {})[str(d)] = errors(res, METHOD)
                save_study(out, data)
        elif part == "paced" and name in PACED_STREAMS:
            for (feedback, _, _), rate, order in product(FEEDBACK, RATES, ORDERS):
                opts = AnnotatorOptions(feedback=feedback, stream_rate=rate, order=order)
                res = run(f"paced-{feedback}-{rate}-{order}", annotator=opts)
                ann = [r.annotation for r in res]
                s.setdefault("paced", {})[f"{feedback}/{rate}/{order}"] = {
                    "error": errors(res, METHOD),
                    "received": float(np.mean([a["received"] for a in ann])),
                    "requested": float(np.mean([a["requested"] for a in ann])),
                }
                save_study(out, data)
        elif part == "delay":
            if not all(s.get("references", {}).get(m) for m in REFERENCES):
                ref = run("references", methods=list(REFERENCES))
                s["references"] = {m: errors(ref, m) for m in REFERENCES}
                save_study(out, data)
            for d in delays:
                late = None if d == 0 else AnnotatorOptions(delay=d)  # 0: the synchronous path
                res = run(f"delay-{d}", seeds=seeds, annotator=late)
                s.setdefault("delay", {})[str(d)] = errors(res, METHOD)
                save_study(out, data)
    return data


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def bar(s: dict[str, Any], keys: Sequence[str], half_gain: bool = True) -> list[list[str]]:
    """The bar's rows (means over seeds): at every delay > 0, error <= min(ETA, TENT) + 0.5; at
    delays 1 and 4, at least half the delay-0 gain over ETA kept."""
    refs = s.get("references", {})
    if not all(refs.get(m) for m in REFERENCES) or "delay" not in s:
        return []
    best = min(float(np.mean(refs[m])) for m in REFERENCES)
    eta = float(np.mean(refs["eta"]))
    zero = s["delay"].get("0")
    gain0 = eta - float(np.mean(zero)) if zero else 0.0
    first = ["≤ min(ETA, TENT) + 0.5"]
    half = ["keeps ≥ half the delay-0 gain over ETA"]
    for k in keys:
        v = float(np.mean(s["delay"][k]))
        first.append("" if k == "0" else f"{verdict(v <= best + 0.5)} ({v - best:+.1f})")
        kept = f"{verdict(eta - v >= gain0 / 2)} ({eta - v:.1f} of {gain0:.1f})"
        half.append(kept if k in ("1", "4") and zero and half_gain else "")
    return [first, half] if any(half[1:]) else [first]


def report(data: dict[str, Any]) -> str:
    """The section of docs/real-annotators.md: ``templates/late_labels.md`` filled."""
    return with_streams(PAGE, data["streams"], _stream_report, tune=TUNE_STREAM)


def _stream_report(name: str, s: dict[str, Any]) -> str:
    """One stream's tables ("" where none of its parts ran)."""
    if not any(k in s for k in ("delay", "mechanisms", "paced")):
        return ""
    refs = s.get("references", {})

    def references(n: int) -> list[list[str]]:
        return [[f"{m} (no labels)", *[fmt(refs[m])] * n] for m in REFERENCES if refs.get(m)]

    out = []
    if "delay" in s:
        keys = [k for k in DELAY_KEYS if k in s["delay"]]
        rows = [
            [f"{METHOD} (default)", *[fmt(s["delay"][k]) for k in keys]],
            *references(len(keys)),
        ]
        rows += [[f"bar: {r[0]}", *r[1:]] for r in bar(s, keys, name in HALF_GAIN_STREAMS)]
        n = max(len(v) for v in s["delay"].values())
        out += [PAGE("delay", n=n), table(["method", *keys], rows)]
    if "mechanisms" in s:
        m = s["mechanisms"]
        keys = sorted({k for v in m.values() for k in v}, key=DELAY_KEYS.index)
        rows = [[label, *[fmt(v.get(k, [])) for k in keys]] for label, v in m.items()]
        out += [PAGE("mechanisms"), table(["mechanism", *keys], rows + references(len(keys)))]
    rows = []
    for (feedback, sec, kind), rate in product(FEEDBACK, RATES):
        cells = [s.get("paced", {}).get(f"{feedback}/{rate}/{o}") for o in ORDERS]
        if all(cells):
            got = cells[0]["received"] / max(cells[0]["requested"], 1)
            errs = [fmt(c["error"]) for c in cells]
            rows.append([f"{kind}, {sec:g} s, {rate} batch/s", f"{100 * got:.1f} %", *errs])
    if rows:
        head = ["person", "answered", *[f"{o} first" for o in ORDERS]]
        out += [PAGE("paced"), table(head, rows)]
    return "\n\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/late-labels", plan=PLAN, parts=PARTS)
    p.add_argument("--delays", default=",".join(DELAY_KEYS), help="of the delay part (a subset)")
    p.add_argument("--tables", default="benchmarks/results/late_labels.md")
    p.add_argument("--doc", default="docs/real-annotators.md")
    args = p.parse_args(argv)
    plan = parse_plan(args.plan, PARTS, STREAM_NAMES)
    if args.report_only:
        data = saved(args.out, STREAM_NAMES, Path(args.tables).with_suffix(".json"))
    else:
        delays = chosen("--delays", args.delays, DELAYS)
        data = study(Path(args.out), args.seeds, plan, delays)
    publish(report(data), data, args.tables, args.doc, "late-labels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
