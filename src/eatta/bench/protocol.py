"""How a benchmark streams its domains: :class:`StreamProtocol`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from eatta.bench.flags import flag, is_int, is_positive

__all__ = ["CCC_SPEEDS", "StreamProtocol"]

#: The CCC-style stream's speeds (see :mod:`eatta.data.ccc`).
CCC_SPEEDS = ("slow", "medium", "fast")


@dataclass(frozen=True)
class StreamProtocol:
    """Rounds, gradual severities, label shift, mixed domains or a CCC-style stream; each field
    is a flag of ``eatta-bench run``."""

    rounds: int | None = flag(
        "recurring: repeat the domain sequence R times, each round reshuffled "
        "(default: 10 when digits-c is the only dataset, else 1)",
        type=int,
    )
    gradual: bool = flag(
        "gradual: severity 1,2,3,4,5,4,3,2,1 within each corruption (imagenet-c, digits-c)", False
    )
    dirichlet: float | None = flag(
        "label shift: order each domain by a Dirichlet(DELTA) class process "
        "(0.1: strongly class-correlated batches)",
        type=float,
        metavar="DELTA",
    )
    mixed: bool = flag("mixed domains: every batch drawn across all domains of the round", False)
    ccc: str | None = flag(
        "CCC-style stream (digits-c): corruption pairs blended with a continuously changing mix "
        "and severity, at this speed",
        choices=CCC_SPEEDS,
    )

    def __post_init__(self) -> None:
        if self.rounds is not None and not (is_int(self.rounds) and self.rounds >= 1):
            raise ValueError(f"rounds must be an int >= 1, got {self.rounds!r}")
        for name in ("gradual", "mixed"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.dirichlet is not None and not is_positive(self.dirichlet):
            raise ValueError(f"dirichlet must be a finite number > 0, got {self.dirichlet!r}")
        if self.ccc is not None and self.ccc not in CCC_SPEEDS:
            raise ValueError(f"unknown CCC speed {self.ccc!r}; use one of {', '.join(CCC_SPEEDS)}")
        if self.ccc is not None and self.gradual:
            raise ValueError("the CCC stream sets its own severities; leave out gradual")

    def describe(self) -> dict[str, Any]:
        """The fields by name (for result files and pages)."""
        return asdict(self)
