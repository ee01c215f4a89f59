"""One-sided gradient-norm debiasing: EATTA's weights, never below 1 for the labelled loss.

Faithful GND (:class:`~eatta.debias.gradnorm.GradNormDebiaser`) equalises the two weighted gradient
norms: ``γ_sup·g_s = γ_unsup·g_u``. When the labelled gradient is the larger one (``g_s > g_u``,
the usual case with one label per batch on a small network), that halves or worse the pull of the
only ground truth and amplifies the entropy term up to 2x; over long streams the amplified entropy
minimisation drifts (see ``docs/when-eatta-helps.md``). The bounded debiaser keeps the direction in
which GND helps, a labelled gradient drowned by the entropy gradient is weighted up, and drops the
other: the labelled weight is floored at ``sup_floor`` and the entropy weight capped at
``unsup_cap`` (both 1 by default, so when ``g_s >= g_u`` the step is the 1 : 1 step of the paper's
Baseline). It uses the two norms EATTA already computes: no extra backward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from eatta.debias.gradnorm import GradNormDebiaser, LossWeights

__all__ = ["BoundedGradNormDebiaser"]


class BoundedGradNormDebiaser(GradNormDebiaser):
    """GND weights clamped: ``γ_sup = max(s, sup_floor)``, ``γ_unsup = min(u, unsup_cap)``.

    ``s, u`` are the faithful (EMA-smoothed) weights of :class:`GradNormDebiaser`, whose EMA
    state evolves exactly as the faithful one's (the clamp acts on the applied weights only).
    ``sup_floor=0, unsup_cap=2`` gives back the faithful weights. ``LossWeights.sup_raw`` /
    ``unsup_raw`` stay the unclamped Eq. 4-5 values. A degenerate step (no confident unlabelled
    sample, or both norms zero) is weighted as by the faithful debiaser (1 and 0 or 1).

    Args:
        alpha: EMA factor of the underlying weights (0.8 as in the paper).
        sup_floor: lower bound of the labelled weight, in ``[0, 2]``.
        unsup_cap: upper bound of the entropy weight, in ``[0, 2]``.
        ema: smooth the weights by the EMA before clamping.
    """

    def __init__(
        self,
        alpha: float = 0.8,
        *,
        sup_floor: float = 1.0,
        unsup_cap: float = 1.0,
        ema: bool = True,
    ) -> None:
        for name, value in (("sup_floor", sup_floor), ("unsup_cap", unsup_cap)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not 0.0 <= float(value) <= 2.0:
                raise ValueError(f"{name} must be in [0, 2], got {value}")
        super().__init__(alpha=alpha, normalize=True, ema=ema)
        self.sup_floor = float(sup_floor)
        self.unsup_cap = float(unsup_cap)

    @property
    def current(self) -> tuple[Tensor, Tensor] | None:
        """The applied (clamped) EMA weights ``(sup, unsup)``, or None before the first update."""
        ema = super().current
        if ema is None:
            return None
        return self._clamp(*ema)

    def _clamp(self, sup: Tensor, unsup: Tensor) -> tuple[Tensor, Tensor]:
        return sup.clamp(min=self.sup_floor), unsup.clamp(max=self.unsup_cap)

    def weights(self, g_sup: Tensor, g_unsup: Tensor, has_unsup: Tensor) -> LossWeights:
        """Faithful GND weights for this step (updating the EMA), then clamped."""
        w = super().weights(g_sup, g_unsup, has_unsup)
        total = g_sup + g_unsup
        valid = has_unsup & (total > 0) & torch.isfinite(total)
        sup, unsup = self._clamp(w.sup, w.unsup)
        return LossWeights(
            torch.where(valid, sup, w.sup),
            torch.where(valid, unsup, w.unsup),
            w.sup_raw,
            w.unsup_raw,
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "sup_floor": self.sup_floor, "unsup_cap": self.unsup_cap}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("sup_floor", "unsup_cap"):
            if key in state and float(state[key]) != getattr(self, key):
                raise ValueError(
                    f"state was saved with {key}={state[key]}, this debiaser has "
                    f"{getattr(self, key)}"
                )
        super().load_state_dict(state)

    def __repr__(self) -> str:
        return (
            f"BoundedGradNormDebiaser(alpha={self.alpha}, sup_floor={self.sup_floor}, "
            f"unsup_cap={self.unsup_cap}, ema={self.ema})"
        )
