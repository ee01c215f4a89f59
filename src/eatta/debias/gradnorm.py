"""Gradient-norm debiasing of the supervised and unsupervised losses (paper Eq. 4-6)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = ["GradNormDebiaser", "LossWeights"]


class LossWeights(NamedTuple):
    """``(sup, unsup, sup_raw, unsup_raw)`` tensors: applied weights and the raw Eq. 4-5 values."""

    sup: Tensor
    unsup: Tensor
    sup_raw: Tensor
    unsup_raw: Tensor


class GradNormDebiaser:
    """Weights ``γ_sup = 2 g_u/(g_s+g_u)``, ``γ_unsup = 2 g_s/(g_s+g_u)``, smoothed by an EMA.

    The larger gradient gets the smaller weight; the two always sum to 2. The EMA (``alpha``)
    starts from the first raw values. ``normalize=False`` is the ablation without GND (weights
    1, 1); ``ema=False`` applies the raw weights. Everything stays on the device (no host sync).

    A degenerate step (no confident unlabelled sample, or both norms zero) weights the labelled
    term 1 and the empty term 0, and leaves the EMA untouched.

    ``sup_floor`` and ``unsup_cap`` bound the applied weights of a valid step,
    ``γ_sup = max(s, sup_floor)``, ``γ_unsup = min(u, unsup_cap)`` (``s, u`` the EMA-smoothed
    weights, whose EMA evolves unclamped; ``LossWeights.sup_raw`` / ``unsup_raw`` stay the Eq. 4-5
    values). The faithful defaults, 0 and 2, bound nothing (the weights lie in [0, 2]) and no
    clamp runs; :class:`~eatta.debias.bounded.BoundedGradNormDebiaser` sets both to 1.
    """

    def __init__(
        self,
        alpha: float = 0.8,
        normalize: bool = True,
        ema: bool = True,
        *,
        sup_floor: float = 0.0,
        unsup_cap: float = 2.0,
    ) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"EMA alpha must be in [0, 1], got {alpha}")
        for name, value in (("sup_floor", sup_floor), ("unsup_cap", unsup_cap)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not 0.0 <= float(value) <= 2.0:
                raise ValueError(f"{name} must be in [0, 2], got {value}")
        self.alpha = float(alpha)
        self.normalize = normalize
        self.ema = ema
        self.sup_floor, self.unsup_cap = float(sup_floor), float(unsup_cap)
        #: whether the bounds can change a weight (else the faithful weights, no clamp)
        self.bounded = self.sup_floor > 0.0 or self.unsup_cap < 2.0
        self._state: Tensor | None = None  # [ema_sup, ema_unsup, initialized]

    @property
    def needs_grad_norms(self) -> bool:
        """Whether :meth:`weights` uses the gradient norms (else one backward pass suffices)."""
        return self.normalize

    @property
    def current(self) -> tuple[Tensor, Tensor] | None:
        """The applied EMA weights ``(sup, unsup)`` (bounded), or None before the first update."""
        if self._state is None or not bool(self._state[2]):
            return None
        sup, unsup = self._state[0], self._state[1]
        if not self.bounded:
            return sup, unsup
        return sup.clamp(min=self.sup_floor), unsup.clamp(max=self.unsup_cap)

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
        if self.bounded:  # γ_sup = max(s, sup_floor), γ_unsup = min(u, unsup_cap) where valid
            sup = torch.where(valid, sup.clamp(min=self.sup_floor), sup)
            unsup = torch.where(valid, unsup.clamp(max=self.unsup_cap), unsup)
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
        state: dict[str, Any] = {"state": None if self._state is None else self._state.clone()}
        if self.bounded:
            state.update(sup_floor=self.sup_floor, unsup_cap=self.unsup_cap)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("sup_floor", "unsup_cap"):
            if float(state.get(key, (0.0, 2.0)[key == "unsup_cap"])) != getattr(self, key):
                raise ValueError(
                    f"state was saved with {key}={state.get(key)}, this debiaser has "
                    f"{getattr(self, key)}"
                )
        s = state["state"]
        self._state = None if s is None else s.clone()
