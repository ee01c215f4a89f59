"""TENT (Wang et al., ICLR 2021): minimize the prediction entropy of every test batch.

The model is configured as in :func:`eatta.configure` (eval mode, BatchNorm on batch statistics,
only the normalization layers' affine parameters trainable) and takes one optimizer step per
batch on the mean entropy of the whole batch. The paper's settings (docs/method.md §5): SGD lr
2.5e-4, momentum 0.9 on ImageNet-C/R/K/A; Adam lr 5e-3 on PACS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.configure import configure
from eatta.losses import entropy
from eatta.methods.base import AdaptiveMethod, Options, unique_params
from eatta.methods.config import OptimizerConfig, ParamSelection, hparam
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register

__all__ = ["Tent", "set_grads"]


def set_grads(loss: Tensor, params: Sequence[nn.Parameter]) -> None:
    """Store ``d loss / d p`` in ``p.grad`` for each parameter (replacing what was there).

    Unlike ``loss.backward()`` it touches no other parameter's ``.grad``; a parameter the loss does
    not depend on gets ``None``, so the optimizer skips it exactly as after ``backward()``.
    """
    grads = torch.autograd.grad(loss, list(params), allow_unused=True)
    for p, g in zip(params, grads, strict=True):
        p.grad = g


def trainable(optimizer: torch.optim.Optimizer | None, method: str) -> list[nn.Parameter]:
    """The optimizer's parameters, each once, switched to ``requires_grad=True``."""
    if optimizer is None:
        raise TypeError(f"{method} needs an optimizer over the parameters to adapt")
    params = unique_params(p for g in optimizer.param_groups for p in g["params"])
    if not params:
        raise ValueError("the optimizer holds no parameters")
    for p in params:
        p.requires_grad_(True)
    return params


class Tent(AdaptiveMethod):
    """Entropy minimization on every batch; returns the logits computed before the update.

    Args:
        model: a classifier prepared with :func:`eatta.configure` (in place).
        optimizer: over the parameters to adapt (norm affine parameters in TENT).
        steps: optimizer steps per batch (1 in the paper). With more than one, the returned logits
            are still those of the first forward pass (the official code returns the last pass's);
            this keeps every method's output "before this batch's update".
        options: what every method takes (:class:`~eatta.methods.base.Options`: the parts,
            ``split``, ``check_finite``, ``autocast``, ``channels_last``).
    """

    optimizer: torch.optim.Optimizer  # required here (the base allows None)

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        steps: int = 1,
        **options: Unpack[Options],
    ) -> None:
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        super().__init__(model, optimizer, **options)
        self.steps = steps
        self._train = trainable(optimizer, "TENT")

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        first: Tensor | None = None
        for _ in range(self.steps):
            logits = self.logits(x)
            if first is None:
                first = logits.detach()
            set_grads(entropy(logits).mean(), self._train)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        assert first is not None
        return first


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TentConfig(OptimizerConfig):
    """TENT's keys. Nesterov momentum as in the official TENT/CoTTA configuration
    (``OPTIM.NESTEROV = True``); per-dataset rates in :mod:`eatta.methods.presets`."""

    nesterov: bool = hparam(True, "SGD Nesterov momentum")
    params: ParamSelection = hparam("norm", "parameters to adapt (eatta.configure preset)")
    steps: int = hparam(1, "optimizer steps per batch", min=1)


def _build_tent(
    model: nn.Module, cfg: TentConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    params = configure(model, cfg.params)
    return Tent(model, make_optimizer(params, cfg), steps=cfg.steps, **cfg.options(), **parts)


register(
    MethodSpec(
        "tent",
        _build_tent,
        config=TentConfig,
        datasets=DATASET_PRESETS["tent"],
        summary="TENT: entropy minimization of norm-layer affine parameters",
    )
)
