"""What serving one request at a time costs: per-request latency at batch size 1, against the
bare model's forward.

Each request is one digits-C image; variants, interleaved request by request: ``bare`` (the
source model, eval, no gradients), ``eatta-stable+w`` (the recommended small-batch
configuration, ``window=64``, one label per 64 samples: a step inside every 64th request),
``eatta-safe+w`` (the same with the source model beside it; issue 36's bar: a request that does
not step at most 1.5x the bare forward at the median, i.e. overhead p50 at most 0.5x) and
``tent+w``. A request's overhead is its time minus the bare forward's median; reported: the
median (the bar: at most 3x the bare forward's) and p99 (the requests that step or refresh the
window's statistics). Regenerates the ``small-batch-latency`` section of ``docs/small-batches.md``
and ``benchmarks/results/small_batch_latency.json``.

    python benchmarks/small_batch_latency.py                  # 1,920 requests a variant
    python benchmarks/small_batch_latency.py --requests 640   # quicker
"""

from __future__ import annotations

import argparse
import copy
import gc
import time
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import RESULTS, Template, finish_meta, machine, replace_section, write_json
from _common import markdown_table as table
from torch import Tensor, nn

import eatta
import eatta.window
from eatta.data import TestStream, digits_c_domains
from eatta.models.digits_cnn import packaged_digits_source

DOC = Path(__file__).resolve().parents[1] / "docs" / "small-batches.md"
WINDOW = 64
PAGE = Template("small_batch_latency")
#: The doc section's markers.
MARKERS = ("<!-- small-batch-latency:begin -->", "<!-- small-batch-latency:end -->")


def variants(source: nn.Module) -> dict[str, Callable[[Tensor, Tensor], object]]:
    """Each variant's per-request function ``(x, y) -> logits``."""
    kw: dict[str, Any] = {"dataset": "digits-c", "window": WINDOW}
    bare = copy.deepcopy(source).eval()
    stable, safe = (
        eatta.create(name, copy.deepcopy(source), oracle=eatta.GroundTruthOracle(), **kw)
        for name in ("eatta-stable", "eatta-safe")
    )
    tent = eatta.create("tent", copy.deepcopy(source), **kw)

    @torch.no_grad()
    def run_bare(x: Tensor, y: Tensor) -> Tensor:
        return bare(x)

    return {
        "bare": run_bare,
        "eatta-stable+w": lambda x, y: stable(x, labels=y),
        "eatta-safe+w": lambda x, y: safe(x, labels=y),
        "tent+w": lambda x, y: tent(x),
    }


def measure(requests: int, warmup: int, seed: int) -> dict[str, Any]:
    """Each variant's latency over the requests, the variants' order rotating request by request."""
    torch.manual_seed(seed)
    source, _ = packaged_digits_source()
    stream = TestStream(digits_c_domains(), 1, seed=seed)
    batches = [(x, torch.as_tensor(y)) for x, y, _ in islice(stream, requests + warmup)]
    fns = variants(source)
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i, (x, y) in enumerate(batches):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            gc.disable()
            try:
                t0 = time.perf_counter()
                fns[name](x, y)
                dt = time.perf_counter() - t0
            finally:
                gc.enable()
            if i >= warmup:
                times[name].append(dt)
    bare_p50 = float(np.median(times["bare"]))
    rows = {}
    for name in names:
        t = np.asarray(times[name])
        over = t - bare_p50
        rows[name] = {
            "p50_ms": 1e3 * float(np.median(t)),
            "p99_ms": 1e3 * float(np.percentile(t, 99)),
            "mean_ms": 1e3 * float(t.mean()),
            "overhead_p50_ms": 1e3 * float(np.median(over)),
            "overhead_p99_ms": 1e3 * float(np.percentile(over, 99)),
            "overhead_p50_x_bare": float(np.median(over)) / bare_p50,
            "overhead_p99_x_bare": float(np.percentile(over, 99)) / bare_p50,
        }
    window = {"window": WINDOW, "refresh": eatta.window.WINDOW_REFRESH}
    return {"requests": requests, "warmup": warmup, **window, "variants": rows}


def _over(r: dict[str, Any], q: str, ms_digits: int, x_digits: int) -> str:
    return f"{r[f'overhead_{q}_ms']:.{ms_digits}f} ({r[f'overhead_{q}_x_bare']:.{x_digits}f}x)"


def report(res: dict[str, Any]) -> str:
    """The doc's section: the setting, the bar's verdict and the table."""
    rows = []
    for name, r in res["variants"].items():
        ms = [f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.2f}", f"{r['mean_ms']:.3f}"]
        over = ["-", "-"] if name == "bare" else [_over(r, "p50", 3, 2), _over(r, "p99", 2, 1)]
        rows.append([name, *ms, *over])
    header = ["variant", "p50 ms", "p99 ms", "mean ms", "overhead p50 ms", "overhead p99 ms"]
    ratio = res["variants"]["eatta-stable+w"]["overhead_p50_x_bare"]
    return PAGE(
        requests=res["requests"],
        warmup=res["warmup"],
        cpu=res["meta"]["machine"]["cpu"],
        threads=res["meta"]["machine"].get("torch_threads", 1),
        verdict="met" if ratio <= 3 else "missed",
        ratio=f"{ratio:.2f}",
        refresh=res["refresh"],
        window=res["window"],
        table=table(header, rows),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1920)
    p.add_argument("--warmup", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-doc", action="store_true", help="print, write neither json nor doc")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    res = measure(args.requests, args.warmup, args.seed)
    res["meta"] = {"machine": machine(torch.device("cpu"))}
    finish_meta(res["meta"], started)
    text = report(res)
    print(text)
    if not args.no_doc:
        write_json(RESULTS / "small_batch_latency.json", res)
        replace_section(DOC, *MARKERS, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
