#!/usr/bin/env python
"""The GPU path in one prepared call: step cost, peak memory and host syncs against TENT.

Per model (torchvision ResNet-50 and ViT-B/16, random init, 224 px, batch 64; ``--tiny``: small
ones at 32 px, batch 8, the same path) and precision (fp32, bf16 autocast), five variants, each
on its own copy of one initial model: ``inference`` (eval, ``no_grad``), ``tent``, ``eatta``
(exact gradient norms), ``eatta-approx`` (``grad_mode="approx"``) and ``eatta-safe``; the active
methods get random labels through ``method(x, labels=y)``. Phases:

1. timing: interleaved rounds (``_common.time_interleaved``) after ``--warmup`` steps, until
   ``--rounds`` or this job's share of ``--budget-s`` is spent (at least one round);
2. memory and syncs, one variant at a time, after all the timing (the profiler stays out of it):
   the peak while the method is built and stepped ``--memory-steps`` times
   (``torch.cuda.max_memory_allocated``; on the CPU the profiler's allocation events), then the
   host syncs of one step under ``torch.cuda.set_sync_debug_mode("warn")`` and of another under
   ``torch.profiler`` (the runtime's blocking calls, less the profiler's own);
3. the ``gpu``-marked tests (``pytest -m gpu``), unless ``--skip-tests``.

bf16: a method with an ``autocast`` option is built with ``autocast=True``, the others run inside
``torch.autocast``; each variant's entry says which. The JSON (rewritten after every phase of
every job, ``"complete": false`` until the end; a failed job is recorded with its traceback and
the exit status is 1) holds the machine's facts, every measurement, the ratios to TENT and the
issue's targets (EATTA <= 1.3x TENT's time, approx and eatta-safe <= 1.1x, peak memory <= 1.05x,
at most one host sync a step), each marked ``met`` or ``missed``.

    timeout 480 python benchmarks/gpu_check.py --device cuda   # benchmarks/results/gpu_check.json
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/dry.json   # CPU dry run
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("eatta") is None:  # not installed: the checkout's source
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import _common  # noqa: E402  (after the path fallback above)

import eatta  # noqa: E402
from eatta._compat import TorchvisionOpsWarning, import_torchvision  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
VARIANTS = ("inference", "tent", "eatta", "eatta-approx", "eatta-safe")
TIME_TARGETS = {"eatta": 1.3, "eatta-approx": 1.1, "eatta-safe": 1.1}
MEMORY_TARGET = 1.05
SYNC_TARGET = 1
SYNC_RUNTIME_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",  # the blocking copy; cudaMemcpyAsync is not a sync by itself
)
AUTOCAST_OUTSIDE = "torch.autocast around the call"

Step = Callable[[], object]


class ModelCase(NamedTuple):
    """A model to measure: how to build it, its input size, classes and batch (a tiny one's
    defaults)."""

    name: str
    arch: str
    build: Callable[[], nn.Module]
    image_size: int = 32
    num_classes: int = 10
    batch: int = 8


def _full(arch: str) -> ModelCase:
    """A torchvision model at 224 px, 1000 classes, batch 64."""

    def build() -> nn.Module:
        return getattr(import_torchvision().models, arch)()

    return ModelCase(arch, f"torchvision {arch}", build, 224, 1000, 64)


def _resnet_tiny() -> nn.Module:
    resnet = import_torchvision().models.resnet
    return resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=10)


def _vit_tiny() -> nn.Module:
    return import_torchvision().models.vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=10,
    )  # fmt: skip


CASES: dict[str, tuple[ModelCase, ModelCase]] = {  # family: (full, tiny)
    "resnet50": (
        _full("resnet50"),
        ModelCase("resnet-tiny", "torchvision ResNet(BasicBlock, [1,1,1,1])", _resnet_tiny),
    ),
    "vit_b_16": (
        _full("vit_b_16"),
        ModelCase(
            "vit-tiny", "torchvision VisionTransformer(32 px, patch 8, 2 layers, dim 32)", _vit_tiny
        ),
    ),
}


# -- machine facts ---------------------------------------------------------------------------------
def _run_text(cmd: list[str], timeout: float = 10.0) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine(device: torch.device, commit: str | None = None) -> dict[str, Any]:
    """Versions, CPU, GPU and the checkout: what makes the numbers comparable."""
    try:
        tv_version: str | None = import_torchvision().__version__
    except Exception:  # a fact, not a requirement: recorded as missing
        tv_version = None
    from_git = _run_text(["git", "rev-parse", "HEAD"])
    dirty = from_git and _run_text(["git", "status", "--porcelain", "--untracked-files=no"])
    cudnn = torch.backends.cudnn
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": tv_version,
        "eatta": eatta.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "platform": platform.platform(),
        "cpu": _common.cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # an explicit --commit wins: a copied tree's .git may be older than the files measured
        "git_commit": commit or from_git,
        "git_commit_from": "--commit" if commit else ("git" if from_git else None),
        "git_dirty": bool(dirty) if from_git else None,
        "device": str(device),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        info.update(
            gpu=props.name,
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_memory_bytes=props.total_memory,
            driver=_run_text(smi),
            cudnn_benchmark=cudnn.benchmark,
            cudnn_allow_tf32=cudnn.allow_tf32,
            matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
            float32_matmul_precision=torch.get_float32_matmul_precision(),
        )
    return info


def bf16_support(device: torch.device) -> tuple[bool, str]:
    """Whether bf16 autocast works here, and why not if it does not."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return False, "torch.cuda.is_bf16_supported() is False"
    try:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            a = torch.ones(4, 4, device=device)
            out = a @ a
        if out.dtype != torch.bfloat16:
            return False, f"autocast matmul gave {out.dtype}"
    except (RuntimeError, TypeError) as err:
        return False, f"autocast failed: {err}"
    return True, "ok"


# -- models and variants ---------------------------------------------------------------------------
def initial_model(case: ModelCase, x: Tensor, seed: int = 0) -> tuple[nn.Module, float]:
    """The shared initial model (on the CPU) and the factor its head was scaled by
    (``_common.scale_head``, on a train-mode copy: batch statistics, as the methods use, and the
    model's own BatchNorm statistics do not move)."""
    torch.manual_seed(seed)
    model = case.build().to(x.device)
    probe = copy.deepcopy(model).train()
    scale = _common.scale_head(probe, _head(probe), x, case.num_classes, tries=16)
    _head(model).load_state_dict(_head(probe).state_dict())
    return model.cpu(), scale


def _head(model: nn.Module) -> nn.Linear:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("the model has no nn.Linear head")
    return linears[-1]


class Variant:
    """One step of a variant on a fresh copy of ``initial`` (labels for the active methods'
    oracle); ``via``: how bf16 is applied to it; ``built``: the model or method."""

    def __init__(self, name: str, initial: nn.Module, x: Tensor, y: Tensor, bf16: bool) -> None:
        self.name, self.x, self.y = name, x, y
        model = copy.deepcopy(initial).to(x.device)
        self.built: Any = model.eval()
        self.via = AUTOCAST_OUTSIDE if bf16 else "none"
        if name == "inference":
            return
        kw: dict[str, Any] = {} if name == "tent" else {"oracle": eatta.GroundTruthOracle()}
        if name == "eatta-approx":
            kw["grad_mode"] = "approx"
        method = name.removesuffix("-approx")
        if bf16:
            try:
                self.built = eatta.create(method, model, autocast=True, **kw)
                self.via = "autocast=True"
                return
            except TypeError:  # no autocast option (TENT): autocast around the call
                pass
        self.built = eatta.create(method, model, **kw)

    def __call__(self) -> object:
        dev = self.x.device.type
        outer = (
            torch.autocast(dev, torch.bfloat16) if self.via == AUTOCAST_OUTSIDE else nullcontext()
        )
        with outer, torch.no_grad() if self.name == "inference" else nullcontext():
            if self.name in ("inference", "tent"):
                return self.built(self.x)
            return self.built(self.x, labels=self.y)


# -- memory and syncs ------------------------------------------------------------------------------
def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("eatta", "torch", "benchmarks"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor) - 1 :])
    return Path(path).name


def count_syncs_debug(step: Step, device: torch.device) -> dict[str, Any]:
    """Synchronising operations in one step, as ``set_sync_debug_mode("warn")`` reports them."""
    sync = _common.synchronizer(device)
    sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sync()
    hits = [w for w in caught if "synchroniz" in str(w.message).lower()]
    sites = Counter(f"{_short(w.filename)}:{w.lineno}" for w in hits)
    return {"count": len(hits), "sites": dict(sites.most_common())}


def count_syncs_profiler(step: Step, device: torch.device) -> dict[str, Any]:
    """CUDA runtime calls that block the host in one step, from ``torch.profiler``; the calls
    the profiler makes around an empty function are subtracted."""
    from torch.profiler import ProfilerActivity, profile

    def calls(fn: Callable[[], object]) -> Counter[str]:
        _common.synchronizer(device)()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
        return Counter(e.name for e in prof.events() if e.name.split("_v")[0] in SYNC_RUNTIME_CALLS)

    own = calls(lambda: None)
    got = calls(step) - own  # Counter subtraction keeps positive counts only
    return {"count": sum(got.values()), "calls": dict(got), "profiler_own": dict(own)}


def memory_and_syncs(
    name: str, initial: nn.Module, x: Tensor, y: Tensor, bf16: bool, steps: int
) -> dict[str, Any]:
    """Build one variant alone, step it, and read its peak memory and its host syncs."""
    device = x.device
    gc.collect()

    def build_and_step() -> Variant:
        step = Variant(name, initial, x, y, bf16)
        for _ in range(steps):
            step()
        return step

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step = build_and_step()
        torch.cuda.synchronize(device)
        peak: int | None = torch.cuda.max_memory_allocated(device)
        above: int | None = torch.cuda.max_memory_allocated(device) - base
        memory_how = (
            "torch.cuda.max_memory_allocated after reset_peak_memory_stats; the method built "
            f"and stepped {steps} times with only the batch on the device"
        )
        debug, prof = count_syncs_debug(step, device), count_syncs_profiler(step, device)
        syncs: int | None = max(debug["count"], prof["count"])
        sync_how: dict[str, Any] = {
            "how": "larger of: torch.cuda.set_sync_debug_mode('warn') warnings in one step; "
            f"torch.profiler runtime calls {list(SYNC_RUNTIME_CALLS)} in another step",
            "sync_debug_mode": debug,
            "profiler": prof,
        }
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
            step = build_and_step()
        above = _common.profiler_peak(p)
        batch_bytes = x.numel() * x.element_size() + y.numel() * y.element_size()
        peak = None if above is None else above + batch_bytes
        memory_how = (
            "CPU: peak of the running sum of torch.profiler's allocation events while the "
            f"method is built and stepped {steps} times, plus the batch's bytes"
        )
        syncs, sync_how = None, {"how": None, "reason": "host syncs are counted on CUDA only"}
    row = {
        "peak_bytes": None if peak is None else int(peak),
        "peak_bytes_above_batch": None if above is None else int(above),
        "memory_how": memory_how,
        "host_syncs_per_step": syncs,
        "host_syncs": sync_how,
        "bf16_via": step.via,
    }
    del step
    gc.collect()
    return row


# -- timing ----------------------------------------------------------------------------------------
def _stats_ms(seconds: list[float]) -> dict[str, Any]:
    ms = [1e3 * s for s in seconds]
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return {
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "q1_ms": q[0],
        "q3_ms": q[2],
        "n": len(ms),
        "samples_ms": ms,  # in round order
    }


def _verdict(value: float | None, target: float) -> dict[str, Any]:
    status = None if value is None else ("met" if value <= target else "missed")
    return {"value": value, "target": target, "status": status}


def ratios_and_targets(
    samples: dict[str, list[float]], rows: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each variant against TENT (time: of the medians, and median of per-round ratios;
    memory: of the peaks), and the issue's targets beside them."""
    tent_m = rows["tent"]["peak_bytes"]
    ratios: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for name in VARIANTS:
        if name != "tent":
            r, mem = _common.ratio(samples, name, "tent"), rows[name]["peak_bytes"]
            ratios[name] = {
                "time": r["median"],
                "time_paired": r["paired"],
                "memory": None if mem is None or not tent_m else mem / tent_m,
            }
        if name != "inference":
            targets[name] = {}
            if name in TIME_TARGETS:
                targets[name]["time"] = _verdict(ratios[name]["time"], TIME_TARGETS[name])
                targets[name]["memory"] = _verdict(ratios[name]["memory"], MEMORY_TARGET)
            syncs = rows[name]["host_syncs_per_step"]
            targets[name]["host_syncs_per_step"] = _verdict(syncs, SYNC_TARGET)
    return ratios, targets


def time_job(
    precision: str,
    initial: nn.Module,
    x: Tensor,
    y: Tensor,
    args: argparse.Namespace,
    deadline: float,
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Interleaved timing of all variants of one (model, precision), each on a fresh copy."""
    started = time.perf_counter()
    steps = {n: Variant(n, initial, x, y, precision == "bf16") for n in VARIANTS}
    samples = _common.time_interleaved(
        steps, repeats=args.rounds, warmup=args.warmup, device=x.device, deadline=deadline
    )
    rows = {n: {"bf16_via": steps[n].via, **_stats_ms(samples[n])} for n in VARIANTS}
    safe = steps["eatta-safe"].built
    rows["eatta-safe"]["served_at_end"] = getattr(getattr(safe, "fallback", None), "serving", None)
    del steps, safe
    _release(x.device)
    res = {
        "rounds_done": len(samples["tent"]),
        "rounds_asked": args.rounds,
        "warmup": args.warmup,
        "stopped_by_budget": len(samples["tent"]) < args.rounds,
        "timing_wall_s": time.perf_counter() - started,
        "variants": rows,
    }
    return res, samples


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- gpu-marked tests ------------------------------------------------------------------------------
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)\b")


def pytest_counts(output: str) -> dict[str, int]:
    """The counts in pytest's closing summary line ("1 passed, 3 skipped, 2 errors in 4.1s")."""
    lines = [ln for ln in output.strip().splitlines() if _PYTEST_COUNT.search(ln)]
    if not lines:
        return {}
    return {
        word.rstrip("s") if word == "errors" else word: int(n)
        for n, word in _PYTEST_COUNT.findall(lines[-1])
    }


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """The test files that hold ``gpu``-marked tests (paths relative to ``root``)."""
    return sorted(
        str(p.relative_to(root))
        for p in (root / "tests").rglob("test_*.py")
        if "mark.gpu" in p.read_text(encoding="utf-8", errors="replace")
    )


def run_gpu_tests(timeout: float) -> dict[str, Any]:
    """``pytest -m gpu`` over the files holding such tests, in a subprocess: counts, exit status
    and the output's tail. Only those files are collected, so a package that the rest of the
    suite needs (a browser driver, a web server) cannot stop the GPU tests from running."""
    files = gpu_test_files()
    if not files:
        return {"skipped": "no test file holds a gpu-marked test"}
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    env = {"HF_HUB_OFFLINE": "1", **os.environ, "PYTHONPATH": path}
    # pyproject's addopts already holds -q; a second -q would drop the summary line
    args = ["-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rfEs", *files]
    command = "python " + " ".join(args)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"command": command, "timed_out": True, "timeout_s": timeout}
    out = done.stdout + done.stderr
    counts = pytest_counts(out)
    return {
        "command": command,
        "returncode": done.returncode,
        "summary_found": bool(counts),
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0),
        "skipped": counts.get("skipped", 0),
        "deselected": counts.get("deselected", 0),
        "duration_s": time.perf_counter() - t0,
        "output_tail": out[-2000:],
    }


# -- main ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    tiny_help = "tiny models, 32 px, batch 8, 2 rounds (a dry run of the same path)"
    ap.add_argument("--tiny", action="store_true", help=tiny_help)
    ap.add_argument("--models", nargs="+", choices=tuple(CASES), default=list(CASES))
    ap.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    ap.add_argument("--rounds", type=int, help="timed rounds (default 30; tiny 2)")
    ap.add_argument("--warmup", type=int, help="untimed steps (default 3; tiny 1)")
    ap.add_argument("--memory-steps", type=int, help="steps before the peak is read (default 3)")
    budget_help = "seconds for all measurements; rounds stop when a model's share is spent"
    ap.add_argument("--budget-s", type=float, default=240.0, help=budget_help)
    ap.add_argument("--tests-timeout-s", type=float, default=120.0)
    ap.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", help="the measured tree's commit (recorded instead of git's)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    for name, full, tiny in (("rounds", 30, 2), ("warmup", 3, 1), ("memory_steps", 3, 2)):
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    if args.rounds < 1 or args.warmup < 0 or args.memory_steps < 1 or args.budget_s <= 0:
        ap.error("--rounds and --memory-steps must be >= 1, --warmup >= 0, --budget-s > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TorchvisionOpsWarning)
        if args.tiny:  # batches of 8 on BatchNorm models: the method's advice is known here
            warnings.simplefilter("ignore", eatta.SmallBatchWarning)
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.device == "cuda" and not torch.cuda.is_available():
        msg = "--device cuda: no CUDA device here (use --device cpu for a dry run)"
        print(msg, file=sys.stderr)
        return 2
    device = torch.device(args.device)
    bf16_ok, bf16_why = bf16_support(device)
    out: dict[str, Any] = {
        "machine": machine(device, args.commit),
        "settings": {
            **{k: getattr(args, k) for k in ("tiny", "rounds", "warmup", "memory_steps")},
            **{k: getattr(args, k) for k in ("budget_s", "seed", "precisions")},
            "bf16_supported": bf16_ok,
            "bf16_check": bf16_why,
            "timing_how": "wall time of one step with the device synchronised before and "
            "after (time.perf_counter), median over interleaved rounds",
            "ratio_how": "time: median(variant) / median(tent); time_paired: median of the "
            "per-round ratios; memory: peak_bytes(variant) / peak_bytes(tent)",
        },
        "targets": {
            "time_ratio_to_tent": TIME_TARGETS,
            "memory_ratio_to_tent": MEMORY_TARGET,
            "host_syncs_per_step": SYNC_TARGET,
        },
        "models": {},
    }
    jobs: list[tuple[ModelCase, str, dict[str, Any]]] = []
    for family in args.models:
        case = CASES[family][1 if args.tiny else 0]
        facts = {k: getattr(case, k) for k in ("arch", "image_size", "batch", "num_classes")}
        init = "random (torch.manual_seed(seed)), head scaled"
        entry = out["models"].setdefault(case.name, {**facts, "init": init, "precisions": {}})
        for precision in args.precisions:
            if precision == "fp32" or bf16_ok:
                jobs.append((case, precision, entry))
            else:
                entry["precisions"][precision] = {"skipped": f"bf16 not supported: {bf16_why}"}
    initials: dict[str, tuple[nn.Module, float]] = {}
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    failed = 0

    def timing(case: ModelCase, precision: str, entry: dict[str, Any], deadline: float) -> None:
        x, y = _batch(case, args.seed, device)
        if case.name not in initials:
            initials[case.name] = initial_model(case, x, args.seed)
        initial, entry["head_scale"] = initials[case.name]
        res, samples[case.name, precision] = time_job(precision, initial, x, y, args, deadline)
        entry["precisions"][precision] = res

    def memory(case: ModelCase, precision: str, entry: dict[str, Any], _: float) -> None:
        x, y = _batch(case, args.seed, device)
        t0, res = time.perf_counter(), entry["precisions"][precision]
        initial, bf16 = initials[case.name][0], precision == "bf16"
        for n in VARIANTS:
            row = memory_and_syncs(n, initial, x, y, bf16, args.memory_steps)
            res["variants"][n] = {**row, **res["variants"][n]}
        _release(device)
        res["memory_wall_s"] = time.perf_counter() - t0
        res["ratios_to_tent"], res["targets"] = ratios_and_targets(
            samples[case.name, precision], res["variants"]
        )
        _print(res)

    # timing first, for every job: the profiler of the memory phase stays out of the timings
    deadline = started + args.budget_s
    for phase, fn in (("timing", timing), ("memory", memory)):
        for i, (case, precision, entry) in enumerate(jobs):
            if phase == "memory" and (case.name, precision) not in samples:
                continue
            share = (deadline - time.perf_counter()) / (len(jobs) - i)
            print(f"{case.name} {precision}: {phase}", flush=True)
            try:
                fn(case, precision, entry, time.perf_counter() + max(share, 0.0))
            except Exception as err:  # recorded, and the other jobs still run: one GPU call
                failed += 1
                entry["precisions"][precision] = {
                    "error": f"{phase}: {err!r}",
                    "traceback": traceback.format_exc()[-3000:],
                }
                print(f"  {phase} failed: {err!r}", flush=True)
            _write(args.out, out, started)  # a timeout later still leaves what was measured
    initials.clear()
    out["measure_wall_s"] = time.perf_counter() - started
    out["gpu_tests"] = (
        {"skipped": "--skip-tests"} if args.skip_tests else run_gpu_tests(args.tests_timeout_s)
    )
    out["failed_jobs"] = failed
    out["complete"] = True
    _write(args.out, out, started)
    print(f"-> {args.out} ({out['wall_s']:.0f} s)")
    return 1 if failed else 0


def _batch(case: ModelCase, seed: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The job's batch and labels: the same for every phase (seeded)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(case.batch, 3, case.image_size, case.image_size, generator=g)
    y = torch.randint(0, case.num_classes, (case.batch,), generator=g)
    return x.to(device), y.to(device)


def _print(res: dict[str, Any]) -> None:
    for n in VARIANTS:
        r = res["variants"][n]
        ratio = res["ratios_to_tent"].get(n, {}).get("time", 1.0)
        print(
            f"  {n:13s} {r['median_ms']:9.2f} ms  x{ratio:.3f} TENT  "
            f"peak {r['peak_bytes']}  syncs {r['host_syncs_per_step']}",
            flush=True,
        )


def _write(path: Path, out: dict[str, Any], started: float) -> None:
    out.setdefault("complete", False)
    out["wall_s"] = time.perf_counter() - started
    _common.write_json(path, out)


if __name__ == "__main__":
    raise SystemExit(main())
