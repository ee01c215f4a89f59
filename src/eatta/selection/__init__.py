"""Sample selectors: which samples of a batch to label.

EATTA's :class:`PerturbationSelector` and the alternatives of the paper's Table 7, by name through
:func:`make_selector` (``eatta.methods.registry.create("eatta", ..., selector="plpd")``).
"""

from __future__ import annotations

from typing import Any

from eatta.selection.base import ScoreSelector, SelectionContext, Selector
from eatta.selection.clustering import IncrementalClusteringSelector
from eatta.selection.dynamic_margin import DynamicMarginSelector
from eatta.selection.perturbation import PerturbationSelector
from eatta.selection.plpd import PLPDSelector
from eatta.selection.uncertainty import (
    EntropyMarginSelector,
    LeastConfidenceSelector,
    MaxEntropySelector,
    MinMarginSelector,
    RandomSelector,
)

__all__ = [
    "SELECTORS",
    "DynamicMarginSelector",
    "EntropyMarginSelector",
    "IncrementalClusteringSelector",
    "LeastConfidenceSelector",
    "MaxEntropySelector",
    "MinMarginSelector",
    "PLPDSelector",
    "PerturbationSelector",
    "RandomSelector",
    "ScoreSelector",
    "SelectionContext",
    "Selector",
    "make_selector",
]

#: Selector classes by name (Table 7 of the paper, plus EATTA's own "perturbation").
SELECTORS: dict[str, type] = {
    "perturbation": PerturbationSelector,
    "max-entropy": MaxEntropySelector,
    "least-confidence": LeastConfidenceSelector,
    "min-margin": MinMarginSelector,
    "random": RandomSelector,
    "entropy-margin": EntropyMarginSelector,
    "plpd": PLPDSelector,
    "k-clustering": IncrementalClusteringSelector,
    "dynamic-margin": DynamicMarginSelector,
}

#: Selectors that draw random numbers and so take a ``seed``.
_SEEDED = frozenset({"perturbation", "random", "plpd"})


def make_selector(spec: str | Selector, *, seed: int | None = None, **kwargs: Any) -> Selector:
    """A selector by name of :data:`SELECTORS`, constructed with ``kwargs``; an instance is
    returned as it is (``selector=`` takes either, in ``eatta.create`` and the class API).

    ``seed`` goes to the selectors that draw random numbers (``perturbation``, ``random``,
    ``plpd``) and is ignored by the deterministic ones, so callers can always pass it.
    """
    if isinstance(spec, Selector):
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"selector must be a name ({', '.join(SELECTORS)}) or a Selector, "
            f"got {type(spec).__name__}"
        )
    key = spec.lower()
    if key not in SELECTORS:
        raise ValueError(f"unknown selector {spec!r}; choose one of {', '.join(SELECTORS)}")
    if seed is not None and key in _SEEDED:
        kwargs["seed"] = seed
    made: Selector = SELECTORS[key](**kwargs)
    return made
