"""The real-time (online) protocol: what a step costs relative to inference, and which batches a
method then adapts on.

Test-time adaptation is a real-time task: the stream does not wait for a step. Alfarra et al.
(ICML 2024, "Evaluation of Test-Time Adaptation Under Computational Time Constraints") evaluate
it so: the stream reveals a batch every time the source model could predict one, and a method
whose step takes ``r`` times as long as that prediction adapts on one batch while the next
``⌈r⌉ − 1`` batches are served by its current model, without adapting. Its *relative cost* ``r``
is the step's time over the source model's forward on the same batch; the source model's is 1 by
definition.

For your own model and batch::

    import copy, eatta, eatta.realtime as rt

    method = eatta.create("tent", copy.deepcopy(model))     # a throwaway: timing steps on it
    r = rt.relative_cost(method, model, x)                  # e.g. 2.9: adapts on every third batch
    rt.skipped_after(r)                                     # 2 batches served without adapting

An active method is timed with the batch's labels (``relative_cost(method, model, x, labels=y)``
and a :class:`~eatta.annotate.oracle.GroundTruthOracle`). ``eatta-bench run --protocol online``
measures with the same functions (``--speeds measure``) or reads a table of ``r``
(``--speeds FILE``), and serves skipped batches with :func:`serve_without_adapting`.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "adapts_on",
    "batch_counts",
    "check_cost",
    "machine_facts",
    "read_costs",
    "relative_cost",
    "relative_costs",
    "serve_without_adapting",
    "skipped_after",
    "synchronizer",
    "tick_annotator",
    "time_interleaved",
    "write_costs",
]


def check_cost(name: str, cost: object) -> float:
    """``cost`` as a float: a finite number >= 0 (a ValueError naming ``name`` otherwise)."""
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        raise ValueError(f"the cost of {name} must be a number, got {cost!r}")
    if not (math.isfinite(cost) and cost >= 0):
        raise ValueError(f"the cost of {name} must be a finite number >= 0, got {cost!r}")
    return float(cost)


def skipped_after(cost: float) -> int:
    """Batches served without adapting after each adapted one: ``⌈r⌉ − 1`` (none for r <= 1)."""
    return max(0, math.ceil(check_cost("a step", cost)) - 1)


def adapts_on(t: int, cost: float) -> bool:
    """Whether batch ``t`` (from 0) of the stream is adapted on: the first is, then every
    ``⌈r⌉``-th (a position alone decides, so a resumed stream keeps its schedule)."""
    return t % (skipped_after(cost) + 1) == 0


def batch_counts(batches: int, cost: float) -> dict[str, int]:
    """``{"adapted": n, "skipped": m}`` of a stream of ``batches`` batches at cost ``r``."""
    adapted = sum(adapts_on(t, cost) for t in range(batches))
    return {"adapted": adapted, "skipped": batches - adapted}


@torch.no_grad()
def serve_without_adapting(method: Any, x: Tensor) -> Tensor:
    """The logits a method's current model gives ``x`` without adapting or asking for labels.

    The model runs in the mode it serves with (BatchNorm on the batch's statistics where the
    method normalizes so, on its robust statistics between a window's steps), and any statistics
    its forward would update are restored afterwards. A method with a fallback serves what the
    fallback serves now (the source model's logits or the blend, recorded as served). CoTTA
    serves its teacher's plain prediction (its augmentation average draws from its generator,
    which a skipped batch leaves alone).
    """
    model: nn.Module = method.serving_model
    saved = [(b, b.clone()) for b in model.buffers()]
    try:
        out: Tensor = method.logits_of(model, x) if model is not method.model else method.logits(x)
    finally:
        for b, value in saved:
            b.copy_(value)
    fallback = getattr(method, "fallback", None)
    if fallback is not None:  # the source model or the blend where that is served now
        out = fallback.serve(method, x, out)
    return out


def tick_annotator(annotator: object) -> None:
    """A skipped batch on an asynchronous annotator's clock (its time runs on without a step):
    answers that fall due are kept for the method's next collect. Other annotators: nothing."""
    hook = getattr(annotator, "on_collect", None)
    if callable(hook):
        hook()


# -- timing -----------------------------------------------------------------------------------
def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _minor_faults() -> int:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError):
        return 0


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int,
    device: torch.device,
    faults: dict[str, list[int]] | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Wall seconds of each call, the variants interleaved round by round, the first rotating
    (a change in machine load hits all variants alike and per-round ratios stay meaningful);
    ``clock=time.thread_time``: this thread's CPU seconds instead (with one torch thread, all
    the work is this thread's, and other processes' load moves it far less than wall time).

    The device is synchronised around each timed call; the garbage collector runs between calls,
    not inside them. ``faults`` receives each call's minor page faults, per variant. Past
    ``deadline`` (``time.perf_counter``) no further round starts (the first always runs).
    """
    sync = synchronizer(device)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
            sync()
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        if r and deadline is not None and time.perf_counter() >= deadline:
            break
        k = r % len(names)
        for name in names[k:] + names[:k]:
            gc.collect()
            gc.disable()
            try:
                sync()
                f0 = _minor_faults()
                t0 = clock()
                fns[name]()
                sync()
                samples[name].append(clock() - t0)
                if faults is not None:
                    faults.setdefault(name, []).append(_minor_faults() - f0)
            finally:
                gc.enable()
    return samples


def relative_costs(
    methods: Mapping[str, Callable[..., Tensor]],
    source: nn.Module,
    x: Tensor,
    *,
    labels: Tensor | None = None,
    repeats: int = 20,
    warmup: int = 3,
    calls: int = 1,
) -> dict[str, float]:
    """Each method's relative cost ``r`` on ``x``: the median of its timed calls over the median
    of ``source``'s prediction on ``x`` (eval mode, no gradients), all interleaved round by round
    (:func:`time_interleaved`).

    Every call adapts: give throwaway methods (built on copies of the model). ``labels`` go to
    the methods whose oracle takes a batch's labels (a
    :class:`~eatta.annotate.oracle.GroundTruthOracle`). ``calls``: requests per timed call, for
    a method that steps once per window of several requests (``source`` predicts as many, so
    ``r`` stays per request)."""
    if repeats < 1 or warmup < 0 or calls < 1:
        raise ValueError(
            f"repeats and calls must be >= 1, warmup >= 0; got {repeats, warmup, calls}"
        )
    source.eval()

    def timed(method: Callable[..., Tensor]) -> Callable[[], None]:
        takes = hasattr(getattr(method, "oracle", None), "set_labels") and labels is not None
        kw = {"labels": labels} if takes else {}

        def step() -> None:
            for _ in range(calls):
                method(x, **kw)

        return step

    @torch.no_grad()
    def forward() -> None:
        for _ in range(calls):
            source(x)

    fns = {"\0source": forward, **{name: timed(m) for name, m in methods.items()}}
    samples = time_interleaved(fns, repeats=repeats, warmup=warmup, device=x.device)
    base = statistics.median(samples["\0source"])
    return {name: statistics.median(samples[name]) / base for name in methods}


def relative_cost(
    method: Callable[..., Tensor],
    source: nn.Module,
    x: Tensor,
    *,
    labels: Tensor | None = None,
    repeats: int = 20,
    warmup: int = 3,
    calls: int = 1,
) -> float:
    """``r`` of one method: :func:`relative_costs` of ``{"method": method}``."""
    costs = relative_costs(
        {"method": method}, source, x, labels=labels, repeats=repeats, warmup=warmup, calls=calls
    )
    return costs["method"]


def read_costs(
    path: str | Path, methods: Sequence[str], what: str = "speeds file"
) -> dict[str, float]:
    """The costs of ``methods`` from a speeds file (JSON with a ``"costs"`` table, method name
    to ``r``, as ``eatta-bench run --speeds measure`` writes it), each checked; ``source``'s is 1
    by definition. A ValueError, naming ``what``, for an unreadable file, a missing method or a
    negative or non-finite cost."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{what} {path}: cannot read it ({err.strerror or err})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} {path}: not JSON ({err})") from None
    costs = doc.get("costs") if isinstance(doc, dict) else None
    if not isinstance(costs, dict):
        raise ValueError(f'{what} {path}: no "costs" table (method name to relative cost r)')
    missing = [m for m in methods if m != "source" and m not in costs]
    if missing:
        raise ValueError(f"{what} {path} has no cost for {', '.join(missing)}")
    return {
        m: 1.0 if m == "source" else check_cost(f"{m} ({what} {path})", costs[m]) for m in methods
    }


def machine_facts(device: str | torch.device = "cpu") -> dict[str, Any]:
    """What a measured cost depends on: the processor (or GPU), cores, torch's threads and CPU
    kernels, torch's version."""
    device = torch.device(device)
    processor = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        processor = names[0] if names else processor
    except OSError:
        pass
    return {
        "processor": processor,
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


def write_costs(
    path: str | Path, costs: Mapping[str, float], batch_size: int, device: str | torch.device
) -> Path:
    """A speeds file that :func:`read_costs` reads: the costs, the batch size they were measured
    on and the machine's facts (:func:`machine_facts`)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"costs": dict(costs), "measured": {"batch_size": batch_size, **machine_facts(device)}}
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return out
