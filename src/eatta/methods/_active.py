"""Helpers shared by the active methods (EATTA, SimATTA, CEMA): selecting and asking safely."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from eatta.history import ClassHistory, Selection
from eatta.annotate.oracle import ABSTAIN, Oracle, OracleError, validate_labels
from eatta.selection.base import SelectionContext, Selector

__all__ = ["ask_oracle", "select_and_ask", "split_answer"]


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


def select_and_ask(
    selector: Selector,
    history: ClassHistory,
    ctx: SelectionContext,
    k: int,
    oracle: Oracle,
    check: Callable[[Selection], None] | None = None,
) -> tuple[Selection, Tensor | None]:
    """Select up to ``k`` samples and get the oracle's validated labels for them.

    The selector's returned indices are checked (unique, in range, at most ``k``), then ``check``
    (a method's own sanity check) runs. If anything fails, the selector's state (its random
    generator, running statistics) is restored before the error propagates.
    """
    saved = selector.state_dict()
    try:
        selection = selector.select(ctx, k, history)
        idx = selection.indices
        batch = ctx.inputs.shape[0]
        if idx.dim() != 1 or len(idx) > k or len(set(idx.tolist())) != len(idx):
            raise RuntimeError(f"selector returned invalid indices {idx.tolist()} for k={k}")
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= batch):
            raise RuntimeError(f"selector returned out-of-range indices {idx.tolist()}")
        if check is not None:
            check(selection)
        labels = ask_oracle(oracle, ctx.inputs, idx, ctx.logits.shape[1])
    except BaseException:
        selector.load_state_dict(saved)
        raise
    return selection, labels
