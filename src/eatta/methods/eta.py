"""ETA and EATA (Niu et al., ICML 2022): entropy minimization on reliable, non-redundant samples.

Per batch (following the authors' code, github.com/mr-eggplant/EATA):

1. entropy ``H`` of every sample; reliable samples have ``H < E0`` (``E0 = 0.4 ln C``);
2. a reliable sample is redundant when the cosine similarity between its softmax and a moving
   average ``m`` of earlier kept samples' softmax is at least ``d_margin`` (0.05); the first batch
   has no average and skips this filter;
3. the kept samples' entropies are weighted by ``1 / exp(H - E0)`` and averaged over the kept
   samples; EATA adds the Fisher regularizer ``alpha · Σ F (θ - θ0)²``;
4. one optimizer step, only if at least one sample was kept;
5. ``m ← 0.9 m + 0.1 · mean softmax of the kept samples`` (on the first batch, ``m`` = that mean;
   unchanged when nothing was kept).

The Fisher information ``F`` is the average over clean batches of the squared gradient of the
batch's cross-entropy against its own pseudo-labels (:func:`compute_fishers`, as in EATA's code).

Deliberate difference from the reference: ``reset()`` also clears the probability average and the
counters (EATA's own reset restores only the model and the optimizer), so a per-domain reset
starts from exactly the state at creation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.configure import configure
from eatta.losses import default_entropy_margin, entropy
from eatta.methods.base import AdaptiveMethod, InvalidInputError, Options, is_finite, read_logits
from eatta.methods.config import OptimizerConfig, ParamSelection, hparam
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.tent import set_grads, trainable
from eatta.split import ModelSplit

__all__ = ["ETA", "EATAFisher", "ETARecord", "FisherInfo", "compute_fishers"]

#: Parameter name -> (Fisher information, parameter value it was measured at).
FisherInfo = dict[str, tuple[Tensor, Tensor]]


@dataclass
class ETARecord:
    """What one ETA step did (tensors detached, on the model's device)."""

    logits: Tensor
    entropy: Tensor
    reliable: Tensor  # bool [B]: H < E0
    kept: Tensor  # bool [B]: reliable and not redundant
    weights: Tensor  # [B]: 1 / exp(H - E0) on kept samples, 0 elsewhere
    loss: Tensor  # the minimized loss (entropy term + Fisher term)
    updated: bool  # whether the optimizer stepped


class ETA(AdaptiveMethod):
    """Efficient anti-forgetting TTA without the Fisher regularizer (the paper's "ETA").

    Args:
        model: a classifier prepared with :func:`eatta.configure` (in place).
        optimizer: over the norm affine parameters (SGD lr 2.5e-4, momentum 0.9 in the paper).
        entropy_margin: ``E0``; default ``0.4 ln C`` with ``C`` read from the logits.
        d_margin: cosine-similarity threshold of the redundancy filter (0.05).
        prob_momentum: momentum of the moving average of kept samples' probabilities (0.9).
        options: what every method takes (:class:`~eatta.methods.base.Options`).

    Attributes ``num_reliable`` and ``num_kept`` count, since the last reset, the samples that
    passed the first filter and both filters.
    """

    optimizer: torch.optim.Optimizer  # required here (the base allows None)

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        entropy_margin: float | None = None,
        d_margin: float = 0.05,
        prob_momentum: float = 0.9,
        **options: Unpack[Options],
    ) -> None:
        if entropy_margin is not None and not entropy_margin > 0:
            raise ValueError(f"entropy_margin must be > 0, got {entropy_margin!r}")
        if not 0.0 <= prob_momentum <= 1.0:
            raise ValueError(f"prob_momentum must be in [0, 1], got {prob_momentum!r}")
        super().__init__(model, optimizer, **options)
        self.entropy_margin = entropy_margin
        self.d_margin = float(d_margin)
        self.prob_momentum = float(prob_momentum)
        self._train = trainable(optimizer, type(self).__name__)
        self.model_probs: Tensor | None = None
        self.num_reliable = 0
        self.num_kept = 0
        self.last_step: ETARecord | None = None

    def regularizer(self) -> Tensor | None:
        """An extra loss term added to the entropy loss (None for ETA)."""
        return None

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        logits = self.logits(x)
        if logits.dim() != 2:
            raise RuntimeError(f"the model must return [batch, classes], got {tuple(logits.shape)}")
        margin = (
            self.entropy_margin
            if self.entropy_margin is not None
            else default_entropy_margin(logits.shape[1])
        )
        h = entropy(logits)
        reliable = h.detach() < margin
        probs = logits.detach().softmax(dim=1)
        kept = reliable
        if self.model_probs is not None:
            cos = F.cosine_similarity(self.model_probs.unsqueeze(0), probs, dim=1)
            kept = reliable & (cos.abs() < self.d_margin)
        n_kept = int(kept.sum())
        weights = torch.where(kept, torch.exp(margin - h.detach()), torch.zeros_like(h))
        loss = (h * weights).sum() / max(n_kept, 1)
        reg = self.regularizer()
        if reg is not None:
            loss = loss + reg
        if n_kept:
            set_grads(loss, self._train)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            mean = probs[kept].mean(dim=0)
            if self.model_probs is None:
                self.model_probs = mean
            else:
                m = self.prob_momentum
                self.model_probs = m * self.model_probs + (1 - m) * mean
        self.num_reliable += int(reliable.sum())
        self.num_kept += n_kept
        self.last_step = ETARecord(
            logits=logits.detach(),
            entropy=h.detach(),
            reliable=reliable,
            kept=kept,
            weights=weights,
            loss=loss.detach(),
            updated=bool(n_kept),
        )
        return logits.detach()

    # -- state -------------------------------------------------------------------------------
    def reset_method_state(self) -> None:
        super().reset_method_state()
        self.model_probs = None
        self.num_reliable = 0
        self.num_kept = 0

    def method_state(self) -> dict[str, Any]:
        return {
            "model_probs": None if self.model_probs is None else self.model_probs.clone(),
            "num_reliable": self.num_reliable,
            "num_kept": self.num_kept,
        }

    def load_method_state(self, state: dict[str, Any]) -> None:
        probs = state.get("model_probs")
        self.model_probs = None if probs is None else probs.clone()
        self.num_reliable = int(state.get("num_reliable", 0))
        self.num_kept = int(state.get("num_kept", 0))


def _named_trainable(model: nn.Module, params: Sequence[nn.Parameter]) -> dict[str, nn.Parameter]:
    wanted = {id(p) for p in params}
    named: dict[str, nn.Parameter] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in wanted and id(p) not in seen:
            seen.add(id(p))
            named[name] = p
    return named


def _batch_input(batch: Any) -> Tensor:
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    if not isinstance(x, Tensor):
        raise TypeError(
            f"fisher_data must yield tensors or (inputs, ...) tuples, got {type(batch).__name__}"
        )
    return x


def compute_fishers(
    model: nn.Module,
    data: Iterable[Any],
    params: Sequence[nn.Parameter] | None = None,
    split: ModelSplit | tuple[nn.Module, nn.Module] | None = None,
) -> FisherInfo:
    """Diagonal Fisher information of ``params`` on clean data, as EATA's code computes it.

    For each batch of ``data`` (tensors, or tuples whose first element is the input; labels are
    ignored), the cross-entropy of the model's output against its own arg-max pseudo-labels is
    averaged over the batch and its gradient squared; ``F`` is the mean of these squares over the
    batches. Also records the parameters' current values ``θ0``. The model should already be
    configured for adaptation (EATA computes the Fisher after configuring, BatchNorm on batch
    statistics). Neither the parameters nor their ``.grad`` are modified.

    Args:
        model: the source model.
        data: clean (source-like) batches, e.g. a DataLoader.
        params: parameters to measure; default every parameter with ``requires_grad``.
        split: ``(backbone, head)`` to read the logits through, for a model whose output is not
            them (as the methods read it: :func:`eatta.methods.base.read_logits`).
    """
    if params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    named = _named_trainable(model, params)
    if not named:
        raise ValueError("no parameters of the model to compute the Fisher information for")
    names = list(named)
    ref = named[names[0]]
    frozen = [p for p in named.values() if not p.requires_grad]
    sums: dict[str, Tensor] = {}
    batches = 0
    try:
        for p in frozen:  # gradients are needed even for parameters the caller froze
            p.requires_grad_(True)
        with torch.enable_grad():
            for batch in data:
                x = _batch_input(batch)
                if not x.is_floating_point() or x.dim() < 2 or x.shape[0] == 0:
                    raise InvalidInputError(
                        "fisher_data batches must be non-empty floating-point [batch, ...] "
                        f"tensors, got dtype {x.dtype} shape {tuple(x.shape)}"
                    )
                if not is_finite(x):
                    raise InvalidInputError("fisher_data contains NaN or infinite values")
                x = x.to(device=ref.device, dtype=ref.dtype)
                if split is None:
                    logits = read_logits(model(x), model)
                else:
                    logits = read_logits(split[1](split[0](x)), model, what="the split's head")
                loss = F.cross_entropy(logits, logits.detach().argmax(dim=1))
                grads = torch.autograd.grad(loss, [named[n] for n in names], allow_unused=True)
                for n, g in zip(names, grads, strict=True):
                    if g is not None:
                        sq = g.detach() ** 2
                        sums[n] = sums[n] + sq if n in sums else sq
                batches += 1
    finally:
        for p in frozen:
            p.requires_grad_(False)
    if batches == 0:
        raise ValueError("fisher_data yielded no batches")
    return {n: (s / batches, named[n].detach().clone()) for n, s in sums.items()}


class EATAFisher(ETA):
    """EATA: :class:`ETA` plus the Fisher regularizer ``alpha · Σ F (θ - θ0)²``.

    Args:
        fishers: from :func:`compute_fishers`, keyed by the model's parameter names; parameters
            without an entry are not regularized.
        fisher_alpha: ``alpha`` (2000 in EATA's code).
        Others as :class:`ETA`.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        fishers: Mapping[str, tuple[Tensor, Tensor]],
        fisher_alpha: float = 2000.0,
        entropy_margin: float | None = None,
        d_margin: float = 0.05,
        prob_momentum: float = 0.9,
        **options: Unpack[Options],
    ) -> None:
        if not math.isfinite(fisher_alpha) or fisher_alpha < 0:
            raise ValueError(f"fisher_alpha must be finite and >= 0, got {fisher_alpha!r}")
        super().__init__(
            model,
            optimizer,
            entropy_margin=entropy_margin,
            d_margin=d_margin,
            prob_momentum=prob_momentum,
            **options,
        )
        self.fisher_alpha = float(fisher_alpha)
        self._named = dict(model.named_parameters())
        self.fishers: FisherInfo = self._checked(fishers)

    def _checked(self, fishers: Mapping[str, tuple[Tensor, Tensor]]) -> FisherInfo:
        if not fishers:
            raise ValueError("fishers is empty: compute it with eatta.methods.eta.compute_fishers")
        out: FisherInfo = {}
        for name, pair in fishers.items():
            if name not in self._named:
                raise ValueError(f"fishers has an entry for {name!r}, not a model parameter")
            fisher, anchor = pair
            p = self._named[name]
            if fisher.shape != p.shape or anchor.shape != p.shape:
                raise ValueError(f"fishers[{name!r}] does not match the parameter's shape")
            out[name] = (fisher.detach().to(p), anchor.detach().to(p))
        return out

    def regularizer(self) -> Tensor | None:
        terms = []
        for name, (fisher, anchor) in self.fishers.items():
            p = self._named[name]
            if fisher.device != p.device:  # the method was moved after creation
                fisher, anchor = fisher.to(p), anchor.to(p)
                self.fishers[name] = (fisher, anchor)
            terms.append((fisher * (p - anchor) ** 2).sum())
        return self.fisher_alpha * torch.stack(terms).sum()

    def method_state(self) -> dict[str, Any]:
        state = super().method_state()
        state["fishers"] = {n: (f.clone(), a.clone()) for n, (f, a) in self.fishers.items()}
        return state

    def load_method_state(self, state: dict[str, Any]) -> None:
        super().load_method_state(state)
        if state.get("fishers") is not None:
            self.fishers = self._checked(state["fishers"])


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ETAConfig(OptimizerConfig):
    """ETA's keys (paper supplementary: SGD 2.5e-4, momentum 0.9 without Nesterov as in EATA's
    code; E0 = 0.4 ln C, cosine threshold 0.05, EMA 0.9); per-dataset rates in
    :mod:`eatta.methods.presets`."""

    params: ParamSelection = hparam("norm", "parameters to adapt (eatta.configure preset)")
    entropy_margin: float | None = hparam(
        None, "reliability threshold E0 (None: 0.4 ln C)", min=0.0
    )
    d_margin: float = hparam(0.05, "cosine-similarity threshold for redundant samples")
    prob_momentum: float = hparam(0.9, "EMA factor of the mean prediction", min=0.0, max=1.0)


@dataclass(frozen=True)
class EATAConfig(ETAConfig):
    """EATA's keys: ETA's plus the Fisher regularizer's (clean data or precomputed Fishers)."""

    fisher_alpha: float = hparam(2000.0, "weight of the Fisher regularizer", min=0.0)
    fisher_data: Iterable[Any] | None = hparam(None, "batches of clean source inputs")
    fishers: Mapping[str, tuple[Tensor, Tensor]] | None = hparam(
        None, "precomputed Fishers (eatta.methods.eta.compute_fishers)"
    )


def _eta_kwargs(cfg: ETAConfig) -> dict[str, Any]:
    return {
        "entropy_margin": cfg.entropy_margin,
        "d_margin": cfg.d_margin,
        "prob_momentum": cfg.prob_momentum,
        **cfg.options(),
    }


def _build_eta(
    model: nn.Module, cfg: ETAConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    params = configure(model, cfg.params)
    return ETA(model, make_optimizer(params, cfg), **_eta_kwargs(cfg), **parts)


def _build_eata(
    model: nn.Module, cfg: EATAConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    fishers, data = cfg.fishers, cfg.fisher_data
    if fishers is None and data is None:
        raise ValueError(
            "EATA needs clean source data for its Fisher regularizer: pass fisher_data= "
            "(batches of clean inputs) or fishers= (from eatta.methods.eta.compute_fishers)"
        )
    params = configure(model, cfg.params)
    if fishers is None:
        assert data is not None  # checked above
        fishers = compute_fishers(model, data, params, split=cfg.split)
    return EATAFisher(
        model,
        make_optimizer(params, cfg),
        fishers=fishers,
        fisher_alpha=cfg.fisher_alpha,
        **_eta_kwargs(cfg),
        **parts,
    )


register(
    MethodSpec(
        "eta",
        _build_eta,
        config=ETAConfig,
        datasets=DATASET_PRESETS["eta"],
        summary="ETA: reliable, non-redundant, re-weighted entropy minimization",
    )
)
register(
    MethodSpec(
        "eata",
        _build_eata,
        config=EATAConfig,
        datasets=DATASET_PRESETS["eata"],
        summary="EATA: ETA plus a Fisher regularizer from clean data (fisher_data=)",
        needs=("fisher_data",),
    )
)
