"""How a benchmark's cells are run: :class:`RunOptions` (identical options, identical results)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eatta.anchor import check_alpha
from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.flags import is_int, is_positive
from eatta.bench.monitoring import MonitorOptions
from eatta.window import check_window

__all__ = ["AUTO_WINDOW", "RunOptions"]

#: ``--window auto``: 64 samples, the paper's batch size, for smaller batches
AUTO_WINDOW = 64


@dataclass
class RunOptions:
    """How cells are run (identical options, identical results); ``reuse=False`` ignores
    finished results and checkpoints; ``mixed`` draws each batch across the round's domains."""

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
    #: audits and the guard (``--audit``, ``--guard``)
    monitor: MonitorOptions = field(default_factory=MonitorOptions)
    #: ``--window``: ``"auto"`` (:data:`AUTO_WINDOW` samples for smaller batches), ``"off"``,
    #: a number of samples, or None (batches as given, with the small-batch warning)
    window: int | str | None = None
    #: the weight anchor every adapting method gets (``--weight-anchor``; None: none)
    weight_anchor: float | None = None
    #: the online protocol's relative cost r by method (None: the offline protocol)
    costs: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if not (is_int(self.batch_size) and self.batch_size >= 1):
            raise ValueError(f"batch size must be an int >= 1, got {self.batch_size!r}")
        if self.window not in (None, "auto", "off"):
            check_window(self.window)
        if self.weight_anchor is not None:
            check_alpha(self.weight_anchor)  # refuses a value outside (0, 1]
        if self.limit is not None and self.limit < 2:
            raise ValueError(f"limit must be >= 2 images per domain, got {self.limit}")
        if self.checkpoint_every < 0 or (self.workers is not None and self.workers < 0):
            raise ValueError("checkpoint_every and workers must be >= 0")
        if not (is_int(self.rounds) and self.rounds >= 1):
            raise ValueError(f"rounds must be an int >= 1, got {self.rounds!r}")
        if self.dirichlet is not None and not is_positive(self.dirichlet):
            raise ValueError(f"dirichlet must be a finite number > 0, got {self.dirichlet!r}")

    def method_window(self) -> int | bool | None:
        """The ``window=`` an adapting method gets (``"auto"``: on every model, docs/safety.md,
        docs/small-batches.md; ``"off"``: False)."""
        if self.window is None:
            return None
        if self.window == "off":
            return False
        if self.window == "auto":
            return AUTO_WINDOW if self.batch_size < AUTO_WINDOW else None
        return int(self.window)

    def overrides(self, method: str) -> dict[str, Any]:
        """Hyperparameter overrides for ``method``: those for all (``"*"``), then its own."""
        return {**self.hparams.get("*", {}), **self.hparams.get(method, {})}
