"""Annotators: who labels the samples a method selects, when, how well, and at what cost.

- Synchronous: any callable ``oracle(selected_inputs, indices) -> labels``
  (:class:`GroundTruthOracle`, :class:`ModelOracle`).
- Asynchronous (:class:`Annotator`): requests go out with ``submit``, answers come back later with
  ``collect``, in any order, some or never (:class:`SimulatedAnnotator` for benchmarks,
  :class:`ThreadedAnnotator` for a live one, ``ModelOracle(...).asynchronous()``).
- Yes/no feedback (``feedback="binary"``), annotator time (:class:`AnnotatorCost`).
"""

from eatta.annotate.base import Annotator, AnswerInbox, QueuedAnnotator, is_asynchronous
from eatta.annotate.cost import AnnotatorCost
from eatta.annotate.oracle import (
    ABSTAIN,
    GroundTruthOracle,
    ModelOracle,
    Oracle,
    OracleError,
    validate_labels,
)
from eatta.annotate.paced import PersonPace
from eatta.annotate.pending import Arrived, PendingLabels
from eatta.annotate.queue import LabelQueue
from eatta.annotate.requests import FEEDBACK, Answer, AnswerError, Feedback, LabelRequest
from eatta.annotate.simulated import SimulatedAnnotator, ThreadedAnnotator, parse_delay

__all__ = [
    "ABSTAIN",
    "FEEDBACK",
    "Annotator",
    "AnnotatorCost",
    "Answer",
    "AnswerError",
    "AnswerInbox",
    "Arrived",
    "Feedback",
    "GroundTruthOracle",
    "LabelQueue",
    "LabelRequest",
    "ModelOracle",
    "Oracle",
    "OracleError",
    "PendingLabels",
    "PersonPace",
    "QueuedAnnotator",
    "SimulatedAnnotator",
    "ThreadedAnnotator",
    "is_asynchronous",
    "parse_delay",
    "validate_labels",
]
