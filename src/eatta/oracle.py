"""Former home of the synchronous oracles, now :mod:`eatta.annotate.oracle` (kept as an alias)."""

from eatta.annotate.oracle import (
    ABSTAIN,
    GroundTruthOracle,
    ModelOracle,
    Oracle,
    OracleError,
    validate_labels,
)

__all__ = [
    "ABSTAIN",
    "GroundTruthOracle",
    "ModelOracle",
    "Oracle",
    "OracleError",
    "validate_labels",
]
