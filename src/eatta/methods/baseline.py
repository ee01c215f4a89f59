"""The paper's ATTA baseline: TENT plus randomly chosen labelled samples, losses weighted 1 : 1.

EATTA paper, Sec. 4 and supplementary: the baseline "builds on TENT, randomly selects a
specified number of samples from each online batch for manual annotation and then performs ATTA
using Eq. 2": cross-entropy on the labelled samples plus the entropy of the confident
(``H < 0.4 ln C``) unlabelled samples, both with weight ``γ = 1``. It is EATTA with its three
components switched off (random selection, no class balancing, no gradient-norm debiasing), so
it is built as one (:func:`baseline`): the registered ``"baseline"`` is an
:class:`~eatta.methods.eatta.EATTA`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from typing_extensions import Unpack

from eatta.annotate.asking import DEFAULT_LABEL_EXPIRY
from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.configure import configure
from eatta.debias import GradNormDebiaser
from eatta.methods.base import AdaptiveMethod, Options
from eatta.methods.config import ActiveConfig, ParamSelection, hparam
from eatta.methods.eatta import EATTA
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.selection.uncertainty import RandomSelector

__all__ = ["BaselineConfig", "baseline"]


def baseline(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    oracle: Oracle,
    budget: int | Budget = 1,
    seed: int = 0,
    buffer: LabelBuffer | int | None = None,
    entropy_margin: float | None = None,
    label_expiry: int = DEFAULT_LABEL_EXPIRY,
    **options: Unpack[Options],
) -> EATTA:
    """The Baseline: EATTA's step with uniformly random selection (``seed``), no class
    balancing and weights 1, 1; the other arguments as :class:`~eatta.methods.eatta.EATTA`'s
    (TENT's optimizer: SGD lr 2.5e-4, momentum 0.9)."""
    return EATTA(
        model,
        optimizer,
        oracle=oracle,
        budget=budget,
        selector=RandomSelector(seed),
        balance=None,
        debiaser=GradNormDebiaser(normalize=False),
        buffer=buffer,
        entropy_margin=entropy_margin,
        label_expiry=label_expiry,
        **options,
    )


@dataclass(frozen=True)
class BaselineConfig(ActiveConfig):
    """The ATTA baseline's keys (TENT's optimizer settings, Nesterov momentum)."""

    nesterov: bool = hparam(True, "SGD Nesterov momentum")
    params: ParamSelection = hparam("norm", "parameters to adapt (eatta.configure preset)")
    seed: int = hparam(0, "seed of the random selection and the buffer")
    buffer: int | None = hparam(None, "replay buffer size (None or 0: no buffer)", min=0)
    entropy_margin: float | None = hparam(None, "entropy filter (None: 0.4 ln C)", min=0.0)


def _build_baseline(
    model: nn.Module, cfg: BaselineConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    assert oracle is not None
    params = configure(model, cfg.params)
    return baseline(
        model,
        make_optimizer(params, cfg),
        oracle=oracle,
        budget=budget,
        seed=cfg.seed,
        buffer=LabelBuffer(cfg.buffer, seed=cfg.seed) if cfg.buffer else None,
        entropy_margin=cfg.entropy_margin,
        **cfg.options(),
        label_expiry=cfg.label_expiry,
        **parts,
    )


register(
    MethodSpec(
        "baseline",
        _build_baseline,
        active=True,
        config=BaselineConfig,
        datasets=DATASET_PRESETS["baseline"],
        summary="ATTA baseline: TENT + randomly selected labels, supervised and entropy terms 1:1",
    )
)
