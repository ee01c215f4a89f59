"""Would a per-sample choice close the easy domains' gap on mixed batches? Measured, not adopted.

The rule: serve the source model's prediction for each sample whose channel means at the source
model's last BatchNorm layer lie near its running statistics, ``d(x) = mean_c (μ_c(x) − μ_c)² /
σ²_c < τ``, everywhere or (gated) only in batches where at most a share ``g`` of the samples are
that near (docs/safety.md, *A per-sample choice*). Every ``eatta-safe`` run is recorded per sample
and the rule applied afterwards, so one run per stream and seed serves every ``τ`` and ``g``.
Writes ``benchmarks/results/per_sample_choice.json`` (with the median ``d`` of each digits-C
corruption) and prints the table docs/safety.md quotes (``--report-only``: from that file).

    python benchmarks/per_sample_choice.py --seeds 0-2 --out runs/per-sample
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import torch
from _common import load_json, markdown_table, run_part, study_parser
from _study import chosen
from safety_study import DATASETS, EASY, STREAMS
from torch import Tensor

import eatta.bench
from eatta.bench import runner
from eatta.monitor.fallback import SourceFallback

THRESHOLDS = (0.1, 0.2, 0.25, 0.3)
GATES = (None, 0.2)
#: The rules, (τ, gate): as served (None, None), then every threshold with and without the gate.
RULES = ((None, None), *((t, g) for g in GATES for t in THRESHOLDS))
#: The rules docs/safety.md quotes, and its names of the streams.
QUOTED = ((None, None), (0.25, None), (0.3, None), (0.25, 0.2), (0.3, 0.2))
NAMES = {"ccc": "CCC", "deployed-mixed": "deployed, mixed"}


def _near(model: torch.nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """The source model's predictions and ``d(x)`` at its last BatchNorm layer."""
    bn = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)][-1]
    got: list[Tensor] = []

    def hook(m: Any, inputs: tuple[Tensor, ...], _out: Any) -> None:
        mu = inputs[0].mean(tuple(range(2, inputs[0].dim())))
        got.append(((mu - m.running_mean) ** 2 / m.running_var).mean(1))

    handle = bn.register_forward_hook(hook)
    try:
        with torch.no_grad():
            pred = model(x).argmax(1)
    finally:
        handle.remove()
    return pred, got[0]


def medians(images: int = 512) -> dict[str, float]:
    """The median ``d`` of each severity-5 corruption's first ``images`` images under the source
    model (which corruptions look like the source data)."""
    data = eatta.bench.load_benchmarks(["digits-c"])["digits-c"]
    model = data.model_fn().eval()
    out = {}
    for domain in data.domains:
        n = min(images, len(domain.dataset))
        x = torch.stack([torch.as_tensor(domain.dataset[i][0]) for i in range(n)])
        out[domain.name] = round(float(_near(model, x)[1].median()), 4)
    return out


def record(stream: str, seed: int, out: Path) -> dict[str, np.ndarray]:
    """One run of ``eatta-safe`` on ``stream``, recorded per sample (the run is unchanged: the
    records are read beside it)."""
    keys = ("y", "batch", "served", "source", "d", "domain", "mixed")
    rec: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    after, serve = SourceFallback.after_step, runner._serve
    show, count = runner._show, runner._count_domains

    def after_(self: SourceFallback, method: Any, batch: Any) -> None:
        if batch.step_x is None:  # no step: the fallback decides nothing
            return after(self, method, batch)
        pred, d = _near(method.given, batch.step_x)
        after(self, method, batch)
        rec["served"].append(batch.served.argmax(1).numpy())
        rec["source"].append(pred.numpy())
        rec["d"].append(d.numpy())

    def serve_(method: Any, x: Tensor, y: Tensor, *args: Any) -> Any:
        rec["batch"].append(np.full(len(y), len(rec["y"])))  # which batch each sample is in
        rec["y"].append(y.numpy())
        return serve(method, x, y, *args)

    def show_(bar: Any, error: float, domain: str) -> None:  # the batch's domain
        rec["domain"].append(np.array([domain] * len(rec["y"][-1])))
        show(bar, error, domain)

    def count_(stream: Any, t: int, *args: Any) -> None:  # mixed: each sample's own domain
        rec["mixed"].append(np.array([stream.domains[k].name for k in stream.sample_domains(t)]))
        count(stream, t, *args)

    with (
        patch.object(SourceFallback, "after_step", after_),
        patch.object(runner, "_serve", serve_),
        patch.object(runner, "_show", show_),
        patch.object(runner, "_count_domains", count_),
    ):
        dataset = DATASETS.get(stream, "digits-c")
        run_part(out, stream, STREAMS[stream], ["eatta-safe"], [seed], dataset=dataset, reuse=False)
    if rec["mixed"]:
        rec["domain"] = rec.pop("mixed")
    return {k: np.concatenate(v) for k, v in rec.items() if v}


def evaluate(
    r: dict[str, np.ndarray], tau: float | None, gate: float | None
) -> tuple[float, float]:
    """Error % over the stream and its easy domains (each sample's own), the rule applied (``tau``
    None: as served)."""
    pred = r["served"]
    if tau is not None:
        near = r["d"] < tau
        if gate is not None:  # each batch's share of near samples, read at its samples
            batch = r["batch"]
            share = np.bincount(batch, weights=near) / np.bincount(batch)
            near &= share[batch] <= gate
        pred = np.where(near, r["source"], pred)
    wrong, y, dom = pred != r["y"], r["y"], r["domain"]
    easy = [d for d in np.unique(dom) if 100 * (r["source"][dom == d] != y[dom == d]).mean() < EASY]
    easy_error = np.mean([wrong[dom == d].mean() for d in easy]) if easy else np.nan
    return 100 * float(wrong.mean()), 100 * float(easy_error)


def table(data: dict[str, Any], rules: Sequence[tuple[float | None, float | None]] = RULES) -> str:
    """Error % (easy domains) per stream and rule, mean over seeds: the table docs/safety.md
    quotes (its ``QUOTED`` rules)."""
    head = ["stream", *(_rule(tau, gate) for tau, gate in rules)]
    rows = [
        [NAMES.get(stream, stream), *(_cell(results[f"tau={t} gate={g}"]) for t, g in rules)]
        for stream, results in data["streams"].items()
    ]
    return markdown_table(head, rows)


def _rule(tau: float | None, gate: float | None) -> str:
    if tau is None:
        return "as served"
    return f"`τ = {tau:g}`" + ("" if gate is None else ", gated")


def _cell(values: Sequence[Sequence[float]]) -> str:
    """Error % (on the easy domains) over seeds: ``"64.09 (14.2)"``."""
    easy = [v[1] for v in values if not np.isnan(v[1])]  # mnist: no easy domain
    return f"{np.mean([v[0] for v in values]):.2f}" + (f" ({np.mean(easy):.1f})" if easy else "")


def main(argv: Sequence[str] | None = None) -> int:
    p = study_parser(__doc__, "runs/per-sample")
    p.add_argument("--streams", default=",".join(STREAMS), help="'': only the medians")
    p.add_argument("--json", default="benchmarks/results/per_sample_choice.json")
    args = p.parse_args(argv)
    path = Path(args.json)
    saved = load_json(path) or {}
    if args.report_only:
        if "streams" not in saved:
            raise SystemExit(f"--report-only: {path} holds no study (run it first)")
        print(table(saved))
        return 0
    streams = chosen("--streams", args.streams, tuple(STREAMS))
    if saved.get("seeds") != args.seeds:  # streams run on other seeds are not kept
        saved = {}
    near = medians()
    print("median d per corruption:", near)
    results: dict[str, Any] = saved.get("streams", {})  # streams not rerun (same seeds) are kept
    for stream in streams:
        runs = [record(stream, seed, Path(args.out) / str(seed)) for seed in args.seeds]
        results[stream] = {f"tau={t} gate={g}": [evaluate(r, t, g) for r in runs] for t, g in RULES}
    data = {"seeds": args.seeds, "medians": near, "streams": results}
    path.write_text(json.dumps(data, indent=1))
    print(f"error % (easy domains), mean over seeds {args.seeds}:\n{table(data)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
