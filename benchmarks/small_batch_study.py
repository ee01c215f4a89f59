"""The small-batch study: batches of 1 to 64 samples at equal labels per sample.

Regenerates the section between the ``small-batches`` markers of ``docs/small-batches.md`` from
``benchmarks/results/small_batches.json``. Every run is the packaged digits CNN on a digits-C
stream (``recurring``: ``--rounds`` rounds; ``ccc``: slow, one walk) in batches of ``B`` samples,
one label per 64 samples. Rows: ``source``; ``tent`` and ``eatta-stable`` adapting on each batch
as given; ``tent+w`` and ``eatta-stable+w``, the same with a window of 64 samples
(``eatta.create(..., window=64)``, the plain method at ``B = 64``); ``eatta-stable+w`` is the
recommended configuration. ``--tune`` runs the window's EMA-rate choice on ``TUNE_SEED``, which is
not among the reported seeds.

    python benchmarks/small_batch_study.py --seeds 0-2 --rounds 10          # runs, then writes
    python benchmarks/small_batch_study.py --report-only                     # the committed page
    python benchmarks/small_batch_study.py --tune                            # the EMA-rate choice
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import RESULTS, Template, replace_section
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from _study import verdict
from torch import Tensor

import eatta
import eatta.window
from eatta.bench.flags import seed_list
from eatta.data import TestStream, digits_c_domains
from eatta.data.ccc import digits_ccc
from eatta.models.digits_cnn import packaged_digits_source

DOC = Path(__file__).resolve().parents[1] / "docs" / "small-batches.md"
JSON = RESULTS / "small_batches.json"
BATCH_SIZES = (1, 2, 4, 8, 16, 64)
METHODS = ("source", "tent", "tent+w", "eatta-stable", "eatta-stable+w")
RECOMMENDED = "eatta-stable+w"
DEFAULT_REFRESH = eatta.window.WINDOW_REFRESH
#: the report's rows: (label, method, the window's refresh)
ROWS: tuple[tuple[str, str, int | None], ...] = (
    ("source", "source", None),
    ("tent", "tent", None),
    ("eatta-stable", "eatta-stable", None),
    ("tent+w, no refresh", "tent+w", None),
    ("tent+w", "tent+w", DEFAULT_REFRESH),
    ("eatta-stable+w, no refresh", "eatta-stable+w", None),
    ("**eatta-stable+w** (recommended)", "eatta-stable+w", DEFAULT_REFRESH),
)
WINDOW = 64
LABELS_EVERY = 64  # samples per label, at every batch size
TUNE_SEED = 100
TUNE_MOMENTA = (1.0, 0.5, 0.2, 0.05)
PAGE = Template("small_batches")


@dataclass(frozen=True)
class Run:
    """One run: ``method`` on stream ``kind`` in batches of ``batch_size``; a window's EMA rate
    ``momentum``, its step every ``every`` samples and its refresh of the statistics without a
    step every ``refresh`` samples (None: at steps only)."""

    method: str
    kind: str
    batch_size: int
    seed: int
    rounds: int
    momentum: float
    every: int = WINDOW
    refresh: int | None = None

    @property
    def windowed(self) -> bool:
        """A ``+w`` method below the window's size (at batch 64 it is the plain method)."""
        return self.method.endswith("+w") and self.batch_size < WINDOW

    @property
    def key(self) -> str:
        """The run's name in the JSON; a window's method at batch 64 is the plain method's run."""
        method, rate = self.method.removesuffix("+w"), "plain"
        if self.windowed:
            method, rate = self.method, f"m{self.momentum}"
            rate += f"e{self.every}" if self.every != WINDOW else ""
            rate += f"r{self.refresh}" if self.refresh is not None else ""
        return f"{self.kind}/r{self.rounds}/{method}/B{self.batch_size}/s{self.seed}/{rate}"


def load_stream(spec: Run) -> tuple[TestStream, Tensor, Tensor]:
    """The stream's batch order and all its images and labels, concatenated (in memory: the
    study indexes them directly instead of going through a DataLoader per batch of 1)."""
    if spec.kind == "recurring":
        domains = digits_c_domains()
        stream = TestStream(domains, spec.batch_size, seed=spec.seed, rounds=spec.rounds)
    elif spec.kind == "ccc":
        domains = digits_ccc("slow").domains
        stream = TestStream(domains, spec.batch_size, seed=spec.seed, rounds=1, shuffle=False)
    else:
        raise ValueError(f"unknown stream {spec.kind!r}")
    xs, ys = zip(*(d.dataset.tensors for d in domains), strict=True)  # type: ignore[attr-defined]
    return stream, torch.cat(xs), torch.cat(ys).long()


def build(spec: Run) -> eatta.AdaptiveMethod:
    """The run's method on a fresh copy of the packaged digits CNN."""
    model = copy.deepcopy(packaged_digits_source()[0])
    name = spec.method.removesuffix("+w")
    if name == "source":
        return eatta.create("source", model)
    kw: dict[str, Any] = {"dataset": "digits-c"}
    if spec.windowed:
        kw.update(window=WINDOW, window_every=spec.every, window_momentum=spec.momentum)
        kw["window_refresh"] = spec.refresh  # always explicit: None is no refresh
    elif spec.batch_size < 32:
        kw["window"] = False  # today's behaviour, on purpose: no warning
    if name != "tent":
        per_step = spec.every if spec.windowed else spec.batch_size
        kw["oracle"] = eatta.GroundTruthOracle()
        kw["budget"] = eatta.Budget(1, every=max(1, LABELS_EVERY // per_step))
    return eatta.create(name, model, **kw)


def run(spec: Run) -> dict[str, Any]:
    """Per-round error % of one run, its labels and CPU seconds."""
    torch.manual_seed(spec.seed)
    stream, X, Y = load_stream(spec)
    m = build(spec)
    oracle = getattr(m, "oracle", None)
    wrong, seen = np.zeros(stream.rounds), np.zeros(stream.rounds)
    c0 = time.thread_time()
    missed = None
    if spec.method == "source":  # its predictions do not depend on the stream: each image once
        with torch.no_grad():
            pred = torch.cat([m(X[i : i + 1024]).argmax(1) for i in range(0, len(X), 1024)])
        missed = pred != Y
    for t in range(len(stream)):
        idx = torch.as_tensor(stream.batch_indices(t)[1])
        y = Y[idx]
        if missed is None and oracle is not None:
            oracle.set_labels(y)
        miss = missed[idx] if missed is not None else m(X[idx]).argmax(1) != y
        r = stream.round_of_batch(t)
        wrong[r] += int(miss.sum())
        seen[r] += len(y)
    return {
        "errors": (100 * wrong / seen).tolist(),
        "labels": int(getattr(m, "labels_used", 0)),
        "samples": int(seen.sum()),
        "cpu_s": time.thread_time() - c0,
    }


def _mean_error(run: dict[str, Any]) -> float:
    return float(np.mean(run["errors"]))


def _cell(runs: list[dict[str, Any] | None]) -> str:
    """A method's error at one batch size over the seeds asked (how many, if fewer ran)."""
    if not (done := [g for g in runs if g is not None]):
        return "not run"
    text = fmt([_mean_error(g) for g in done])
    if len(done) == len(runs):
        return text
    return f"{text} ({len(done)} seed{'s' if len(done) > 1 else ''})"


def _cpu(runs: list[dict[str, Any] | None]) -> str:
    """The mean CPU seconds of the runs that ran."""
    done = [g["cpu_s"] for g in runs if g is not None]
    return f"{np.mean(done):.0f}" if done else ""


def _bar_row(b: int, runs: list[tuple[dict[str, Any], ...]]) -> list[str]:
    """The bar's check at batch size ``b`` from (batch ``b``, batch 64, source) run triples."""
    if not runs:
        return [f"B={b}", "not run", "", "", "", ""]
    mean_b = float(np.mean([_mean_error(g) for g, _, _ in runs]))
    mean_64 = float(np.mean([_mean_error(f) for _, f, _ in runs]))
    per_round = np.mean([g["errors"] for g, _, _ in runs], axis=0)
    src_round = np.mean([s0["errors"] for _, _, s0 in runs], axis=0)
    worst = float(np.max(per_round - src_round))
    ok = verdict(mean_b - mean_64 <= 2 and worst <= 0)
    versus = f"{mean_b:.1f} vs {mean_64:.1f}"
    return [f"B={b}", str(len(runs)), versus, f"{mean_b - mean_64:+.1f}", f"{worst:+.1f}", ok]


def report(data: dict[str, Any], rounds: int, seeds: Sequence[int], momentum: float) -> str:
    """The docs section: per stream, error (mean over rounds, mean ± std over seeds) per method
    and batch size; the bar's checks for the recommended configuration."""

    def runs(method: str, kind: str, b: int, r: int, refresh: int | None = None) -> list[Any]:
        """The stored run of each seed (None: not run)."""
        return [data.get(Run(method, kind, b, s, r, momentum, refresh=refresh).key) for s in seeds]

    out = []
    sizes = [f"B={b}" for b in BATCH_SIZES]
    for kind in ("recurring", "ccc"):
        r = rounds if kind == "recurring" else 1
        rows, cpu_rows = [], []
        for label, method, refresh in ROWS:
            per_size = [runs(method, kind, b, r, refresh) for b in BATCH_SIZES]
            rows.append([label] + [_cell(gs) for gs in per_size])
            cpu_rows.append([label] + [_cpu(gs) for gs in per_size])
        out += [PAGE(kind, rounds=r), table(["method", *sizes], rows)]
        out += [PAGE("cpu"), table(["method", *sizes], cpu_rows)]
    src, ref = runs("source", "recurring", 64, rounds), runs(RECOMMENDED, "recurring", 64, rounds)
    checks = []
    for b in (1, 2, 8):
        got = runs(RECOMMENDED, "recurring", b, rounds, DEFAULT_REFRESH)
        triples = zip(got, ref, src, strict=True)
        checks.append(_bar_row(b, [t for t in triples if None not in t]))
    head = ["batch", "seeds", "error vs batch 64 (same seeds)", "difference (bar: ≤ +2)"]
    head += ["worst round vs source (bar: ≤ 0)", "bar"]
    return PAGE(
        seeds=", ".join(map(str, seeds)),
        rounds=rounds,
        every=LABELS_EVERY,
        window=WINDOW,
        momentum=momentum,
        streams="\n\n".join(out),
        bar=table(head, checks),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2])
    p.add_argument(
        "--rounds", type=int, help="rounds of the recurring stream (default 10; reports: stored)"
    )
    p.add_argument("--streams", default="recurring,ccc")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    p.add_argument("--momentum", type=float, default=eatta.window.WINDOW_MOMENTUM)
    p.add_argument("--refresh", type=int, default=None, help="window_refresh (samples)")
    p.add_argument("--report-only", action="store_true", help="rewrite the section from --json")
    p.add_argument("--tune", action="store_true", help="the EMA-rate choice on TUNE_SEED")
    p.add_argument("--json", type=Path, default=JSON, help="the runs (read back, then added to)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    data: dict[str, Any] = json.loads(args.json.read_text()) if args.json.is_file() else {}
    if args.rounds is None:  # a report shows the recurring runs stored most often
        stored = Counter(k.split("/")[1] for k in data if k.startswith("recurring/"))
        args.rounds = int(stored.most_common(1)[0][0][1:]) if args.report_only and stored else 10
    specs: list[Run] = []
    if args.tune:  # batches of 8: EMA rates, then a step every 32 samples, then batch 64
        plan = [(8, mom, WINDOW) for mom in TUNE_MOMENTA] + [(8, 1.0, 32), (64, 1.0, WINDOW)]
        if args.refresh is not None:  # --refresh N --tune: the refresh at the chosen rate only
            plan = [(8, 1.0, WINDOW)]
        specs = [
            Run(method, "recurring", b, TUNE_SEED, 1, mom, every, args.refresh)
            for b, mom, every in plan
            for method in ("tent+w", "eatta-stable+w")
        ]
    elif not args.report_only:
        rounds = {"recurring": args.rounds}  # ccc: one walk
        specs = [
            Run(method, kind, b, seed, rounds.get(kind, 1), args.momentum, refresh=args.refresh)
            for kind in args.streams.split(",")
            for seed in args.seeds
            for b in map(int, args.batch_sizes.split(","))
            for method in args.methods.split(",")
        ]
    for spec in specs:
        ran = spec.key not in data
        if ran:  # the JSON saved after each run, so a cut study resumes
            data[spec.key] = run(spec)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        cpu = f"{data[spec.key]['cpu_s']:.0f}s" if ran else "(stored)"
        print(spec.key, f"{_mean_error(data[spec.key]):.2f}", cpu, flush=True)
    if args.tune:
        return 0
    section = report(data, args.rounds, args.seeds, args.momentum)
    replace_section(DOC, "<!-- small-batches:begin -->", "<!-- small-batches:end -->", section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
