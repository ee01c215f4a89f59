#!/usr/bin/env python
"""What the source-model fallback costs a step: ``eatta-safe`` against ``eatta-stable`` (and TENT).

On one batch per model, interleaved rounds (``_common.time_interleaved``), median of the per-round
ratios, in one run:

* ``tent``: TENT's step;
* ``eatta-stable``: the recommended configuration before the fallback (budget 1, a synchronous
  ground-truth oracle);
* ``eatta-safe``: the same plus the source model's forward pass on 16 of the 64 samples, the drawn
  request and the decision, while the adapted model is served (``fallback_start="adapted"``; the
  issue's bar: at most 1.15x ``eatta-stable``);
* ``eatta-safe (serving source)``: while the source model is served it predicts on the whole batch
  (the adapted model goes on adapting beside it, to show when it is better again);
* ``eatta-safe (measure only)``: the estimates without acting on them (``fallback=False``);
* ``eatta-safe (exact step)``: the same on the exact two-backward step (``grad_mode="auto"``;
  ``eatta-safe`` itself takes the approximate one-backward step). The bar: a step that adapts
  at most 1.10x TENT's.

(Single requests between window steps: ``benchmarks/small_batch_latency.py``.)

Models: ``digits-32`` (the digits-C CNN, packaged weights) and ``resnet18-64`` (torchvision
ResNet-18, random init, 1000 classes, 64 px, its head's weights times 40 so that part of the
batch passes the entropy margin).

Usage::

    python benchmarks/safe_step_cost.py            # writes benchmarks/results/safe_step_cost.json
    python benchmarks/safe_step_cost.py --quick    # smoke run, nothing written
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

import eatta
from eatta._compat import TorchvisionOpsWarning, import_torchvision
from eatta.annotate.oracle import GroundTruthOracle

RESULTS = Path(__file__).resolve().parent / "results" / "safe_step_cost.json"


def _digits() -> tuple[nn.Module, int, int]:
    from eatta.models.digits_cnn import packaged_digits_source

    model, _ = packaged_digits_source()
    return model, 32, 10


def _resnet18() -> tuple[nn.Module, int, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TorchvisionOpsWarning)
        tv = import_torchvision()
    torch.manual_seed(0)
    model = tv.models.resnet18(num_classes=1000)
    with torch.no_grad():  # a random head is uniformly unsure: scale it so some samples pass
        model.fc.weight.mul_(40.0)
    return model.eval(), 64, 1000


MODELS: dict[str, Callable[[], tuple[nn.Module, int, int]]] = {
    "digits-32": _digits,
    "resnet18-64": _resnet18,
}


def _variants(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Callable[[], object]]:
    def make(name: str, **kw: Any) -> Callable[[], object]:
        active = name != "tent"
        extra: dict[str, Any] = {"oracle": GroundTruthOracle()} if active else {}
        method = eatta.create(name, copy.deepcopy(model), lr=1e-4, **extra, **kw)
        return (lambda: method(x, labels=y)) if active else (lambda: method(x))

    return {
        "tent": make("tent"),
        "eatta-stable": make("eatta-stable"),
        "eatta-safe": make("eatta-safe", fallback_start="adapted"),
        "eatta-safe (serving source)": make("eatta-safe", fallback_start="source"),
        "eatta-safe (measure only)": make("eatta-safe", fallback=False),
        "eatta-safe (exact step)": make("eatta-safe", fallback_start="adapted", grad_mode="auto"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="3 repeats, nothing written")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    repeats, warmup = (3, 1) if args.quick else (max(args.repeats, 2), args.warmup)
    started = time.perf_counter()
    device = torch.device("cpu")
    out: dict[str, Any] = {"meta": _common.machine(device), "models": {}}
    out["meta"].update({"repeats": repeats, "warmup": warmup, "threads": args.threads})
    for name, build in MODELS.items():
        model, size, classes = build()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 3, size, size, generator=g)
        y = torch.randint(0, classes, (64,), generator=g)
        samples = _common.time_interleaved(
            _variants(model, x, y), repeats=repeats, warmup=warmup, device=device
        )
        row = {v: _common.stats_ms(s) for v, s in samples.items()}
        ratios = {  # and the quartiles of the per-round ratios
            k: _common.ratio(samples, a, b)
            | {"quartiles": statistics.quantiles(map(float.__truediv__, samples[a], samples[b]))}
            for k, a, b in (
                ("eatta-safe / eatta-stable", "eatta-safe", "eatta-stable"),
                ("serving given / eatta-stable", "eatta-safe (serving source)", "eatta-stable"),
                ("measure only / eatta-stable", "eatta-safe (measure only)", "eatta-stable"),
                ("eatta-stable / tent", "eatta-stable", "tent"),
                ("eatta-safe / tent", "eatta-safe", "tent"),
                ("exact step / tent", "eatta-safe (exact step)", "tent"),
            )
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
