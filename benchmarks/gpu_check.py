#!/usr/bin/env python
"""The GPU path in one prepared call: step cost, peak memory and host syncs against TENT.

Per model (ResNet-50 and ViT-B/16, random init, 224 px, batch 64; ``--tiny``: small ones at
32 px, batch 8, the same path) and precision (fp32, bf16): the :data:`VARIANTS` (with
``--compile``, also :data:`COMPILED`, on ``torch.compile(model)``) on copies of one initial model,
the active ones given random labels. Phases: 1. interleaved timing rounds until ``--rounds`` or
the job's share of ``--budget-s`` is spent; 2. after all timing, per variant: the peak memory
while it is built and stepped ``--memory-steps`` times, and the host syncs of one step (CUDA's
sync debug mode; ``torch.profiler``'s blocking runtime calls); 3. ``pytest -m gpu``, unless
``--skip-tests``. bf16: every method is built with its ``autocast`` option; the inference and
the floors run inside ``torch.autocast``.

The JSON, rewritten after every phase of every job (``"complete": false`` until the end; a failed
job keeps its traceback and makes the exit status 1), holds the machine's facts, the
measurements, the ratios to TENT and the issue's targets, each ``met`` or ``missed``.

    timeout 480 python benchmarks/gpu_check.py --device cuda   # benchmarks/results/gpu_check.json
    timeout 540 python benchmarks/gpu_check.py --device cuda --compile --precisions bf16 \
        --out benchmarks/results/gpu_check_compiled.json           # the compiled rows too
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/dry.json   # CPU dry run
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import os
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("eatta") is None:  # not installed: the checkout's source
    sys.path.insert(0, str(ROOT / "src"))

import _common  # noqa: E402  (after the path fallback above)
import _timing  # noqa: E402
from _timing import ModelCase  # noqa: E402

import eatta  # noqa: E402
from eatta._compat import TorchvisionOpsWarning, import_torchvision  # noqa: E402
from eatta.losses import default_entropy_margin  # noqa: E402
from eatta.methods.registry import get_spec  # noqa: E402
from eatta.split import split_model  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
#: ``floor-two-pass``, ``floor-one-pass``: :func:`floor_step` (its two ways), in plain torch
VARIANTS = tuple("inference tent eatta eatta-stable eatta-approx eatta-safe".split())
VARIANTS += ("floor-two-pass", "floor-one-pass")
#: with ``--compile``: these steps on ``torch.compile(model)``
COMPILED = ("tent-compiled", "eatta-compiled", "eatta-approx-compiled")
#: issue 54's bar
TIME_TARGETS = {"eatta": 1.65, "eatta-stable": 1.65, "eatta-approx": 1.10, "eatta-safe": 1.20}
MEMORY_TARGET = 1.05
SYNC_TARGETS = {"tent": 1, "eatta": 2, "eatta-stable": 2, "eatta-approx": 2, "eatta-safe": 3}
SYNC_RUNTIME_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",  # the blocking copy; cudaMemcpyAsync is not a sync by itself
)
AUTOCAST_OUTSIDE = "torch.autocast around the call"
INIT = "random (torch.manual_seed(seed)), head scaled"
#: How the numbers are taken, recorded with the settings.
HOW = {
    "timing_how": "wall time of one step with the device synchronised before and after "
    "(time.perf_counter), median over interleaved rounds",
    "ratio_how": "time: median(variant) / median(tent); time_paired: median of the per-round "
    "ratios; memory: peak_bytes(variant) / peak_bytes(tent)",
}
#: ``--models``: family -> (the step benchmark's model at 224 px, the ``--tiny`` one)
CASES = {"resnet50": ("resnet50-224", "resnet-tiny"), "vit_b_16": ("vit_b_16-224", "vit-tiny")}

Step = Callable[[], object]


# -- machine facts ---------------------------------------------------------------------------------
def _run_text(cmd: list[str], timeout: float = 10.0) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine(device: torch.device, commit: str | None = None) -> dict[str, Any]:
    """:func:`_common.host`'s facts, the libraries, the checkout and the GPU."""
    try:
        tv_version: str | None = import_torchvision().__version__
    except Exception:  # a fact, not a requirement: recorded as missing
        tv_version = None
    from_git = _run_text(["git", "rev-parse", "HEAD"])
    dirty = from_git and _run_text(["git", "status", "--porcelain", "--untracked-files=no"])
    cudnn = torch.backends.cudnn
    info = _common.host(device) | {
        "torchvision": tv_version,
        "eatta": eatta.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # an explicit --commit wins: a copied tree's .git may be older than the files measured
        "git_commit": commit or from_git,
        "git_commit_from": "--commit" if commit else ("git" if from_git else None),
        "git_dirty": bool(dirty) if from_git else None,
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
    scale = _common.scale_head(probe, _timing.head_of(probe), x, case.num_classes, tries=16)
    _timing.head_of(model).load_state_dict(_timing.head_of(probe).state_dict())
    return model.cpu(), scale


class Variant:
    """One step of a variant on a fresh copy of ``initial`` (``y``: the active methods' labels);
    ``via``: how bf16 is applied to it; ``step.func``: the method."""

    def __init__(
        self,
        name: str,
        initial: nn.Module,
        x: Tensor,
        y: Tensor,
        bf16: bool,
        compile_kw: dict[str, Any] | None = None,
    ) -> None:
        model = copy.deepcopy(initial).to(x.device).eval()
        self.device_type = x.device.type
        self.via = AUTOCAST_OUTSIDE if bf16 else "none"
        if name == "inference":
            self.step: Step = _timing.inference(model, x)
            return
        if name.startswith("floor-"):
            self.step = partial(floor_step, *floor_parts(model), x, y, name == "floor-one-pass")
            return
        if name.endswith("-compiled"):
            model = torch.compile(model, **(compile_kw or {}))  # type: ignore[assignment]
            name = name.removesuffix("-compiled")
        method = name.removesuffix("-approx")
        kw: dict[str, Any] = {"grad_mode": "approx"} if name == "eatta-approx" else {}
        if bf16 and "autocast" in get_spec(method).keys:  # every method has the option
            kw["autocast"], self.via = True, "autocast=True"
        self.step = _timing.method_step(method, model, x, y, **kw)

    def __call__(self) -> object:
        outside = self.via == AUTOCAST_OUTSIDE
        with torch.autocast(self.device_type, torch.bfloat16) if outside else nullcontext():
            return self.step()


def floor_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    """The floor's backbone, head and optimizer: EATTA's parameters (``norm``) and SGD."""
    params = eatta.configure(model, "norm")
    backbone, head = split_model(model)
    return backbone, head, torch.optim.SGD(params, lr=2.5e-4, momentum=0.9, nesterov=True)


def floor_step(
    backbone: nn.Module,
    head: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    one_pass: bool,
) -> Tensor:
    """The floor in plain torch, nothing read on the host: features and logits; the perturbed
    head's forward scores the batch (Eq. 3) and picks the sample to label on the device; the
    labelled cross-entropy and the confident samples' entropy; ``one_pass``: one backward pass
    on their sum, else two passes (each loss's gradient) summed; one SGD step."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    with torch.enable_grad():
        z = backbone(x)
        o = head(z)
        with torch.no_grad():
            p = o.softmax(1)
            moved = head(z + 0.01 * torch.randn_like(z)).softmax(1)
            pl = p.argmax(1, keepdim=True)
            pick = (p.gather(1, pl) - moved.gather(1, pl)).abs().argmax().reshape(1)
        loss_sup = F.cross_entropy(o.index_select(0, pick), y.index_select(0, pick))
        h = -(o.log_softmax(1) * o.softmax(1)).sum(1)
        mask = (h.detach() < default_entropy_margin(o.shape[1])).index_fill(0, pick, False)
        loss_unsup = torch.where(mask, h, torch.zeros_like(h)).sum() / mask.sum().clamp_min(1)
        if one_pass:
            grads = torch.autograd.grad(loss_sup + loss_unsup, params, allow_unused=True)
        else:
            gs = torch.autograd.grad(loss_sup, params, retain_graph=True, allow_unused=True)
            gu = torch.autograd.grad(loss_unsup, params, allow_unused=True)
            grads = tuple(
                None if a is None and b is None else (a if b is None else b if a is None else a + b)
                for a, b in zip(gs, gu, strict=True)
            )
        for param, g in zip(params, grads, strict=True):
            param.grad = g
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return o.detach()


# -- memory and syncs ------------------------------------------------------------------------------
def _short(path: str) -> str:
    """``path`` relative to the first of the package's parent, torch's parent, the tests and the
    checkout that holds it (so the checkout's folder name never shows), else its file name."""
    p = Path(path).resolve()
    roots = (
        Path(eatta.__file__).resolve().parent.parent,
        Path(torch.__file__).resolve().parent.parent,
        ROOT / "tests",
        ROOT,
    )
    for root in roots:
        if p.is_relative_to(root):
            return p.relative_to(root).as_posix()
    return p.name


def count_syncs_debug(step: Step, device: torch.device) -> dict[str, Any]:
    """Synchronising operations in one step, as ``set_sync_debug_mode("warn")`` reports them."""
    sync = _timing.synchronizer(device)
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
        _timing.synchronizer(device)()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
        return Counter(e.name for e in prof.events() if e.name.split("_v")[0] in SYNC_RUNTIME_CALLS)

    own = calls(lambda: None)
    got = calls(step) - own  # Counter subtraction keeps positive counts only
    return {"count": sum(got.values()), "calls": dict(got), "profiler_own": dict(own)}


def memory_and_syncs(
    name: str,
    initial: nn.Module,
    x: Tensor,
    y: Tensor,
    bf16: bool,
    steps: int,
    compile_kw: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build one variant alone, step it, and read its peak memory and its host syncs."""
    device = x.device
    built: list[Variant] = []

    def build_and_step() -> None:
        built.append(Variant(name, initial, x, y, bf16, compile_kw))
        for _ in range(steps):
            built[0]()

    _release(device)
    cuda = device.type == "cuda"
    batch_bytes = x.numel() * x.element_size() + y.numel() * y.element_size()
    base = torch.cuda.memory_allocated(device) if cuda else batch_bytes
    above = _timing.peak_bytes(build_and_step, device)
    step = built.pop()
    if cuda:
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
        memory_how = (
            "CPU: peak of the running sum of torch.profiler's allocation events while the "
            f"method is built and stepped {steps} times, plus the batch's bytes"
        )
        syncs, sync_how = None, {"how": None, "reason": "host syncs are counted on CUDA only"}
    row = {
        "peak_bytes": None if above is None else above + base,
        "peak_bytes_above_batch": above,
        "memory_how": memory_how,
        "host_syncs_per_step": syncs,
        "host_syncs": sync_how,
        "bf16_via": step.via,
    }
    del step
    gc.collect()
    return row


# -- timing ----------------------------------------------------------------------------------------
def _verdict(value: float | None, target: float) -> dict[str, Any]:
    status = None if value is None else ("met" if value <= target else "missed")
    return {"value": value, "target": target, "status": status}


def ratios_and_targets(
    samples: dict[str, list[float]], rows: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each variant against TENT (time: of the medians, and median of per-round ratios;
    memory: of the peaks), and the issue's targets beside them (host syncs: where it sets
    one)."""
    tent_m = rows["tent"]["peak_bytes"]
    ratios: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for name in rows:
        if name != "tent":
            r, mem = _timing.ratio(samples, name, "tent"), rows[name]["peak_bytes"]
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
            if name in SYNC_TARGETS:
                syncs = rows[name]["host_syncs_per_step"]
                targets[name]["host_syncs_per_step"] = _verdict(syncs, SYNC_TARGETS[name])
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
    names, kw = variant_names(args), compile_options(args)
    steps = {n: Variant(n, initial, x, y, precision == "bf16", kw) for n in names}
    for n in names:  # compiled and warmed outside the timing (a first call compiles)
        if n.endswith("-compiled"):
            for _ in range(3):
                steps[n]()
    samples = _timing.time_interleaved(
        steps, repeats=args.rounds, warmup=args.warmup, device=x.device, deadline=deadline
    )
    rows = {n: {"bf16_via": steps[n].via, **_timing.stats_ms(samples[n], raw=True)} for n in names}
    safe = steps["eatta-safe"].step.func
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


def variant_names(args: argparse.Namespace) -> tuple[str, ...]:
    return VARIANTS + (COMPILED if args.compile else ())


def compile_options(args: argparse.Namespace) -> dict[str, Any]:
    """``torch.compile``'s keywords for the compiled variants (mode None: its default)."""
    return {"backend": args.compile_backend, "mode": args.compile_mode}


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
    ap.add_argument("--compile", action="store_true", help="add the torch.compile(model) rows")
    ap.add_argument("--compile-backend", default="inductor", help="their backend")
    ap.add_argument("--compile-mode", help="their mode (e.g. max-autotune-no-cudagraphs)")
    args = ap.parse_args(argv)
    _timing.fill_defaults(args, args.tiny, rounds=(30, 2), warmup=(3, 1), memory_steps=(3, 2))
    if args.rounds < 1 or args.warmup < 0 or args.memory_steps < 1 or args.budget_s <= 0:
        ap.error("--rounds and --memory-steps must be >= 1, --warmup >= 0, --budget-s > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        msg = "--device cuda: no CUDA device here (use --device cpu for a dry run)"
        print(msg, file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TorchvisionOpsWarning)
        if args.tiny:  # batches of 8 on BatchNorm models: the method's advice is known here
            warnings.simplefilter("ignore", eatta.SmallBatchWarning)
        return measure(args, torch.device(args.device))


def measure(args: argparse.Namespace, device: torch.device) -> int:
    """Every phase of every job, the JSON rewritten after each; 1 if a job failed."""
    started = time.perf_counter()
    bf16_ok, bf16_why = bf16_support(device)
    settings = ("tiny", "rounds", "warmup", "memory_steps", "budget_s", "seed", "precisions")
    settings += ("compile", "compile_backend", "compile_mode")
    out: dict[str, Any] = {
        "machine": machine(device, args.commit),
        "settings": {k: getattr(args, k) for k in settings},
        "targets": {
            "time_ratio_to_tent": TIME_TARGETS,
            "memory_ratio_to_tent": MEMORY_TARGET,
            "host_syncs_per_step": SYNC_TARGETS,
        },
        "models": {},
    }
    out["settings"].update(bf16_supported=bf16_ok, bf16_check=bf16_why, **HOW)
    jobs: list[tuple[ModelCase, str, dict[str, Any]]] = []
    for family in args.models:
        full, small = CASES[family]  # the full model named by the family
        case = _timing.MODELS[small] if args.tiny else replace(_timing.MODELS[full], name=family)
        facts = {"arch": case.arch, "image_size": case.resolution, "batch": case.batch}
        facts |= {"num_classes": case.num_classes, "init": INIT, "precisions": {}}
        entry = out["models"].setdefault(case.name, facts)
        for precision in args.precisions:
            if precision == "fp32" or bf16_ok:
                jobs.append((case, precision, entry))
            else:
                entry["precisions"][precision] = {"skipped": f"bf16 not supported: {bf16_why}"}
    initials: dict[str, tuple[nn.Module, float]] = {}
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}

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
        for n in variant_names(args):
            row = memory_and_syncs(n, initial, x, y, bf16, args.memory_steps, compile_options(args))
            res["variants"][n] = {**row, **res["variants"][n]}
        _release(device)
        res["memory_wall_s"] = time.perf_counter() - t0
        res["ratios_to_tent"], res["targets"] = ratios_and_targets(
            samples[case.name, precision], res["variants"]
        )
        _print(res)

    # timing first, for every job: the profiler of the memory phase stays out of the timings
    deadline, failed = started + args.budget_s, 0
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
    x, y = _timing.random_batch(case, case.batch, seed)
    return x.to(device), y.to(device)


def _print(res: dict[str, Any]) -> None:
    for n in res["variants"]:
        r = res["variants"][n]
        ratio = res["ratios_to_tent"].get(n, {}).get("time", 1.0)
        print(
            f"  {n:21s} {r['median_ms']:9.2f} ms  x{ratio:.3f} TENT  "
            f"peak {r['peak_bytes']}  syncs {r['host_syncs_per_step']}",
            flush=True,
        )


def _write(path: Path, out: dict[str, Any], started: float) -> None:
    out.setdefault("complete", False)
    out["wall_s"] = time.perf_counter() - started
    _common.write_json(path, out)


if __name__ == "__main__":
    raise SystemExit(main())
