"""Gradient-norm debiasing of the supervised and unsupervised losses (paper Eq. 4-6).

:class:`GradNormDebiaser` is the paper's (faithful) rule, :class:`BoundedGradNormDebiaser` the
one-sided variant ``eatta-stable`` uses; both share :class:`LossWeights`. :func:`make_debiaser`
builds one by name (``debiaser=`` takes a name or an instance, in ``eatta.create`` and in the
class API alike).
"""

from __future__ import annotations

from typing import Literal, get_args

from eatta.debias.bounded import BoundedGradNormDebiaser
from eatta.debias.gradnorm import GradNormDebiaser, LossWeights

__all__ = [
    "DEBIASERS",
    "BoundedGradNormDebiaser",
    "DebiaserName",
    "GradNormDebiaser",
    "LossWeights",
    "make_debiaser",
]

#: Debiaser names: the paper's rule, ``eatta-stable``'s bounded one, and weights 1 and 1 (no GND:
#: the paper's Baseline and its ablation row).
DebiaserName = Literal["gradnorm", "bounded", "none"]
DEBIASERS: tuple[str, ...] = get_args(DebiaserName)


def make_debiaser(
    spec: str | GradNormDebiaser | None, *, alpha: float = 0.8, ema: bool = True
) -> GradNormDebiaser:
    """A debiaser from a name of :data:`DEBIASERS` (built with ``alpha`` and ``ema``, the bounded
    one with its default bounds), an instance (returned as it is), or None (``"gradnorm"``)."""
    if isinstance(spec, GradNormDebiaser):
        return spec
    if spec is None or spec == "gradnorm":
        return GradNormDebiaser(alpha=alpha, ema=ema)
    if spec == "bounded":
        return BoundedGradNormDebiaser(alpha=alpha, ema=ema)
    if spec == "none":
        return GradNormDebiaser(alpha=alpha, normalize=False, ema=ema)
    if isinstance(spec, str):
        raise ValueError(f"unknown debiaser {spec!r}; choose one of {', '.join(DEBIASERS)}")
    raise TypeError(
        f"debiaser must be a name ({', '.join(DEBIASERS)}) or a GradNormDebiaser, "
        f"got {type(spec).__name__}"
    )
