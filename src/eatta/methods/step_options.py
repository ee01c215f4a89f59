"""How EATTA's step runs: gradient strategy, autocast, channels-last.

All options but ``grad_mode="approx"`` give the same update up to float rounding; the defaults
reproduce the golden traces bit for bit. See ``docs/method.md`` (Performance options) and
``docs/approx-step.md`` (the approximate step, which changes what is computed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor, nn

from eatta.methods._grads import Batched, GradientStrategy, Segmented, TwoPass

__all__ = ["GradMode", "StepOptions"]

#: How the two gradients are computed (see :mod:`eatta.methods._grads`).
GradMode = Literal["auto", "two-pass", "segmented", "batched", "approx"]


@dataclass(frozen=True)
class StepOptions:
    """Performance options of an EATTA step.

    Attributes:
        grad_mode: ``"segmented"``: the two backward passes run segment by segment between cut
            points of the graph, as fast as ``"two-pass"`` with about TENT's peak memory (a
            gradient hook on a tensor at a cut point runs twice per pass). ``"two-pass"``: one
            pass retaining the whole graph, then one freeing it (+14-19% peak memory over TENT on
            ResNets). ``"batched"``: one vmapped pass (``is_grads_batched``); low memory, slower
            in PyTorch 2.13. ``"auto"``: ``"segmented"``, or ``"two-pass"`` when the model has
            module hooks or its graph's gradients total less than ``segment_min_bytes``.
            ``"approx"``: not exact: ONE backward pass on ``γ_sup·L_sup + γ_unsup·L_unsup``, the
            weights from estimated gradient norms (``EATTA``'s ``approx_proxy``,
            ``approx_refresh``; ``docs/approx-step.md``); refresh steps run as ``"auto"``.
        autocast: run the feature extractor under bfloat16 autocast; the head, the perturbation
            scores and the losses stay float32 (the perturbation difference is ~1e-3 and would
            drown in bfloat16 rounding).
        channels_last: convert the model (in place) and each 4-d batch to channels-last memory
            format, which GPU and oneDNN CPU convolutions run faster.
        grad_segments: segments of the ``"segmented"`` computation (more: less memory, more calls).
        segment_min_bytes: ``"auto"`` segments only graphs whose gradients total at least this
            (digits-C CNN: 12 MiB, ResNet-18 at 64 px far more).
    """

    grad_mode: GradMode = "auto"
    autocast: bool = False
    channels_last: bool = False
    grad_segments: int = 4
    segment_min_bytes: int = 32 * 2**20

    def __post_init__(self) -> None:
        if self.grad_mode not in get_args(GradMode):
            raise ValueError(
                f"grad_mode must be one of {get_args(GradMode)}, got {self.grad_mode!r}"
            )
        if self.grad_segments < 1 or self.segment_min_bytes < 0:
            raise ValueError(
                "grad_segments must be >= 1 and segment_min_bytes >= 0, got "
                f"{self.grad_segments}, {self.segment_min_bytes}"
            )

    def prepare_model(self, model: nn.Module) -> None:
        """Convert ``model`` in place as the options say (channels-last)."""
        if self.channels_last:
            # Module.to takes memory_format (as Tensor.to does), but torch's overloads omit it
            model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]

    def prepare_input(self, x: Tensor) -> Tensor:
        """The batch in the memory format the options say."""
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def features(self, backbone: nn.Module, x: Tensor) -> Tensor:
        """``backbone(x)``, under bfloat16 autocast if asked (returned as float32)."""
        if not self.autocast:
            return backbone(x)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            z = backbone(x)
        return z.float()

    def gradient_strategy(self, model: nn.Module) -> GradientStrategy:
        """The :class:`~eatta.methods._grads.GradientStrategy` for ``grad_mode``."""
        if self.grad_mode == "two-pass":
            return TwoPass()
        if self.grad_mode == "batched":
            return Batched()
        auto = self.grad_mode in ("auto", "approx")  # approx: its exact refresh steps
        return Segmented(self.grad_segments, self.segment_min_bytes, auto=auto, model=model)


class DeferredFiniteCheck:
    """The input's finiteness flag, computed on the device and read at a later host sync.

    ``bool(torch.isfinite(x).all())`` would stall the host at the start of every step on an
    accelerator; the flag is read at the step's synchronisation instead, before any state
    changes. Only for forwards without side effects (no train-mode BatchNorm with running
    statistics).
    """

    def __init__(self) -> None:
        self.flag: Tensor | None = None
        #: the flag's value once a selector read it with the selection (None: not read)
        self.known: bool | None = None

    @staticmethod
    def applies(x: Tensor, model: nn.Module) -> bool:
        """Whether the check may be deferred for ``x`` on ``model``."""
        if x.device.type == "cpu":  # no sync to save
            return False
        return DeferredFiniteCheck.side_effect_free(model)

    @staticmethod
    def side_effect_free(model: nn.Module) -> bool:
        """Whether ``model``'s forward changes no state a non-finite batch could spoil."""
        return not any(  # a forward that updates running statistics must not see bad input
            isinstance(m, nn.modules.batchnorm._BatchNorm)
            and m.training
            and m.track_running_stats
            and m.running_mean is not None
            for m in model.modules()
        )

    def take(self) -> Tensor | None:
        """The pending flag (None if none), now cleared."""
        flag, self.flag = self.flag, None
        return flag

    def resolve(self, value: bool) -> None:
        """The flag was read with the selection (:class:`~eatta.selection.base.DeferredRead`)."""
        self.flag, self.known = None, value

    def read(self) -> bool:
        """Whether the input was finite: the value read with the selection, else the pending
        flag read now (one host synchronisation), else True (nothing deferred). Clears both."""
        known, self.known = self.known, None
        if known is not None:
            return known
        flag = self.take()
        return True if flag is None else bool(flag)
