#!/usr/bin/env python
"""A compiled model (``torch.compile``) under the methods: does it match, and is the step cheaper?

``--check``: every registered method (and EATTA's approximate step) wraps
``torch.compile(model, backend=...)`` and the eager model, same weights and stream, 20 steps;
the largest difference of the predictions and the adapted weights, per method, on the digits
CNN and on a ``features`` / ``classifier`` CNN (whose split is discovered). The bar is 1e-4.

Timing (default): on each model, one batch, the step of TENT, ``eatta``, ``eatta-approx`` and
``eatta-approx-head`` (``approx_proxy="head"``) with the model eager and compiled (``--backend``,
inductor by default), timed interleaved (the compiled variants warmed until compiled), with
plain inference eager and compiled; ratios to the eager TENT step and compiled over eager.
``--cpu-time --threads 1``: each call's CPU time, on a machine other jobs load.

    python benchmarks/compile_step.py                  # CPU timing, digits-32 and resnet18-64
    python benchmarks/compile_step.py --check          # the matrix, aot_eager (minutes)
    python benchmarks/compile_step.py --device cuda --models resnet50-224 vit_b_16-224
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import _common
import _timing
import torch
from torch import Tensor, nn

import eatta
from eatta.methods.registry import available, get_spec
from eatta.models.digits_cnn import packaged_digits_source

STEPS = 20
APPROX = "eatta~approx"


class FeaturesClassifier(nn.Module):
    """A ``features`` / ``classifier`` CNN: no rule by class splits it, discovery does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(32, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def create(name: str, model: nn.Module, x: Tensor) -> eatta.AdaptiveMethod:
    method, kw = ("eatta", {"grad_mode": "approx"}) if name == APPROX else (name, {})
    torch.manual_seed(0)
    if method == "eata":
        kw["fisher_data"] = [torch.randn(x.shape, generator=torch.Generator().manual_seed(1))]
    if get_spec(method).active:
        kw["oracle"] = eatta.GroundTruthOracle()
    return eatta.create(method, model, **kw)  # type: ignore[arg-type]


def run(name: str, model: nn.Module, stream: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Predictions over the stream and the weights after it, as one row."""
    m = create(name, model, stream[0][0])
    active = get_spec(_method(name)).active
    outs = [m(x, labels=y) if active else m(x) for x, y in stream]
    weights = [t.detach().reshape(-1) for t in model.state_dict().values() if t.is_floating_point()]
    return torch.cat([torch.cat(outs).reshape(-1), *weights])


def _method(name: str) -> str:
    return "eatta" if name == APPROX else name


def check(backend: str) -> dict[str, Any]:
    """The matrix: per model, per method, the largest |compiled - eager| after 20 steps."""
    models: dict[str, tuple[Callable[[], nn.Module], int, int]] = {
        "digits-cnn": (lambda: packaged_digits_source()[0], 32, 10),
        "features-classifier": (FeaturesClassifier, 16, 10),
    }
    out: dict[str, Any] = {}
    for label, (make, pixels, classes) in models.items():
        g = torch.Generator().manual_seed(0)
        stream = [
            (
                torch.randn(16, 3, pixels, pixels, generator=g) * 0.8 + 0.1,
                torch.randint(0, classes, (16,), generator=g),
            )
            for _ in range(STEPS)
        ]
        rows: dict[str, Any] = {}
        for name in [*available(), APPROX]:
            torch._dynamo.reset()
            base = make()
            t0 = time.perf_counter()
            try:
                eager = run(name, copy.deepcopy(base), stream)
                compiled = run(name, torch.compile(copy.deepcopy(base), backend=backend), stream)
                diff = float((eager - compiled).abs().max())
                rows[name] = {"max_abs_diff": diff, "ok": diff <= 1e-4}
            except Exception as err:  # reported, not raised: the matrix is the result
                rows[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
            rows[name]["seconds"] = round(time.perf_counter() - t0, 1)
            print(f"[{label}] {name}: {rows[name]}", flush=True)
        out[label] = rows
    return out


def variants(case: _timing.ModelCase, x: Tensor, y: Tensor, backend: str, mode: str | None):
    """Inference, TENT, eatta, eatta-approx; each eager and compiled, own model copies."""
    torch.manual_seed(0)
    base = case.build().to(x.device)

    def model(compiled: bool) -> nn.Module:
        m = copy.deepcopy(base)
        return torch.compile(m, backend=backend, mode=mode) if compiled else m

    fns: dict[str, Callable[[], object]] = {}
    for compiled in (False, True):
        tag = " (compiled)" if compiled else ""
        fns[f"inference{tag}"] = _timing.inference(model(compiled).eval(), x)
        fns[f"tent{tag}"] = _timing.method_step("tent", model(compiled), x, y)
        fns[f"eatta{tag}"] = _timing.method_step("eatta", model(compiled), x, y)
        fns[f"eatta-approx{tag}"] = _timing.method_step(
            "eatta", model(compiled), x, y, grad_mode="approx"
        )
        fns[f"eatta-approx-head{tag}"] = _timing.method_step(
            "eatta", model(compiled), x, y, grad_mode="approx", approx_proxy="head"
        )
    return fns


def cpu_time_interleaved(
    fns: dict[str, Callable[[], object]], repeats: int
) -> dict[str, list[float]]:
    """Each call's CPU time on this thread (``time.thread_time``), the variants interleaved
    round by round, the first rotating: with one torch thread (``--threads 1``) all the work is
    this thread's, and other processes' load moves it far less than wall time."""
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.thread_time()
            fns[name]()
            samples[name].append(time.thread_time() - t0)
    return samples


def timing(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in args.models:
        case = _timing.MODELS[name]
        x, y = _timing.random_batch(case, args.batch, seed=1)
        x = x.to(device)
        fns = variants(case, x, y.to(device), args.backend, args.mode)
        t0 = time.perf_counter()
        for fn in fns.values():  # compile (and recompile) outside the timing
            for _ in range(3):
                fn()
        compile_s = time.perf_counter() - t0
        if args.cpu_time:
            samples = cpu_time_interleaved(fns, args.repeats)
        else:
            samples = _timing.time_interleaved(fns, repeats=args.repeats, warmup=1, device=device)
        pairs = [(n, "tent") for n in fns if n != "tent"]
        pairs += [(f"{n} (compiled)", n) for n in fns if "(compiled)" not in n]
        ratios = {f"{a}/{b}": _timing.ratio(samples, a, b) for a, b in pairs}
        out[name] = {
            "batch": args.batch,
            "warm_up_and_compile_s": round(compile_s, 1),
            "variants": {n: _timing.stats_ms(s) for n, s in samples.items()},
            "time_ratios": ratios,
        }
        for key in ("eatta/tent", "eatta (compiled)/tent", "eatta (compiled)/eatta",
                    "tent (compiled)/tent", "eatta-approx (compiled)/eatta-approx",
                    "eatta-approx-head (compiled)/tent"):  # fmt: skip
            r = ratios[key]
            print(f"[{name}] {key}: median {r['median']:.3f} paired {r['paired']:.3f}", flush=True)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _timing.timing_parser(__doc__)
    p.add_argument("--check", action="store_true", help="the correctness matrix instead")
    p.add_argument("--backend", help="torch.compile backend (default: inductor; --check aot_eager)")
    p.add_argument("--mode", help="torch.compile mode (e.g. max-autotune-no-cudagraphs)")
    p.add_argument("--models", nargs="+", default=["digits-32", "resnet18-64"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, help="timed rounds (default 15, quick 3)")
    p.add_argument(
        "--cpu-time", action="store_true", help="CPU time of this thread (use --threads 1)"
    )
    args = p.parse_args(argv)
    _timing.fill_defaults(args, args.quick, repeats=(15, 3))
    args.backend = args.backend or ("aot_eager" if args.check else "inductor")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = _timing.timing_device(args)
    if device is None:
        return 2
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    meta = _common.machine(device)
    meta.update(backend=args.backend, mode=args.mode, steps=STEPS if args.check else None)
    if args.check:
        data: dict[str, Any] = {"meta": meta, "check": check(args.backend)}
        path = args.out / f"compile_check_{args.backend}.json"
    else:
        meta.update(repeats=args.repeats, batch=args.batch, cpu_time=args.cpu_time)
        data = {"meta": meta, "models": timing(args, device)}
        path = args.out / f"compile_step_{device.type}.json"
    _common.finish_meta(data["meta"], started)
    _common.write_json(path, data)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
