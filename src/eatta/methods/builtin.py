"""Registers the built-in methods with their per-dataset defaults (method.md §5)."""

from __future__ import annotations

from typing import Any

from torch import nn

import eatta.methods.baseline  # registers on import
import eatta.methods.cema  # registers on import
import eatta.methods.cotta  # registers on import
import eatta.methods.eatta_variants  # registers on import
import eatta.methods.eta  # registers on import
import eatta.methods.sar  # registers on import
import eatta.methods.simatta  # registers on import
import eatta.methods.tent  # noqa: F401  (registers on import)
from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.configure import collect_params, configure
from eatta.debias import GradNormDebiaser
from eatta.methods.base import AdaptiveMethod
from eatta.methods.eatta import EATTA
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.source import Source
from eatta.oracle import Oracle
from eatta.selection import make_selector

# Learning rates per dataset shared by TENT-like methods (paper supplementary).
SGD_LR = {
    "default": {"optimizer": "sgd", "lr": 2.5e-4, "momentum": 0.9},
    "imagenet-c": {"lr": 2.5e-4},
    "imagenet-r": {"lr": 1e-3},
    "imagenet-k": {"lr": 1e-3},
    "imagenet-a": {"lr": 5e-3},
    "pacs": {"optimizer": "adam", "lr": 5e-3},
    "digits-c": {"optimizer": "sgd", "lr": 5e-3, "momentum": 0.9},
}


def _with(base: dict[str, dict[str, Any]], **extra: Any) -> dict[str, dict[str, Any]]:
    out = {k: dict(v) for k, v in base.items()}
    out["default"].update(extra)
    return out


def _build_source(
    model: nn.Module, hp: dict[str, Any], oracle: Oracle | None, budget: Budget
) -> AdaptiveMethod:
    return Source(model)


def _build_eatta(
    model: nn.Module, hp: dict[str, Any], oracle: Oracle | None, budget: Budget
) -> AdaptiveMethod:
    if hp.get("preset") == "reference":  # the authors' ImageNet-C configuration (method.md §4)
        hp = {"params": "reference", "steps": 2, **hp}
    elif hp.get("preset") is not None:
        raise ValueError(f"unknown EATTA preset {hp['preset']!r}; the only preset is 'reference'")
    params = configure(model, hp.get("params", "norm"))
    norm_params = None
    if hp.get("params") == "reference":
        norm_params, _ = collect_params(model, "norm")
    assert oracle is not None
    selector = hp.get("selector") or "perturbation"  # a Selector, or a name (Table 7)
    if isinstance(selector, str):
        kw = dict(hp.get("selector_kwargs") or {})
        if selector == "perturbation":
            kw.setdefault("std", hp.get("noise_std", 0.01))
        selector = make_selector(selector, seed=hp.get("seed", 0), **kw)
    return EATTA(
        model,
        make_optimizer(params, hp),
        oracle=oracle,
        budget=budget,
        selector=selector,
        history=hp.get("history", "reference"),
        debiaser=GradNormDebiaser(
            alpha=hp.get("ema_alpha", 0.8), normalize=hp.get("gnd", True), ema=hp.get("ema", True)
        ),
        buffer=LabelBuffer(hp["buffer"], seed=hp.get("seed", 0)) if hp.get("buffer") else None,
        entropy_margin=hp.get("entropy_margin"),
        steps=hp.get("steps", 1),
        grad_norm_params=norm_params,
        split=hp.get("split"),
        grad_mode=hp.get("grad_mode", "auto"),
        autocast=hp.get("autocast", False),
        channels_last=hp.get("channels_last", False),
    )


register(MethodSpec("source", _build_source, summary="no adaptation"))
register(
    MethodSpec(
        "eatta",
        _build_eatta,
        active=True,
        defaults=_with(SGD_LR, nesterov=True),
        summary="EATTA: perturbation selection, class balancing, gradient-norm debiasing",
    )
)
