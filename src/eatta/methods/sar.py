"""SAR (Niu et al., ICLR 2023): sharpness-aware, reliable entropy minimization with model recovery.

Per batch (following the authors' code, github.com/mr-eggplant/SAR):

1. forward at the weights ``θ``; reliable samples ``R1 = {i : H_i < E0}`` (``E0 = 0.4 ln C``);
   gradient ``g1`` of the mean entropy over ``R1``;
2. SAM ascent: ``θ' = θ + ρ g1 / ||g1||`` (ρ = 0.05, one global norm);
3. forward at ``θ'``; ``R2 = {i ∈ R1 : H'_i < E0}`` (filtered again at the perturbed weights);
   gradient ``g2`` of the mean entropy over ``R2``;
4. back to ``θ`` and one base-optimizer step with ``g2``;
5. recovery: ``ema ← 0.9 ema + 0.1 · loss2`` (``ema`` = ``loss2`` at first; not updated when
   ``R2`` is empty); when ``ema < 0.2`` the model and optimizer return to their initial state.
   As in the reference, the recovery keeps ``ema`` (so a low value can trigger again on the next
   batch); only :meth:`SAR.reset` clears it.

The returned logits are those of the first forward pass (before the update).

Parameters (:func:`sar_params`): SAR's code adapts the affine parameters of the normalization
layers except those of the last stage (``layer4`` of ResNets; blocks 9-11 and the final ``norm``
of a 12-block timm ViT); on models without such names this is every norm layer.

Deliberate difference from the reference: its model recovery reloads a SAM state dict that does
not contain the base optimizer's state, so SGD's momentum buffers survive a recovery there. Here
a recovery restores the base optimizer's state too (momentum cleared), as the paper describes
("reset to the original").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.configure import NORM_TYPES, configure
from eatta.losses import default_entropy_margin, entropy, masked_mean
from eatta.methods.base import AdaptiveMethod, Options
from eatta.methods.config import OptimizerConfig, ParamSelection, hparam
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.tent import set_grads, trainable

__all__ = ["SAM", "SAR", "SARRecord", "sar_param_filter", "sar_params"]


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimization around an existing optimizer (Foret et al., ICLR 2021).

    ``first_step()`` moves every parameter with a gradient to ``θ + ρ g / ||g||`` (``||g||`` one
    norm over all of them; ``adaptive`` scales by ``|θ|`` as in ASAM) and remembers ``θ``;
    ``second_step()`` puts ``θ`` back and lets the base optimizer step with the gradients now in
    ``.grad`` (those taken at the perturbed weights). ``step(closure)`` does both, the closure
    recomputing the loss and gradients at the perturbed weights.

    Parameter groups, state and ``state_dict()`` are the base optimizer's (its momentum buffers
    are saved and restored with it); ``ρ`` and ``adaptive`` are fixed attributes.
    """

    def __init__(
        self, base_optimizer: torch.optim.Optimizer, rho: float = 0.05, adaptive: bool = False
    ) -> None:
        if not isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"base_optimizer must be a torch.optim.Optimizer, got {type(base_optimizer)}"
            )
        if not rho >= 0.0:
            raise ValueError(f"rho must be >= 0, got {rho!r}")
        params = [p for g in base_optimizer.param_groups for p in g["params"]]
        super().__init__(params, dict(base_optimizer.defaults, rho=rho, adaptive=adaptive))
        self.base_optimizer = base_optimizer
        self.rho = float(rho)
        self.adaptive = bool(adaptive)
        self._share()
        self._saved: list[tuple[Tensor, Tensor]] = []

    def _share(self) -> None:
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state

    def _with_grad(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.grad is not None]

    @torch.no_grad()
    def grad_norm(self) -> Tensor:
        """One L2 norm over every gradient (scaled by ``|θ|`` when adaptive)."""
        params = self._with_grad()
        if not params:
            return torch.zeros(())
        dev = params[0].device
        norms = []
        for p in params:
            g = p.grad
            assert g is not None  # _with_grad keeps the parameters that have a gradient
            norms.append(((p.abs() * g) if self.adaptive else g).norm(2).to(dev))
        return torch.linalg.vector_norm(torch.stack(norms))

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        """Ascend to ``θ + ρ g / ||g||`` (remembering ``θ``)."""
        if self._saved:
            raise RuntimeError("first_step called twice without second_step")
        params = self._with_grad()
        scale = self.rho / (self.grad_norm() + 1e-12)
        for p in params:
            assert p.grad is not None
            e = p.grad * scale.to(p)
            if self.adaptive:
                e = e * p.pow(2)
            self._saved.append((p, p.detach().clone()))
            p.add_(e)
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def restore(self) -> None:
        """Put back the weights remembered by :meth:`first_step` (no optimizer step)."""
        for p, old in self._saved:
            p.copy_(old)
        self._saved = []

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        """Back to ``θ``, then the base optimizer's step with the current gradients."""
        self.restore()
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Both steps; ``closure`` must recompute the loss and its gradients (it is required)."""
        if closure is None:
            raise ValueError("SAM.step needs a closure that recomputes the loss and gradients")
        self.first_step(zero_grad=True)
        try:
            with torch.enable_grad():
                loss = closure()
        except BaseException:
            self.restore()
            raise
        self.second_step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.base_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.base_optimizer.load_state_dict(state_dict)
        self._share()


# -- parameters ----------------------------------------------------------------------------------

_SKIPPED_STAGES = ("layer4", "blocks.9", "blocks.10", "blocks.11")


def sar_param_filter(module_name: str, module: nn.Module, param_name: str) -> bool:
    """SAR's choice: norm affine parameters outside the last stage and the final ViT norm.

    Excludes modules under ``layer4`` (ResNets) or ``blocks.9``-``blocks.11`` (ViT-B/16 in timm)
    and the top-level ``norm`` (also under eatta's normalization wrapper, ``model.norm``).
    """
    if not isinstance(module, NORM_TYPES) or param_name not in ("weight", "bias"):
        return False
    dotted = f".{module_name}."
    if any(f".{stage}." in dotted for stage in _SKIPPED_STAGES):
        return False
    return module_name not in ("norm", "model.norm")


def sar_params(model: nn.Module) -> list[nn.Parameter]:
    """Configure ``model`` in place (see :func:`eatta.configure`) with SAR's parameter choice."""
    return configure(model, sar_param_filter)


# -- the method ----------------------------------------------------------------------------------


@dataclass
class SARRecord:
    """What one SAR step did (tensors detached)."""

    logits: Tensor
    reliable_first: Tensor  # bool [B]
    reliable_second: Tensor  # bool [B], a subset of reliable_first
    loss_first: Tensor
    loss_second: Tensor
    ema: float | None
    recovered: bool


def _update_ema(ema: float | None, value: float, momentum: float) -> float:
    return value if ema is None else momentum * ema + (1 - momentum) * value


class SAR(AdaptiveMethod):
    """Sharpness-aware reliable entropy minimization with model recovery.

    Args:
        model: a classifier configured in place (:func:`sar_params` or :func:`eatta.configure`).
        optimizer: a :class:`SAM` (or any optimizer, which is then wrapped in ``SAM(opt, rho)``).
        entropy_margin: ``E0``; default ``0.4 ln C`` with ``C`` read from the logits.
        reset_constant: recover when the loss EMA falls below it (0.2).
        ema_momentum: momentum of the loss EMA (0.9).
        rho: SAM radius when ``optimizer`` is not already a :class:`SAM` (0.05).
        options: what every method takes (:class:`~eatta.methods.base.Options`).

    ``num_recoveries`` counts model recoveries since the last :meth:`reset`.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        entropy_margin: float | None = None,
        reset_constant: float = 0.2,
        ema_momentum: float = 0.9,
        rho: float = 0.05,
        **options: Unpack[Options],
    ) -> None:
        if entropy_margin is not None and not entropy_margin > 0:
            raise ValueError(f"entropy_margin must be > 0, got {entropy_margin!r}")
        if not 0.0 <= ema_momentum <= 1.0:
            raise ValueError(f"ema_momentum must be in [0, 1], got {ema_momentum!r}")
        if optimizer is None:
            raise TypeError("SAR needs an optimizer (a SAM, or a base optimizer to wrap)")
        sam = optimizer if isinstance(optimizer, SAM) else SAM(optimizer, rho=rho)
        super().__init__(model, sam, **options)
        self.sam = sam
        self.entropy_margin = entropy_margin
        self.reset_constant = float(reset_constant)
        self.ema_momentum = float(ema_momentum)
        self._train: Sequence[nn.Parameter] = trainable(sam, "SAR")
        self.ema: float | None = None
        self.num_recoveries = 0
        self.last_step: SARRecord | None = None

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        logits = self.logits(x)
        if logits.dim() != 2:
            raise RuntimeError(f"the model must return [batch, classes], got {tuple(logits.shape)}")
        margin = (
            self.entropy_margin
            if self.entropy_margin is not None
            else default_entropy_margin(logits.shape[1])
        )
        h1 = entropy(logits)
        reliable1 = h1.detach() < margin
        loss1, _ = masked_mean(h1, reliable1)  # empty: 0 with zero gradients, as the reference
        set_grads(loss1, self._train)
        self.sam.first_step(zero_grad=True)
        try:
            h2 = entropy(self.logits(x))
            reliable2 = reliable1 & (h2.detach() < margin)
            loss2, n2 = masked_mean(h2, reliable2)
            set_grads(loss2, self._train)
        except BaseException:
            self.sam.restore()
            self.sam.zero_grad(set_to_none=True)
            raise
        self.sam.second_step(zero_grad=True)
        if int(n2) > 0:
            self.ema = _update_ema(self.ema, float(loss2.detach()), self.ema_momentum)
        recovered = self.ema is not None and self.ema < self.reset_constant
        if recovered:
            self._recover()
        self.last_step = SARRecord(
            logits=logits.detach(),
            reliable_first=reliable1,
            reliable_second=reliable2,
            loss_first=loss1.detach(),
            loss_second=loss2.detach(),
            ema=self.ema,
            recovered=recovered,
        )
        return logits.detach()

    def _recover(self) -> None:
        """Model recovery: initial model and optimizer, the loss EMA kept (as the reference)."""
        ema, count = self.ema, self.num_recoveries
        self.reset(keep_monitor=True)  # a recovery, not a new stream: the monitor goes on
        self.ema, self.num_recoveries = ema, count + 1

    # -- state -------------------------------------------------------------------------------
    def reset_method_state(self) -> None:
        super().reset_method_state()
        self.ema = None
        self.num_recoveries = 0

    def method_state(self) -> dict[str, Any]:
        return {"ema": self.ema, "num_recoveries": self.num_recoveries}

    def load_method_state(self, state: dict[str, Any]) -> None:
        ema = state.get("ema")
        self.ema = None if ema is None else float(ema)
        self.num_recoveries = int(state.get("num_recoveries", 0))


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SARConfig(OptimizerConfig):
    """SAR's keys (paper supplementary: SAM over SGD lr 1e-3, momentum 0.9 without Nesterov as in
    SAR's code; rho = 0.05, reset 0.2, E0 = 0.4 ln C, EMA 0.9); per-dataset rates in
    :mod:`eatta.methods.presets`."""

    lr: float = hparam(1e-3, "learning rate", min=0.0)
    params: Literal["sar"] | ParamSelection = hparam(
        "sar", "parameters to adapt ('sar': norm layers except the deepest blocks)"
    )
    rho: float = hparam(0.05, "SAM radius", min=0.0)
    reset_constant: float = hparam(0.2, "loss EMA below which the model is reset", min=0.0)
    ema_momentum: float = hparam(0.9, "EMA factor of the loss", min=0.0, max=1.0)
    entropy_margin: float | None = hparam(
        None, "reliability threshold E0 (None: 0.4 ln C)", min=0.0
    )


def _build_sar(
    model: nn.Module, cfg: SARConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    params = sar_params(model) if cfg.params == "sar" else configure(model, cfg.params)
    return SAR(
        model,
        SAM(make_optimizer(params, cfg), rho=cfg.rho),
        entropy_margin=cfg.entropy_margin,
        reset_constant=cfg.reset_constant,
        ema_momentum=cfg.ema_momentum,
        **cfg.options(),
        **parts,
    )


register(
    MethodSpec(
        "sar",
        _build_sar,
        config=SARConfig,
        datasets=DATASET_PRESETS["sar"],
        summary="SAR: sharpness-aware reliable entropy minimization with model recovery",
    )
)
