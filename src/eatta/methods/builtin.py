"""Registers the built-in methods with their configs and per-dataset defaults (method.md §5)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from torch import nn

import eatta.methods.baseline  # registers on import
import eatta.methods.cema  # registers on import
import eatta.methods.cotta  # registers on import
import eatta.methods.eta  # registers on import
import eatta.methods.rdumb  # registers on import
import eatta.methods.sar  # registers on import
import eatta.methods.simatta  # registers on import
import eatta.methods.tent
from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.configure import collect_params, configure
from eatta.debias import GradNormDebiaser
from eatta.history import ClassHistory
from eatta.methods.base import AdaptiveMethod
from eatta.methods.config import MethodConfig, OptimizerConfig, ParamSelection, hparam
from eatta.methods.eatta import EATTA, GradMode
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.source import Source
from eatta.oracle import Oracle
from eatta.selection import SELECTORS, Selector, make_selector

#: Selector names ``selector=`` takes (Table 7).
SelectorName = Literal[tuple(SELECTORS)]  # type: ignore[valid-type]
#: Class-history names ``history=`` takes (see :func:`eatta.history.make_history`).
HistoryName = Literal["reference", "last-k", "paper", "none"]


@dataclass(frozen=True)
class EATTAConfig(OptimizerConfig):
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
    history: HistoryName | ClassHistory | None = hparam("reference", "class-balancing history")
    ema_alpha: float = hparam(0.8, "EMA factor of the gradient-norm debiaser", min=0.0, max=1.0)
    gnd: bool = hparam(True, "weight the losses by gradient norm (GND)")
    ema: bool = hparam(True, "smooth the gradient norms with an EMA")
    buffer: int | None = hparam(None, "replay buffer size (None or 0: no buffer)", min=0)
    entropy_margin: float | None = hparam(None, "entropy filter (None: 0.4 ln C)", min=0.0)
    steps: int = hparam(1, "optimizer steps per batch", min=1)
    grad_mode: GradMode = hparam("auto", "how the two backward passes are run")
    autocast: bool = hparam(False, "bf16 autocast of the feature extractor")
    channels_last: bool = hparam(False, "channels-last memory format")


def _build_source(
    model: nn.Module, cfg: MethodConfig, oracle: Oracle | None, budget: Budget
) -> AdaptiveMethod:
    return Source(model, split=cfg.split)


def build_eatta(
    model: nn.Module,
    cfg: EATTAConfig,
    oracle: Oracle | None,
    budget: Budget,
    *,
    debiaser: GradNormDebiaser | None = None,
) -> AdaptiveMethod:
    """EATTA from a validated config; ``debiaser`` replaces the config's GND (variants)."""
    params = configure(model, cfg.params)
    norm_params = None
    if cfg.params == "reference":
        norm_params, _ = collect_params(model, "norm")
    assert oracle is not None
    selector = cfg.selector or "perturbation"  # a Selector, or a name (Table 7)
    if isinstance(selector, str):
        kw = dict(cfg.selector_kwargs or {})
        if selector == "perturbation":
            kw.setdefault("std", cfg.noise_std)
        selector = make_selector(selector, seed=cfg.seed, **kw)
    return EATTA(
        model,
        make_optimizer(params, cfg),
        oracle=oracle,
        budget=budget,
        selector=selector,
        history=cfg.history,
        debiaser=debiaser
        if debiaser is not None
        else GradNormDebiaser(alpha=cfg.ema_alpha, normalize=cfg.gnd, ema=cfg.ema),
        buffer=LabelBuffer(cfg.buffer, seed=cfg.seed) if cfg.buffer else None,
        entropy_margin=cfg.entropy_margin,
        steps=cfg.steps,
        grad_norm_params=norm_params,
        split=cfg.split,
        grad_mode=cfg.grad_mode,
        autocast=cfg.autocast,
        channels_last=cfg.channels_last,
    )


register(MethodSpec("source", _build_source, summary="no adaptation"))
register(
    MethodSpec(
        "eatta",
        build_eatta,
        active=True,
        config=EATTAConfig,
        datasets=DATASET_PRESETS["eatta"],
        summary="EATTA: perturbation selection, class balancing, gradient-norm debiasing",
    )
)

import eatta.methods.eatta_variants  # noqa: E402, F401  (registers on import; needs EATTA's)
