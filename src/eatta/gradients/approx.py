"""The approximate gradient (``grad_mode="approx"``): EATTA's two norms estimated cheaply, one pass.

The exact step needs ``g_sup = ||∇L_sup||`` and ``g_unsup = ||∇L_unsup||`` over the adapted
parameters: two backward passes through the whole network. Gradient-norm debiasing only uses
their ratio, so an estimate whose ratio follows the exact one lets the step make one backward
pass on ``γ_sup·L_sup + γ_unsup·L_unsup``. The estimates here (``benchmarks/approx_proxy_study.py``
measures how well each ratio tracks the exact one):

* ``"last-norm"``: the two norms over the affine parameters of the backbone's last normalization
  layer only (GradNorm's "last shared layer"): two small backward passes that stop there.
* ``"auto"`` (the default): ``"last-norm"`` where the backbone has such a layer among the measured
  parameters, else ``"head"``, so the approximate step runs on every model the exact one does.
* ``"head"``: the norms of the gradients with respect to the head's input features, in closed
  form through a linear head: ``δ = ∂L/∂logits`` (cross-entropy: ``(p − e_y)/n``; entropy:
  ``−p ⊙ (log p + H)/n``), then ``δ W`` (:func:`logit_grad_ce`, :func:`logit_grad_entropy`,
  :func:`feature_grad`); computed by autograd down to the features, which is the same.

:class:`NormCalibration` adds the "refresh" of both: every ``period`` steps the exact norms are
computed (two backward passes) and the ratio ``exact / estimate`` of each loss is kept, scaling
the estimates of the steps between.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from eatta.configure import NORM_TYPES
from eatta.gradients.exact import ExactGradient, GradientStrategy, SegmentPlan, dense

__all__ = [
    "ApproxGradient",
    "NormCalibration",
    "ProxyName",
    "feature_grad",
    "last_norm_params",
    "logit_grad_ce",
    "logit_grad_entropy",
    "proxy_norms",
]

#: Which cheap estimate of the two gradient norms the approximate step uses.
ProxyName = Literal["auto", "last-norm", "head"]


def logit_grad_ce(logits: Tensor, targets: Tensor) -> Tensor:
    """``∂/∂logits`` of ``F.cross_entropy(logits, targets)`` (mean): ``(softmax − one_hot)/n``."""
    p = logits.softmax(1)
    p[torch.arange(len(targets), device=logits.device), targets] -= 1
    return p / len(targets)


def logit_grad_entropy(logits: Tensor, mask: Tensor) -> Tensor:
    """``∂/∂logits`` of the mean entropy of the rows in ``mask`` (zero rows elsewhere).

    Per row ``H = −Σ p log p`` has ``∂H/∂o = −p ⊙ (log p + H)``.
    """
    logp = logits.log_softmax(1)
    p = logp.exp()
    h = -(p * logp).sum(1, keepdim=True)
    g = -p * (logp + h)
    n = mask.sum().clamp_min(1)
    return g * mask[:, None].to(g.dtype) / n


def feature_grad(delta: Tensor, weight: Tensor) -> Tensor:
    """``∂L/∂features`` through a linear head ``o = z Wᵀ + b`` given ``δ = ∂L/∂o``: ``δ W``."""
    return delta @ weight


def last_norm_params(backbone: nn.Module, allowed: Sequence[Tensor]) -> list[nn.Parameter]:
    """Affine parameters of the last normalization layer (in registration order) among
    ``allowed``: torchvision ResNets register their final block's last BatchNorm last, ViTs
    their final LayerNorm, a ``Sequential`` its last norm layer."""
    ids = {id(p) for p in allowed}
    last: list[nn.Parameter] = []
    for module in backbone.modules():
        if isinstance(module, NORM_TYPES):
            own = [p for p in module.parameters(recurse=False) if id(p) in ids]
            if own:
                last = own
    return last


def _norm(grads: Sequence[Tensor | None], like: Tensor) -> Tensor:
    present = [g.reshape(-1) for g in grads if g is not None]
    if not present:
        return like.new_zeros(())
    return torch.linalg.vector_norm(torch.cat(present))


def proxy_norms(
    loss_sup: Tensor, loss_unsup: Tensor, at: Sequence[Tensor]
) -> tuple[Tensor, Tensor]:
    """The two losses' gradient norms with respect to ``at`` (a layer's parameters, or the
    features), each by a backward pass that stops there; the graph is kept for the update.
    Nothing to measure at (``at`` empty): both zero, a degenerate step for the debiaser."""
    if not at:
        return loss_sup.new_zeros(()), loss_unsup.new_zeros(())
    gs = torch.autograd.grad(loss_sup, at, retain_graph=True, allow_unused=True)
    gu = torch.autograd.grad(loss_unsup, at, retain_graph=True, allow_unused=True)
    return _norm(gs, loss_sup), _norm(gu, loss_unsup)


class NormCalibration:
    """Every ``period`` steps, the exact norms' ratio to the estimates; scales the estimates
    between. ``period=None``: never (the estimates are used as they are).

    State: the steps counted and the two scales (``exact / estimate`` at the last refresh, 1
    before the first). Every step with both losses counts (:meth:`advance`), rolled back with
    the method's other parts when the step is skipped.
    """

    def __init__(self, period: int | None) -> None:
        if period is not None and (
            isinstance(period, bool) or not isinstance(period, int) or period < 1
        ):
            raise ValueError(f"approx_refresh must be an int >= 1 or None, got {period!r}")
        self.period = period
        self.steps = 0
        self._scale: Tensor | None = None

    @property
    def due(self) -> bool:
        """Whether this step computes the exact norms."""
        return self.period is not None and self.steps % self.period == 0

    def scale(self, est_sup: Tensor, est_unsup: Tensor) -> tuple[Tensor, Tensor]:
        """The estimates times the scales of the last refresh."""
        if self._scale is None:
            return est_sup, est_unsup
        s = self._scale.to(est_sup.device, est_sup.dtype)
        return est_sup * s[0], est_unsup * s[1]

    def refresh(self, est: tuple[Tensor, Tensor], exact: tuple[Tensor, Tensor]) -> None:
        """Keep ``exact / estimate`` of each loss (a zero or non-finite quotient keeps the old
        scale)."""
        e, x = torch.stack(est), torch.stack(exact)
        q = x / torch.where(e > 0, e, torch.ones_like(e))
        ok = (e > 0) & (x > 0) & torch.isfinite(q)
        old = torch.ones_like(q) if self._scale is None else self._scale.to(q.device, q.dtype)
        self._scale = torch.where(ok, q, old).detach()

    def advance(self) -> None:
        self.steps += 1

    def snapshot(self) -> tuple[int, Tensor | None]:
        """A token for :meth:`restore` (the scale tensor is replaced, never written into)."""
        return self.steps, self._scale

    def restore(self, token: tuple[int, Tensor | None]) -> None:
        self.steps, self._scale = token

    def to(self, device: torch.device | str) -> NormCalibration:
        """Move the scales to ``device`` (after loading a state saved elsewhere)."""
        if self._scale is not None:
            self._scale = self._scale.to(device)
        return self

    def reset(self) -> None:
        self.steps = 0
        self._scale = None

    def state_dict(self) -> dict[str, Any]:
        scale = None if self._scale is None else self._scale.clone()
        return {"period": self.period, "steps": self.steps, "scale": scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["period"] != self.period:
            raise ValueError(
                f"state was saved with approx_refresh={state['period']}, this step has "
                f"{self.period}"
            )
        self.steps = int(state["steps"])
        s = state["scale"]
        self._scale = None if s is None else s.clone()


def check_proxy(name: str) -> ProxyName:
    """``name`` if it is a :data:`ProxyName`, else a ``ValueError`` naming it."""
    if name not in get_args(ProxyName):
        raise ValueError(f"approx_proxy must be one of {get_args(ProxyName)}, got {name!r}")
    return name  # type: ignore[return-value]  # checked above


class ApproxGradient(ExactGradient):
    """One backward pass on the weighted sum, its weights from estimated norms.

    ``proxy``: ``"last-norm"`` (the norms over the backbone's last normalization layer's affine
    parameters, found with the split: on the first batch for models only a batch splits),
    ``"head"`` (at the head's input features) or ``"auto"`` (``"last-norm"`` where the backbone
    has such a layer, else ``"head"``; :attr:`proxy` says which once the split is found).
    ``calibration``: the refresh schedule and scales.
    """

    approximate = True

    def __init__(
        self,
        strategy: GradientStrategy,
        train: Sequence[nn.Parameter],
        measure: Sequence[nn.Parameter],
        needs_norms: bool,
        proxy: ProxyName,
        calibration: NormCalibration,
        backbone: Callable[[], nn.Module],
    ) -> None:
        super().__init__(strategy, train, measure, needs_norms)
        self.backbone = backbone  # the split's, when the proxy is looked for
        self.proxy: ProxyName = proxy
        self.calibration = calibration
        self.covers_update = False  # estimated norms say nothing of the update's finiteness
        self.proxy_params: list[nn.Parameter] | None = None if proxy != "head" else []
        self._measure = list(measure)

    def find_proxy(self) -> None:
        """Find the "last-norm" parameters in the backbone if not found yet (``"auto"``
        without any: the head's input instead; ``"last-norm"`` without any: an error)."""
        if self.proxy_params is not None:
            return
        params = last_norm_params(self.backbone(), self._measure)
        if not params and self.proxy == "last-norm":
            raise ValueError(
                "approx_proxy='last-norm' needs a normalization layer with measured affine "
                "parameters in the backbone; use approx_proxy='head' (or 'auto')"
            )
        self.proxy = "last-norm" if params else "head"
        self.proxy_params = params

    def plan(self, o: Tensor) -> SegmentPlan | None:
        if not self.calibration.due:
            return None  # between refreshes: one backward pass, no plan
        return super().plan(o)

    def norms(
        self,
        loss_sup: Tensor,
        loss_unsup: Tensor,
        plan: SegmentPlan | None = None,
        features: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        self.measured = self.estimated = False
        if not self.needs_norms:
            return super().norms(loss_sup, loss_unsup)
        if self.proxy_params is None:  # the split is known by now
            self.find_proxy()
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
        exact = super().norms(loss_sup, loss_unsup, plan)
        cal.refresh(est, exact)
        return exact

    def weighted(self, w_sup: Tensor, w_unsup: Tensor) -> list[Tensor]:
        if (
            self.estimated and self._losses is not None
        ):  # one pass: ∇(γ_sup·L_sup + γ_unsup·L_unsup)
            loss_sup, loss_unsup = self._losses
            self._losses = None
            total = w_sup * loss_sup + w_unsup * loss_unsup
            return dense(torch.autograd.grad(total, self.train, allow_unused=True), self.train)
        return super().weighted(w_sup, w_unsup)
