"""What ``eatta-serve`` is started with: the command's flags, checked, as one value."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ADAPTERS", "Options"]

#: Where the method steps: its own process (serving never shares Python's lock with a step), or
#: a thread of the server's process (no second process: tests, and machines without fork/spawn).
ADAPTERS = ("process", "thread")


@dataclass(frozen=True)
class Options:
    """What ``eatta-serve`` is started with (the command's flags, checked)."""

    model: str
    method: str = "eatta-safe"
    dataset: str = "default"
    name: str = "model"
    input_shape: tuple[int, ...] = (3, 32, 32)
    window: int = 64
    budget: int = 1
    max_batch: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 4096
    checkpoint_s: float = 1.0
    device: str = "cpu"
    order: str = "newest"
    adapter: str = "process"
    adapter_nice: int = 5
    threads: int | None = None
    #: The method's own settings (``eatta.create``'s keywords, e.g. eatta-safe's ``tolerance``).
    hparams: dict[str, Any] = field(default_factory=dict)

    def durable(self) -> dict[str, Any]:
        """The options a checkpoint must have been written with to be loaded."""
        keys = ("model", "method", "dataset", "input_shape", "window", "budget", "hparams")
        # a state written without settings of its own has no "hparams" (older states neither)
        return {k: v for k, v in asdict(self).items() if k in keys and (k != "hparams" or v)}
