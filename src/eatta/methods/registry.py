"""Methods by name, with per-dataset default hyperparameters (method.md §5).

``create("eatta", model, dataset="imagenet-c", oracle=..., budget=1)`` configures the model, builds
the optimizer from the defaults (overridable by keyword) and returns the method. The benchmark
CLI lists and builds methods only through this registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from eatta.budget import Budget
from eatta.methods.base import AdaptiveMethod
from eatta.oracle import Oracle

__all__ = ["MethodSpec", "available", "create", "get_spec", "make_optimizer", "register"]

#: Dataset keys used for defaults; anything else falls back to ``"default"``.
DATASETS = ("imagenet-c", "imagenet-r", "imagenet-k", "imagenet-a", "pacs", "digits-c")


@dataclass
class MethodSpec:
    """How to build one method.

    ``build(model, hparams, oracle, budget)`` returns the method; ``hparams`` is the merged dict of
    defaults for the dataset and the caller's overrides. ``active`` methods need an oracle.
    """

    name: str
    build: Callable[[nn.Module, dict[str, Any], Oracle | None, Budget], AdaptiveMethod]
    active: bool = False
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary: str = ""

    def hparams(self, dataset: str, overrides: dict[str, Any]) -> dict[str, Any]:
        merged = dict(self.defaults.get("default", {}))
        merged.update(self.defaults.get(dataset, {}))
        merged.update(overrides)
        return merged


_REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method (its name, lower-case, must be new)."""
    key = spec.name.lower()
    if key in _REGISTRY:
        raise ValueError(f"method {spec.name!r} is already registered")
    _REGISTRY[key] = spec
    return spec


def _load_builtins() -> None:
    import eatta.methods.builtin  # noqa: F401  (registers on import)


def get_spec(name: str) -> MethodSpec:
    _load_builtins()
    try:
        return _REGISTRY[name.lower()]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; available: {', '.join(available())}") from None


def available() -> list[str]:
    """Registered method names."""
    _load_builtins()
    return sorted(_REGISTRY)


def create(
    name: str,
    model: nn.Module,
    *,
    dataset: str = "default",
    oracle: Oracle | None = None,
    budget: int | Budget = 1,
    **overrides: Any,
) -> AdaptiveMethod:
    """Build method ``name`` around ``model`` with the dataset's defaults and the overrides."""
    spec = get_spec(name)
    if spec.active and oracle is None:
        raise ValueError(f"method {spec.name!r} is active: pass oracle=")
    return spec.build(model, spec.hparams(dataset, overrides), oracle, Budget.coerce(budget))


def make_optimizer(params: Iterable[nn.Parameter], hp: dict[str, Any]) -> torch.optim.Optimizer:
    """SGD or Adam from hyperparameters ``optimizer``, ``lr``, ``momentum``, ``nesterov``,
    ``weight_decay`` (``betas`` for Adam)."""
    kind = str(hp.get("optimizer", "sgd")).lower()
    params = list(params)
    if kind == "sgd":
        return torch.optim.SGD(
            params,
            lr=hp["lr"],
            momentum=hp.get("momentum", 0.9),
            nesterov=hp.get("nesterov", False),
            weight_decay=hp.get("weight_decay", 0.0),
        )
    if kind == "adam":
        return torch.optim.Adam(
            params,
            lr=hp["lr"],
            betas=tuple(hp.get("betas", (0.9, 0.999))),
            weight_decay=hp.get("weight_decay", 0.0),
        )
    raise ValueError(f"unknown optimizer {kind!r}; use 'sgd' or 'adam'")


def entropy_margin(num_classes: int, factor: float = 0.4) -> float:
    """``factor · ln C``."""
    return factor * math.log(num_classes)
