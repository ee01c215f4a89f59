"""Adaptation methods, each an :class:`AdaptiveMethod` that predicts and adapts in ``forward``."""

from eatta.methods.base import AdaptiveMethod, InvalidInputError
from eatta.methods.eatta import EATTA, StepRecord

__all__ = ["EATTA", "AdaptiveMethod", "InvalidInputError", "StepRecord"]
