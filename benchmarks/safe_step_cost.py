#!/usr/bin/env python
"""What the source-model fallback costs a step: ``eatta-safe`` against ``eatta-stable`` (and TENT).

On one batch per model (:func:`source_model`), interleaved rounds, median of the per-round ratios
(:data:`RATIOS`) of the variants of :func:`_variants`: ``eatta-safe`` while the adapted model is
served (the source model's forward on 16 of the 64 samples, the drawn request, the decision; the
bar: at most 1.15x ``eatta-stable``), serving the source model, measuring only, on the exact step
(the bar: at most 1.10x TENT), and the kept source model's forward alone on its 16 samples (the
floor of keeping it one step away). Single requests: ``benchmarks/small_batch_latency.py``.

    python benchmarks/safe_step_cost.py            # writes benchmarks/results/safe_step_cost.json
    python benchmarks/safe_step_cost.py --quick    # smoke run, nothing written
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from functools import partial
from typing import Any

import _common
import _timing
import torch
from torch import Tensor, nn

from eatta._compat import TorchvisionOpsWarning
from eatta.models.digits_cnn import packaged_digits_source

RESULTS = _common.RESULTS / "safe_step_cost.json"
MODELS = ("digits-32", "resnet18-64")
#: The ratios reported: name, numerator, denominator.
RATIOS = (
    ("eatta-safe / eatta-stable", "eatta-safe", "eatta-stable"),
    ("serving given / eatta-stable", "eatta-safe (serving source)", "eatta-stable"),
    ("measure only / eatta-stable", "eatta-safe (measure only)", "eatta-stable"),
    ("eatta-stable / tent", "eatta-stable", "tent"),
    ("eatta-safe / tent", "eatta-safe", "tent"),
    ("exact step / tent", "eatta-safe (exact step)", "tent"),
    ("source forward on 16 / tent", "source forward on 16", "tent"),
    ("promise, both models / tent", "eatta-safe (promise, both models)", "tent"),
    ("promise, adapted alone / tent", "eatta-safe (promise, adapted alone)", "tent"),
)


def _pinned(step: Any, alone: bool) -> Any:
    """``step``'s eatta-safe held in one regime of its promise: the adapted model alone (its
    certified bound pinned far below 0: the given model on a subset) or both models (never
    alone)."""
    promise = step.func.fallback.promise
    if alone:
        promise.reserve = -1e9  # certified better by far, and kept so for every round
    else:
        promise.adapted_alone = lambda n: False
    return step


def source_model(name: str) -> nn.Module:
    """``digits-32``: the packaged weights; ``resnet18-64``: random init, the head times 40."""
    if name == "digits-32":
        return packaged_digits_source()[0]
    torch.manual_seed(0)
    model = _timing.MODELS[name].build()
    with torch.no_grad():  # a random head is uniformly unsure: scale it so some samples pass
        _timing.head_of(model).weight.mul_(40.0)
    return model.eval()


def _variants(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Any]:
    def make(name: str, **kw: Any) -> Any:
        return _timing.method_step(name, copy.deepcopy(model), x, y, lr=1e-4, **kw)

    kept = make("eatta-safe", fallback_start="adapted").func  # its given model, kept once
    sample = kept.fallback.sample  # the fallback's default subset of 16 samples
    assert sample is not None

    return {
        "tent": make("tent"),
        "eatta-stable": make("eatta-stable"),
        "eatta-safe": make("eatta-safe", fallback_start="adapted"),
        "eatta-safe (serving source)": make("eatta-safe", fallback_start="source"),
        "eatta-safe (measure only)": make("eatta-safe", fallback_acts=False),
        "eatta-safe (exact step)": make("eatta-safe", fallback_start="adapted", grad_mode="auto"),
        "source forward on 16": partial(kept.given_logits, x[:sample]),
        "eatta-safe (promise, both models)": _pinned(make("eatta-safe"), alone=False),
        "eatta-safe (promise, adapted alone)": _pinned(make("eatta-safe"), alone=True),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, help="timed rounds (default 40, quick 3)")
    ap.add_argument("--warmup", type=int, help="untimed rounds (default 5, quick 1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a smoke run, nothing written")
    args = ap.parse_args(argv)
    _timing.fill_defaults(args, args.quick, repeats=(40, 3), warmup=(5, 1))
    repeats = max(args.repeats, 2)  # the quartiles need two
    warnings.simplefilter("ignore", TorchvisionOpsWarning)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    device = torch.device("cpu")
    out: dict[str, Any] = {"meta": _common.machine(device), "models": {}}
    out["meta"].update({"repeats": repeats, "warmup": args.warmup, "threads": args.threads})
    for name in MODELS:
        model = source_model(name)
        x, y = _timing.random_batch(_timing.MODELS[name], 64, seed=0)
        samples = _timing.time_interleaved(
            _variants(model, x, y), repeats=repeats, warmup=args.warmup, device=device
        )
        row = {v: _timing.stats_ms(s) for v, s in samples.items()}
        ratios = {  # and the quartiles of the per-round ratios
            k: _timing.ratio(samples, a, b)
            | {"quartiles": statistics.quantiles(map(float.__truediv__, samples[a], samples[b]))}
            for k, a, b in RATIOS
        }
        out["models"][name] = {"ms": row, "ratios": ratios}
        print(f"{name}:")
        for v, st in row.items():
            print(f"  {v:28s} median {st['median_ms']:.1f} ms")
        for k, r in ratios.items():
            q = "-".join(f"{v:.3f}" for v in r["quartiles"][::2])
            print(f"  {k:28s} {r['paired']:.3f} (median of per-round ratios, IQR {q})")
    _common.finish_meta(out["meta"], started)
    if not args.quick:
        _common.write_json(RESULTS, out)
        print(f"-> {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
