"""Who answers the active methods' label requests in a benchmark: :class:`AnnotatorOptions`.

The ground truth answers at once (the paper's protocol) unless a delay, noise, yes/no feedback
or a pace asks for a :class:`~eatta.annotate.simulated.SimulatedAnnotator`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

from eatta.annotate.cost import AnnotatorCost
from eatta.annotate.oracle import GroundTruthOracle
from eatta.annotate.paced import DEFAULT_PATIENCE
from eatta.annotate.requests import FEEDBACK, Feedback, check_feedback
from eatta.annotate.simulated import SimulatedAnnotator, parse_delay
from eatta.bench.flags import _int, flag

__all__ = ["AnnotatorOptions", "annotation_summary"]


def _delay(text: str) -> int | str:
    """``--label-delay``: a number of batches >= 0 or ``never``."""
    if text.strip().lower() == "never":
        return "never"
    value = _int(text, f"label delay is a number of batches >= 0 or 'never', got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"label delay must be >= 0 batches, got {value}")
    return value


@dataclass(frozen=True)
class AnnotatorOptions:
    """The benchmark's annotator (see each flag's help); ``cost``: seconds per answer."""

    delay: int | str | None = flag(
        "labels arrive D batches after they are asked for ('never': they never come); "
        "0 gives the numbers of a run without it",
        name="label-delay",
        type=_delay,
        metavar="D|never",
    )
    noise: float = flag(
        "probability that an answer is wrong (a uniformly drawn other class, or a flipped yes/no)",
        0.0,
        name="label-noise",
        type=float,
        metavar="P",
    )
    feedback: Feedback = flag(
        "label: the annotator gives a class; binary: yes/no on the model's prediction",
        "label",
        choices=FEEDBACK,
    )
    cost: AnnotatorCost = field(default_factory=AnnotatorCost)
    pace: float | None = flag(
        "a person answering A requests per batch, one at a time (instead of --label-delay: "
        "the delay follows from the load)",
        name="label-pace",
        type=float,
        metavar="A",
    )
    stream_rate: float | None = flag(
        "a person at --seconds-per-label/--seconds-per-binary against a stream of R batches "
        "per second (the pace in seconds, instead of --label-pace)",
        type=float,
        metavar="R",
    )
    order: str | None = flag(
        "with a pace: which waiting request the person answers next (default: newest)",
        name="label-order",
        metavar="newest|oldest",
    )
    patience: int | None = flag(
        "with a pace: batches a request waits before the person drops it "
        f"(default: {DEFAULT_PATIENCE})",
        name="label-patience",
        type=int,
        metavar="N",
    )

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
        if self.paced and self.delay is not None:
            raise ValueError(
                f"a paced annotator's delay follows from its load; got label delay {self.delay!r}"
            )
        if not self.paced and (self.order is not None or self.patience is not None):
            given = {"order": self.order, "patience": self.patience}
            raise ValueError(f"{given} apply to a paced annotator; give a pace or a stream rate")
        if self.paced:
            self.build(0)  # checks pace, rate, order and patience (a clear error naming them)

    @property
    def paced(self) -> bool:
        """Whether a person's pace (not a fixed delay) sets when answers come."""
        return self.pace is not None or self.stream_rate is not None

    @property
    def simulated(self) -> bool:
        """Whether a :class:`SimulatedAnnotator` answers (else the synchronous ground truth)."""
        return self.delay is not None or self.noise > 0 or self.feedback != "label" or self.paced

    def build(self, seed: int) -> GroundTruthOracle | SimulatedAnnotator:
        """The annotator of one cell (its draws seeded by the cell's seed)."""
        if not self.simulated:
            return GroundTruthOracle()
        delay = 0 if self.delay is None else self.delay
        seconds = None if self.stream_rate is None else self.cost.per_request(self.feedback)
        same = ("noise", "feedback", "stream_rate", "order", "patience")  # the order: checked there
        return SimulatedAnnotator(
            delay=delay,  # type: ignore[arg-type]  # checked in __post_init__
            seed=seed,
            capacity=self.pace,
            seconds_per_answer=seconds,
            **{k: getattr(self, k) for k in same},
        )

    def describe(self) -> dict[str, Any]:
        """Plain description for fingerprints and ``results.json`` (the cost only where it sets
        the pace: elsewhere it changes no result)."""
        out: dict[str, Any] = {"delay": self.delay, "noise": self.noise, "feedback": self.feedback}
        paced = ("pace", "stream_rate", "order", "patience")  # only when set: old fingerprints hold
        out |= {k: getattr(self, k) for k in paced if getattr(self, k) is not None}
        if self.stream_rate is not None:  # the pace follows from the seconds per answer
            out["seconds_per_answer"] = self.cost.per_request(self.feedback)
        return out

    def text(self) -> str:
        """Short text for table titles, e.g. ``label delay 16, noise 0.2, yes/no``."""
        rate, sec = self.stream_rate, self.cost.per_request(self.feedback)
        parts = [
            f"label delay {self.delay}" if self.delay is not None else "",
            f"{self.pace:g} answers/batch" if self.pace is not None else "",
            f"{sec:g} s/answer at {rate:g} batches/s" if rate is not None else "",
            f"{self.order} first" if self.order is not None else "",
            f"label noise {self.noise:g}" if self.noise else "",
            "yes/no feedback" if self.feedback == "binary" else "",
        ]
        return ", ".join(part for part in parts if part)


def annotation_summary(
    method: Any, annotator: object, labels_used: int, options: AnnotatorOptions
) -> dict[str, Any]:
    """What a cell's annotator did: request counts, wrong answers and annotator seconds."""
    stats = dict(getattr(method, "annotation_stats", {}) or {})
    if not stats:  # synchronous ground truth: every request answered at once, correctly
        stats = {"requested": labels_used, "received": labels_used, "pending": 0}
    own = annotator.stats() if isinstance(annotator, SimulatedAnnotator) else {}
    counts = ("requested", "received", "expired", "pending", "skipped", "dropped")
    out: dict[str, Any] = {"feedback": options.feedback}
    out |= {k: int(stats.get(k, 0)) for k in counts}
    out["wrong"] = int(own.get("wrong", 0))
    out["seconds"] = options.cost.seconds(out["requested"], options.feedback)
    return out
