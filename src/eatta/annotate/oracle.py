"""Synchronous annotators: a callable that labels the selected samples at once.

An oracle is any callable ``oracle(selected_inputs, indices) -> labels``: ``selected_inputs`` is
``x[indices]`` and ``indices`` the positions in the batch the method steps on (CPU int64). It
returns one integer class per selected sample, ``ABSTAIN`` (-1) for a sample it will not label, or
``None`` to abstain on all.

Under a window (``window=N``) that batch is the window's last ``N`` samples, not the request just
served, so ``indices`` are positions in the window: a simulation that looks labels up passes them
with each request (``method(x, labels=y)``, kept by the window) and answers with
:class:`GroundTruthOracle`, rather than indexing its own request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from eatta.annotate.batch_labels import BatchLabels
from eatta.annotate.simulated import ThreadedAnnotator

if TYPE_CHECKING:
    from eatta.annotate.requests import LabelRequest

__all__ = [
    "ABSTAIN",
    "BatchLabels",
    "GroundTruthOracle",
    "ModelOracle",
    "Oracle",
    "OracleError",
    "validate_labels",
]

ABSTAIN = -1
"""The label an annotator gives for a sample it will not label: the sample is skipped."""

Oracle = Callable[[Tensor, Tensor], "Tensor | None"]


class OracleError(RuntimeError):
    """The oracle raised, or answered with labels of the wrong shape, dtype or range."""


class GroundTruthOracle(BatchLabels):
    """Simulated annotator that reveals only the selected samples' true labels, at once.

    The batch's labels are given as :class:`BatchLabels` says. ``revealed`` counts the labels
    handed out.
    """

    def __init__(self) -> None:
        self._labels: Tensor | None = None
        self.revealed = 0
        # labels on an accelerator: their host copy, started when they are given, without
        # blocking (the method's selection waits for the device before asking, so the copy is
        # done by then; the event says so, or is waited for)
        self._host: tuple[Tensor, Tensor, torch.cuda.Event | None] | None = None

    def set_labels(self, labels: Tensor) -> None:
        super().set_labels(labels)
        given = self._labels
        self._host = None
        if given is not None:  # (on the CPU: the labels themselves)
            host = given.to("cpu", non_blocking=True)
            event = None
            if given.device.type == "cuda":
                event = torch.cuda.Event()
                event.record()
            self._host = (given, host, event)

    def _host_labels(self, labels: Tensor) -> Tensor | None:
        if self._host is None or self._host[0] is not labels:
            return None
        _, host, event = self._host
        if event is not None and not event.query():
            event.synchronize()
        return host

    def __call__(self, inputs: Tensor, indices: Tensor) -> Tensor:
        if self._labels is None:
            raise RuntimeError(
                "GroundTruthOracle has no labels for this batch; call set_labels(y) before each "
                "batch or pass method(x, labels=y)"
            )
        if indices.numel() and int(indices.max()) >= len(self._labels):
            raise IndexError(f"index {int(indices.max())} beyond {len(self._labels)} labels")
        self.revealed += int(indices.numel())
        host = self._host_labels(self._labels)
        if host is not None:
            return host[indices]
        return self._labels[indices.to(self._labels.device)]


class ModelOracle:
    """A (large) model as annotator: labels the selected samples by its argmax (paper Tab. 8).

    Called, it answers at once; :meth:`asynchronous` gives the same model as an annotator that
    answers from another thread (and so from another device) while the stream goes on.
    """

    def __init__(self, model: nn.Module, transform: Callable[[Tensor], Tensor] | None = None):
        self.model = model.eval()
        self.transform = transform

    @torch.no_grad()
    def __call__(self, inputs: Tensor, indices: Tensor) -> Tensor:
        x = self.transform(inputs) if self.transform is not None else inputs
        device = next(self.model.parameters()).device
        return self.model(x.to(device)).argmax(dim=1)

    def asynchronous(self, *, delay_s: float = 0.0, workers: int = 1) -> ThreadedAnnotator:
        """This model as an asynchronous annotator: each request is labelled by a worker thread
        on the model's own device, ``delay_s`` seconds after it was sent at the earliest."""

        def label(request: LabelRequest) -> int:
            return int(self(request.sample.unsqueeze(0), torch.zeros(1, dtype=torch.long))[0])

        return ThreadedAnnotator(label, delay_s=delay_s, workers=workers)


def validate_labels(answer: object, count: int, num_classes: int) -> Tensor | None:
    """Check an oracle's answer; return int64 CPU labels (``ABSTAIN`` allowed) or None."""
    if answer is None:
        return None
    try:
        labels = torch.as_tensor(answer)
    except (TypeError, ValueError, RuntimeError) as err:
        raise OracleError(f"oracle returned {type(answer).__name__}, not labels") from err
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise OracleError(f"oracle labels must be integers, got dtype {labels.dtype}")
    if labels.shape != (count,):
        raise OracleError(
            f"oracle returned labels of shape {tuple(labels.shape)}, expected ({count},)"
        )
    labels = labels.to(device="cpu", dtype=torch.long)
    bad = (labels < ABSTAIN) | (labels >= num_classes)
    if bool(bad.any()):
        raise OracleError(
            f"the annotator's labels must be classes of the model, in [0, {num_classes}), or "
            f"{ABSTAIN} to abstain; got {labels[bad].tolist()} (with method(x, labels=y), y "
            "holds them)"
        )
    return labels
