"""Gradient-norm debiasing of the supervised and unsupervised losses (paper Eq. 4-6).

:class:`GradNormDebiaser` is the paper's (faithful) rule, :class:`BoundedGradNormDebiaser` the
one-sided variant ``eatta-stable`` uses; both share :class:`LossWeights`.
"""

from __future__ import annotations

from eatta.debias.bounded import BoundedGradNormDebiaser
from eatta.debias.gradnorm import GradNormDebiaser, LossWeights

__all__ = ["BoundedGradNormDebiaser", "GradNormDebiaser", "LossWeights"]
