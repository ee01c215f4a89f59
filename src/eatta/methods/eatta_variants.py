"""Opt-in EATTA variants registered by name (``create("eatta-stable", ...)``, ``"eatta-safe"``).

``eatta-stable``: EATTA with :class:`~eatta.debias.bounded.BoundedGradNormDebiaser` (the labelled
weight never below 1, the entropy weight never above 1). It takes every key of ``"eatta"`` with the
same per-dataset defaults, plus ``sup_floor`` and ``unsup_cap`` (both 1.0). The faithful
``"eatta"`` is untouched. The same method from the class API:
``EATTA(model, optimizer, oracle=..., debiaser=BoundedGradNormDebiaser())``.

``eatta-safe``: ``eatta-stable`` that is never knowingly worse than the model it was given. A
frozen copy of the model as given (taken before it is configured: its running statistics too)
predicts beside the adapted one; each label request is drawn with a known probability, mostly
among the samples the two disagree on (:class:`~eatta.selection.drawn.DisagreementDraw`, no class
balance), so the same answers that teach also estimate without bias which model is better, and
:class:`~eatta.monitor.fallback.SourceFallback` serves the source model's predictions (and
resets the adapted model) when they say adapting is worse. It uses no label beyond the budget.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

from torch import nn

from eatta.annotate.oracle import Oracle
from eatta.balance import ClassBalance
from eatta.budget import Budget
from eatta.debias.bounded import BoundedGradNormDebiaser
from eatta.methods.base import AdaptiveMethod
from eatta.methods.config import hparam
from eatta.methods.eatta import BalanceName, EATTAConfig, _build_eatta, config_selector
from eatta.methods.late_labels import LateLabels
from eatta.methods.nearest_replay import NearestReplay
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, register
from eatta.methods.step_options import GradMode
from eatta.monitor.fallback import START, SourceFallback
from eatta.selection.base import ScoreSelector, Selector
from eatta.selection.drawn import DisagreementDraw

__all__ = ["EATTASafeConfig", "EATTAStableConfig"]


@dataclass(frozen=True)
class EATTAStableConfig(EATTAConfig):
    """EATTA's keys plus the bounds of the applied gradient-norm weights."""

    sup_floor: float = hparam(1.0, "lower bound of the labelled loss's weight", min=0.0, max=2.0)
    unsup_cap: float = hparam(1.0, "upper bound of the entropy loss's weight", min=0.0, max=2.0)
    late_weight: Literal["full", "age", "drift", "similarity"] = hparam(
        "similarity",
        "how a late label counts: full, by age, by how far the stream moved, by how close its "
        "sample is to the current batch",
    )
    late_half_life: float = hparam(
        2.0, "steps after which an age-weighted label counts half", min=0.0
    )
    late_drift_scale: float = hparam(
        0.25, "drift weighting's scale (batch-to-batch moves; tuned on CCC)", min=0.0
    )
    late_anchor: float = hparam(
        0.1, "label weight below which a step without a fresh label falls back", min=0.0
    )
    late_replay: int = hparam(
        0,
        "labelled samples nearest the batch replayed per step without a fresh label (0: off)",
        min=0,
    )
    late_entropy_filter: Literal["none", "eta"] = hparam(
        "eta", "entropy term of a step without a usable label: as always, or ETA's filter"
    )


def _build_eatta_stable(
    model: nn.Module,
    cfg: EATTAStableConfig,
    oracle: Oracle | None,
    budget: Budget,
    selector: Selector | None = None,
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
        entropy_filter=cfg.late_entropy_filter,
        anchor=cfg.late_anchor,
        label_expiry=cfg.label_expiry,
        replay=NearestReplay(64, cfg.late_replay) if cfg.late_replay else None,
    )
    return _build_eatta(
        model,
        cfg,
        oracle,
        budget,
        debiaser=debiaser,
        late_labels=late,
        selector=selector,
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


@dataclass(frozen=True)
class EATTASafeConfig(EATTAStableConfig):
    """``eatta-stable``'s keys, no class balance (requests are drawn), and the fallback's."""

    balance: BalanceName | ClassBalance | None = hparam(
        "none", "class balance (requests are drawn: only 'none')"
    )
    explore: float = hparam(
        0.25,
        "share of each request drawn by the selector's score (the rest: disagreements)",
        min=0.0,
        max=1.0,
    )
    fallback: bool = hparam(
        True, "act on evidence (False: measure only, always serve the adapted model)"
    )
    fallback_recent: int = hparam(16, "answers the fallback's bets are sized from", min=1)
    fallback_level: float = hparam(
        0.05, "error level of each of the fallback's decisions", min=0.0, max=1.0
    )
    fallback_start: Literal["blend", "source", "adapted", "auto"] = hparam(
        "blend",
        "served before the first decision: blend (the given model until the answers lean to the "
        "adapted one, then the two models' mean probabilities), source (the given model), "
        "adapted, auto (label-free signs: misled on the safety study's mnist-far)",
    )
    fallback_reset: bool = hparam(False, "reset the adapted model when it is found worse")
    grad_mode: GradMode = hparam(
        "approx",
        "how the two gradients are computed ('approx', the default here: one backward pass, "
        "within the seed spread of the exact step on the safety study's streams)",
    )


def _build_eatta_safe(
    model: nn.Module, cfg: EATTASafeConfig, oracle: Oracle | None, budget: Budget
) -> AdaptiveMethod:
    if cfg.balance not in (None, "none"):
        raise ValueError(
            f"eatta-safe draws its requests with known probabilities and takes no class "
            f"balance; got balance={cfg.balance!r} (use 'none')"
        )
    base = config_selector(cfg)
    if not isinstance(base, ScoreSelector):
        raise TypeError(f"eatta-safe draws by a per-sample score; {base!r} has none")
    draw = DisagreementDraw(base, explore=cfg.explore, seed=cfg.seed)
    assert cfg.fallback_start in START
    fallback = SourceFallback(
        copy.deepcopy(model),  # the model as given, before configure() drops its statistics
        recent=cfg.fallback_recent,
        level=cfg.fallback_level,
        start=cfg.fallback_start,
        reset=cfg.fallback_reset,
        draw=draw,
        act=cfg.fallback,
    )
    method = _build_eatta_stable(model, cfg, fallback.listen(oracle), budget, selector=draw)
    method.attach(fallback=fallback)
    return method


register(
    MethodSpec(
        "eatta-safe",
        _build_eatta_safe,
        active=True,
        config=EATTASafeConfig,
        datasets=DATASET_PRESETS["eatta-safe"],
        summary="eatta-stable serving the source model when its own answers say adapting is worse",
    )
)
