"""What serving one request at a time costs: per-request latency at batch size 1, against the
bare model's forward.

Each request is one digits-C image. Variants, interleaved request by request (the starting
variant rotating, so a change in the machine's load hits all alike):

* ``bare``: the source model's forward (eval mode, running statistics, no gradients);
* ``eatta-stable+w``: the recommended configuration at small batches,
  ``eatta.create("eatta-stable", model, window=64)``, one label per 64 samples (its step, on the
  window, runs inside every 64th request);
* ``tent+w``: TENT with the same window.

The overhead of a request is its time minus the bare forward's median; reported: its median (the
bar: at most 3x the bare forward's median) and 99th percentile (which includes the requests that
step: 1 in 64, 1.6 %, or refresh the served statistics: 1 in 16; so p99 is one of those).
Regenerates the section of ``docs/small-batches.md``
between ``<!-- small-batch-latency:begin -->`` and ``<!-- small-batch-latency:end -->`` and
``benchmarks/results/small_batch_latency.json``.

    python benchmarks/small_batch_latency.py                  # 1,920 requests a variant
    python benchmarks/small_batch_latency.py --requests 640   # quicker
"""

from __future__ import annotations

import argparse
import copy
import gc
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import RESULTS, finish_meta, machine, replace_section, write_json
from _common import markdown_table as table

import eatta
import eatta.window
from eatta.data import TestStream, digits_c_domains
from eatta.models.digits_cnn import packaged_digits_source

DOC = Path(__file__).resolve().parents[1] / "docs" / "small-batches.md"
WINDOW = 64


def variants(source: torch.nn.Module) -> dict[str, Any]:
    """Each variant's per-request function ``(x, y) -> logits``."""
    bare = copy.deepcopy(source).eval()

    def run_bare(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return bare(x)

    out: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"bare": run_bare}
    for name in ("eatta-stable", "tent"):
        kw: dict[str, Any] = {"dataset": "digits-c", "window": WINDOW}
        if name != "tent":
            kw.update(oracle=eatta.GroundTruthOracle(), budget=1)
        method = eatta.create(name, copy.deepcopy(source), **kw)
        labelled = name != "tent"

        def serve(x: torch.Tensor, y: torch.Tensor, m: Any = method, lab: bool = labelled) -> Any:
            return m(x, labels=y) if lab else m(x)

        out[f"{name}+w"] = serve
    return out


def measure(requests: int, warmup: int, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    source, _ = packaged_digits_source()
    stream = TestStream(digits_c_domains(), 1, seed=seed)
    xs, ys = [], []
    for t, (x, y, _) in enumerate(stream):
        if t >= requests + warmup:
            break
        xs.append(x)
        ys.append(torch.as_tensor(y))
    fns = variants(source)
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(len(xs)):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            gc.disable()
            try:
                t0 = time.perf_counter()
                fns[name](xs[i], ys[i])
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
    return {
        "requests": requests,
        "warmup": warmup,
        "window": WINDOW,
        "refresh": eatta.window.WINDOW_REFRESH,
        "variants": rows,
    }


def _over(r: dict[str, Any], q: str, ms_digits: int, x_digits: int) -> str:
    return f"{r[f'overhead_{q}_ms']:.{ms_digits}f} ({r[f'overhead_{q}_x_bare']:.{x_digits}f}x)"


def report(res: dict[str, Any]) -> str:
    v = res["variants"]
    rows = [
        [
            name,
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.2f}",
            f"{r['mean_ms']:.3f}",
            _over(r, "p50", 3, 2) if name != "bare" else "-",
            _over(r, "p99", 2, 1) if name != "bare" else "-",
        ]
        for name, r in v.items()
    ]
    rec = v["eatta-stable+w"]
    verdict = "met" if rec["overhead_p50_x_bare"] <= 3 else "missed"
    head = (
        f"Generated by `python benchmarks/small_batch_latency.py` ({res['requests']} requests of "
        f"one digits-C image a variant, interleaved, after {res['warmup']} warm-up requests; "
        f"{res['meta']['machine']['cpu']}, {res['meta']['machine'].get('torch_threads', 1)} "
        f"thread). Overhead: a request's time minus the bare forward's median; in brackets, as "
        f"a multiple of that median. The bar (overhead p50 at most 3x the bare forward's p50) "
        f"for the recommended configuration: **{verdict}** "
        f"({rec['overhead_p50_x_bare']:.2f}x). p99 falls on the requests that refresh the "
        f"statistics from the window (1 in {res['refresh']}) or step on it (1 in {res['window']})."
    )
    return "\n".join(
        [
            head,
            "",
            table(
                ["variant", "p50 ms", "p99 ms", "mean ms", "overhead p50 ms", "overhead p99 ms"],
                rows,
            ),
            "",
        ]
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
        replace_section(
            DOC, "<!-- small-batch-latency:begin -->", "<!-- small-batch-latency:end -->", text
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
