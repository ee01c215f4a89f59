"""The gradient of EATTA's update, ``γ_sup·∇L_sup + γ_unsup·∇L_unsup`` (paper Eq. 2), as strategies.

The step asks its :class:`ExactUpdate` (or :class:`ApproxUpdate`) for the two gradient norms
``‖∇L_sup‖₂``, ``‖∇L_unsup‖₂`` (the inputs of Eq. 4-5), lets the debiaser turn them into the
weights, and asks for the weighted gradient with those weights (``weighted_gradient``):

* :class:`ExactUpdate`: both gradients, by two backward passes (the
  :class:`~eatta.methods._grads.GradientStrategy` of ``grad_mode``: two-pass, segmented,
  batched), their norms over the measured parameters, then the weighted sum (:func:`weighted_sum`).
  A debiaser that needs no norms (weights 1, 1) gets ``∇(L_sup + L_unsup)`` in one pass instead.
* :class:`ApproxUpdate` (``grad_mode="approx"``): the norms estimated cheaply
  (:mod:`eatta.methods._approx`), then ONE backward pass on ``γ_sup·L_sup + γ_unsup·L_unsup``:
  the same weighted gradient by linearity, from estimated weights. Every ``refresh`` steps it
  runs as :class:`ExactUpdate` and rescales its estimates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from eatta.methods._approx import NormCalibration, ProxyName, last_norm_params, proxy_norms
from eatta.methods._grads import GradientStrategy, SegmentPlan
from eatta.methods.base import unique_params

__all__ = ["ApproxUpdate", "ExactUpdate", "global_norm", "weighted_sum"]


def global_norm(grads: Sequence[Tensor | None]) -> Tensor:
    """``‖(g_1, ..., g_n)‖₂`` over the present gradients (fused per-tensor norms)."""
    present = [g for g in grads if g is not None]
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(present)))


def weighted_sum(a: Tensor, xs: list[Tensor], b: Tensor, ys: list[Tensor]) -> list[Tensor]:
    """``a·x_i + b·y_i`` for every pair, in two fused calls."""
    out = list(torch._foreach_mul(xs, a))
    torch._foreach_add_(out, torch._foreach_mul(ys, b))
    return out


def _dense(grads: Sequence[Tensor | None], params: Sequence[nn.Parameter]) -> list[Tensor]:
    """Each parameter's gradient, zeros where a loss does not reach it."""
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=False)]


class ExactUpdate:
    """The exact norms and weighted gradient (see the module docstring).

    ``train``: the updated parameters; ``measure``: those the two norms are measured over (the
    optimizer's, or e.g. all normalization layers for the reference preset).
    """

    def __init__(
        self,
        strategy: GradientStrategy,
        train: Sequence[nn.Parameter],
        measure: Sequence[nn.Parameter],
    ) -> None:
        self.strategy = strategy
        self.train = list(train)
        train_ids, measure_ids = {id(p) for p in train}, {id(p) for p in measure}
        self.params = self.train + [p for p in unique_params(measure) if id(p) not in train_ids]
        self.measure_pos = [i for i, p in enumerate(self.params) if id(p) in measure_ids]
        #: whether the two norms already saw every gradient of the update (no extra check)
        self.covers_update = train_ids <= measure_ids
        self.measured = False  # whether the last norms were computed (else the debiaser's 1, 1)
        self.estimated = False  # whether the last norms were estimates (ApproxUpdate)
        self._sup: list[Tensor] = []
        self._unsup: list[Tensor] = []
        self._losses: tuple[Tensor, Tensor] | None = None

    def plan(self, o: Tensor, needs_norms: bool) -> SegmentPlan | None:
        """Cut points below the logits ``o`` for the two passes (None: no plan needed)."""
        return self.strategy.plan(o, self.params) if needs_norms else None

    def entropy_only(self, loss_unsup: Tensor) -> list[Tensor]:
        """``∇L_unsup`` alone (a step without a label: weight 1)."""
        self.measured = self.estimated = False
        return _dense(torch.autograd.grad(loss_unsup, self.train, allow_unused=True), self.train)

    def norms(
        self,
        loss_sup: Tensor,
        loss_unsup: Tensor,
        needs_norms: bool,
        plan: SegmentPlan | None = None,
        features: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(‖∇L_sup‖₂, ‖∇L_unsup‖₂)`` over the measured parameters; zeros when the debiaser
        does not need them (its weights are then 1, 1)."""
        self.measured = self.estimated = False
        if not needs_norms:
            self._losses = (loss_sup, loss_unsup)
            zero = loss_sup.new_zeros(())
            return zero, zero
        self._losses = None
        gs, gu = self.strategy.grads(loss_sup, loss_unsup, self.params, plan)
        zero = loss_sup.new_zeros(())
        g_sup = global_norm([gs[i] for i in self.measure_pos] + [zero])
        g_unsup = global_norm([gu[i] for i in self.measure_pos] + [zero])
        self._sup, self._unsup = _dense(gs, self.train), _dense(gu, self.train)
        self.measured = True
        return g_sup, g_unsup

    def weighted_gradient(self, w_sup: Tensor, w_unsup: Tensor) -> list[Tensor]:
        """``γ_sup·∇L_sup + γ_unsup·∇L_unsup`` for the updated parameters."""
        if self._losses is not None:  # weights 1, 1: the sum's gradient in one pass
            loss_sup, loss_unsup = self._losses
            self._losses = None
            g = torch.autograd.grad(loss_sup + loss_unsup, self.train, allow_unused=True)
            return _dense(g, self.train)
        sup, unsup = self._sup, self._unsup
        self._sup, self._unsup = [], []
        return weighted_sum(w_sup, sup, w_unsup, unsup)


class ApproxUpdate(ExactUpdate):
    """One backward pass on the weighted sum, its weights from estimated norms.

    ``proxy``: ``"last-norm"`` (the norms over the backbone's last normalization layer's affine
    parameters, found with the split: on the first batch for models only a batch splits),
    ``"head"`` (at the head's input features) or ``"auto"`` (``"last-norm"`` where the backbone
    has such a layer, else ``"head"``; :attr:`proxy` says which once the split is found).
    ``calibration``: the refresh schedule and scales.
    """

    def __init__(
        self,
        strategy: GradientStrategy,
        train: Sequence[nn.Parameter],
        measure: Sequence[nn.Parameter],
        proxy: ProxyName,
        calibration: NormCalibration,
    ) -> None:
        super().__init__(strategy, train, measure)
        self.proxy: ProxyName = proxy
        self.calibration = calibration
        self.covers_update = False  # estimated norms say nothing of the update's finiteness
        self.proxy_params: list[nn.Parameter] | None = None if proxy != "head" else []
        self._measure = list(measure)

    def find_proxy(self, backbone: Callable[[], nn.Module]) -> None:
        """Find the "last-norm" parameters in ``backbone()`` if not found yet (``"auto"``
        without any: the head's input instead; ``"last-norm"`` without any: an error)."""
        if self.proxy_params is not None:
            return
        params = last_norm_params(backbone(), self._measure)
        if not params and self.proxy == "last-norm":
            raise ValueError(
                "approx_proxy='last-norm' needs a normalization layer with measured affine "
                "parameters in the backbone; use approx_proxy='head' (or 'auto')"
            )
        self.proxy = "last-norm" if params else "head"
        self.proxy_params = params

    def plan(self, o: Tensor, needs_norms: bool) -> SegmentPlan | None:
        if not self.calibration.due:
            return None  # between refreshes: one backward pass, no plan
        return super().plan(o, needs_norms)

    def norms(
        self,
        loss_sup: Tensor,
        loss_unsup: Tensor,
        needs_norms: bool,
        plan: SegmentPlan | None = None,
        features: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        self.measured = self.estimated = False
        if not needs_norms:
            return super().norms(loss_sup, loss_unsup, needs_norms)
        cal = self.calibration
        at: list[Tensor] = list(self.proxy_params or [])
        if self.proxy == "head" and features is not None:
            at = [features]
        due = cal.due
        cal.advance()  # rolled back with the other parts if the step is skipped
        est = proxy_norms(loss_sup, loss_unsup, at)
        if not due:  # the estimates, scaled as the last refresh said
            self._losses = (loss_sup, loss_unsup)
            self.estimated = True
            return cal.scale(*est)
        exact = super().norms(loss_sup, loss_unsup, needs_norms, plan)
        cal.refresh(est, exact)
        return exact

    def weighted_gradient(self, w_sup: Tensor, w_unsup: Tensor) -> list[Tensor]:
        if (
            self.estimated and self._losses is not None
        ):  # one pass: ∇(γ_sup·L_sup + γ_unsup·L_unsup)
            loss_sup, loss_unsup = self._losses
            self._losses = None
            total = w_sup * loss_sup + w_unsup * loss_unsup
            return _dense(torch.autograd.grad(total, self.train, allow_unused=True), self.train)
        return super().weighted_gradient(w_sup, w_unsup)
