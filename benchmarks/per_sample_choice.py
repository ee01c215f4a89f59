"""Would a per-sample choice close the easy domains' gap on mixed batches? Measured, not adopted.

``eatta-safe`` chooses which model serves per batch. On the mixed stream its easy domains (the
source model under 10 % error) end far above the source model's error: the batch's statistics
are the hard corruptions'. A label-free per-sample rule: serve the source model's prediction
for each sample whose features look like the source data, at the source model's last
BatchNorm layer,

    d(x) = mean_c (μ_c(x) − μ_c)² / σ²_c   (μ_c(x): the sample's channel mean; μ_c, σ²_c: the
                                            layer's running statistics),

when ``d(x) < τ``, everywhere or (gated) only in batches where at most a share ``g`` of the
samples are that near (a mixed batch). Every run of ``eatta-safe`` (answers at once, requests
of 64) is recorded per sample: its served prediction, the source model's prediction and ``d``;
the rule is applied to the records afterwards, so one run per stream and seed serves every
``τ`` and ``g``. Also the median ``d`` of each digits-C corruption. Writes
``benchmarks/results/per_sample_choice.json`` and prints the table that docs/safety.md quotes.

    python benchmarks/per_sample_choice.py --seeds 0-2 --out runs/per-sample
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import seed_list
from safety_study import DATASETS, EASY, STREAMS

import eatta.bench
from eatta.bench import runner
from eatta.monitor.fallback import SourceFallback

THRESHOLDS = (0.1, 0.2, 0.25, 0.3)
GATES = (None, 0.2)


def _near(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The source model's predictions and ``d(x)`` at its last BatchNorm layer."""
    bn = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)][-1]
    got: list[torch.Tensor] = []

    def hook(m: Any, inputs: tuple[torch.Tensor, ...], _out: Any) -> None:
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
    after, serve, show, count = (
        SourceFallback.after,
        runner._serve,
        runner._show,
        runner._count_domains,
    )

    def after_(
        self: SourceFallback,
        method: Any,
        x: torch.Tensor,
        logits: torch.Tensor,
        *args: Any,
        **kw: Any,
    ) -> torch.Tensor:
        pred, d = _near(self.given, x)
        out = after(self, method, x, logits, *args, **kw)
        rec["served"].append(out.argmax(1).numpy())
        rec["source"].append(pred.numpy())
        rec["d"].append(d.numpy())
        return out

    def serve_(method: Any, x: torch.Tensor, y: torch.Tensor, *args: Any) -> Any:
        rec["batch"].append(np.full(len(y), len(rec["y"])))  # which batch each sample is in
        rec["y"].append(y.numpy())
        return serve(method, x, y, *args)

    def show_(bar: Any, error: float, domain: str) -> None:  # the batch's domain
        rec["domain"].append(np.array([domain] * len(rec["y"][-1])))
        show(bar, error, domain)

    def count_(stream: Any, t: int, *args: Any) -> None:  # mixed: each sample's own domain
        rec["mixed"].append(np.array([stream.domains[k].name for k in stream.sample_domains(t)]))
        count(stream, t, *args)

    patched = (after_, serve_, show_, count_)
    SourceFallback.after, runner._serve, runner._show, runner._count_domains = patched  # type: ignore
    try:
        eatta.bench.run(
            DATASETS.get(stream, "digits-c"),
            ["eatta-safe"],
            protocol=STREAMS[stream],
            seeds=[seed],
            out=out / stream,
            jobs=1,
            threads=1,
            progress=False,
            plot=False,
            reuse=False,
        )
    finally:
        SourceFallback.after, runner._serve, runner._show, runner._count_domains = (  # type: ignore
            after,
            serve,
            show,
            count,
        )
    if rec["mixed"]:
        rec["domain"] = rec.pop("mixed")
    return {k: np.concatenate(v) for k, v in rec.items() if v}


def evaluate(
    r: dict[str, np.ndarray], tau: float | None, gate: float | None
) -> tuple[float, float]:
    """Error % over the stream and over its easy domains (each sample's own), the rule applied
    (``tau`` None: as served)."""
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


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=seed_list, default="0-2")
    p.add_argument("--streams", default=",".join(STREAMS), help="'': only the medians")
    p.add_argument("--out", default="runs/per-sample")
    p.add_argument("--json", default="benchmarks/results/per_sample_choice.json")
    args = p.parse_args(argv)
    streams = [x for x in args.streams.split(",") if x]
    unknown = [x for x in streams if x not in STREAMS]
    if unknown:
        raise SystemExit(f"--streams: unknown {unknown}; choose from {', '.join(STREAMS)}")
    path = Path(args.json)
    saved = json.loads(path.read_text()) if path.is_file() else {}
    if saved.get("seeds") != args.seeds:  # streams run on other seeds are not kept
        saved = {}
    near = medians()
    print("median d per corruption:", near)
    rules: list[tuple[float | None, float | None]] = [(None, None)]
    rules += [(t, g) for g in GATES for t in THRESHOLDS]
    table: dict[str, Any] = saved.get("streams", {})  # streams not rerun (same seeds) are kept
    for stream in streams:
        runs = [record(stream, seed, Path(args.out) / str(seed)) for seed in args.seeds]
        table[stream] = {f"tau={t} gate={g}": [evaluate(r, t, g) for r in runs] for t, g in rules}
        print(f"{stream}: (error, easy domains) mean over seeds {args.seeds}")
        for rule, values in table[stream].items():
            err = np.mean([v[0] for v in values])
            easy_values = [v[1] for v in values if not np.isnan(v[1])]  # mnist: no easy domain
            easy = np.mean(easy_values) if easy_values else np.nan
            print(f"  {rule:22s} {err:6.2f} {easy:6.2f}")
    path.write_text(json.dumps({"seeds": args.seeds, "medians": near, "streams": table}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
