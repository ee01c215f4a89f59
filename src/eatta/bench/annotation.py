"""Who answers the active methods' label requests in a benchmark: :class:`AnnotatorOptions`.

By default the ground truth answers at once (:class:`~eatta.annotate.oracle.GroundTruthOracle`,
the paper's protocol). A label delay, label noise or yes/no feedback makes it a
:class:`~eatta.annotate.simulated.SimulatedAnnotator` answering through the asynchronous path
(``--label-delay 0`` gives exactly the numbers of the default). Annotator time is requests times
seconds per answer (:class:`~eatta.annotate.cost.AnnotatorCost`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from eatta.annotate.cost import AnnotatorCost
from eatta.annotate.oracle import GroundTruthOracle
from eatta.annotate.requests import Feedback, check_feedback
from eatta.annotate.simulated import SimulatedAnnotator, parse_delay

__all__ = ["AnnotatorOptions", "annotation_summary"]


@dataclass(frozen=True)
class AnnotatorOptions:
    """The benchmark's simulated annotator.

    ``delay``: None (synchronous, the default), steps (an int >= 0) or ``"never"``; ``noise``:
    probability of a wrong answer; ``feedback``: ``"label"`` or ``"binary"`` (yes/no on the
    model's prediction); ``cost``: seconds per answer of each kind.
    """

    delay: int | str | None = None
    noise: float = 0.0
    feedback: Feedback = "label"
    cost: AnnotatorCost = field(default_factory=AnnotatorCost)

    def __post_init__(self) -> None:
        if self.delay is not None:
            parse_delay(self.delay)
        if isinstance(self.noise, bool) or not isinstance(self.noise, int | float):
            raise TypeError(f"label noise must be a number in [0, 1], got {self.noise!r}")
        if math.isnan(self.noise) or not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"label noise must be in [0, 1], got {self.noise!r}")
        check_feedback(self.feedback)
        if not isinstance(self.cost, AnnotatorCost):
            raise TypeError(f"cost must be an AnnotatorCost, got {type(self.cost).__name__}")

    @property
    def simulated(self) -> bool:
        """Whether a :class:`SimulatedAnnotator` answers (else the synchronous ground truth)."""
        return self.delay is not None or self.noise > 0 or self.feedback != "label"

    def build(self, seed: int) -> GroundTruthOracle | SimulatedAnnotator:
        """The annotator of one cell (its draws seeded by the cell's seed)."""
        if not self.simulated:
            return GroundTruthOracle()
        delay = 0 if self.delay is None else self.delay
        return SimulatedAnnotator(
            delay=delay,  # type: ignore[arg-type]  # checked in __post_init__
            noise=self.noise,
            feedback=self.feedback,
            seed=seed,
        )

    def describe(self) -> dict[str, Any]:
        """Plain description for fingerprints and ``results.json`` (the cost is not included in
        fingerprints: it changes no result, only the seconds reported)."""
        return {"delay": self.delay, "noise": self.noise, "feedback": self.feedback}

    def text(self) -> str:
        """Short text for table titles, e.g. ``label delay 16, noise 0.2, yes/no``."""
        parts = []
        if self.delay is not None:
            parts.append(f"label delay {self.delay}")
        if self.noise:
            parts.append(f"label noise {self.noise:g}")
        if self.feedback == "binary":
            parts.append("yes/no feedback")
        return ", ".join(parts)


def annotation_summary(
    method: Any, annotator: object, labels_used: int, options: AnnotatorOptions
) -> dict[str, Any]:
    """What a cell's annotator did: requested, received, expired, pending at the end, skipped,
    wrong, and annotator seconds (requests x seconds per answer)."""
    stats = dict(getattr(method, "annotation_stats", {}) or {})
    if not stats:  # synchronous ground truth: every request answered at once, correctly
        stats = {"requested": labels_used, "received": labels_used, "pending": 0}
    own = annotator.stats() if isinstance(annotator, SimulatedAnnotator) else {}
    requested = int(stats.get("requested", 0))
    return {
        "feedback": options.feedback,
        "requested": requested,
        "received": int(stats.get("received", 0)),
        "expired": int(stats.get("expired", 0)),
        "pending": int(stats.get("pending", 0)),
        "skipped": int(stats.get("skipped", 0)),
        "dropped": int(stats.get("dropped", 0)),
        "wrong": int(own.get("wrong", 0)),
        "seconds": options.cost.seconds(requested, options.feedback),
    }
