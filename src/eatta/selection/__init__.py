"""Sample selectors: which samples of a batch to label."""

from eatta.selection.base import ScoreSelector, SelectionContext, Selector
from eatta.selection.perturbation import PerturbationSelector

__all__ = ["PerturbationSelector", "ScoreSelector", "SelectionContext", "Selector"]
