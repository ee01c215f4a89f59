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

from eatta.debias.gradnorm import GradNormDebiaser

__all__ = ["BoundedGradNormDebiaser"]


class BoundedGradNormDebiaser(GradNormDebiaser):
    """GND weights bounded: ``γ_sup = max(s, sup_floor)``, ``γ_unsup = min(u, unsup_cap)``.

    ``s, u`` are the faithful (EMA-smoothed) weights of :class:`GradNormDebiaser`, whose EMA
    state evolves exactly as the faithful one's (the bounds act on the applied weights only).
    ``sup_floor=0, unsup_cap=2`` gives back the faithful weights. ``LossWeights.sup_raw`` /
    ``unsup_raw`` stay the unclamped Eq. 4-5 values. A degenerate step (no confident unlabelled
    sample, or both norms zero) is weighted as by the faithful debiaser (1 and 0 or 1).

    Args:
        alpha: EMA factor of the underlying weights (0.8 as in the paper).
        sup_floor: lower bound of the labelled weight, in ``[0, 2]``.
        unsup_cap: upper bound of the entropy weight, in ``[0, 2]``.
        ema: smooth the weights by the EMA before bounding them.
    """

    def __init__(
        self,
        alpha: float = 0.8,
        *,
        sup_floor: float = 1.0,
        unsup_cap: float = 1.0,
        ema: bool = True,
    ) -> None:
        super().__init__(alpha, True, ema, sup_floor=sup_floor, unsup_cap=unsup_cap)

    def __repr__(self) -> str:
        return (
            f"BoundedGradNormDebiaser(alpha={self.alpha}, sup_floor={self.sup_floor}, "
            f"unsup_cap={self.unsup_cap}, ema={self.ema})"
        )
