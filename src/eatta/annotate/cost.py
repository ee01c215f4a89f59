"""What annotation costs a person: seconds per answer, by feedback kind.

The defaults come from the user study that BiTTA (ICML 2025) cites: a full class label takes
11.7 s per sample (12.7 % of them wrong), a yes/no on the model's prediction 1.6 s (0.8 % wrong).
One full label per batch costs about as much as seven yes/no answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eatta.annotate.requests import Feedback, check_feedback

__all__ = ["AnnotatorCost"]


@dataclass(frozen=True)
class AnnotatorCost:
    """Seconds a person spends per request of each feedback kind."""

    seconds_per_label: float = 11.7
    seconds_per_binary: float = 1.6

    def __post_init__(self) -> None:
        for name in ("seconds_per_label", "seconds_per_binary"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number of seconds, got {value!r}")
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def per_request(self, kind: Feedback) -> float:
        """Seconds per request of ``kind``."""
        check_feedback(kind)
        return self.seconds_per_label if kind == "label" else self.seconds_per_binary

    def seconds(self, requests: int, kind: Feedback) -> float:
        """Annotator time for ``requests`` requests of ``kind``."""
        return requests * self.per_request(kind)
