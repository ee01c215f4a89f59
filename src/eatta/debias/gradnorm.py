"""Gradient-norm debiasing of the supervised and unsupervised losses (paper Eq. 4-6)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["GradNormDebiaser", "LossWeights"]


class LossWeights(tuple[Tensor, ...]):
    """``(sup, unsup, sup_raw, unsup_raw)`` tensors: applied weights and the raw Eq. 4-5 values."""

    __slots__ = ()

    def __new__(cls, sup: Tensor, unsup: Tensor, sup_raw: Tensor, unsup_raw: Tensor) -> LossWeights:
        return super().__new__(cls, (sup, unsup, sup_raw, unsup_raw))

    @property
    def sup(self) -> Tensor:
        return self[0]

    @property
    def unsup(self) -> Tensor:
        return self[1]

    @property
    def sup_raw(self) -> Tensor:
        return self[2]

    @property
    def unsup_raw(self) -> Tensor:
        return self[3]


class GradNormDebiaser:
    """Weights ``γ_sup = 2 g_u/(g_s+g_u)``, ``γ_unsup = 2 g_s/(g_s+g_u)``, smoothed by an EMA.

    The larger gradient gets the smaller weight; the two always sum to 2. The EMA (``alpha``)
    starts from the first raw values. ``normalize=False`` is the ablation without GND (weights
    1, 1); ``ema=False`` applies the raw weights. Everything stays on the device (no host sync).

    A degenerate step (no confident unlabelled sample, or both norms zero) weights the labelled
    term 1 and the empty term 0, and leaves the EMA untouched.
    """

    def __init__(self, alpha: float = 0.8, normalize: bool = True, ema: bool = True) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"EMA alpha must be in [0, 1], got {alpha}")
        self.alpha = float(alpha)
        self.normalize = normalize
        self.ema = ema
        self._state: Tensor | None = None  # [ema_sup, ema_unsup, initialized]

    @property
    def needs_grad_norms(self) -> bool:
        """Whether :meth:`weights` uses the gradient norms (else one backward pass suffices)."""
        return self.normalize

    @property
    def current(self) -> tuple[Tensor, Tensor] | None:
        """The EMA weights ``(sup, unsup)``, or None before the first update."""
        if self._state is None or not bool(self._state[2]):
            return None
        return self._state[0], self._state[1]

    def weights(self, g_sup: Tensor, g_unsup: Tensor, has_unsup: Tensor) -> LossWeights:
        """Weights for this step from the two global gradient norms; updates the EMA."""
        one = torch.ones_like(g_sup)
        if not self.normalize:
            return LossWeights(one, one, one, one)
        total = g_sup + g_unsup
        valid = has_unsup & (total > 0) & torch.isfinite(total)
        safe = torch.where(valid, total, one)
        raw_sup = 2 * g_unsup / safe
        raw_unsup = 2 * g_sup / safe
        if not self.ema:
            applied_sup, applied_unsup = raw_sup, raw_unsup
        else:
            if self._state is None:
                self._state = torch.zeros(3, device=g_sup.device, dtype=g_sup.dtype)
            elif self._state.device != g_sup.device:  # resumed elsewhere: move, never reset
                self._state = self._state.to(g_sup.device)
            ema_sup, ema_unsup, started = self._state.unbind()
            started = started > 0
            a = self.alpha
            new_sup = torch.where(started, a * ema_sup + (1 - a) * raw_sup, raw_sup)
            new_unsup = torch.where(started, a * ema_unsup + (1 - a) * raw_unsup, raw_unsup)
            self._state = torch.stack(
                [
                    torch.where(valid, new_sup, ema_sup),
                    torch.where(valid, new_unsup, ema_unsup),
                    (started | valid).to(g_sup.dtype),
                ]
            )
            applied_sup, applied_unsup = new_sup, new_unsup
        zero = torch.zeros_like(g_sup)
        sup = torch.where(valid, applied_sup, one)
        unsup = torch.where(valid, applied_unsup, torch.where(has_unsup, one, zero))
        return LossWeights(sup, unsup, raw_sup, raw_unsup)

    def reset(self) -> None:
        self._state = None

    def snapshot(self) -> Tensor | None:
        """A token for :meth:`restore`: the EMA tensor itself (:meth:`weights` replaces it,
        never writes into it, so holding it costs nothing)."""
        return self._state

    def restore(self, token: Tensor | None) -> None:
        self._state = token

    def to(self, device: torch.device | str) -> GradNormDebiaser:
        """Move the EMA to ``device`` (after loading a state saved elsewhere)."""
        if self._state is not None:
            self._state = self._state.to(device)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"state": None if self._state is None else self._state.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        s = state["state"]
        self._state = None if s is None else s.clone()
