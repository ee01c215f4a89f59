"""Source: the unadapted model, the reference point of every table."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.methods.base import AdaptiveMethod
from eatta.methods.config import MethodConfig
from eatta.methods.parts import Parts
from eatta.methods.registry import MethodSpec, register
from eatta.split import ModelSplit

__all__ = ["Source"]


class Source(AdaptiveMethod):
    """Predicts with the model as trained (eval mode, running statistics); never adapts."""

    adapts = False

    def __init__(
        self,
        model: nn.Module,
        *,
        split: ModelSplit | tuple[nn.Module, nn.Module] | None = None,
        check_finite: bool = True,
        **parts: Unpack[Parts],
    ) -> None:
        super().__init__(model.eval(), None, split=split, check_finite=check_finite)
        self.attach(**parts)

    def check_input(self, x: Tensor) -> None:
        if isinstance(x, Tensor) and x.dim() >= 1 and x.shape[0] == 1:
            return super().check_input(torch.cat([x, x]))  # batch of 1 is fine without adapting
        super().check_input(x)

    @torch.no_grad()
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        return self.model(x)


def _build_source(
    model: nn.Module, cfg: MethodConfig, oracle: Oracle | None, budget: Budget
) -> AdaptiveMethod:
    return Source(model, split=cfg.split)


register(MethodSpec("source", _build_source, summary="no adaptation"))
