"""One BatchNorm replacement that mixes the source model's statistics with test statistics.

:class:`MixedBatchNorm` keeps the running statistics of the layer it replaces (the *source*
statistics) and normalizes with ``w · test + (1 − w) · source`` (mean and variance each), where
the *test* statistics are either those of the batch being normalized (``stats="batch"``:
gradients flow through them, as in TENT) or an exponential moving average over recent batches
(``stats="ema"``: RoTTA's robust BatchNorm, ``momentum`` α ≈ 0.05). The weight ``w`` on the test
statistics is explicit (:attr:`MixedBatchNorm.mix_weight`, settable at run time, e.g. from
evidence that adapting hurts) or comes from a prior of ``N`` source samples, ``w = n / (n + N)``
for a batch of ``n`` (Schneider et al., NeurIPS 2020).

Two settings reproduce existing layers exactly, bit for bit:

* ``stats="batch"``, weight 1: BatchNorm on the batch's statistics, what :func:`eatta.configure`
  sets up (TENT's normalization);
* weight 0: the given layer in eval mode, on its running statistics (the source model's
  behaviour).

:func:`use_mixed_norm` swaps every BatchNorm of a model for one, in place; :func:`set_mix_weight`
sets the weight on every layer. The statistics and the weight are buffers, so ``state_dict()``
resumes a stream bit-identically and a method's ``reset()`` (which reloads the model's state at
creation) returns to them. The windowed small-batch path (:mod:`eatta.window`) serves requests
with the EMA statistics (independent of the request's size, so a batch of 1 works) and adapts on
a window of recent samples under :func:`batch_statistics`, then folds the window's statistics
into the EMA with :func:`absorb_statistics`.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "MixedBatchNorm",
    "Stats",
    "absorb_statistics",
    "batch_statistics",
    "has_batchnorm",
    "mixed_norm_layers",
    "set_mix_weight",
    "use_mixed_norm",
]


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` normalizes with batch statistics when it adapts (any BatchNorm layer,
    :class:`MixedBatchNorm` included): such a model cannot adapt on a batch of one sample."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


_UNSET = -1.0  # test_weight when the weight comes from the prior (a number, so states compare)

#: Where a layer's test statistics come from.
Stats = Literal["batch", "ema"]

# None: each layer normalizes as configured; "batch": every layer on its batch's statistics
# (exactly BatchNorm as eatta.configure leaves it); "absorb": the same, and each layer folds the
# batch's statistics into its EMA. A context variable, so that copies of a model (a teacher, an
# anchor) follow the same phase as the model itself.
_PHASE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "eatta_norm_phase", default=None
)


def _check_fraction(name: str, value: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    ok = (0.0 < value if low_open else 0.0 <= value) and value <= 1.0
    if not ok or math.isnan(value):
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return value


class MixedBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm that normalizes with ``w · test + (1 − w) · source`` statistics.

    Build it with :meth:`from_batchnorm` (or :func:`use_mixed_norm` for a whole model). It is a
    ``_BatchNorm``, so :func:`eatta.configure` selects its affine parameters and eatta's methods
    treat it as BatchNorm; configuring drops ``running_mean``/``running_var`` as usual, but the
    source statistics live in their own buffers (``source_mean``, ``source_var``) and stay.

    Args:
        num_features: channels.
        source_mean: the source model's running mean.
        source_var: the source model's running variance.
        stats: ``"batch"`` (the statistics of the batch being normalized; gradients flow through
            them) or ``"ema"`` (an exponential moving average of batches' statistics).
        weight: the weight ``w`` on the test statistics, in [0, 1]; or
        prior: a prior of ``N`` source samples (``w = n / (n + N)`` for a batch of ``n``; with
            ``stats="batch"`` only). Neither: ``w = 1``.
        momentum: the EMA's rate α in (0, 1]. The first batches are averaged with weight
            ``max(α, 1 / k)`` for the k-th batch, so the EMA starts as the plain mean of the
            batches seen rather than from the source statistics.
        update: with ``stats="ema"``, fold each normalized batch into the EMA and normalize with
            the result (RoTTA: the batch's share carries gradients); False: the EMA changes only
            through :func:`absorb_statistics`.
        eps: as in BatchNorm.
    """

    source_mean: Tensor
    source_var: Tensor
    test_mean: Tensor
    test_var: Tensor
    test_batches: Tensor
    test_weight: Tensor

    def __init__(
        self,
        num_features: int,
        source_mean: Tensor,
        source_var: Tensor,
        *,
        stats: Stats = "batch",
        weight: float | None = None,
        prior: float | None = None,
        momentum: float = 0.05,
        update: bool = False,
        eps: float = 1e-5,
        affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if stats not in ("batch", "ema"):
            raise ValueError(f"stats must be 'batch' or 'ema', got {stats!r}")
        if weight is not None and prior is not None:
            raise ValueError(
                f"give either weight ({weight!r}) or prior ({prior!r}), not both: the weight on "
                "the test statistics is explicit or comes from the prior"
            )
        if prior is not None:
            if stats != "batch":
                raise ValueError(
                    f"prior={prior!r} weighs a batch's statistics by its size; with stats='ema' "
                    "set weight instead"
                )
            if isinstance(prior, bool) or not isinstance(prior, int | float) or not prior >= 0:
                raise ValueError(f"prior must be a number of samples >= 0, got {prior!r}")
            if math.isinf(prior):
                raise ValueError(f"prior must be finite (weight=0 serves the source), got {prior}")
        w = _UNSET if weight is None else _check_fraction("weight", weight)
        momentum = _check_fraction("momentum", momentum, low_open=True)
        if source_mean.shape != (num_features,) or source_var.shape != (num_features,):
            raise ValueError(
                f"source statistics must have shape ({num_features},), got "
                f"{tuple(source_mean.shape)} and {tuple(source_var.shape)}"
            )
        super().__init__(
            num_features,
            eps=eps,
            momentum=None,
            affine=affine,
            track_running_stats=False,
            device=device,
            dtype=dtype,
        )
        mean = source_mean.detach().clone().to(device=device, dtype=dtype)
        self.register_buffer("source_mean", mean)
        self.register_buffer("source_var", source_var.detach().clone().to(mean))
        self.register_buffer("test_mean", torch.zeros_like(mean))
        self.register_buffer("test_var", torch.ones_like(mean))
        self.register_buffer("test_batches", torch.zeros((), dtype=torch.long, device=mean.device))
        self.register_buffer(
            "test_weight", torch.tensor(w, dtype=torch.float64, device=mean.device)
        )
        self.stats: Stats = stats
        self.prior = None if prior is None else float(prior)
        self.ema_momentum = momentum
        self.update = bool(update)
        self._initial_weight = w

    @classmethod
    def from_batchnorm(
        cls,
        bn: nn.modules.batchnorm._BatchNorm,
        *,
        source: tuple[Tensor, Tensor] | None = None,
        stats: Stats = "batch",
        weight: float | None = None,
        prior: float | None = None,
        momentum: float = 0.05,
        update: bool = False,
    ) -> MixedBatchNorm:
        """The replacement of ``bn``: the same affine parameters (the same ``Parameter`` objects,
        so an optimizer built over them keeps working) and ``bn``'s running statistics as the
        source (or ``source=(mean, var)`` when ``bn`` has none, e.g. after
        :func:`eatta.configure`)."""
        if source is None:
            if bn.running_mean is None or bn.running_var is None:
                raise ValueError(
                    "this BatchNorm has no running statistics (built with "
                    "track_running_stats=False, or dropped by eatta.configure): swap before "
                    "configuring, or pass source= (a copy of the source model with them)"
                )
            source = (bn.running_mean, bn.running_var)
        ref = bn.weight if bn.weight is not None else source[0]
        new = cls(
            bn.num_features,
            source[0],
            source[1],
            stats=stats,
            weight=weight,
            prior=prior,
            momentum=momentum,
            update=update,
            eps=bn.eps,
            affine=bn.affine,
            device=ref.device,
            dtype=source[0].dtype,
        )
        if bn.affine:
            new.weight, new.bias = bn.weight, bn.bias  # shared: optimizers keep their parameters
        new.train(bn.training)
        return new

    # -- the mix ---------------------------------------------------------------------------------
    @property
    def mix_weight(self) -> float | None:
        """The explicit weight on the test statistics (None: from the prior, or 1 without one).

        Settable at run time (a float in [0, 1], or None to go back to the prior); kept in
        ``state_dict()`` as the buffer ``test_weight`` (-1 for None)."""
        w = float(self.test_weight)
        return None if w == _UNSET else w

    @mix_weight.setter
    def mix_weight(self, value: float | None) -> None:
        w = _UNSET if value is None else _check_fraction("mix_weight", value)
        self.test_weight.fill_(w)  # an explicit weight overrides the prior until set to None

    def weight_for(self, n: int) -> float:
        """The weight on the test statistics for a batch of ``n`` samples."""
        w = self.mix_weight
        if w is not None:
            return w
        if self.prior is not None:
            return n / (n + self.prior) if n + self.prior > 0 else 1.0
        return 1.0

    def _fold(self, mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
        """The EMA after folding in a batch's ``mean``/``var`` (differentiable in them); the
        buffers are updated with the detached result."""
        k = int(self.test_batches) + 1
        a = max(self.ema_momentum, 1.0 / k)
        new_mean = (1 - a) * self.test_mean + a * mean
        new_var = (1 - a) * self.test_var + a * var
        with torch.no_grad():
            self.test_mean.copy_(new_mean)
            self.test_var.copy_(new_var)
            self.test_batches.add_(1)
        return new_mean, new_var

    def reset_statistics(self) -> None:
        """Forget the test statistics and return the weight to its value at creation."""
        with torch.no_grad():
            self.test_mean.zero_()
            self.test_var.fill_(1.0)
            self.test_batches.zero_()
            self.test_weight.fill_(self._initial_weight)

    # -- forward ---------------------------------------------------------------------------------
    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected input [batch, channels, ...], got {input.dim()}-d")

    def _batch(self, x: Tensor) -> Tensor:
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

    def _with(self, x: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        if not (mean.requires_grad or var.requires_grad):  # constants: the kernel, exactly eval
            return F.batch_norm(x, mean, var, self.weight, self.bias, False, 0.0, self.eps)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.weight is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        x = input
        phase = _PHASE.get()
        if phase is not None:
            if phase == "absorb":
                with torch.no_grad():
                    var, mean = torch.var_mean(x, dim=_dims(x), unbiased=False)
                    self._fold(mean, var)
            return self._batch(x)
        w = self.weight_for(x.shape[0])
        if self.stats == "batch":
            if w == 1.0:
                return self._batch(x)  # exactly BatchNorm on the batch's statistics
            if w == 0.0:
                return self._with(x, self.source_mean, self.source_var)  # exactly the source
            var, mean = torch.var_mean(x, dim=_dims(x), unbiased=False)
        elif self.update:
            var, mean = torch.var_mean(x, dim=_dims(x), unbiased=False)
            mean, var = self._fold(mean, var)
        elif int(self.test_batches) == 0:  # no test statistics yet: the source model's
            return self._with(x, self.source_mean, self.source_var)
        else:
            mean, var = self.test_mean, self.test_var
        if w == 1.0:
            return self._with(x, mean, var)
        if w == 0.0:
            return self._with(x, self.source_mean, self.source_var)
        return self._with(
            x, w * mean + (1 - w) * self.source_mean, w * var + (1 - w) * self.source_var
        )

    def extra_repr(self) -> str:
        mix = (
            f"weight={self.mix_weight}"
            if self.mix_weight is not None
            else (f"prior={self.prior}" if self.prior is not None else "weight=1")
        )
        ema = f", momentum={self.ema_momentum}, update={self.update}" if self.stats == "ema" else ""
        return f"{self.num_features}, eps={self.eps}, stats={self.stats!r}, {mix}{ema}"


def _dims(x: Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def mixed_norm_layers(model: nn.Module) -> list[MixedBatchNorm]:
    """The model's :class:`MixedBatchNorm` layers, each once, in module order."""
    seen: set[int] = set()
    out = []
    for m in model.modules():
        if isinstance(m, MixedBatchNorm) and id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def use_mixed_norm(
    model: nn.Module,
    *,
    stats: Stats = "batch",
    weight: float | None = None,
    prior: float | None = None,
    momentum: float = 0.05,
    update: bool = False,
    source: nn.Module | None = None,
) -> list[str]:
    """Swap every BatchNorm of ``model`` for a :class:`MixedBatchNorm`, in place.

    The source statistics are each layer's running statistics, or those of the same-named layer
    of ``source`` (a copy of the source model) when ``model`` was already configured by
    :func:`eatta.configure` (which drops them). Affine parameters are shared, not copied, so an
    optimizer built before the swap keeps working. Layers that already are ``MixedBatchNorm`` are
    left as they are. Returns the qualified names of the swapped layers (empty for a model
    without BatchNorm). Every argument is checked, and every layer's statistics found, before
    the model changes.
    """
    named = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, MixedBatchNorm)
    ]
    theirs = dict(source.named_modules()) if source is not None else {}
    built: dict[int, MixedBatchNorm] = {}
    for name, bn in named:
        if id(bn) in built:
            continue
        stats_from: tuple[Tensor, Tensor] | None = None
        if bn.running_mean is None or bn.running_var is None:
            other = theirs.get(name)
            if not isinstance(other, nn.modules.batchnorm._BatchNorm) or (
                other.running_mean is None or other.running_var is None
            ):
                where = (
                    "source= has no such BatchNorm with them"
                    if source is not None
                    else "pass source= (a copy of the model with them, before eatta.configure)"
                )
                raise ValueError(
                    f"BatchNorm layer {name!r} has no running statistics (built with "
                    f"track_running_stats=False, or dropped by eatta.configure), and serving "
                    f"between steps normalizes with them; {where}"
                )
            stats_from = (other.running_mean, other.running_var)
        built[id(bn)] = MixedBatchNorm.from_batchnorm(
            bn,
            source=stats_from,
            stats=stats,
            weight=weight,
            prior=prior,
            momentum=momentum,
            update=update,
        )
    swapped = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if id(child) in built:
                setattr(parent, child_name, built[id(child)])
                swapped.append(f"{parent_name}.{child_name}" if parent_name else child_name)
    return swapped


def set_mix_weight(model: nn.Module, weight: float | None) -> int:
    """Set :attr:`MixedBatchNorm.mix_weight` on every such layer of ``model`` (0: the given
    model's statistics, 1: the test statistics; None: back to each layer's prior). Returns how
    many layers were set; a model without any is an error (nothing to set)."""
    layers = mixed_norm_layers(model)
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no MixedBatchNorm layer (use_mixed_norm swaps them in)"
        )
    if weight is not None:
        _check_fraction("mix weight", weight)
    for layer in layers:
        layer.mix_weight = weight
    return len(layers)


@contextmanager
def batch_statistics(*, absorb: bool = False) -> Iterator[None]:
    """Within: every :class:`MixedBatchNorm` normalizes with its batch's statistics, exactly as
    BatchNorm configured by :func:`eatta.configure` (the windowed path's adaptation step); with
    ``absorb``, each also folds the batch's statistics into its EMA."""
    token = _PHASE.set("absorb" if absorb else "batch")
    try:
        yield
    finally:
        _PHASE.reset(token)


@torch.no_grad()
def absorb_statistics(model: nn.Module, x: Tensor) -> None:
    """Fold the statistics of ``x`` (as normalized by ``model``'s current parameters) into the
    EMA of every :class:`MixedBatchNorm` of ``model``: one forward pass, no gradients."""
    with batch_statistics(absorb=True):
        model(x)
