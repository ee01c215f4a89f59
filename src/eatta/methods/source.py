"""Source: the unadapted model, the reference point of every table."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from eatta.methods.base import AdaptiveMethod

__all__ = ["Source"]


class Source(AdaptiveMethod):
    """Predicts with the model as trained (eval mode, running statistics); never adapts."""

    def __init__(self, model: nn.Module, **kwargs: object) -> None:
        super().__init__(model.eval(), None, **kwargs)  # type: ignore[arg-type]

    def check_input(self, x: Tensor) -> None:
        if isinstance(x, Tensor) and x.dim() >= 1 and x.shape[0] == 1:
            return super().check_input(torch.cat([x, x]))  # batch of 1 is fine without adapting
        super().check_input(x)

    @torch.no_grad()
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        return self.model(x)
