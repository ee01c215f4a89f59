"""Opt-in EATTA variants registered by name (``create("eatta-stable", ...)``).

``eatta-stable``: EATTA with :class:`~eatta.debias.bounded.BoundedGradNormDebiaser` (the labelled
weight never below 1, the entropy weight never above 1). It takes every key of ``"eatta"`` with the
same per-dataset defaults, plus ``sup_floor`` and ``unsup_cap`` (both 1.0). The faithful
``"eatta"`` is untouched. The same method from the class API:
``EATTA(model, optimizer, oracle=..., debiaser=BoundedGradNormDebiaser())``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.debias.bounded import BoundedGradNormDebiaser
from eatta.methods.base import AdaptiveMethod
from eatta.methods.config import hparam
from eatta.methods.eatta import EATTAConfig, build_eatta
from eatta.methods.late_labels import LateLabels
from eatta.methods.nearest_replay import NearestReplay
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, register

__all__ = ["EATTAStableConfig"]


@dataclass(frozen=True)
class EATTAStableConfig(EATTAConfig):
    """EATTA's keys plus the bounds of the applied gradient-norm weights."""

    sup_floor: float = hparam(1.0, "lower bound of the labelled loss's weight", min=0.0, max=2.0)
    unsup_cap: float = hparam(1.0, "upper bound of the entropy loss's weight", min=0.0, max=2.0)
    late_weight: Literal["full", "age", "drift"] = hparam(
        "drift", "how a late label counts: full, by age, by how far the stream moved"
    )
    late_half_life: float = hparam(
        2.0, "steps after which an age-weighted label counts half", min=0.0
    )
    late_drift_scale: float = hparam(
        0.25, "drift weighting's scale (batch-to-batch moves)", min=0.0
    )
    late_anchor: float = hparam(
        0.1, "label weight below which a step without a fresh label falls back", min=0.0
    )
    late_replay: int = hparam(
        0,
        "labelled samples nearest the batch replayed per step without a fresh label (0: off)",
        min=0,
    )
    late_fallback: Literal["none", "eta"] = hparam(
        "eta", "entropy term of a step without a usable label: as always, or ETA's filter"
    )


def _build_eatta_stable(
    model: nn.Module, cfg: EATTAStableConfig, oracle: Oracle | None, budget: Budget
) -> AdaptiveMethod:
    debiaser = None
    if cfg.gnd:  # built (and so checked) before the model is configured
        debiaser = BoundedGradNormDebiaser(
            alpha=cfg.ema_alpha, ema=cfg.ema, sup_floor=cfg.sup_floor, unsup_cap=cfg.unsup_cap
        )
    late = LateLabels(
        cfg.late_weight,
        half_life=cfg.late_half_life,
        drift_scale=cfg.late_drift_scale,
        fallback=cfg.late_fallback,
        anchor=cfg.late_anchor,
        max_age=cfg.label_expiry,
    )
    replay = NearestReplay(64, cfg.late_replay) if cfg.late_replay else None
    return build_eatta(
        model, cfg, oracle, budget, debiaser=debiaser, late_labels=late, nearest_replay=replay
    )


register(
    MethodSpec(
        "eatta-stable",
        _build_eatta_stable,
        active=True,
        config=EATTAStableConfig,
        datasets=DATASET_PRESETS["eatta-stable"],
        summary="EATTA with one-sided gradient-norm debiasing (labelled weight >= 1): long streams",
    )
)
