"""Opt-in EATTA variants registered by name (``create("eatta-stable", ...)``).

``eatta-stable``: EATTA with :class:`~eatta.debias_bounded.BoundedGradNormDebiaser` (the labelled
weight never below 1, the entropy weight never above 1), otherwise EATTA's registry entry with the
same per-dataset defaults and options, so ``create("eatta-stable", gnd=False)`` etc. work as for
``"eatta"``. The faithful ``"eatta"`` is untouched. Options of its own: ``sup_floor`` and
``unsup_cap`` (both 1.0). The same method from the class API:
``EATTA(model, optimizer, oracle=..., debiaser=BoundedGradNormDebiaser())``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from eatta.budget import Budget
from eatta.debias_bounded import BoundedGradNormDebiaser
from eatta.methods.base import AdaptiveMethod
from eatta.methods.registry import MethodSpec, get_spec, register
from eatta.oracle import Oracle

__all__ = ["STABLE_DEFAULTS"]

#: The variant's own options and their defaults (everything else is EATTA's).
STABLE_DEFAULTS: dict[str, float] = {"sup_floor": 1.0, "unsup_cap": 1.0}


@dataclass
class _DerivedSpec(MethodSpec):
    """A spec whose defaults are those of the ``base`` method, looked up when used."""

    base: str = "eatta"

    def hparams(self, dataset: str, overrides: dict[str, Any]) -> dict[str, Any]:
        merged = get_spec(self.base).hparams(dataset, {})
        merged.update(self.defaults.get("default", {}))
        merged.update(self.defaults.get(dataset, {}))
        merged.update(overrides)
        return merged


def _build_eatta_stable(
    model: nn.Module, hp: dict[str, Any], oracle: Oracle | None, budget: Budget
) -> AdaptiveMethod:
    hp = dict(hp)
    own = {k: hp.pop(k) for k in STABLE_DEFAULTS}
    debiaser = BoundedGradNormDebiaser(
        alpha=hp.get("ema_alpha", 0.8), ema=hp.get("ema", True), **own
    )  # validated before the model is configured
    method = get_spec("eatta").build(model, hp, oracle, budget)
    if hp.get("gnd", True):
        method.debiaser = debiaser  # type: ignore[assignment]
    return method


register(
    _DerivedSpec(
        "eatta-stable",
        _build_eatta_stable,
        active=True,
        defaults={"default": dict(STABLE_DEFAULTS)},
        summary="EATTA with one-sided gradient-norm debiasing (labelled weight >= 1): long streams",
    )
)
