"""The real-annotators study: EATTA and the Baseline with late, wrong and yes/no labels.

Regenerates the tables and plot of ``docs/real-annotators.md`` (mean ± std over seeds) on the
recurring, mixed and CCC digits-C streams. Parts: error against label delay for eatta,
eatta-stable and the Baseline, with TENT and ETA as label-free references; error against label
noise; yes/no feedback against full labels at equal annotator time; a replay buffer as a way to
recover what delay costs (its size tuned on ``ccc`` only, reported on the other two). Every run
is a cell of :func:`eatta.bench.run` in ``--out`` (finished cells are read back, so an
interrupted study resumes). A delay of 0 is not run again: it is bit-identical to the default
synchronous annotator (tests/methods/test_async_annotation.py), so the default cells stand for it.

    python benchmarks/real_annotators.py --seeds 0-2 --out runs/real-annotators
    python benchmarks/real_annotators.py --quick --seeds 0     # a smoke run (short streams)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from _common import Template, run_part, save_study, streams, study_parser
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from _study import errors, publish, saved, with_streams

from eatta.bench import AnnotatorOptions
from eatta.bench.report import pyplot
from eatta.bench.results import CellResult

ACTIVE = ("baseline", "eatta", "eatta-stable")
REFERENCES = ("source", "tent", "eta", "rdumb")
DELAYS: tuple[int | str, ...] = (1, 4, 16, 64, "never")
#: The delay columns: 0 (the default cells) and ``DELAYS``.
DELAY_KEYS = ["0", *[str(d) for d in DELAYS]]
NOISE = (0.1, 0.2, 0.3)
#: Replay-buffer sizes tried under delay (tuned on TUNE_STREAM, reported on the others).
BUFFERS = (32, 300)
TUNE_DELAY = 16
TUNE_STREAM = "ccc"
#: Yes/no answers per batch at about the annotator time of one full label (11.7 s / 1.6 s).
BINARY_PER_LABEL = 7
#: The annotation counts kept per delay.
COUNTS = ("requested", "received", "expired", "pending")
#: What ran where, for the study to fit in one session on 2 cores: every part on ``ccc``; the
#: delays and the buffer on ``mixed``; the delays but 64 on the 10-round stream (each of its runs
#: takes 8x a CCC run).
STREAM_NAMES = ("ccc", "recurring", "mixed")
EVERY_PART = ("ccc",)
BUFFER_STREAMS = ("ccc", "mixed")
SKIP_DELAYS = {"recurring": (64,)}
PAGE = Template("real_annotators")


def _of(
    res: list[CellResult], last: bool = False, methods: Sequence[str] = ACTIVE
) -> dict[str, list[float]]:
    """Each method's errors over the runs (``last``: of the last round)."""
    return {m: errors(res, m, last) for m in methods}


def study(out: Path, seeds: list[int], jobs: int, quick: bool) -> dict[str, Any]:
    """Run every part into ``out``, saving the study after each run."""
    data: dict[str, Any] = {"seeds": seeds, "streams": {}}
    chosen_buffer: int | None = None
    for name, proto in streams(*STREAM_NAMES, quick=quick).items():
        save_study(out, data)  # the streams before this one
        print(f"stream {name}: {proto}", flush=True)
        s: dict[str, Any] = {"protocol": proto.describe()}
        data["streams"][name] = s  # filled part by part
        part = partial(run_part, out / name, protocol=proto, methods=ACTIVE, seeds=seeds, jobs=jobs)
        base = part("default", methods=REFERENCES + ACTIVE)
        s["default"] = _of(base, methods=REFERENCES + ACTIVE)
        s["default_last"] = _of(base, last=True, methods=REFERENCES + ACTIVE)
        s["delay"], s["delay_last"] = {"0": _of(base)}, {"0": _of(base, last=True)}
        s["delay_counts"] = {}
        for d in (d for d in DELAYS if d not in SKIP_DELAYS.get(name, ())):
            res = part(f"delay-{d}", annotator=AnnotatorOptions(delay=d))
            s["delay"][str(d)], s["delay_last"][str(d)] = _of(res), _of(res, last=True)
            s["delay_counts"][str(d)] = {m: _counts(res, m) for m in ACTIVE}
            save_study(out, data)
        if name not in BUFFER_STREAMS:
            continue
        s["buffer"] = {}
        late = AnnotatorOptions(delay=TUNE_DELAY)
        for b in BUFFERS if name == TUNE_STREAM else (chosen_buffer,):
            res = part(f"delay-{TUNE_DELAY}-buffer-{b}", annotator=late, buffers=b)
            s["buffer"][str(b)] = _of(res)
            save_study(out, data)
        if name == TUNE_STREAM:  # the size with the lowest error, averaged over the methods
            mean = {b: np.mean([np.mean(v) for v in s["buffer"][str(b)].values()]) for b in BUFFERS}
            chosen_buffer = data["chosen_buffer"] = min(BUFFERS, key=lambda b: float(mean[b]))
            print(f"  buffer size chosen on {name}: {chosen_buffer}", flush=True)
        s["binary"] = {}
        if name in EVERY_PART:
            s["label_minutes"] = _minutes([r for r in base if r.annotation])
        s["noise"] = {"0": _of(base)}
        if name not in EVERY_PART:
            continue
        for k in (1, BINARY_PER_LABEL):
            res = part(f"binary-{k}", annotator=AnnotatorOptions(feedback="binary"), labels=k)
            s["binary"][str(k)] = _of(res)
            s["binary"][f"{k}_minutes"] = _minutes(res)
            save_study(out, data)
        for p in NOISE:
            s["noise"][f"{p:g}"] = _of(part(f"noise-{p:g}", annotator=AnnotatorOptions(noise=p)))
            save_study(out, data)
    save_study(out, data)
    return data


def _counts(results: Sequence[CellResult], method: str) -> dict[str, float]:
    """The method's annotation counts (``COUNTS``), mean over seeds."""
    runs = [r.annotation for r in results if r.spec.method == method]
    return {k: float(np.mean([a[k] for a in runs])) for k in COUNTS}


def _minutes(results: Sequence[CellResult]) -> float:
    """The annotator's time of the runs, in minutes (mean over seeds)."""
    return float(np.mean([r.annotation["seconds"] for r in results]) / 60)


def plot(data: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    names = list(data["streams"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        s = data["streams"][name]
        keys = [k for k in DELAY_KEYS if k in s.get("delay", {})]
        if len(keys) < 2:
            continue
        xs = np.array([DELAY_KEYS.index(k) for k in keys])
        for m in ACTIVE:
            ys = [s["delay"][k][m] for k in keys]
            sd = [np.std(y, ddof=1) if len(y) > 1 else 0 for y in ys]
            ax.errorbar(xs, [np.mean(y) for y in ys], yerr=sd, marker="o", capsize=3, label=m)
        for m, style in (("tent", ":"), ("eta", "--"), ("source", "-.")):
            ax.axhline(np.mean(s["default"][m]), color="gray", linestyle=style, label=m)
        ax.set_xticks(np.arange(len(DELAY_KEYS)), DELAY_KEYS)
        ax.set_xlabel("label delay (batches)")
        ax.set_title(name)
        ax.set_ylabel("error % (mean over rounds)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(data: dict[str, Any]) -> str:
    """benchmarks/results/real_annotators.md: ``templates/real_annotators.md`` filled."""
    seeds = data["seeds"]
    return with_streams(PAGE, data["streams"], _stream_report, first=seeds[0], last=seeds[-1])


def _stream_report(name: str, s: dict[str, Any]) -> str:
    """One stream's tables ("" where it was not measured: an interrupted study)."""
    keys = [k for k in DELAY_KEYS if k in s.get("delay", {})]
    if len(keys) < 2 or not all(k in s.get("delay_counts", {}) for k in keys[1:]):
        return ""

    def rows(*cells: tuple[dict[str, Any], str]) -> list[list[str]]:
        """A row per active method: its errors in each ``(part, column)`` of ``cells``."""
        return [[m, *(fmt(part[c][m]) for part, c in cells)] for m in ACTIVE]

    delay = rows(*((s["delay"], k) for k in keys))
    delay += [[m + " (no labels)", *[fmt(s["default"][m])] * len(keys)] for m in ("tent", "eta")]
    out = [PAGE("delay"), table(["method", *keys], delay)]
    out += [PAGE("last"), table(["method", *keys], rows(*((s["delay_last"], k) for k in keys)))]
    counts = s["delay_counts"]
    per_delay = [[k, *[f"{counts[k]['eatta'][c]:.0f}" for c in COUNTS]] for k in counts]
    out += [PAGE("counts"), table(["delay", "asked", "received", "expired", "pending"], per_delay)]
    ps = [p for p in ["0", *[f"{p:g}" for p in NOISE]] if p in s.get("noise", {})]
    if len(ps) > 1:
        out += [PAGE("noise"), table(["method", *ps], rows(*((s["noise"], p) for p in ps)))]
    ks = [k for k in ("1", str(BINARY_PER_LABEL)) if k in s.get("binary", {})]
    if ks and "label_minutes" in s:
        head = [
            "method",
            f"1 label/batch ({s['label_minutes']:.0f} min)",
            *[f"{k} yes/no/batch ({s['binary'][k + '_minutes']:.0f} min)" for k in ks],
        ]
        binary = rows((s["delay"], "0"), *((s["binary"], k) for k in ks))
        out += [PAGE("binary"), table(head, binary)]
    if s.get("buffer"):
        head = ["method", f"delay {TUNE_DELAY}", *[f"+ buffer {b}" for b in s["buffer"]]]
        buffer = rows((s["delay"], str(TUNE_DELAY)), *((s["buffer"], b) for b in s["buffer"]))
        out += [PAGE("buffer", delay=TUNE_DELAY), table(head, buffer)]
    return "\n\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/real-annotators")
    p.add_argument("--jobs", type=int, default=2, help="cells run in parallel")
    p.add_argument("--quick", action="store_true", help="short streams (a smoke run)")
    p.add_argument("--plot", default="docs/img/real-annotators-delay.png")
    p.add_argument("--tables", default="benchmarks/results/real_annotators.md")
    args = p.parse_args(argv)
    started = time.perf_counter()
    if args.report_only:
        data = saved(args.out, STREAM_NAMES, Path(args.tables).with_suffix(".json"))
    else:
        data = study(Path(args.out), args.seeds, args.jobs, args.quick)
    publish(report(data), data, args.tables)
    plot(data, Path(args.plot))
    print(f"plot: {args.plot}; {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
