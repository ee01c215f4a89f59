"""Shared helpers of the timing benchmarks: the models, interleaved timing (the library's,
:mod:`eatta.realtime`), statistics, peak memory, the options and the results file.

Not part of the package; the scripts run from this folder import it (it is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import _common
import _summary
import torch
from torch import Tensor, nn

import eatta
from eatta._compat import TorchvisionOpsWarning, import_torchvision
from eatta.methods.registry import get_spec
from eatta.models.digits_cnn import digits_cnn
from eatta.realtime import synchronizer, time_interleaved  # noqa: F401  # the scripts' timing


# -- models ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelCase:
    """A model to time: its builder (random init), input size, classes, what it is, batch."""

    name: str
    build: Callable[[], nn.Module]
    resolution: int
    num_classes: int
    arch: str
    batch: int = 64


def _torchvision(arch: str) -> Callable[[], nn.Module]:
    return lambda: getattr(import_torchvision().models, arch)(num_classes=1000)


def _resnet_tiny() -> nn.Module:
    resnet = import_torchvision().models.resnet
    return resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=10)


def _vit_tiny() -> nn.Module:
    return import_torchvision().models.vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=10,
    )  # fmt: skip


_RESNET_TINY = "torchvision ResNet(BasicBlock, [1,1,1,1])"
_VIT_TINY = "torchvision VisionTransformer(32 px, patch 8, 2 layers, dim 32)"
#: By name: the step benchmark's four, then ``gpu_check.py --tiny``'s two.
MODELS: dict[str, ModelCase] = {
    case.name: case
    for case in (
        ModelCase("resnet18-64", _torchvision("resnet18"), 64, 1000, "torchvision resnet18"),
        ModelCase("digits-32", digits_cnn, 32, 10, "the digits-C CNN"),
        ModelCase("resnet50-224", _torchvision("resnet50"), 224, 1000, "torchvision resnet50"),
        ModelCase("vit_b_16-224", _torchvision("vit_b_16"), 224, 1000, "torchvision vit_b_16"),
        ModelCase("resnet-tiny", _resnet_tiny, 32, 10, _RESNET_TINY, batch=8),
        ModelCase("vit-tiny", _vit_tiny, 32, 10, _VIT_TINY, batch=8),
    )
}


def head_of(model: nn.Module) -> nn.Linear:
    """The model's last ``nn.Linear``: the classifier of every model here."""
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1]


def random_batch(case: ModelCase, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """``size`` normal images at the case's resolution and uniform labels, drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 3, case.resolution, case.resolution, generator=g)
    return x, torch.randint(0, case.num_classes, (size,), generator=g)


# -- variants --------------------------------------------------------------------------------------
def inference(model: nn.Module, x: Tensor) -> Callable[[], Tensor]:
    """Plain inference on ``x``, without gradients."""

    def step() -> Tensor:
        with torch.no_grad():
            return model(x)

    return step


def method_step(name: str, model: nn.Module, x: Tensor, y: Tensor, **kw: Any) -> partial[Any]:
    """One step on ``x`` of :func:`eatta.create`'s method ``name`` (``.func``); a method that
    takes labels gets a ground-truth oracle and ``y``."""
    if not get_spec(name).active:
        return partial(eatta.create(name, model, **kw), x)
    return partial(eatta.create(name, model, oracle=eatta.GroundTruthOracle(), **kw), x, labels=y)


# -- timing and memory -----------------------------------------------------------------------------
def stats_ms(samples: list[float], *, raw: bool = False) -> dict[str, Any]:
    """Median, min, quartiles (ms) of a list of seconds, and the samples: sorted, rounded to µs,
    or (``raw``) as measured, in round order (the quartiles then inclusive)."""
    ms = [1e3 * s for s in samples]
    method = "inclusive" if raw else "exclusive"
    q = statistics.quantiles(ms, n=4, method=method) if len(ms) > 1 else [ms[0]] * 3
    return {
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "q1_ms": q[0],
        "q3_ms": q[2],
        "n": len(ms),
        "samples_ms": ms if raw else [round(v, 3) for v in sorted(ms)],
    }


def ratio(samples: dict[str, list[float]], num: str, den: str) -> dict[str, float]:
    """``num / den`` three ways: of the medians, median of per-round ratios, of the minima."""
    a, b = samples[num], samples[den]
    paired = [x / y for x, y in zip(a, b, strict=True)]
    return {
        "median": statistics.median(a) / statistics.median(b),
        "paired": statistics.median(paired),
        "min": min(a) / min(b),
    }


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """Peak bytes allocated by one call of ``fn`` above what was allocated before it: CUDA's
    ``max_memory_allocated``, or on the CPU :func:`profiler_peak` of the call under
    ``torch.profiler`` (oneDNN's scratch and the allocator's caching not counted; None: no
    profiler event list)."""
    sync = synchronizer(device)
    gc.collect()
    if device.type == "cuda":
        sync()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        sync()
        return int(torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return profiler_peak(prof)


def profiler_peak(prof: Any) -> int | None:
    """Peak of the running sum, in time order, of a ``profile_memory`` profile's allocation and
    free events: the most the profiled code held above its start (None: no event list)."""
    try:
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    except AttributeError:
        return None
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return int(peak)


# -- options and results ---------------------------------------------------------------------------
def timing_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options the timing benchmarks share: --device, --quick, --out, --threads."""
    p = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--quick", action="store_true", help="smoke run, into results/quick")
    p.add_argument("--out", type=Path, help="results folder (default benchmarks/results)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: cores)")
    return p


def fill_defaults(args: argparse.Namespace, quick: bool, **defaults: tuple[int, int]) -> None:
    """Each option of ``defaults`` not given (None): its ``(full, quick)`` default."""
    for name, (full, short) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)


def timing_device(args: argparse.Namespace) -> torch.device | None:
    """``--device`` with torch's threads set (None, said on stderr: no CUDA device here); fills
    in ``--out``'s default."""
    warnings.simplefilter("ignore", TorchvisionOpsWarning)
    args.out = args.out or (_common.RESULTS / "quick" if args.quick else _common.RESULTS)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device available", file=sys.stderr)
        return None
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    return device


def write_results(path: Path, data: dict[str, Any], started: float, **meta: Any) -> None:
    """A timing benchmark's JSON (its ``meta`` finished, then ``meta`` added) and the folder's
    ``summary.md``."""
    _common.finish_meta(data["meta"], started)
    data["meta"].update(meta)
    _common.write_json(path, data)
    print(f"wrote {path} and {_summary.render(path.parent)}")
