"""RDumb (Press et al., NeurIPS 2023): ETA whose model is reset to the source every N batches.

"RDumb: A simple approach that questions our progress in continual test-time adaptation" shows
that on long streams (their CCC benchmark) every adapting method eventually falls below the
non-adapting source model, and that simply restarting ETA from the source weights every 1,000
steps avoids this collapse.

Reset timing, as in the authors' code (github.com/oripress/CCC, ``models/rdumb.py``): their
``forward`` restores the model when ``total_steps % 1000 == 0`` *before* the batch is processed,
then adapts and increments the counter. Here too: batches ``0 .. N-1`` (0-based, counted since
creation or the last :meth:`~eatta.methods.base.AdaptiveMethod.reset`) adapt one continuous
model; batch ``N`` is predicted and adapted on by the freshly restored source model, and so on
for ``2N, 3N, ...``. The restart at batch 0 is a no-op and skipped.

Deliberate difference from the reference: the periodic reset restores everything
:meth:`reset` restores (source weights and BatchNorm buffers, the optimizer's initial state, and
all of ETA's state: the probability average of the redundancy filter *and* the sample counters;
the authors' code keeps counting samples across resets). Only the step counter keeps running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.configure import configure
from eatta.methods.base import AdaptiveMethod, Options
from eatta.methods.config import hparam
from eatta.methods.eta import ETA, ETAConfig, _eta_kwargs
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register

__all__ = ["RDumb", "RDumbConfig"]

#: The reset interval of the RDumb paper (batches of 64).
DEFAULT_RESET_EVERY = 1000


def _check_interval(reset_every: object) -> int:
    if isinstance(reset_every, bool) or not isinstance(reset_every, int) or reset_every < 1:
        raise ValueError(f"reset_every must be an integer >= 1, got {reset_every!r}")
    return reset_every


class RDumb(ETA):
    """:class:`~eatta.methods.eta.ETA` restarted from the source model every ``reset_every``
    batches (before batch ``reset_every``, ``2·reset_every``, ...; see the module docstring).

    Args:
        reset_every: batches between two restarts (1,000 in the paper; 1 restarts before every
            batch, so each batch is adapted on from the source model).
        Others as :class:`~eatta.methods.eta.ETA`.

    ``num_steps`` counts the batches processed since creation or the last :meth:`reset` (it is
    saved in :meth:`state_dict`, so a resumed stream restarts at the same batches);
    :attr:`num_resets` the periodic restarts among them.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        reset_every: int = DEFAULT_RESET_EVERY,
        entropy_margin: float | None = None,
        d_margin: float = 0.05,
        prob_momentum: float = 0.9,
        **options: Unpack[Options],
    ) -> None:
        interval = _check_interval(reset_every)  # before anything is built or changed
        super().__init__(
            model,
            optimizer,
            entropy_margin=entropy_margin,
            d_margin=d_margin,
            prob_momentum=prob_momentum,
            **options,
        )
        self.reset_every = interval
        self.num_steps = 0

    @property
    def num_resets(self) -> int:
        """Periodic restarts so far (since creation or the last :meth:`reset`)."""
        return max(0, self.num_steps - 1) // self.reset_every

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        if self.num_steps and self.num_steps % self.reset_every == 0:
            steps = self.num_steps
            self.reset(keep_monitor=True)  # source weights, optimizer and all of ETA's state
            self.num_steps = steps
        logits = super().forward_and_adapt(x)
        self.num_steps += 1
        return logits

    # -- state -------------------------------------------------------------------------------
    def reset_method_state(self) -> None:
        super().reset_method_state()
        self.num_steps = 0

    def method_state(self) -> dict[str, Any]:
        return {**super().method_state(), "num_steps": self.num_steps}

    def load_method_state(self, state: dict[str, Any]) -> None:
        super().load_method_state(state)
        self.num_steps = int(state.get("num_steps", 0))


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RDumbConfig(ETAConfig):
    """RDumb's keys: ETA's (the paper's SGD 2.5e-4, momentum 0.9) plus the reset interval."""

    reset_every: int = hparam(
        DEFAULT_RESET_EVERY, "restart from the source model every this many batches", min=1
    )


def _build_rdumb(
    model: nn.Module, cfg: RDumbConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    params = configure(model, cfg.params)
    optimizer = make_optimizer(params, cfg)
    return RDumb(model, optimizer, reset_every=cfg.reset_every, **_eta_kwargs(cfg), **parts)


register(
    MethodSpec(
        "rdumb",
        _build_rdumb,
        config=RDumbConfig,
        datasets=DATASET_PRESETS["rdumb"],
        summary="RDumb: ETA reset to the source model every reset_every batches",
    )
)
