"""The true labels of the batch in progress, shared by the annotators simulated from them.

:class:`~eatta.annotate.oracle.GroundTruthOracle` (synchronous) and
:class:`~eatta.annotate.simulated.SimulatedAnnotator` (asynchronous) both read them; this module
imports neither, so the two do not import each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from typing_extensions import Self

__all__ = ["BatchLabels"]


class BatchLabels:
    """The true labels of the batch in progress, for annotators simulated from the ground truth.

    The labels belong to one batch: give them before the step (``method(x, labels=y)``,
    ``set_labels(y)`` or ``with annotator.labels(y):``); the method ends the batch when its
    forward returns or fails (:meth:`end_batch`), so a forgotten ``set_labels`` raises instead of
    serving the previous batch's labels.
    """

    _labels: Tensor | None = None

    def set_labels(self, labels: Tensor) -> None:
        """The current batch's labels, one per sample."""
        labels = torch.as_tensor(labels)
        if labels.dim() != 1:
            raise ValueError(f"labels must be 1-d [batch], got shape {tuple(labels.shape)}")
        self._labels = labels

    @property
    def batch_labels(self) -> Tensor | None:
        """The labels given for the batch in progress (None: none given); a method with a window
        of recent samples (:mod:`eatta.window`) keeps them with the samples it adapts on later."""
        return self._labels

    def end_batch(self) -> None:
        """Forget the batch's labels (called by the method after each forward)."""
        self._labels = None

    @contextmanager
    def labels(self, labels: Tensor) -> Iterator[Self]:
        self.set_labels(labels)
        try:
            yield self
        finally:
            self._labels = None
