"""The late-labels study: labels weighed by staleness, a person's pace, the newest request first.

Regenerates the section of ``docs/real-annotators.md`` between ``<!-- late-labels:begin -->`` and
``<!-- late-labels:end -->`` (and ``benchmarks/results/late_labels.md``, ``.json``) on the digits-C
streams of ``benchmarks/real_annotators.py``. Parts, in the order they run (each resumable: every
run is a cell of :func:`eatta.bench.run` under ``--out``; finished cells are read back):

* ``mechanisms``: every late-label mechanism of ``eatta-stable`` (full weight as before, by age,
  by drift, IWMS-like nearest replay, the ETA-style fallback, and the chosen default) on
  ``TUNE_STREAM`` (where the defaults were chosen) at delays 4, 16 and never, and on the
  other streams at delay 16 (untouched while choosing);
* ``paced``: a person at 11.7 s a label or 1.6 s a yes/no against streams of 1, 4 and 16 batches
  a second, newest first against oldest first (the default ``eatta-stable``);
* ``delay``: the default ``eatta-stable`` at delays 0, 1, 4, 16, 64 and never, with TENT and ETA
  (no labels) as references, over ``--seeds``.

    python benchmarks/late_labels_study.py --seeds 0-2 --out runs/late-labels
    python benchmarks/late_labels_study.py --report-only --out runs/late-labels
    # two processes, each on part of the plan, then one report from both folders:
    python benchmarks/late_labels_study.py --plan delay:mixed --out runs/late-labels-b
    python benchmarks/late_labels_study.py --report-only --out runs/late-labels,runs/late-labels-b
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
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

from eatta.bench import AnnotatorOptions
from eatta.bench.results import CellResult

METHOD = "eatta-stable"
REFERENCES = ("tent", "eta")
DELAYS: tuple[int | str, ...] = (0, 1, 4, 16, 64, "never")
#: The stream the mechanisms' defaults were chosen on; nothing was tuned on the others.
TUNE_STREAM = "ccc"
#: Mechanisms: ``eatta-stable`` overrides. "today" is the rule before this study.
MECHANISMS: dict[str, dict[str, Any]] = {
    "today: full weight": {"late_weight": "full", "late_entropy_filter": "none"},
    "age (half-life 2 steps)": {"late_weight": "age", "late_entropy_filter": "none"},
    "drift, scale 1": {
        "late_weight": "drift",
        "late_drift_scale": 1.0,
        "late_entropy_filter": "none",
    },
    "drift, scale 0.25": {"late_weight": "drift", "late_entropy_filter": "none"},
    "IWMS-like nearest replay (4 of 64)": {
        "late_weight": "full",
        "late_entropy_filter": "none",
        "late_replay": 4,
    },
    "default: drift 0.25 + ETA fallback (anchor 0.1)": {},
}
#: At ``never`` no label arrives: the weighting and the replay change nothing, only the fallback.
NEVER_ROWS = ("today: full weight", "default: drift 0.25 + ETA fallback (anchor 0.1)")
MECH_DELAYS_TUNE: tuple[int | str, ...] = (4, 16, "never")
MECH_DELAYS_OTHER: tuple[int | str, ...] = (16,)
#: A person's pace: seconds per answer (AnnotatorCost's defaults) against batches per second.
RATES = (1, 4, 16)
ORDERS = ("newest", "oldest")
PACED_STREAMS = ("ccc",)
PARTS = ("mechanisms", "paced", "delay")
#: The order the study runs in (most informative first: an interrupted study still reports).
PLAN = (
    "mechanisms:ccc",
    "paced:ccc",
    "delay:ccc",
    "mechanisms:mixed",
    "delay:mixed",
    "delay:recurring",
)
#: Seeds per part (the delay part takes --seeds; the others seed 0 only, for time).
ONE_SEED = [0]


#: The streams, in the order the study runs them.
STREAM_NAMES = ("ccc", "mixed", "recurring")


def errors(results: Sequence[CellResult], method: str) -> list[float]:
    return [float(r.average_error) for r in results if r.spec.method == method]


def study(
    out: Path,
    seeds: list[int],
    plan: Sequence[tuple[str, str]],
    delays: Sequence[int | str] = DELAYS,
) -> dict[str, Any]:
    data = load_study(out)
    data["seeds"] = seeds
    every = streams(*STREAM_NAMES)
    for part, name in plan:
        proto = every[name]
        s = data["streams"].setdefault(name, {"protocol": proto.describe()})
        print(f"{part} / {name}: {proto}", flush=True)
        if part == "mechanisms":
            m = s.setdefault("mechanisms", {})
            for label, hp in MECHANISMS.items():
                for d in MECH_DELAYS_TUNE if name == TUNE_STREAM else MECH_DELAYS_OTHER:
                    if d == "never" and label not in NEVER_ROWS:
                        continue  # no label arrives: the same run as today's
                    res = run_part(
                        out / name,
                        f"mech-{_slug(label)}-{d}",
                        proto,
                        [METHOD],
                        ONE_SEED,
                        annotator=AnnotatorOptions(delay=d),
                        hparams={METHOD: hp},
                    )
                    m.setdefault(label, {})[str(d)] = errors(res, METHOD)
                    save_study(out, data)
        elif part == "paced" and name in PACED_STREAMS:
            p = s.setdefault("paced", {})
            for feedback in ("label", "binary"):
                for rate in RATES:
                    for order in ORDERS:
                        opts = AnnotatorOptions(
                            feedback=feedback,  # type: ignore[arg-type]  # a literal
                            stream_rate=rate,
                            order=order,
                        )
                        res = run_part(
                            out / name,
                            f"paced-{feedback}-{rate}-{order}",
                            proto,
                            [METHOD],
                            ONE_SEED,
                            annotator=opts,
                        )
                        ann = [r.annotation for r in res]
                        p[f"{feedback}/{rate}/{order}"] = {
                            "error": errors(res, METHOD),
                            "received": float(np.mean([a["received"] for a in ann])),
                            "requested": float(np.mean([a["requested"] for a in ann])),
                        }
                        save_study(out, data)
        elif part == "delay":
            if not all(s.get("references", {}).get(m) for m in REFERENCES):
                ref = run_part(out / name, "references", proto, list(REFERENCES), ONE_SEED)
                s["references"] = {m: errors(ref, m) for m in REFERENCES}
                save_study(out, data)
            dd = s.setdefault("delay", {})
            for d in delays:
                opts = None if d == 0 else AnnotatorOptions(delay=d)  # 0: the synchronous path
                res = run_part(out / name, f"delay-{d}", proto, [METHOD], seeds, annotator=opts)
                dd[str(d)] = errors(res, METHOD)
                save_study(out, data)
    return data


def merged(folders: Sequence[Path]) -> dict[str, Any]:
    """The studies saved in ``folders`` as one (parts of a stream from several folders)."""
    data: dict[str, Any] = {"streams": {}}
    for folder in folders:
        one = json.loads((folder / "study.json").read_text(encoding="utf-8"))
        data["seeds"] = one["seeds"]
        for name, s in one["streams"].items():
            stream = data["streams"].setdefault(name, {})
            for part, value in s.items():  # parts split by delay merge key by key
                if isinstance(value, dict) and isinstance(stream.get(part), dict):
                    stream[part].update(value)
                else:
                    stream[part] = value
    order = list(streams(*STREAM_NAMES))
    data["streams"] = dict(sorted(data["streams"].items(), key=lambda kv: order.index(kv[0])))
    return data


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


#: The streams where the bar asks for half the delay-0 gain over ETA at delays 1 and 4.
HALF_GAIN_STREAMS = ("recurring", "mixed")


def bar(s: dict[str, Any], keys: Sequence[str], half_gain: bool = True) -> list[list[str]]:
    """The bar's rows (means over seeds): at every delay > 0, error <= min(ETA, TENT) + 0.5; at
    delays 1 and 4, at least half the delay-0 gain over ETA kept."""
    refs = s.get("references", {})
    if not all(refs.get(m) for m in REFERENCES) or "delay" not in s:
        return []
    best = min(float(np.mean(refs[m])) for m in REFERENCES)
    eta = float(np.mean(refs["eta"]))
    first = ["≤ min(ETA, TENT) + 0.5"]
    half = ["keeps ≥ half the delay-0 gain over ETA"]
    zero = s["delay"].get("0")
    for k in keys:
        v = float(np.mean(s["delay"][k]))
        first.append(
            "" if k == "0" else f"{'met' if v <= best + 0.5 else 'missed'} ({v - best:+.1f})"
        )
        if k in ("1", "4") and zero and half_gain:
            gain0 = eta - float(np.mean(zero))
            half.append(
                f"{'met' if eta - v >= gain0 / 2 else 'missed'} ({eta - v:.1f} of {gain0:.1f})"
            )
        else:
            half.append("")
    return [first, half] if any(half[1:]) else [first]


PAGE = Template("late_labels")


def report(data: dict[str, Any]) -> str:
    """The section of docs/real-annotators.md: ``templates/late_labels.md`` filled."""
    blocks = [_stream_report(n, s) for n, s in data["streams"].items()]
    blocks = [b for b in blocks if b]
    text = PAGE(tune=TUNE_STREAM, streams="\n" + "\n\n".join(blocks) if blocks else "")
    return text if blocks else text[:-1]


def _stream_report(name: str, s: dict[str, Any]) -> str:
    """One stream's tables ("" where none of its parts ran)."""
    if not any(k in s for k in ("delay", "mechanisms", "paced")):
        return ""
    out = [PAGE("stream", name=name, protocol=json.dumps(s["protocol"]))]
    if "delay" in s:
        keys = [str(d) for d in DELAYS if str(d) in s["delay"]]
        rows = [[f"{METHOD} (default)", *[fmt(s["delay"][k]) for k in keys]]]
        for m in REFERENCES:
            if s.get("references", {}).get(m):
                rows.append([f"{m} (no labels)", *[fmt(s["references"][m])] * len(keys)])
        marks = bar(s, keys, name in HALF_GAIN_STREAMS)
        rows += [[f"bar: {r[0]}", *r[1:]] for r in marks]
        n = max(len(v) for v in s["delay"].values())
        out += [PAGE("delay", method=METHOD, n=n), table(["method", *keys], rows)]
    if "mechanisms" in s:
        m = s["mechanisms"]
        keys = sorted(
            {k for v in m.values() for k in v}, key=lambda k: [str(d) for d in DELAYS].index(k)
        )
        rows = [[label, *[fmt(v.get(k, [])) for k in keys]] for label, v in m.items()]
        if "references" in s:
            for r in REFERENCES:
                rows.append([f"{r} (no labels)", *[fmt(s["references"][r])] * len(keys)])
        out += [PAGE("mechanisms"), table(["mechanism", *keys], rows)]
    if "paced" in s:
        p = s["paced"]
        rows = []
        for feedback, sec in (("label", 11.7), ("binary", 1.6)):
            for rate in RATES:
                cells = [p.get(f"{feedback}/{rate}/{o}") for o in ORDERS]
                if not all(cells):
                    continue
                kind = "label" if feedback == "label" else "yes/no"
                got = cells[0]["received"] / max(cells[0]["requested"], 1)  # type: ignore[index]
                rows.append(
                    [
                        f"{kind}, {sec:g} s, {rate} batch/s",
                        f"{100 * got:.1f} %",
                        *[fmt(c["error"]) for c in cells],  # type: ignore[index]
                    ]
                )
        if rows:
            head = ["person", "answered", *[f"{o} first" for o in ORDERS]]
            out += [PAGE("paced"), table(head, rows)]
    return "\n\n".join(out)


BEGIN, END = "<!-- late-labels:begin -->", "<!-- late-labels:end -->"


def main(argv: Sequence[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/late-labels", plan=PLAN, parts=PARTS)
    p.add_argument(
        "--delays",
        default=",".join(str(d) for d in DELAYS),
        help="delays of the delay part (a subset, e.g. 16,never, when time is short)",
    )
    p.add_argument("--tables", default="benchmarks/results/late_labels.md")
    p.add_argument("--doc", default="docs/real-annotators.md")
    args = p.parse_args(argv)
    seeds = args.seeds
    plan = parse_plan(args.plan, PARTS, STREAM_NAMES)
    if args.report_only:
        data = merged([Path(x) for x in args.out.split(",") if x])
    else:
        delays = [d if d == "never" else int(d) for d in args.delays.split(",") if d]
        if any(d not in DELAYS for d in delays):
            raise SystemExit(f"--delays must be among {DELAYS}, got {args.delays!r}")
        data = study(Path(args.out), seeds, plan, delays)
    text = report(data)
    write_tables(text, data, args.tables)
    replace_section(Path(args.doc), BEGIN, END, text)
    print(f"tables: {args.tables}; section of {args.doc} regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
