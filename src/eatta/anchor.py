"""A pull of the adapted weights back toward the given model's after each step (a part of any
method: ``weight_anchor=``).

ROID's weight ensembling (Marsden et al., WACV 2024)::

    θ ← α·θ + (1 − α)·θ₀

for every parameter ``θ`` the method's optimizer updates, ``θ₀`` its value when the method was
created (what ``reset()`` restores). ``α`` in (0, 1]: ROID's 0.99 keeps 99 % of each step's
weights; 1 changes nothing. A step that wrote none of the parameters (a method that skipped its
update, a request served between a window's steps) is not pulled.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from eatta.hooks import Batch, HostMethod

__all__ = ["WeightAnchor", "check_alpha"]


def check_alpha(alpha: object) -> float:
    """``alpha`` as a float in (0, 1], or a clear error naming the keyword."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise TypeError(f"weight_anchor must be a number in (0, 1], got {alpha!r}")
    if not (math.isfinite(alpha) and 0 < alpha <= 1):
        raise ValueError(f"weight_anchor must be in (0, 1] (1: no pull), got {alpha!r}")
    return float(alpha)


class WeightAnchor:
    """See the module docstring; ``method``: the method whose parameters are anchored."""

    name = "weight_anchor"
    measures = False

    def __init__(self, alpha: float, method: HostMethod) -> None:
        self.alpha = check_alpha(alpha)
        if not method.adapts or not method.params:
            raise ValueError(
                f"{type(method).__name__} updates no parameter: a weight anchor has nothing to pull"
            )
        self._method = method
        self._pairs: list[tuple[nn.Parameter, Tensor]] | None = None  # (θ, θ₀), on first use
        self._versions: list[int] = []

    @property
    def pairs(self) -> list[tuple[nn.Parameter, Tensor]]:
        """Each anchored parameter ``θ`` with ``θ₀``, its value when the method was created."""
        if self._pairs is None:
            self._pairs = self._method.params_at_creation()
        return self._pairs

    def check(self, method: HostMethod, batch: Batch) -> None:
        """Nothing to refuse."""

    def before_step(self, method: HostMethod, batch: Batch) -> None:
        """Note each parameter's version (its count of in-place changes)."""
        self._versions = [theta._version for theta, _ in self.pairs]

    def after_step(self, method: HostMethod, batch: Batch) -> None:
        """Pull the parameters back if the step wrote any."""
        pairs, versions = self.pairs, self._versions
        if any(theta._version != v for (theta, _), v in zip(pairs, versions, strict=True)):
            self.pull()

    @torch.no_grad()
    def pull(self) -> None:
        """``θ ← α·θ + (1 − α)·θ₀`` for every anchored parameter (α = 1: nothing to do)."""
        a = self.alpha
        if a == 1:
            return
        pairs = self.pairs
        for i, (theta, theta0) in enumerate(pairs):
            if theta0.device != theta.device or theta0.dtype != theta.dtype:  # the model moved:
                theta0 = theta0.to(theta)  # θ₀ follows it once, not a copy every step
                pairs[i] = (theta, theta0)
            theta.copy_(a * theta + (1 - a) * theta0)

    def reset(self) -> None:
        """Nothing to clear: θ₀ is the method's state at creation."""

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if float(state["alpha"]) != self.alpha:
            raise ValueError(
                f"this state was saved with weight_anchor={state['alpha']}; this method pulls "
                f"with {self.alpha}"
            )

    def __repr__(self) -> str:
        return f"WeightAnchor(alpha={self.alpha})"
