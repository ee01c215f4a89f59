"""The registered EATTA family: ``eatta``, ``eatta-stable``, ``eatta-safe``, their keys and
builders.

``eatta``: the paper's method, faithful (:class:`~eatta.methods.eatta.EATTA`).

``eatta-stable``: EATTA with :class:`~eatta.debias.bounded.BoundedGradNormDebiaser` (the labelled
weight never below 1, the entropy weight never above 1), and late labels weighed by their sample's
similarity to the batch. It takes every key of ``"eatta"`` with the same per-dataset defaults, plus
its own. The same method from the class API: ``EATTA(model, optimizer, oracle=...,
debiaser=BoundedGradNormDebiaser(), late_labels=LateLabels())``.

``eatta-safe``: ``eatta-stable`` that is never knowingly worse than the model it was given. Its
requests are drawn with known probabilities, mostly among the samples the adapted and the given
model disagree on (:class:`~eatta.selection.drawn.DisagreementDraw`, no class balance), so the
answers that teach also estimate without bias which model is better, and its fallback
(:class:`~eatta.monitor.SourceFallback`) serves the given model's predictions, or their blend,
until they say adapting is better. It uses no label beyond the budget. Its builder is the one
place the draw and the fallback are made together (:func:`eatta.monitor.safe_parts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from torch import nn

from eatta.annotate.oracle import Oracle
from eatta.balance import ClassBalance
from eatta.budget import Budget
from eatta.buffer import LabelBuffer, make_buffer
from eatta.configure import collect_params, configure
from eatta.debias import DebiaserName, GradNormDebiaser, make_debiaser
from eatta.debias.bounded import BoundedGradNormDebiaser
from eatta.gradients import GradMode
from eatta.gradients.approx import ProxyName
from eatta.methods.base import AdaptiveMethod
from eatta.methods.config import ActiveConfig, ParamSelection, hparam
from eatta.methods.eatta import EATTA
from eatta.methods.late_labels import LateLabels
from eatta.methods.nearest_replay import NearestReplay
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.monitor.confseq import check_level
from eatta.monitor.fallback import START, safe_parts
from eatta.selection import SELECTORS, make_selector
from eatta.selection.base import Selector

__all__ = [
    "BalanceName",
    "EATTAConfig",
    "EATTASafeConfig",
    "EATTAStableConfig",
    "SelectorName",
    "config_debiaser",
    "config_selector",
]

#: Selector names ``selector=`` takes (Table 7).
SelectorName = Literal[
    "perturbation",
    "max-entropy",
    "least-confidence",
    "min-margin",
    "random",
    "entropy-margin",
    "plpd",
    "k-clustering",
    "dynamic-margin",
]
if set(get_args(SelectorName)) != set(SELECTORS):  # the Literal spells out the registry's names
    raise ImportError("SelectorName is out of date with eatta.selection.SELECTORS")
#: Class-balance names ``balance=`` takes (see :func:`eatta.balance.make_balance`).
BalanceName = Literal["reference", "last-k", "paper", "none"]


@dataclass(frozen=True)
class EATTAConfig(ActiveConfig):
    """EATTA's keys: the wrapper's switches plus the optimizer's (paper defaults)."""

    EXPANSIONS: ClassVar[Mapping[str, Mapping[Any, Mapping[str, Any]]]] = {
        "preset": {"reference": {"params": "reference", "steps": 2}}
    }

    nesterov: bool = hparam(True, "SGD Nesterov momentum")
    preset: Literal["reference"] | None = hparam(
        None, "'reference': the authors' ImageNet-C set (params='reference', steps=2)"
    )
    params: ParamSelection = hparam("norm", "parameters to adapt (eatta.configure preset)")
    selector: SelectorName | Selector | None = hparam(
        "perturbation", "sample selector, by name or instance (None: perturbation)"
    )
    selector_kwargs: Mapping[str, Any] | None = hparam(
        None, "keyword arguments of a named selector"
    )
    noise_std: float = hparam(0.01, "std of the perturbation selector's feature noise", min=0.0)
    seed: int = hparam(0, "seed of the selector's and the buffer's random draws")
    balance: BalanceName | ClassBalance | None = hparam("reference", "class balance")
    debiaser: DebiaserName | GradNormDebiaser | None = hparam(
        None,
        "loss weighting, by name or instance (None: built from gnd, ema, ema_alpha; "
        "eatta-stable's bounded one from its bounds)",
    )
    ema_alpha: float = hparam(0.8, "EMA factor of the gradient-norm debiaser", min=0.0, max=1.0)
    gnd: bool = hparam(True, "weight the losses by gradient norm (GND)")
    ema: bool = hparam(True, "smooth the gradient norms with an EMA")
    buffer: int | LabelBuffer | None = hparam(
        None, "replay buffer, a capacity or a LabelBuffer (None or 0: no buffer)", min=0
    )
    entropy_margin: float | None = hparam(None, "entropy filter (None: 0.4 ln C)", min=0.0)
    steps: int = hparam(1, "optimizer steps per batch", min=1)
    grad_mode: GradMode = hparam(
        "auto", "how the two gradients are computed ('approx': one backward pass, estimated norms)"
    )
    approx_proxy: ProxyName = hparam(
        "auto",
        "grad_mode='approx': norms estimated at the last norm layer, the head input, or "
        "auto (the first where there is one)",
    )
    approx_refresh: int | None = hparam(
        None, "grad_mode='approx': exact norms every this many steps (None: never)", min=1
    )


def config_selector(cfg: EATTAConfig) -> Selector:
    """The config's selector: an instance as given, or one made from its name (Table 7), the
    perturbation selector taking ``noise_std``, every named one ``seed``."""
    selector = cfg.selector or "perturbation"
    if not isinstance(selector, str):
        return selector
    kw = dict(cfg.selector_kwargs or {})
    if selector == "perturbation":
        kw.setdefault("std", cfg.noise_std)
    return make_selector(selector, seed=cfg.seed, **kw)


def config_debiaser(cfg: EATTAConfig) -> GradNormDebiaser:
    """The config's debiaser: an instance as given, one made from its name (with ``ema_alpha``
    and ``ema``), or, with none named, the faithful one from ``gnd``, ``ema`` and ``ema_alpha``."""
    if cfg.debiaser is None:
        return GradNormDebiaser(alpha=cfg.ema_alpha, normalize=cfg.gnd, ema=cfg.ema)
    return make_debiaser(cfg.debiaser, alpha=cfg.ema_alpha, ema=cfg.ema)


def _build_eatta(
    model: nn.Module,
    cfg: EATTAConfig,
    oracle: Oracle | None,
    budget: Budget,
    *,
    debiaser: GradNormDebiaser | None = None,
    late_labels: LateLabels | None = None,
    **parts: Any,
) -> AdaptiveMethod:
    """EATTA from a validated config (the registry's builder); ``debiaser`` and ``late_labels``
    replace the config's, and ``parts`` may hold a ``selector`` and a ``balance`` that do (the
    variants) beside the parts every method takes."""
    selector = parts.pop("selector") if "selector" in parts else config_selector(cfg)
    balance = parts.pop("balance") if "balance" in parts else cfg.balance
    debiaser = config_debiaser(cfg) if debiaser is None else debiaser
    buffer = make_buffer(cfg.buffer, seed=cfg.seed)
    params = configure(model, cfg.params)
    norm_params = None
    if cfg.params == "reference":
        norm_params, _ = collect_params(model, "norm")
    assert oracle is not None
    return EATTA(
        model,
        make_optimizer(params, cfg),
        oracle=oracle,
        budget=budget,
        selector=selector,
        balance=balance,
        debiaser=debiaser,
        buffer=buffer,
        entropy_margin=cfg.entropy_margin,
        steps=cfg.steps,
        grad_norm_params=norm_params,
        grad_mode=cfg.grad_mode,
        approx_proxy=cfg.approx_proxy,
        approx_refresh=cfg.approx_refresh,
        label_expiry=cfg.label_expiry,
        late_labels=late_labels,
        **cfg.options(),
        **parts,
    )


register(
    MethodSpec(
        "eatta",
        _build_eatta,
        active=True,
        config=EATTAConfig,
        datasets=DATASET_PRESETS["eatta"],
        summary="EATTA: perturbation selection, class balancing, gradient-norm debiasing",
        labels_each_step=True,
    )
)


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
    **parts: Any,
) -> AdaptiveMethod:
    debiaser = None  # built (and so checked) before the model is configured
    if cfg.debiaser == "bounded" or (cfg.debiaser is None and cfg.gnd):
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
    return _build_eatta(model, cfg, oracle, budget, debiaser=debiaser, late_labels=late, **parts)


register(
    MethodSpec(
        "eatta-stable",
        _build_eatta_stable,
        active=True,
        config=EATTAStableConfig,
        datasets=DATASET_PRESETS["eatta-stable"],
        summary="EATTA with one-sided gradient-norm debiasing (labelled weight >= 1): long streams",
        labels_each_step=True,
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
    fallback_acts: bool = hparam(
        True, "the fallback acts on evidence (False: it only measures; the adapted model serves)"
    )
    fallback_recent: int = hparam(16, "answers the fallback's bets are sized from", min=1)
    tolerance: float = hparam(
        0.5,
        "the promise: points of error the served predictions may exceed the given model's by, "
        "at every batch (fallback_start='promise')",
        min=0.0,
        max=100.0,
    )
    level: float = hparam(
        0.05,
        "the promise: the chance it may fail (fallback_start='promise'; docs/safety.md)",
        min=0.0,
        max=1.0,
    )
    fallback_level: float = hparam(
        0.05,
        "error level of each of the fallback's decisions (the starts other than 'promise')",
        min=0.0,
        max=1.0,
    )
    fallback_start: Literal["promise", "blend", "source", "adapted", "auto"] = hparam(
        "promise",
        "what serves: promise (the first of the adapted model, the blend, the adapted model on "
        "part of its disagreements and the given model that keeps the promise set by tolerance "
        "and level), or, until a decision of the test: blend "
        "(the given model until the answers lean to the adapted one, then the two models' mean "
        "probabilities: measured, not guaranteed), source (the given model), adapted, auto "
        "(label-free signs: misled on the safety study's mnist-far)",
    )
    fallback_reset: bool = hparam(False, "reset the adapted model when it is found worse")
    grad_mode: GradMode = hparam(
        "approx",
        "how the two gradients are computed ('approx', the default here: one backward pass, "
        "within the seed spread of the exact step on the safety study's streams)",
    )


def _build_eatta_safe(
    model: nn.Module, cfg: EATTASafeConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    if cfg.balance not in (None, "none"):
        raise ValueError(
            f"eatta-safe draws its requests with known probabilities and takes no class "
            f"balance; got balance={cfg.balance!r} (use 'none')"
        )
    if parts.get("fallback") is not None:
        raise TypeError("eatta-safe builds its own fallback: set its fallback_* keys instead")
    assert cfg.fallback_start in START
    promised = cfg.fallback_start == "promise"
    check_level(cfg.fallback_level, "fallback level")  # the decision test's, read or not
    check_level(cfg.level, "level")
    safe = safe_parts(
        config_selector(cfg),
        explore=cfg.explore,
        seed=cfg.seed,
        recent=cfg.fallback_recent,
        level=cfg.level if promised else cfg.fallback_level,
        start=cfg.fallback_start,
        reset=cfg.fallback_reset,
        act=cfg.fallback_acts,
        **({"tolerance": cfg.tolerance} if promised else {}),
    )
    return _build_eatta_stable(model, cfg, oracle, budget, **safe, **parts)


register(
    MethodSpec(
        "eatta-safe",
        _build_eatta_safe,
        active=True,
        config=EATTASafeConfig,
        datasets=DATASET_PRESETS["eatta-safe"],
        summary="eatta-stable serving the given model until its own answers say adapting is better",
        labels_each_step=True,
        builds_fallback=True,
    )
)
