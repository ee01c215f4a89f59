"""A cell's method as the harness builds it: through ``eatta.create``, with its annotator, its
budget and its parts (a window, a weight anchor, a monitor, a fallback).

Everything the harness must know of a method is data on its
:class:`~eatta.methods.registry.MethodSpec` (whether it adapts, asks, needs clean source data,
builds its own fallback), never a branch on its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from eatta.annotate.oracle import Oracle
from eatta.bench.benchmark import BenchmarkData, OnDevice
from eatta.bench.fingerprint import to_plain
from eatta.bench.grid import CellSpec, is_static
from eatta.bench.monitoring import check_fallback_budget
from eatta.bench.options import RunOptions
from eatta.budget import Budget
from eatta.methods import registry
from eatta.methods.base import AdaptiveMethod

__all__ = ["BuiltMethod", "build_method"]


@dataclass
class BuiltMethod:
    """A cell's method, the annotator it asks (None: label-free), its hyperparameters as shown
    in results, and the auditors of its monitor and fallback (None where it has none)."""

    method: AdaptiveMethod
    oracle: Oracle | None
    hparams: dict[str, Any]
    monitor: Any = None
    auditor: Any = None
    fallback_auditor: Any = None


def build_method(
    spec: CellSpec, data: BenchmarkData, options: RunOptions, device: torch.device
) -> BuiltMethod:
    """``spec``'s method around a fresh copy of ``data``'s model on ``device``."""
    method_spec = registry.get_spec(spec.method)
    static = is_static(spec.method)
    model = data.model_fn().to(device)
    hp = options.overrides(spec.method)
    if "seed" in method_spec.keys:  # only methods that draw random numbers declare a seed
        hp.setdefault("seed", options.seed)
    if spec.buffer is not None:
        hp["buffer"] = spec.buffer
    if "fisher_data" in method_spec.needs and "fishers" not in hp and "fisher_data" not in hp:
        if data.fisher_data is None:
            raise ValueError(
                f"{spec.method} needs clean source data for its Fisher regularizer and "
                f"{data.name!r} provides none (CLI: --fisher-root for ImageNet)"
            )
        hp["fisher_data"] = OnDevice(data.fisher_data(device), device)
    window = None if static else options.method_window()
    oracle: Oracle | None = None
    keywords: dict[str, Any] = {}  # a label-free method takes neither an oracle nor a budget
    if method_spec.active:
        if data.oracle_fn is not None and options.annotator.simulated:
            raise ValueError(
                "label delay, noise and yes/no feedback are simulated from the ground truth; "
                f"{data.name!r} is annotated by a model (leave out the model annotator)"
            )
        if data.oracle_fn is not None:
            oracle = data.oracle_fn(device)
        else:
            oracle = options.annotator.build(options.seed)  # type: ignore[assignment]
        per_batch = spec.labels  # less the audits --fallback takes out of the budget
        if options.monitor.fallback:
            per_batch -= check_fallback_budget(method_spec, spec.labels, spec.every)
        budget = _budget(per_batch, spec.every, options.batch_size, window)
        keywords = {"oracle": oracle, "budget": budget}
    if window is not None:
        keywords["window"] = window
    if options.weight_anchor is not None and not static:
        keywords["weight_anchor"] = options.weight_anchor
    parts = options.monitor
    monitor = auditor = fallback_auditor = None
    if parts.active and not static:
        if parts.audit > 0.0:
            monitor, auditor = parts.monitor_part(options.annotator, options.seed)
            keywords["monitor"] = monitor
        if parts.fallback and not method_spec.builds_fallback:
            keywords["fallback"], fallback_auditor = parts.fallback_part(
                options.annotator, options.seed
            )
    method = registry.create(spec.method, model, dataset=data.defaults_key, **keywords, **hp)
    shown = method_spec.hparams(data.defaults_key, hp)
    hparams = to_plain({k: v for k, v in shown.items() if k not in method_spec.needs})
    return BuiltMethod(method, oracle, hparams, monitor, auditor, fallback_auditor)


def _budget(labels: int, every: int, batch_size: int, window: int | bool | None) -> Budget:
    """``labels`` per ``every`` batches; with a window larger than the batch, the same rate per
    sample counted in window steps: ``labels · window / (every · batch_size)``, reduced."""
    if window is None or window is False or batch_size >= window:
        return Budget(labels, every=every)
    rate = Fraction(labels * int(window), every * batch_size)  # 0: Budget(0, every=1)
    return Budget(rate.numerator, every=rate.denominator)
