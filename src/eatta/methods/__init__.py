"""Adaptation methods, each an :class:`AdaptiveMethod` that predicts and adapts in ``forward``.

Every built-in method's module is imported here, eagerly: each registers itself by name at the
bottom of its module (``register(MethodSpec(...))``, :mod:`eatta.methods.registry`), so the
registry is complete as soon as ``eatta`` is imported. The registry imports no method; a new
method adds its module to the list below.
"""

from eatta.methods import baseline as baseline
from eatta.methods import cema as cema
from eatta.methods import cotta as cotta
from eatta.methods import eatta as eatta
from eatta.methods import eatta_family as eatta_family
from eatta.methods import eta as eta
from eatta.methods import hiltta as hiltta
from eatta.methods import rdumb as rdumb
from eatta.methods import sar as sar
from eatta.methods import simatta as simatta
from eatta.methods import source as source
from eatta.methods import tent as tent
from eatta.methods.base import AdaptiveMethod, InvalidInputError
from eatta.methods.eatta import EATTA, StepRecord

__all__ = ["EATTA", "AdaptiveMethod", "InvalidInputError", "StepRecord"]
