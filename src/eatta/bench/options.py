"""How a benchmark's cells are run: :class:`RunOptions` (identical options, identical results)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.monitoring import MonitorOptions

__all__ = ["RunOptions"]


@dataclass
class RunOptions:
    """How cells are run (identical options give identical results).

    ``reuse=False`` ignores finished results and checkpoints in the output folder (runs afresh);
    ``mixed``: every batch drawn across the round's domains; ``annotator``: who answers the
    active methods (default: the ground truth, at once); ``monitor``: audits and the guard.
    """

    batch_size: int = 64
    seed: int = 0
    limit: int | None = None
    device: str = "cpu"
    workers: int | None = None  # None: 0 on the CPU, up to 8 worker processes on a GPU
    checkpoint_every: int = 100
    hparams: dict[str, dict[str, Any]] = field(default_factory=dict)
    progress: bool = True
    reuse: bool = True
    rounds: int = 1
    dirichlet: float | None = None
    mixed: bool = False
    annotator: AnnotatorOptions = field(default_factory=AnnotatorOptions)
    #: audits and the guard (``--audit``, ``--guard``); default: none
    monitor: MonitorOptions = field(default_factory=MonitorOptions)

    def __post_init__(self) -> None:
        if (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or self.batch_size < 1
        ):
            raise ValueError(f"batch size must be an int >= 1, got {self.batch_size!r}")
        if self.limit is not None and self.limit < 2:
            raise ValueError(f"limit must be >= 2 images per domain, got {self.limit}")
        if self.checkpoint_every < 0 or (self.workers is not None and self.workers < 0):
            raise ValueError("checkpoint_every and workers must be >= 0")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {self.rounds!r}")
        if self.dirichlet is not None and not (
            isinstance(self.dirichlet, int | float)
            and not isinstance(self.dirichlet, bool)
            and 0 < self.dirichlet < math.inf
        ):
            raise ValueError(f"dirichlet must be a finite number > 0, got {self.dirichlet!r}")

    def overrides(self, method: str) -> dict[str, Any]:
        """Hyperparameter overrides for ``method``: those for all (``"*"``), then its own."""
        out = dict(self.hparams.get("*", {}))
        out.update(self.hparams.get(method, {}))
        return out
