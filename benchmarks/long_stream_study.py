"""EATTA over long streams (issue 9): diagnosis, the Table-3 ablation, and the stable variant.

Every run adapts a fresh copy of a digits source model (``eatta.create``, one label per batch,
digits-c defaults) over ``R`` rounds of a digits-C stream (reshuffled with seed ``100 s + r``) and
records per round the online error, the applied weights, both gradient norms, the share of
mispredicted labelled samples, the confident set, labels per class and the drift ``||θ - θ0||``;
per step ``γ_sup`` and the norm ratio (for plots). Streams: :data:`STREAMS`. Runs are stored as
JSON under ``--out`` (default ``runs/long-stream`` or ``$EATTA_STUDY_OUT``) and reused, so the
commands resume; ``report`` writes ``benchmarks/results/long_stream_study.md`` and the plots.

    python benchmarks/long_stream_study.py all        # every part of PLAN, then the report
    python benchmarks/long_stream_study.py diagnose   # or tuning, compare, ablation: one part
    python benchmarks/long_stream_study.py report     # markdown tables + plots from stored runs
    python benchmarks/long_stream_study.py check      # aliased Table-3 rows == their named runs
    python benchmarks/long_stream_study.py one --streams sev3 --configs baseline eatta \\
        --seeds 0 1 2 --rounds 10                     # any other grid
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _common import RESULTS, Template, write_json
from _common import fmt_mean_std as fmt
from _common import markdown_table as table
from torch import Tensor, nn

from eatta.annotate.oracle import GroundTruthOracle
from eatta.bench.report import pyplot
from eatta.data.digits import DIGITS_C_CORRUPTIONS, digits_c_domains
from eatta.data.stream import TestStream, dirichlet_order
from eatta.methods.registry import create
from eatta.models.digits_cnn import fit_digits_source, packaged_digits_source

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(os.environ.get("EATTA_STUDY_OUT", ROOT / "runs" / "long-stream"))
IMG = ROOT / "docs" / "img"
PAGE = Template("long_stream")

#: The streams: corruption severity and order, source model, Dirichlet label shift (None: none).
STREAMS: dict[str, dict[str, Any]] = {
    "embedded": {"severity": 5, "order": "standard", "model": "cnn", "label_shift": None},
    "sev3": {"severity": 3, "order": "standard", "model": "cnn", "label_shift": None},
    "reversed": {"severity": 5, "order": "reversed", "model": "cnn", "label_shift": None},
    "resnet": {"severity": 5, "order": "standard", "model": "resnet", "label_shift": None},
    "label-shift": {"severity": 5, "order": "standard", "model": "cnn", "label_shift": 0.1},
}

#: name -> (registered method, overrides). The ablation rows follow the paper's Table 3.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "baseline": ("baseline", {}),
    "eatta": ("eatta", {}),
    "eatta-stable": ("eatta-stable", {}),
    "no-gnd": ("eatta", {"gnd": False}),
    "random+gnd": ("eatta", {"selector": "random", "balance": None}),
    "no-ema": ("eatta", {"ema": False}),
    "tent": ("tent", {}),
    # tuning candidates of the variant (tuning streams only: embedded, seeds 0 and 1)
    "stable-cap0.5": ("eatta-stable", {"unsup_cap": 0.5}),
    # Table 3 rows
    "none": ("eatta", {"selector": "random", "balance": None, "gnd": False}),
    "PD": ("eatta", {"balance": None, "gnd": False}),
    "PD+CB": ("eatta", {"gnd": False}),
    "PD+GND": ("eatta", {"balance": None, "ema": False}),
    "PD+GND+EMA": ("eatta", {"balance": None}),
    "GND": ("eatta", {"selector": "random", "balance": None, "ema": False}),
    "GND+EMA": ("eatta", {"selector": "random", "balance": None}),
    "PD+CB+GND": ("eatta", {"ema": False}),
    "all": ("eatta", {}),
}

#: Table-3 rows that are the same computation as a named configuration (checked by ``check``).
ALIASES = {"none": "baseline", "PD+CB": "no-gnd", "all": "eatta"}

ABLATION = ["none", "PD", "PD+CB", "PD+GND", "PD+GND+EMA", "GND", "GND+EMA", "PD+CB+GND", "all"]
COMPARE = ["baseline", "eatta", "eatta-stable"]

#: The study as run for docs/when-eatta-helps.md: (part, streams, configs, seeds, rounds).
#: Rounds and seeds are what two shared CPU cores allowed; raise them with the flags of ``one``.
PLAN: list[tuple[str, list[str], list[str], list[int], int]] = [
    ("diagnose", ["embedded"], ["baseline", "eatta", "no-gnd", "eatta-stable"], [0], 10),
    ("tuning", ["embedded"], [*COMPARE, "stable-cap0.5"], [0, 1], 5),
    ("compare", ["embedded"], COMPARE, [2, 3], 5),
    ("compare", ["sev3", "resnet", "label-shift", "reversed"], COMPARE, [0, 1], 3),
    ("ablation", ["embedded"], [*ABLATION[:5], "all"], [2, 3], 3),  # the six rows
]


class _ResidualBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus a (projected when the shape changes) shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: Tensor) -> Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + self.shortcut(x))


def digits_resnet(num_classes: int = 10, width: int = 16) -> nn.Sequential:
    """A small residual network for 32 px digits: stem + 4 residual blocks (9 BN layers)."""
    w = width
    return nn.Sequential(
        nn.Conv2d(3, w, 3, stride=2, padding=1, bias=False),  # 32 -> 16
        nn.BatchNorm2d(w),
        nn.ReLU(),
        _ResidualBlock(w, w, 1),
        _ResidualBlock(w, 2 * w, 2),  # 16 -> 8
        _ResidualBlock(2 * w, 4 * w, 2),  # 8 -> 4
        _ResidualBlock(4 * w, 4 * w, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, num_classes),
    )


def source_model(kind: str, cache: Path) -> nn.Module:
    """The digits CNN of the benchmark, or the study's residual network (trained once, cached)."""
    if kind == "cnn":
        return packaged_digits_source()[0]  # eatta-bench's model, the same on every CPU
    path = cache / "study-digits-resnet-seed0.pt"
    model = digits_resnet()
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    model, report = fit_digits_source(  # the digits CNN's recipe
        digits_resnet,
        lambda params: torch.optim.Adam(params, lr=1e-2),
        max_lr=1e-2,
        epochs=20,
        seed=0,
        version="study",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    seconds, acc = report["train_seconds"], report["clean_test_accuracy"]
    print(f"residual network trained in {seconds:.0f} s, clean acc {acc:.3f}")
    return model


def round_batches(
    domains: Sequence[Any], seed: int, label_shift: float | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """One pass over the domains: TestStream's shuffle, or each domain in a Dirichlet(δ)
    class order (:func:`~eatta.data.stream.dirichlet_order`, one time slot per batch)."""
    if label_shift is None:
        for x, y, _ in TestStream(domains, 64, seed=seed):
            yield x, y
        return
    for k, dom in enumerate(domains):
        xs, ys = dom.dataset.tensors
        slots = max(1, math.ceil(len(ys) / 64))  # one per batch
        order = dirichlet_order(ys.numpy(), label_shift, slots, np.random.default_rng([seed, k]))
        for i in range(0, len(order), 64):
            idx = torch.from_numpy(order[i : i + 64])
            yield xs[idx], ys[idx]


def _create(config: str, model: nn.Module, oracle: GroundTruthOracle, seed: int, **kw: Any) -> Any:
    """``config``'s method (:data:`CONFIGS`) on ``model``, with digits-c defaults."""
    name, overrides = CONFIGS[config]
    return create(name, model, dataset="digits-c", oracle=oracle, seed=seed, **kw, **overrides)


#: The step diagnostics a run averages per round, in the order it stores them.
GND_KEYS = ("gamma_sup", "gamma_unsup", "grad_norm_sup", "grad_norm_unsup", "norm_ratio")
STEP_KEYS = (*GND_KEYS, "mispredicted_selected", "confident")


def _record(
    rec: Any, acc: dict[str, list[float]], counts: np.ndarray, traces: dict[str, Any]
) -> None:
    """One step's record (``last_step``) into the round's diagnostics ``acc``, its labels per
    class ``counts`` and the run's per-step ``traces``."""
    if rec.num_unsup is not None:
        acc["confident"].append(float(rec.num_unsup))
    if len(rec.selected):
        hit = rec.pseudo_labels[rec.selected] != rec.labels
        acc["mispredicted_selected"].append(float(hit.float().mean()))
        counts += np.bincount(rec.labels.numpy(), minlength=10)
    if rec.weights is not None:
        acc["gamma_sup"].append(float(rec.weights.sup))
        acc["gamma_unsup"].append(float(rec.weights.unsup))
        traces["gamma_trace"].append(acc["gamma_sup"][-1])
    if rec.grad_norm_sup is not None and rec.grad_norm_unsup is not None:
        a, b = float(rec.grad_norm_sup), float(rec.grad_norm_unsup)
        acc["grad_norm_sup"].append(a)
        acc["grad_norm_unsup"].append(b)
        traces["ratio_trace"].append(a / b if b > 0 else float("nan"))
        if b > 0:
            acc["norm_ratio"].append(a / b)


def run(stream: str, config: str, seed: int, rounds: int, out: Path) -> dict[str, Any]:
    """Adapt over ``rounds`` rounds of ``stream`` with ``config``; stored as JSON (cached)."""
    config = ALIASES.get(config, config)
    if stored := _load(out, stream, config, [seed], rounds):
        return stored[0]
    spec = STREAMS[stream]
    step = -1 if spec["order"] == "reversed" else 1
    domains = digits_c_domains(list(DIGITS_C_CORRUPTIONS)[::step], severity=spec["severity"])
    torch.manual_seed(seed)
    model = copy.deepcopy(source_model(spec["model"], out / "cache"))
    oracle = GroundTruthOracle()
    method = _create(config, model, oracle, seed, budget=1)
    start = [p.detach().clone() for p in method.params]
    name, overrides = CONFIGS[config]
    result: dict[str, Any] = {"stream": stream, "config": config, "method": name}
    result.update(overrides=dict(overrides), seed=seed, rounds=rounds, per_round=[])
    result.update(gamma_trace=[], ratio_trace=[], error_trace=[])
    t0 = time.perf_counter()
    for r in range(rounds):
        wrong = total = 0
        acc: dict[str, list[float]] = {k: [] for k in STEP_KEYS}
        counts = np.zeros(10, dtype=np.int64)
        for x, y in round_batches(domains, 100 * seed + r, spec["label_shift"]):
            with oracle.labels(y):
                miss = int((method(x).argmax(1) != y).sum())
            wrong, total = wrong + miss, total + len(y)
            result["error_trace"].append(miss / len(y))
            if (rec := getattr(method, "last_step", None)) is not None:
                _record(rec, acc, counts, result)
        pairs = zip(method.params, start, strict=True)
        drift = math.sqrt(sum(float((p.detach() - p0).pow(2).sum()) for p, p0 in pairs))
        means = {k: statistics.fmean(v) if v else None for k, v in acc.items()}
        error = 100 * wrong / total
        per_round = {"error": error, **means, "labels_per_class": counts.tolist(), "drift": drift}
        result["per_round"].append(per_round)
        print(
            f"  {stream:12s} {config:12s} seed {seed} round {r + 1}: error {error:.1f}", flush=True
        )
    result["seconds"] = time.perf_counter() - t0
    write_json(out / "runs" / f"{stream}__{config}__s{seed}__r{rounds}.json", result)
    return result


def _rounds(path: Path) -> int:
    return int(path.stem.rsplit("__r", 1)[1])


def _load(
    out: Path, stream: str, config: str, seeds: Sequence[int], rounds: int
) -> list[dict[str, Any]]:
    """Stored runs; a longer run of the same seed stands in for a shorter one (its first rounds
    are the same computation), truncated."""
    config = ALIASES.get(config, config)
    runs = []
    for s in seeds:
        found = (out / "runs").glob(f"{stream}__{config}__s{s}__r*.json")
        if longer := sorted((p for p in found if _rounds(p) >= rounds), key=_rounds):
            stored = json.loads(longer[0].read_text())
            stored["per_round"] = stored["per_round"][:rounds]
            runs.append(stored)
    return runs


def error_table(
    out: Path, stream: str, configs: Sequence[str], seeds: Sequence[int], rounds: int
) -> str:
    """Markdown: per-round error (mean ± std over seeds) and the mean over rounds."""
    rows = []
    for c in configs:
        if runs := _load(out, stream, c, seeds, rounds):
            cells = [fmt([run["per_round"][r]["error"] for run in runs]) for r in range(rounds)]
            avg = fmt([statistics.fmean(p["error"] for p in run["per_round"]) for run in runs])
            rows.append([c, *cells, avg])
    head = ["configuration", *(f"r{r + 1}" for r in range(rounds)), "mean"]
    n = len(_load(out, stream, configs[0], seeds, rounds))
    listed = ", ".join(map(str, seeds))
    return PAGE("errors", table=table(head, rows, left=True), found=n, seeds=listed)


#: The diagnostics of ``diagnosis_table``: key, column, digits.
DIAGNOSTICS = (
    ("error", "error %", 1),
    ("gamma_sup", "γ_sup", 2),
    ("gamma_unsup", "γ_unsup", 2),
    ("norm_ratio", "g_s / g_u", 1),
    ("mispredicted_selected", "labelled mispredicted", 2),
    ("confident", "confident set", 1),
    ("drift", "‖θ−θ0‖", 1),
)


def diagnosis_table(out: Path, stream: str, configs: Sequence[str], seed: int, rounds: int) -> str:
    """Markdown: per configuration, first / last round of each diagnostic."""
    rows = []
    for c in configs:
        for found in _load(out, stream, c, [seed], rounds):
            first, last = found["per_round"][0], found["per_round"][-1]
            cells = [
                "–" if first[k] is None else f"{first[k]:.{d}f} → {last[k]:.{d}f}"
                for k, _, d in DIAGNOSTICS
            ]
            counts = last["labels_per_class"]
            rows.append([c, *cells, f"{min(counts)}–{max(counts)}"])
    head = ["configuration", *(k[1] for k in DIAGNOSTICS), "labels/class (last round)"]
    return table(head, rows, left=True)


def _trace(runs: list[dict[str, Any]], key: str) -> np.ndarray:
    """A per-step trace of several runs, end to end."""
    return np.concatenate([np.asarray(r[key], dtype=float) for r in runs])


def clamp_table(out: Path, seeds: Sequence[int], rounds: int) -> str:
    """Markdown: per stream, the median ``g_s / g_u`` of faithful EATTA and the share of steps in
    which eatta-stable applied GND (``γ_sup > 1``) rather than the 1 : 1 weights."""
    rows = []
    for stream in STREAMS:
        faithful = _load(out, stream, "eatta", seeds, rounds)
        stable = _load(out, stream, "eatta-stable", seeds, rounds)
        if faithful and stable:
            ratios = [f"{np.nanmedian(_trace(r, 'ratio_trace')):.1f}" for r in (faithful, stable)]
            applied = 100 * float((_trace(stable, "gamma_trace") > 1).mean())
            rows.append([stream, *ratios, f"{applied:.1f}%"])
    head = ["stream", "median g_s/g_u (eatta)", "median g_s/g_u (stable)", "steps with γ_sup > 1"]
    return table(head, rows, left=True)


#: Each configuration's colour in the plots.
COLORS = {
    "baseline": "tab:blue",
    "eatta": "tab:red",
    "no-ema": "tab:orange",
    "eatta-stable": "tab:green",
}


def plots(out: Path, rounds_diag: int, seeds: Sequence[int], rounds: int) -> list[Path]:
    """γ_sup and the norm ratio over the stream (diagnosis run); per-round error per stream."""
    plt = pyplot()
    IMG.mkdir(parents=True, exist_ok=True)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.6, 3.2), dpi=100)
    k = 45  # moving average over 45 batches (3 domains)
    for c in ("eatta", "no-ema", "eatta-stable"):
        runs = _load(out, "embedded", c, [0], rounds_diag)
        if not runs or not runs[0]["gamma_trace"]:
            continue
        for key, axis in (("gamma_trace", ax), ("ratio_trace", bx)):
            g = np.asarray(runs[0][key], dtype=float)
            smooth = np.convolve(g[np.isfinite(g)], np.ones(k) / k, mode="valid")
            x = np.arange(len(smooth)) / 225 + k / 450
            axis.plot(x, smooth, color=COLORS[c], lw=1, label=c)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--", label="Baseline (γ = 1)")
    ax.set(ylabel="applied γ_sup (moving avg.)")
    ax.set_title("Weight of the labelled loss", fontsize=9)
    bx.set(yscale="log", ylabel="g_s / g_u (moving avg.)")
    bx.set_title("Labelled / entropy gradient norm", fontsize=9)
    for axis in (ax, bx):
        axis.set_xlabel("round (15 corruptions, 225 batches)")
        axis.legend(fontsize=8)
    fig.suptitle("digits-C severity 5, seed 0", fontsize=9)
    made = [_save(plt, fig, "long-stream-gamma.png")]

    panels = [
        ("embedded", [0], rounds_diag, "embedded, seed 0 (diagnosis run)"),
        ("embedded", [2, 3], 5, "embedded, report seeds 2, 3"),
        ("resnet", list(seeds), rounds, f"resnet, seeds {', '.join(map(str, seeds))}"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 3.2), dpi=100)
    for ax, (stream, seeds_here, n, title) in zip(axes, panels, strict=True):
        for c in COMPARE:
            if not (runs := _load(out, stream, c, seeds_here, n)):
                continue
            e = np.asarray([[p["error"] for p in run["per_round"]] for run in runs])
            x = np.arange(1, e.shape[1] + 1)
            ax.plot(x, e.mean(0), color=COLORS[c], marker="o", ms=3, label=c)
            if len(runs) > 1:
                lo, hi = e.mean(0) - e.std(0), e.mean(0) + e.std(0)
                ax.fill_between(x, lo, hi, color=COLORS[c], alpha=0.15)
        ax.set_title(title + (" (mean ± std)" if len(seeds_here) > 1 else ""), fontsize=9)
        ax.set(xlabel="round", ylabel="online error %")
        ax.legend(fontsize=8)
    return [*made, _save(plt, fig, "long-stream-error.png")]


def _save(plt: Any, fig: Any, name: str) -> Path:
    """``fig`` laid out, written to ``docs/img/<name>`` and closed."""
    fig.tight_layout()
    fig.savefig(IMG / name)
    plt.close(fig)
    return IMG / name


def check_aliases(batches: int = 40) -> bool:
    """Whether each aliased Table-3 row gives bit-identical predictions to its named config."""
    domains = digits_c_domains(severity=5)
    base = source_model("cnn", DEFAULT_OUT / "cache")

    def predictions(config: str) -> Tensor:
        """``config``'s logits over the first ``batches`` batches of round 0 (seed 0)."""
        torch.manual_seed(0)
        oracle = GroundTruthOracle()
        method = _create(config, copy.deepcopy(base), oracle, 0)
        logits = []
        for x, y in itertools.islice(round_batches(domains, 0), batches):
            with oracle.labels(y):
                logits.append(method(x))
        return torch.cat(logits)

    ok = True
    for row, named in ALIASES.items():
        same = torch.equal(predictions(row), predictions(named))
        ok &= same
        print(f"{row} == {named} over {batches} batches: {same}")
    return ok


def report(out: Path) -> str:
    """The page of :data:`PLAN`'s tables from the stored runs; also draws the plots."""
    blocks = []
    for part, streams, configs, seeds, rounds in PLAN:
        what = {"tuning": "tuning streams", "diagnose": "diagnosis"}.get(part, "report streams")
        for stream in streams:
            blocks.append(
                PAGE("heading", part=part, stream=stream, rounds=rounds, seeds=seeds, what=what)
            )
            if part == "diagnose":
                diagnosis = diagnosis_table(out, stream, configs, seeds[0], rounds)
                blocks.append(PAGE("diagnosis", table=diagnosis))
            blocks.append(error_table(out, stream, configs, seeds, rounds))
    drawn = [
        PAGE("plot", path=p.relative_to(ROOT), kib=p.stat().st_size // 1024)
        for p in plots(out, 10, [0, 1], 3)
    ]
    clamp = clamp_table(out, [0, 1, 2, 3, 4], 3)
    return PAGE(parts="\n\n".join(blocks), clamp=clamp, plots="\n\n".join(drawn))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "part",
        choices=["diagnose", "tuning", "compare", "ablation", "all", "report", "one", "check"],
        help="a part of PLAN, all of it (then the report), the report, one ad-hoc grid, or check",
    )
    ap.add_argument("--rounds", type=int, default=5, help="for 'one'")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="for 'one'")
    ap.add_argument("--streams", nargs="+", default=["embedded"], choices=sorted(STREAMS))
    ap.add_argument("--configs", nargs="+", default=COMPARE, choices=sorted(CONFIGS))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.part == "check":
        return 0 if check_aliases() else 1
    grids = [g[1:] for g in PLAN if args.part in (g[0], "all")]
    if args.part == "one":
        grids = [(args.streams, args.configs, args.seeds, args.rounds)]
    for streams, configs, seeds, rounds in grids:
        for stream, c, s in itertools.product(streams, configs, seeds):
            run(stream, c, s, rounds, args.out)
    if args.part == "one":
        for stream in args.streams:
            print(f"\n### {stream}\n")
            print(error_table(args.out, stream, args.configs, args.seeds, args.rounds))
    if args.part in ("report", "all"):
        text = report(args.out)
        (RESULTS / "long_stream_study.md").write_text(text)
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
