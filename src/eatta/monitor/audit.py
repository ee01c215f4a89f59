"""Which samples are audited: :class:`AuditSampler`, a uniform random share of the stream.

Each sample of each batch is audited independently with probability ``share`` (Bernoulli, or
Poisson, sampling). Every sample has the same, known inclusion probability, so the plain mean of
the audited answers estimates the stream's accuracy without bias, whatever the method's own
selector does. Importance weighting from selection probabilities was not chosen: the methods'
selectors (the perturbation score, entropy, margins) pick their top-k deterministically, so most
samples have selection probability 0 and no weight can recover them. The draws use the sampler's
own generator: the method's random state is the same with or without audits.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["AuditSampler", "check_share"]


def check_share(share: object) -> float:
    """``share`` as a float in [0, 1], or a :class:`TypeError` / :class:`ValueError`."""
    if isinstance(share, bool) or not isinstance(share, int | float):
        raise TypeError(f"audit share must be a number in [0, 1], got {share!r}")
    if math.isnan(share) or not 0.0 <= float(share) <= 1.0:
        raise ValueError(
            f"audit share must be in [0, 1] (a fraction of the samples), got {share!r}"
        )
    return float(share)


class AuditSampler:
    """Draws the audited positions of each batch: every sample with probability ``share``."""

    def __init__(self, share: float, seed: int = 0) -> None:
        self.share = check_share(share)
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)

    def draw(self, batch: int) -> Tensor:
        """Positions (sorted, ``long``) audited in a batch of ``batch`` samples."""
        u = torch.rand(batch, generator=self._gen)
        return torch.nonzero(u < self.share).flatten()

    def reset(self) -> None:
        self._gen.manual_seed(self.seed)

    def state_dict(self) -> dict[str, Any]:
        return {"share": self.share, "seed": self.seed, "generator": self._gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.share = check_share(state["share"])
        self.seed = int(state["seed"])
        self._gen.set_state(state["generator"])
