"""Source: the unadapted model, the reference point of every table."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.methods.base import AdaptiveMethod, Options
from eatta.methods.config import MethodConfig
from eatta.methods.registry import MethodSpec, register

__all__ = ["Source"]


class Source(AdaptiveMethod):
    """Predicts with the model as trained (eval mode, running statistics); never adapts."""

    adapts = False

    def __init__(
        self,
        model: nn.Module,
        **options: Unpack[Options],
    ) -> None:
        super().__init__(model.eval(), None, **options)

    @torch.no_grad()
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        return self.logits(x)


def _build_source(
    model: nn.Module, cfg: MethodConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    return Source(model, **cfg.options(), **parts)


register(MethodSpec("source", _build_source, summary="no adaptation", adapts=False))
