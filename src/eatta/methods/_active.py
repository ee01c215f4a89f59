"""Helpers shared by the active baselines (SimATTA, CEMA): asking the oracle safely."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from eatta.oracle import ABSTAIN, Oracle, OracleError, validate_labels

__all__ = ["ask_oracle", "split_answer"]


def ask_oracle(oracle: Oracle, x: Tensor, indices: Tensor, num_classes: int) -> Tensor | None:
    """The oracle's validated labels for ``x[indices]`` (None: abstained on all; no call if empty).

    Exceptions raised by the oracle are wrapped in :class:`~eatta.oracle.OracleError`.
    """
    if not len(indices):
        return None
    try:
        answer = oracle(x[indices.to(x.device)], indices.clone())
    except Exception as err:  # the annotator's own failure, reported as such
        raise OracleError(f"the oracle raised {type(err).__name__}: {err}") from err
    return validate_labels(answer, len(indices), num_classes)


def split_answer(indices: Tensor, labels: Tensor | None) -> tuple[Tensor, Tensor, Any]:
    """``(labelled indices, their labels, answered mask)`` from a validated answer."""
    if labels is None:
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty, torch.zeros(len(indices), dtype=torch.bool)
    answered = labels != ABSTAIN
    return indices[answered], labels[answered], answered
