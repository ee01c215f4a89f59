#!/usr/bin/env python
"""What one adaptation step costs over plain inference: TENT, EATTA, reference-style EATTA.

Per model (:data:`MODELS`: random init, the heads scaled until half the batch is confident), on
one batch, the variants of :func:`build_variants` are timed interleaved and their peak memory read
in a separate call (``eatta-approx``: the largest over its refresh period); also p50/p99 latency,
the first update's parity of the exact variants, the growth with the batch size and the labels per
batch, a ``torch.profiler`` breakdown by op category.

``--compile`` (issue 54): inference and :data:`COMPILED_STEPS`, the model eager and on
``torch.compile`` (``--backend``, inductor; warmed until compiled), timed interleaved
(``--cpu-time --threads 1``: each call's CPU time); ratios to the eager TENT step and compiled
over eager. ``--compile-check``: every registered method (and EATTA's approximate step) compiled
(aot_eager) against eager, same weights and stream, 20 steps; the largest difference of the
predictions and the adapted weights (the bar: 1e-4), on the digits CNN and on a ``features`` /
``classifier`` CNN. Results: ``compile_step_<device>.json``, ``compile_check_<backend>.json``.

    python benchmarks/step_benchmark.py                 # CPU, writes benchmarks/results/
    python benchmarks/step_benchmark.py --quick         # smoke run, benchmarks/results/quick/
    python benchmarks/step_benchmark.py --device cuda   # adds ResNet-50 and ViT-B/16
    python benchmarks/step_benchmark.py --compile       # compiled against eager, CPU timing
    python benchmarks/step_benchmark.py --compile-check # the matrix, aot_eager (minutes)
    python benchmarks/step_benchmark.py --compile --device cuda --models resnet50-224 vit_b_16-224
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import _common
import _timing
import numpy as np
import torch
import torch.nn.functional as F
from _timing import ModelCase
from torch import Tensor, nn

import eatta
from eatta.annotate import SimulatedAnnotator
from eatta.configure import configure_model
from eatta.debias import GradNormDebiaser
from eatta.losses import default_entropy_margin, entropy
from eatta.methods.late_labels import LateLabels
from eatta.methods.registry import available, get_spec
from eatta.methods.tent import Tent
from eatta.models.digits_cnn import packaged_digits_source
from eatta.monitor import AccuracyMonitor

LR = 2.5e-4
#: ``--models``: the first two are the default on the CPU and in a quick run, all four on CUDA.
MODELS = ("resnet18-64", "digits-32", "resnet50-224", "vit_b_16-224")
#: ``--compile``: its default models, and its steps (name, method, keywords), eager and compiled
COMPILE_MODELS = ("digits-32", "resnet18-64")
COMPILED_STEPS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("tent", "tent", {}),
    ("eatta", "eatta", {}),
    ("eatta-approx", "eatta", {"grad_mode": "approx"}),
    ("eatta-approx-head", "eatta", {"grad_mode": "approx", "approx_proxy": "head"}),
)
#: ``--compile-check``: steps per method, and the name of EATTA's approximate step
CHECK_STEPS = 20
APPROX = "eatta~approx"


# -- models ----------------------------------------------------------------------------------------
def make_source(case: ModelCase, x: Tensor, seed: int = 0) -> dict[str, Tensor]:
    """Initial weights: random init, the head scaled until half the batch is confident."""
    torch.manual_seed(seed)
    model = configure_model(case.build().to(x.device))
    _common.scale_head(model, _timing.head_of(model), x, case.num_classes, tries=12)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fresh(case: ModelCase, state: dict[str, Tensor], device: torch.device, channels_last: bool):
    """A configured copy of the source model and its norm parameters."""
    model = case.build()
    configure_model(model)
    model.load_state_dict(state)
    model.to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    return model, eatta.configure(model)


def sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9, nesterov=True)


# -- the reference-style step ----------------------------------------------------------------------
class ReferenceStyleStep:
    """The authors' EATTA step structure, re-implemented locally for the cost comparison.

    As in the reference code (method.md §1, §3, §4): perturbation differences from CPU noise, the
    reference class-balancing rule, ``L_unsup`` by boolean indexing, then three backward passes
    through ``.grad``: ``L_sup`` (retain graph) for its gradient norm, ``L_unsup`` (retain graph)
    for its norm, and the weighted sum for the update; the weights and their EMA are host floats.
    With the same noise seed its first update equals :class:`eatta.EATTA`'s (checked in the run).
    The reference's empty-``U`` NaN is left alone: the benchmark's heads keep ``U`` non-empty.
    """

    def __init__(self, model: nn.Module, optimizer: Any, labels: Tensor, budget: int = 1) -> None:
        self.backbone, self.head = eatta.split_model(model)
        self.optimizer, self.budget = optimizer, budget
        self.params = optimizer.param_groups[0]["params"]
        self.labels = labels  # the oracle's ground truth (CPU)
        self.alpha, self.std = 0.8, 0.01  # EATTA's EMA rate and perturbation
        self.generator = torch.Generator().manual_seed(0)
        self.history: list[int] = []
        self.stored_diff: dict[int, float] = {}
        self.ema: tuple[float, float] | None = None

    def _select(self, diff: Tensor, pseudo: Tensor) -> list[int]:
        order = torch.argsort(diff, descending=True).tolist()
        classes = pseudo[order].tolist()
        diffs = diff[order].tolist()
        m = self.budget
        if not self.history:
            taken, extend, trim = list(range(m)), True, False
        else:
            recent, chosen = set(self.history), []
            for j in range(m):
                if classes[j] in recent and diffs[j] < self.stored_diff.get(classes[j], -math.inf):
                    j = next((q for q in range(m, len(order)) if classes[q] not in recent), -1)
                    if j < 0:
                        continue
                if j not in chosen:
                    chosen.append(j)
            taken, extend, trim = (
                (sorted(chosen), True, True) if chosen else (list(range(m)), False, True)
            )
        for q in taken:
            self.stored_diff[classes[q]] = diffs[q]
        if extend:
            self.history.extend(classes[q] for q in taken)
            if trim and len(self.history) > 2:
                self.history = self.history[-1:]
        return [order[q] for q in taken]

    def _norm(self) -> Tensor:
        return torch.norm(torch.stack([p.grad.detach().norm(2) for p in self.params]), 2)

    def __call__(self, x: Tensor) -> Tensor:
        with torch.enable_grad():
            z = self.backbone(x)
            o = self.head(z)
            probs = o.softmax(1)
            conf, pseudo = probs.max(1)
            ent = -(probs * o.log_softmax(1)).sum(1)
            noise = torch.randn(z.shape, generator=self.generator) * self.std
            with torch.no_grad():
                moved = self.head(z.detach() + noise.to(z.device)).softmax(1)
            diff = (conf.detach() - moved.gather(1, pseudo[:, None]).squeeze(1)).abs()
            picked = self._select(diff, pseudo)
            idx = torch.tensor(picked, device=x.device)
            loss_sup = F.cross_entropy(o[idx], self.labels[picked].to(x.device))
            keep = ent.detach() < default_entropy_margin(o.shape[1])
            keep[idx] = False
            loss_unsup = ent[keep].mean()
            self.optimizer.zero_grad()
            loss_sup.backward(retain_graph=True)
            g_sup = self._norm()
            self.optimizer.zero_grad()
            loss_unsup.backward(retain_graph=True)
            g_unsup = self._norm()
            self.optimizer.zero_grad()
            total = float(g_sup + g_unsup)
            raw = (2 * float(g_unsup) / total, 2 * float(g_sup) / total)
            a, e = self.alpha, self.ema
            self.ema = (
                raw if e is None else (a * e[0] + (1 - a) * raw[0], a * e[1] + (1 - a) * raw[1])
            )
            w_sup, w_unsup = self.ema
            (w_sup * loss_sup + w_unsup * loss_unsup).backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
        return o.detach()


# -- variants --------------------------------------------------------------------------------------
def build_variants(
    case: ModelCase,
    state: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    device: torch.device,
    *,
    channels_last: bool,
    batched: bool,
    audit_share: float,
) -> dict[str, Callable[[], object]]:
    """One callable per variant, each with its own copy of the model and optimizer; a method's
    step is ``partial(method, x, ...)``, so ``.func`` is the method."""

    def new() -> tuple[nn.Module, list[nn.Parameter]]:
        return fresh(case, state, device, channels_last)

    def tent(**parts: Any) -> Tent:
        model, params = new()
        return Tent(model, sgd(params), **parts)

    def active(oracle: Any = None, **kw: Any) -> Callable[[], object]:
        model, params = new()
        oracle = oracle or eatta.GroundTruthOracle()
        return partial(eatta.EATTA(model, sgd(params), oracle=oracle, **kw), x, labels=y)

    def audit() -> AccuracyMonitor:
        # compared with the method's copy of the model as given (eval mode, its running
        # statistics), so a sample's prediction does not depend on its batch
        return AccuracyMonitor(eatta.GroundTruthOracle(), share=audit_share, guard="paired")

    variants: dict[str, Callable[[], object]] = {"inference": _timing.inference(new()[0], x)}
    variants["tent"] = partial(tent(), x)
    for mode in ["auto", "two-pass", "approx"] + (["batched"] if batched else []):
        variants["eatta" if mode == "auto" else f"eatta-{mode}"] = active(grad_mode=mode)
    variants["eatta-no-gnd"] = active(debiaser=GradNormDebiaser(normalize=False))
    variants["eatta-async-0"] = active(SimulatedAnnotator(delay=0))
    variants["tent+audit"] = partial(tent(monitor=audit()), x, labels=y)
    variants["eatta+audit"] = active(monitor=audit())
    # eatta-stable's late-label handling; a step without late labels
    variants["eatta-async-0-late"] = active(SimulatedAnnotator(delay=0), late_labels=LateLabels())
    model, params = new()
    variants["reference-style"] = partial(ReferenceStyleStep(model, sgd(params), y), x)
    # one step per candidate, then its own
    variants["hiltta"] = _timing.method_step("hiltta", new()[0], x, y)
    model, params = new()
    variants["two-backward floor"] = partial(_floor_step, model, sgd(params), x, y.to(device))
    return variants


def _floor_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> object:
    """The two-backward floor: forward, both losses, two ``autograd.grad`` passes, the update."""
    params = optimizer.param_groups[0]["params"]
    with torch.enable_grad():
        o = model(x)
        h = entropy(o)
        mask = h.detach() < default_entropy_margin(o.shape[1])
        loss_unsup = torch.where(mask, h, torch.zeros_like(h)).sum() / mask.sum().clamp_min(1)
        loss_sup = F.cross_entropy(o[:1], y[:1])
        gs = torch.autograd.grad(loss_sup, params, retain_graph=True)
        gu = torch.autograd.grad(loss_unsup, params)
        for p, a, b in zip(params, gs, gu, strict=True):
            p.grad = a + b
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return o.detach()


def parity(
    case: ModelCase, state: dict[str, Tensor], x: Tensor, y: Tensor, device: torch.device
) -> dict[str, float]:
    """Max |Δθ| after one step between EATTA (auto) and the other exact variants."""
    after: dict[str, list[Tensor]] = {}
    for name in ("eatta", "eatta-async-0", "eatta-two-pass", "eatta-batched", "reference-style"):
        model, params = fresh(case, state, device, False)
        if name == "reference-style":
            ReferenceStyleStep(model, sgd(params), y)(x)
        else:
            async_ = name == "eatta-async-0"
            oracle = SimulatedAnnotator(delay=0) if async_ else eatta.GroundTruthOracle()
            mode = "auto" if name in ("eatta", "eatta-async-0") else name.removeprefix("eatta-")
            eatta.EATTA(model, sgd(params), oracle=oracle, grad_mode=mode)(x, labels=y)
        after[name] = [p.detach().clone() for p in params]
    base = after.pop("eatta")
    return {
        name: max(float((a - b).abs().max()) for a, b in zip(ps, base, strict=True))
        for name, ps in after.items()
    }


# -- profile ---------------------------------------------------------------------------------------
CATEGORIES = (
    ("conv backward", ("convolution_backward",)),
    ("conv forward", ("convolution", "conv2d")),
    ("norm backward", ("batch_norm_backward", "layer_norm_backward")),
    ("norm forward", ("batch_norm", "layer_norm")),
    ("activation backward", ("threshold_backward", "gelu_backward")),
    ("activation forward", ("relu", "clamp_min", "gelu")),
    ("pooling", ("pool",)),
    ("matmul / attention", ("addmm", "aten::mm", "bmm", "linear", "matmul", "attention")),
    ("copies / fills", ("copy_", "fill_", "zero_", "cat", "stack", "empty", "clone", "index")),
    ("elementwise", ("add", "mul", "div", "sub", "where", "sum", "mean", "norm", "exp", "log")),
)
#: Profiler entries that are not ops (their time is the ops').
NOT_OPS = ("autograd::", "Optimizer", "ProfilerStep")


def _category(name: str) -> str:
    return next((cat for cat, keys in CATEGORIES if any(k in name for k in keys)), "other")


def profile_steps(
    fns: dict[str, Callable[[], object]], device: torch.device, steps: int = 3
) -> dict[str, Any]:
    """Self time per op category (ms per step) and the top ops, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync = _timing.synchronizer(device)
    out: dict[str, Any] = {}
    for name, fn in fns.items():
        fn()
        sync()
        with profile(activities=acts) as prof:
            for _ in range(steps):
                fn()
            sync()
        rows = []
        for e in prof.key_averages():
            if e.key.startswith(NOT_OPS) or "evaluate_function" in e.key:
                continue
            dev = getattr(e, "self_device_time_total", None)
            if dev is None:
                dev = getattr(e, "self_cuda_time_total", 0)
            t = dev if device.type == "cuda" else e.self_cpu_time_total
            rows.append((e.key, t / 1e3 / steps, e.count // steps))
        rows.sort(key=lambda r: -r[1])
        cats: Counter[str] = Counter()
        for key, ms, _ in rows:
            cats[_category(key)] += ms
        out[name] = {
            "total_ms": sum(r[1] for r in rows),
            "categories_ms": dict(cats.most_common()),
            "top_ops": [{"op": k, "ms": round(ms, 3), "calls": n} for k, ms, n in rows[:15]],
        }
    return out


# -- compiled models -------------------------------------------------------------------------------
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


def checked_run(name: str, model: nn.Module, stream: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Method ``name``'s predictions over the stream and the weights after it, as one row."""
    method, kw = ("eatta", {"grad_mode": "approx"}) if name == APPROX else (name, {})
    if method == "eata":
        x = stream[0][0]
        kw["fisher_data"] = [torch.randn(x.shape, generator=torch.Generator().manual_seed(1))]
    torch.manual_seed(0)
    step = _timing.method_step(method, model, *stream[0], **kw).func
    active = get_spec(method).active
    outs = [step(x, labels=y) if active else step(x) for x, y in stream]
    weights = [t.detach().reshape(-1) for t in model.state_dict().values() if t.is_floating_point()]
    return torch.cat([torch.cat(outs).reshape(-1), *weights])


def compile_check(backend: str) -> dict[str, Any]:
    """The matrix: per model, per method, the largest |compiled - eager| after the steps."""
    models: dict[str, tuple[Callable[[], nn.Module], int]] = {
        "digits-cnn": (lambda: packaged_digits_source()[0], 32),
        "features-classifier": (FeaturesClassifier, 16),
    }
    out: dict[str, Any] = {}
    for label, (make, pixels) in models.items():
        g = torch.Generator().manual_seed(0)
        stream = [
            (
                torch.randn(16, 3, pixels, pixels, generator=g) * 0.8 + 0.1,
                torch.randint(0, 10, (16,), generator=g),
            )
            for _ in range(CHECK_STEPS)
        ]
        rows: dict[str, Any] = {}
        for name in [*available(), APPROX]:
            torch._dynamo.reset()
            base = make()
            t0 = time.perf_counter()
            try:
                eager = checked_run(name, copy.deepcopy(base), stream)
                compiled = torch.compile(copy.deepcopy(base), backend=backend)
                diff = float((eager - checked_run(name, compiled, stream)).abs().max())
                rows[name] = {"max_abs_diff": diff, "ok": diff <= 1e-4}
            except Exception as err:  # reported, not raised: the matrix is the result
                rows[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
            rows[name]["seconds"] = round(time.perf_counter() - t0, 1)
            print(f"[{label}] {name}: {rows[name]}", flush=True)
        out[label] = rows
    return out


def _compiled(base: nn.Module, args: argparse.Namespace, compiled: bool) -> nn.Module:
    model = copy.deepcopy(base)
    return torch.compile(model, backend=args.backend, mode=args.mode) if compiled else model


def compile_timing(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Per model: inference and the steps, each eager and compiled (own model copies), timed."""
    out: dict[str, Any] = {}
    for name in args.models or COMPILE_MODELS:
        case = _timing.MODELS[name]
        x, y = (t.to(device) for t in _timing.random_batch(case, args.batch, seed=1))
        torch.manual_seed(0)
        base = case.build().to(device)
        fns: dict[str, Callable[[], object]] = {}
        for compiled in (False, True):
            tag = " (compiled)" if compiled else ""
            fns[f"inference{tag}"] = _timing.inference(_compiled(base, args, compiled).eval(), x)
            for step, method, kw in COMPILED_STEPS:
                model = _compiled(base, args, compiled)
                fns[step + tag] = _timing.method_step(method, model, x, y, **kw)
        t0 = time.perf_counter()
        for fn in fns.values():  # compile (and recompile) outside the timing
            for _ in range(3):
                fn()
        compile_s = time.perf_counter() - t0
        clock = time.thread_time if args.cpu_time else time.perf_counter
        samples = _timing.time_interleaved(
            fns, repeats=args.repeats, warmup=args.warmup, device=device, clock=clock
        )
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


def compile_main(args: argparse.Namespace, device: torch.device) -> int:
    """``--compile`` or ``--compile-check``, and its results file."""
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    meta = _common.machine(device)
    check = args.compile_check
    meta.update(backend=args.backend, mode=args.mode, steps=CHECK_STEPS if check else None)
    if check:
        data: dict[str, Any] = {"meta": meta, "check": compile_check(args.backend)}
        path = args.out / f"compile_check_{args.backend}.json"
    else:
        meta.update(repeats=args.repeats, batch=args.batch, cpu_time=args.cpu_time)
        data = {"meta": meta, "models": compile_timing(args, device)}
        path = args.out / f"compile_step_{device.type}.json"
    _common.finish_meta(meta, started)
    _common.write_json(path, data)
    print(f"wrote {path}")
    return 0


# -- the run ---------------------------------------------------------------------------------------
def batch_for(case: ModelCase, batch: int, device: torch.device, channels_last: bool):
    x, y = _timing.random_batch(case, batch, seed=1)
    memory_format = torch.channels_last if channels_last else torch.preserve_format
    return x.to(device, memory_format=memory_format), y


def bench_model(case: ModelCase, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    x, y = batch_for(case, args.batch, device, args.channels_last)
    state = make_source(case, x)
    variants = build_variants(
        case, state, x, y, device,
        channels_last=args.channels_last, batched=not args.quick, audit_share=args.audit_share,
    )  # fmt: skip
    print(f"[{case.name}] timing {len(variants)} variants, batch {args.batch}", flush=True)
    faults: dict[str, list[int]] = {}
    samples = _timing.time_interleaved(
        variants, repeats=args.repeats, warmup=args.warmup, device=device, faults=faults
    )
    rows = {n: _timing.stats_ms(s) for n, s in samples.items()}
    for name, fn in variants.items():
        f, peak = faults[name], _peak(fn, device)
        rows[name]["minor_faults_median"] = sorted(f)[len(f) // 2]
        rows[name]["peak_mb"] = None if peak is None else peak / 2**20
    pairs = [(n, "tent") for n in samples if n != "tent"]
    pairs += [("tent", "inference"), ("eatta+audit", "eatta")]
    ratios = {f"{a}/{b}": _timing.ratio(samples, a, b) for a, b in pairs}
    result: dict[str, Any] = {
        "batch": args.batch,
        "resolution": case.resolution,
        "num_classes": case.num_classes,
        "variants": rows,
        "time_ratios": ratios,
    }
    peaks = {n: v["peak_mb"] for n, v in rows.items() if v["peak_mb"] is not None}
    if peaks.get("tent"):
        adapting = {n: p for n, p in peaks.items() if n not in ("tent", "inference")}
        mem = {f"{n}/tent": p / peaks["tent"] for n, p in adapting.items()}
        if peaks.get("eatta") and peaks.get("eatta+audit"):
            mem["eatta+audit/eatta"] = peaks["eatta+audit"] / peaks["eatta"]
        result["memory_ratios"] = mem
    result["latency"] = {n: _latency(samples[n]) for n in ("tent", "eatta", "eatta-approx")}
    result["parity_max_abs_diff"] = parity(case, state, x, y, device)
    keys = ("eatta/tent", "eatta-approx/tent", "eatta-no-gnd/tent", "two-backward floor/tent")
    for key in (*keys, "eatta+audit/eatta"):
        r, mem = ratios[key], result.get("memory_ratios", {}).get(key)
        extra = "" if mem is None else f"; peak memory {mem:.3f}"
        print(
            f"  {key}: median {r['median']:.3f} paired {r['paired']:.3f} min {r['min']:.3f}{extra}"
        )
    if args.profile:
        keep = {n: variants[n] for n in ("tent", "eatta", "eatta-approx", "reference-style")}
        result["profile"] = profile_steps(keep, device)
    return result


def _latency(seconds: list[float]) -> dict[str, float]:
    """p50 and p99 of one variant's per-step times (ms; linear interpolation)."""
    p50, p99 = np.percentile(np.multiply(seconds, 1e3), [50, 99])
    return {"p50_ms": float(p50), "p99_ms": float(p99), "n": len(seconds)}


def _peak(fn: Callable[[], object], device: torch.device) -> int | None:
    """Peak bytes of one step; for ``eatta-approx`` the largest over a refresh period."""
    period = getattr(getattr(fn, "func", None), "approx_refresh", None) or 1
    known = [p for p in (_timing.peak_bytes(fn, device) for _ in range(period)) if p is not None]
    return max(known) if known else None


def growth(case: ModelCase, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """EATTA and TENT step time against batch size and labels per batch."""
    batches = (16, 32) if args.quick else (16, 32, 64, 128)
    labels = (1, 3) if args.quick else (1, 3, 5)
    repeats = 2 if args.quick else 11
    out: dict[str, Any] = {"model": case.name, "batch_size": [], "labels": []}
    x, y = batch_for(case, max(batches), device, args.channels_last)
    state = make_source(case, x[:64])
    grid = [("batch_size", b, 1) for b in batches] + [("labels", 64, k) for k in labels]
    for kind, b, k in grid:
        xb, yb = x[:b], y[:b]
        model, params = fresh(case, state, device, args.channels_last)
        fns: dict[str, Callable[[], object]] = {"tent": partial(Tent(model, sgd(params)), xb)}
        model, params = fresh(case, state, device, args.channels_last)
        method = eatta.EATTA(model, sgd(params), oracle=eatta.GroundTruthOracle(), budget=k)
        fns["eatta"] = partial(method, xb, labels=yb)
        s = _timing.time_interleaved(fns, repeats=repeats, warmup=1, device=device)
        eatta_ms, tent_ms = (_timing.stats_ms(s[n])["median_ms"] for n in ("eatta", "tent"))
        r = _timing.ratio(s, "eatta", "tent")
        out[kind].append(
            {
                "batch": len(xb),
                "labels": k,
                "eatta_median_ms": eatta_ms,
                "tent_median_ms": tent_ms,
                "eatta_ms_per_image": eatta_ms / len(xb),
                "ratio": r["median"],
                "ratio_paired": r["paired"],
                "ratio_min": r["min"],
            }
        )
        what = f"batch {b}" if kind == "batch_size" else f"labels {k}"
        print(f"  growth {what}: eatta/tent {r['median']:.3f}", flush=True)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _timing.timing_parser(__doc__)
    p.add_argument("--models", nargs="+", choices=sorted(_timing.MODELS))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--audit-share", type=float, default=0.1, help="of the +audit variants")
    p.add_argument("--repeats", type=int, help="timed rounds (default 25, --compile 15; quick 3)")
    p.add_argument("--warmup", type=int, help="untimed rounds (default 3, --compile and quick 1)")
    p.add_argument("--no-growth", action="store_true")
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--channels-last", action="store_true", help="channels-last model and input")
    p.add_argument("--tag", default="", help="suffix of the JSON file name (e.g. an env setting)")
    p.add_argument("--compile", action="store_true", help="the steps compiled against eager")
    p.add_argument("--compile-check", action="store_true", help="the compiled-model matrix")
    p.add_argument("--backend", help="torch.compile backend (default inductor, check aot_eager)")
    p.add_argument("--mode", help="torch.compile mode (e.g. max-autotune-no-cudagraphs)")
    p.add_argument("--cpu-time", action="store_true", help="--compile: CPU time (--threads 1)")
    args = p.parse_args(argv)
    warmup = (1, 1) if args.compile else (3, 1)
    _timing.fill_defaults(args, args.quick, repeats=(15 if args.compile else 25, 3), warmup=warmup)
    args.profile = args.profile and not args.quick
    args.backend = args.backend or ("aot_eager" if args.compile_check else "inductor")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = _timing.timing_device(args)
    if device is None:
        return 2
    if args.compile or args.compile_check:
        return compile_main(args, device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    models = args.models or MODELS[: 4 if device.type == "cuda" and not args.quick else 2]
    started = time.perf_counter()
    meta = _common.machine(device)
    meta.update(
        quick=args.quick,
        repeats=args.repeats,
        warmup=args.warmup,
        batch=args.batch,
        channels_last=args.channels_last,
        optimizer=f"SGD lr {LR}, momentum 0.9, nesterov",
        memory_method=(
            "torch.cuda.max_memory_allocated above the allocation at the step's start"
            if device.type == "cuda"
            else "torch.profiler profile_memory: running sum of allocator events, max above start"
        ),
    )
    cases = [_timing.MODELS[n] for n in models]
    results = {"meta": meta, "models": {c.name: bench_model(c, args, device) for c in cases}}
    if not args.no_growth:
        results["growth"] = growth(cases[0], args, device)
    path = args.out / f"step_benchmark_{device.type}{f'_{args.tag}' if args.tag else ''}.json"
    _timing.write_results(path, results, started, tag=args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
