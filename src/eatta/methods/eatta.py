"""EATTA: effortless active test-time adaptation (CVPR 2025), one label per batch at most.

The step itself, on one screen with the paper's equations, is :mod:`eatta.methods.eatta_step`;
this module builds it from its parts and registers it. The parts: the active layer
(:mod:`eatta.methods.active`), how the update's gradient is computed
(:mod:`eatta.methods.update`, ``grad_mode``), performance options (``autocast``,
``channels_last``: :class:`~eatta.methods.step_options.StepOptions`), and late answers
(:class:`~eatta.methods.late_labels.LateLabels`, with its nearest replay).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta._finite import all_finite
from eatta.annotate.oracle import Oracle
from eatta.balance import ClassBalance, make_balance
from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.configure import collect_params, configure
from eatta.debias import GradNormDebiaser
from eatta.methods._active import DEFAULT_LABEL_EXPIRY
from eatta.methods._approx import NormCalibration, ProxyName, check_proxy
from eatta.methods.active import Answers, answer_terms, late_samples
from eatta.methods.base import AdaptiveMethod, unique_params
from eatta.methods.config import ActiveConfig, ParamSelection, hparam
from eatta.methods.eatta_step import EATTAStep, StepRecord
from eatta.methods.late_labels import LateLabels
from eatta.methods.parts import Parts
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.step_options import DeferredFiniteCheck, GradMode, StepOptions
from eatta.methods.update import ApproxUpdate, ExactUpdate
from eatta.selection import SELECTORS, make_selector
from eatta.selection.base import SelectionContext, Selector
from eatta.selection.perturbation import PerturbationSelector
from eatta.split import ModelSplit, SplitNotFoundError, backward_twice

__all__ = [
    "EATTA",
    "EATTAConfig",
    "GradMode",
    "ProxyName",
    "StepOptions",
    "StepRecord",
    "config_selector",
]


class EATTA(EATTAStep):
    """Wraps a classifier; ``forward(x)`` predicts, labels at most ``budget`` samples, adapts.

    Each step (:mod:`eatta.methods.eatta_step`, ``docs/method.md`` "One step"): features and
    logits; the selector scores the batch (perturbation difference by default), the class
    balance picks up to ``k`` samples, the oracle labels them; ``L_sup`` = cross-entropy on the
    labelled samples (plus a replayed mini-batch when a buffer is used), ``L_unsup`` = mean
    entropy of the confident (``H < margin``) unlabelled samples; the debiaser weights the two by
    their gradient norms (EMA-smoothed) and the optimizer takes one step. The returned logits are
    those computed before the update. A step whose gradients are not finite is skipped (no
    update, no state change), counted in :attr:`skipped_steps` and warned about once.

    Args:
        model: a classifier prepared with :func:`eatta.configure` (in place).
        optimizer: optimizes the trainable parameters (SGD lr 2.5e-4, momentum 0.9 in the paper).
        oracle: ``oracle(selected_inputs, indices) -> labels`` (see :mod:`eatta.annotate`), or
            an asynchronous annotator (``submit``/``collect``/``cancel``) whose answers arrive in
            later steps: a class, or yes/no on the prediction (``feedback="binary"``).
        budget: labels per batch (int) or a :class:`~eatta.budget.Budget`.
        selector: sample selector; default :class:`PerturbationSelector` (σ = 0.01).
        balance: class balancing: ``"reference"`` (the authors' code, default), ``"last-k"``
            (the paper's text), ``None`` (none), or a :class:`~eatta.balance.ClassBalance`.
        debiaser: loss weighting; default :class:`GradNormDebiaser` (α = 0.8).
        buffer: a :class:`LabelBuffer`, or an int capacity (the paper's BFS = 300), or None.
        entropy_margin: confidence threshold; default ``0.4 ln C``.
        steps: optimization steps per batch, each re-selecting (the reference ImageNet-C preset
            uses 2); the budget is consulted per step.
        grad_norm_params: parameters over which the two gradient norms are measured, if not the
            optimizer's (the reference preset measures all norm layers); they are set to
            ``requires_grad=True`` but not updated.
        grad_mode: how the two gradients are computed
            (:class:`~eatta.methods.step_options.StepOptions` describes the three options).
        autocast: bf16 autocast of the feature extractor.
        channels_last: channels-last memory format for the model and the batch.
        approx_proxy: with ``grad_mode="approx"`` (one backward pass on the weighted sum, its
            weights from estimated gradient norms): the estimate, ``"last-norm"`` (the norms
            over the backbone's last normalization layer's affine parameters, found with the
            split), ``"head"`` (at the head's input features) or ``"auto"`` (the first where the
            backbone has such a layer, else the second); see ``docs/approx-step.md``.
        approx_refresh: with ``grad_mode="approx"``: every this many steps the exact norms are
            computed (two backward passes, as the exact step) and each estimate is scaled by
            ``exact / estimate`` until the next refresh; None: never.
        late_labels: how late answers count, the entropy filter and the nearest replay
            (:class:`~eatta.methods.late_labels.LateLabels`); None: full weight, no fallback, no
            replay. Used only with an asynchronous annotator, in steps without a fresh answer.
        label_expiry: steps an asynchronous request waits for its answer before it expires.
        split: ``(backbone, head)`` for models whose split is not found automatically.
        check_finite: refuse batches with NaN or infinite values.
        parts: ``window``, ``fallback``, ``monitor``, ``weight_anchor``
            (:class:`~eatta.methods.parts.Parts`), attached once the method is built.

    A late answer (docs/real-annotators.md) enters the step in which it arrives: the kept sample
    is re-run through the current model into ``L_sup`` (cross-entropy for a class,
    ``-log(1 - p_c)`` for a "no" on class ``c``) and, with a buffer, added to it; the class balance
    and the selector learn of it then. With an asynchronous annotator the budget counts requests
    (the annotator's time is spent when asked), a synchronous oracle's answered labels.

    On accelerators the input's finiteness check is read at the step's host synchronisation
    (the selection), not before the forward pass, when the forward pass has no side effects.
    """

    binary_feedback = True

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        oracle: Oracle,
        budget: int | Budget = 1,
        selector: Selector | None = None,
        balance: str | ClassBalance | None = "reference",
        debiaser: GradNormDebiaser | None = None,
        buffer: LabelBuffer | int | None = None,
        entropy_margin: float | None = None,
        steps: int = 1,
        grad_norm_params: Sequence[nn.Parameter] | None = None,
        grad_mode: GradMode = "auto",
        autocast: bool = False,
        channels_last: bool = False,
        approx_proxy: ProxyName = "auto",
        approx_refresh: int | None = None,
        late_labels: LateLabels | None = None,
        label_expiry: int = DEFAULT_LABEL_EXPIRY,
        split: ModelSplit | tuple[nn.Module, nn.Module] | None = None,
        check_finite: bool = True,
        **parts: Unpack[Parts],
    ) -> None:
        options = StepOptions(grad_mode=grad_mode, autocast=autocast, channels_last=channels_last)
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        approx = options.grad_mode == "approx"
        calibration = NormCalibration(approx_refresh) if approx else None  # checks the period
        check_proxy(approx_proxy)
        super().__init__(
            model,
            optimizer,
            oracle=oracle,
            budget=budget,
            prepare=options.prepare_model,
            label_expiry=label_expiry,
            split=split,
            check_finite=check_finite,
        )
        self.options = options
        self.selector = selector if selector is not None else PerturbationSelector()
        self.balance = make_balance(balance)
        self.debiaser = debiaser if debiaser is not None else GradNormDebiaser()
        self.buffer = LabelBuffer(buffer) if isinstance(buffer, int) else buffer
        self.entropy_margin = entropy_margin
        self.steps = steps
        self.skipped_steps = 0  # steps skipped for non-finite gradients
        self._finite = DeferredFiniteCheck()
        owned = {id(p) for p in model.parameters()}
        measure = self._train if grad_norm_params is None else unique_params(grad_norm_params)
        if any(id(p) not in owned for p in measure):
            raise ValueError("grad_norm_params must be parameters of the model")
        for p in measure:
            p.requires_grad_(True)
        #: how the two backward passes run (:class:`~eatta.methods._grads.GradientStrategy`)
        self.gradients = options.gradient_strategy(model)
        self._update: ExactUpdate = (  # the norms and the weighted gradient (eatta.methods.update)
            ExactUpdate(self.gradients, self._train, measure)
            if calibration is None
            else ApproxUpdate(self.gradients, self._train, measure, approx_proxy, calibration)
        )
        if isinstance(self._update, ApproxUpdate) and approx_proxy != "head":
            try:  # the split may only be found on the first batch: the proxy then too
                self.split  # noqa: B018  # finds the split, or raises
            except SplitNotFoundError:
                pass
            else:
                self._update.find_proxy(lambda: self.split.backbone)
        self.last_step: StepRecord | None = None
        self.late_labels = late_labels if self.asynchronous else None
        #: the late labels' nearest replay (None: none)
        self.nearest_replay = None if self.late_labels is None else self.late_labels.replay
        self.attach(**parts)

    # -- the parts, by name ----------------------------------------------------------------------
    @property
    def grad_mode(self) -> GradMode:
        return self.options.grad_mode

    @property
    def approx_proxy(self) -> ProxyName | None:
        """The approximate step's norm estimate (None unless ``grad_mode="approx"``)."""
        return self._update.proxy if isinstance(self._update, ApproxUpdate) else None

    @property
    def approx_refresh(self) -> int | None:
        """Steps between the approximate step's exact refreshes (None: never, or not approx)."""
        upd = self._update
        return upd.calibration.period if isinstance(upd, ApproxUpdate) else None

    @property
    def _calibration(self) -> NormCalibration | None:
        return self._update.calibration if isinstance(self._update, ApproxUpdate) else None

    @property
    def _proxy_params(self) -> list[nn.Parameter] | None:
        return self._update.proxy_params if isinstance(self._update, ApproxUpdate) else None

    @property
    def autocast(self) -> bool:
        return self.options.autocast

    @property
    def channels_last(self) -> bool:
        return self.options.channels_last

    def check_input(self, x: Tensor) -> None:
        """As :meth:`AdaptiveMethod.check_input`; on accelerators the finiteness is read later."""
        self._finite.flag, self._finite.known = None, None
        if not (self.check_finite and isinstance(x, Tensor) and self._defer_finite(x)):
            super().check_input(x)
            return
        self.check_finite = False
        try:
            super().check_input(x)
        finally:
            self.check_finite = True
        self._finite.flag = all_finite(x)

    def _defer_finite(self, x: Tensor) -> bool:
        return DeferredFiniteCheck.applies(x, self.model)

    # -- the step (eatta_step) and the parts around it --------------------------------------------
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        if isinstance(self._update, ApproxUpdate):  # the split found on this batch at the latest
            self._update.find_proxy(lambda: self.split.backbone)
        x = self.options.prepare_input(x)
        with backward_twice(self.model):  # a compiled backbone: its backward runs twice
            logits = self._step(x)
            for _ in range(self.steps - 1):
                self.snapshot_parts()  # the step before is committed: a failure rolls back here
                self._step(x)
        return logits

    def _replay_terms(
        self, x: Tensor, z: Tensor, o: Tensor, lab: Answers
    ) -> tuple[list[Tensor], bool]:
        """The fresh labels join the buffer and the nearest replay; then the terms of "no" and
        late answers, the nearest replay's, and a replayed mini-batch from the buffer."""
        if self.late_labels is not None:  # (asynchronous only)
            self.late_labels.observe(self.request_step, z)
        if len(lab.indices):
            idx, y = lab.on(o.device)
            if self.buffer is not None:
                self.buffer.add(x[idx], y)
            if self.nearest_replay is not None and lab.ctx is not None:
                self.nearest_replay.add(x[idx], y, lab.ctx.features[idx])
        terms = self._late_terms(x, z, o, lab) if lab.late else answer_terms(o, lab)
        replayed = bool(lab.late) or (self.buffer is not None and len(self.buffer) > 0)
        near = self._nearest_term(x, lab)
        if near is not None:
            terms.append(near)
            replayed = True
        if self.buffer is not None and len(self.buffer) > 0:
            bx, by = self.buffer.sample()
            head = self.split.head
            terms.append(F.cross_entropy(head(self.options.features(self.split.backbone, bx)), by))
        return terms, replayed

    def _late_terms(self, x: Tensor, z: Tensor, o: Tensor, lab: Answers) -> list[Tensor]:
        """Terms of the batch's "no" answers and the late answers (their kept samples through
        the current model, :func:`~eatta.methods.active.answer_terms`); the late labelled
        samples join the buffer and the nearest replay, and give the selector's context."""
        late = lab.late
        xs = late_samples(late, x)
        backbone, head = self.split
        if self._has_batchnorm:  # normalized with the batch's statistics, as if asked now: a
            # few late samples alone would be normalized by their own statistics (measured on
            # digits-C: labels one batch late then help no more than labels that never come)
            both = self.options.features(backbone, torch.cat([x, xs]))
            zb, zl = both[: x.shape[0]], both[x.shape[0] :]  # the batch's: the same forward's
        else:
            zb, zl = z, self.options.features(backbone, xs)
        ol = head(zl)
        w = None
        if self.late_labels is not None:
            now = self.request_step
            asked = [a.request.step for a in late]
            w = self.late_labels.weights(asked, now, features=zl.detach(), batch=zb.detach())
            w = w.to(ol.device, ol.dtype)
            lab.late_weight = float(w.sum())
        terms = answer_terms(o, lab, ol, w)
        pos = [i for i, a in enumerate(late) if a.label is not None]
        if pos:
            rows = torch.tensor(pos, device=ol.device)
            ys = torch.tensor([late[i].label for i in pos], dtype=torch.long, device=ol.device)
            if self.buffer is not None:
                self.buffer.add(xs[rows.to(xs.device)], ys)
            if self.nearest_replay is not None:
                self.nearest_replay.add(xs[rows.to(xs.device)], ys, zl[rows])
            lab.late_ctx = SelectionContext(
                inputs=xs[rows.to(xs.device)],
                features=zl.detach()[rows],
                logits=ol.detach()[rows],
                head=head,
                backbone=backbone,
            )
        return terms

    def _nearest_term(self, x: Tensor, lab: Answers) -> Tensor | None:
        """In a step without a fresh answer: the kept labelled samples nearest the batch, run
        with it, their cross-entropies weighted by their similarity (NearestReplay)."""
        replay = self.nearest_replay
        if replay is None or not len(replay) or len(lab.indices) or lab.ctx is None:
            return None
        near = replay.nearest(lab.ctx.features)
        if near is None:
            return None
        rx, ry, rw = near
        backbone, head = self.split
        rx = rx.to(x.device, x.dtype)
        if self._has_batchnorm:
            zr = self.options.features(backbone, torch.cat([x, rx]))[x.shape[0] :]
        else:
            zr = self.options.features(backbone, rx)
        ce = F.cross_entropy(head(zr), ry.to(x.device), reduction="none")
        w = rw.to(ce.device, ce.dtype)
        lab.late_weight += float(w.mean())
        return (ce * w).mean()

    def _filters_entropy(self, lab: Answers) -> bool:
        """Whether this step takes the entropy filter: no fresh answer, and late labels
        that weigh too little (``LateLabels.anchor``)."""
        if self.late_labels is None or len(lab.indices) or len(lab.negatives):
            return False
        return self.late_labels.filters(lab.late_weight)

    def _entropy_term(self, o: Tensor, answered: Tensor, lab: Answers) -> tuple[Tensor, Tensor]:
        """Eq. 1 on the confident samples, or, in a step that falls back, the fallback's entropy
        term (ETA's reliable, non-redundant samples, weighted)."""
        if not self._filters_entropy(lab):
            return self._confident_entropy(o, answered)
        assert self.late_labels is not None
        h, mask, margin = self._entropy_below_margin(o, answered)
        return self.late_labels.entropy(h, o.detach().softmax(1), mask, margin)

    # -- state -------------------------------------------------------------------------------
    def state_parts(self) -> dict[str, Any]:
        parts = self.asking_parts()
        return {
            "budget": parts["budget"],
            "selector": self.selector,
            "balance": self.balance,
            "debiaser": self.debiaser,
            "buffer": self.buffer,
            "pending": parts["pending"],
            "late_labels": self.late_labels,
            "nearest_replay": self.nearest_replay,
            **({} if self._calibration is None else {"grad_norm_estimate": self._calibration}),
        }

    def method_state(self) -> dict[str, Any]:
        return {**super().method_state(), "skipped_steps": self.skipped_steps}

    def load_method_state(self, state: dict[str, Any]) -> None:
        super().load_method_state(state)
        self.skipped_steps = int(state.get("skipped_steps", 0))

    def reset_method_state(self) -> None:
        super().reset_method_state()
        self.skipped_steps = 0


# -- registry ------------------------------------------------------------------------------------

#: Selector names ``selector=`` takes (Table 7).
SelectorName = Literal[
    "perturbation",
    "max-entropy",
    "least-confidence",
    "min-margin",
    "random",
    "entropy-margin",
    "plpd",
    "k-clustering",
    "dynamic-margin",
]
if set(get_args(SelectorName)) != set(SELECTORS):  # the Literal spells out the registry's names
    raise ImportError("SelectorName is out of date with eatta.selection.SELECTORS")
#: Class-balance names ``balance=`` takes (see :func:`eatta.balance.make_balance`).
BalanceName = Literal["reference", "last-k", "paper", "none"]


@dataclass(frozen=True)
class EATTAConfig(ActiveConfig):
    """EATTA's keys: the wrapper's switches plus the optimizer's (paper defaults)."""

    EXPANSIONS: ClassVar[Mapping[str, Mapping[Any, Mapping[str, Any]]]] = {
        "preset": {"reference": {"params": "reference", "steps": 2}}
    }

    nesterov: bool = hparam(True, "SGD Nesterov momentum")
    preset: Literal["reference"] | None = hparam(
        None, "'reference': the authors' ImageNet-C set (params='reference', steps=2)"
    )
    params: ParamSelection = hparam("norm", "parameters to adapt (eatta.configure preset)")
    selector: SelectorName | Selector | None = hparam(
        "perturbation", "sample selector, by name or instance (None: perturbation)"
    )
    selector_kwargs: Mapping[str, Any] | None = hparam(
        None, "keyword arguments of a named selector"
    )
    noise_std: float = hparam(0.01, "std of the perturbation selector's feature noise", min=0.0)
    seed: int = hparam(0, "seed of the selector's and the buffer's random draws")
    balance: BalanceName | ClassBalance | None = hparam("reference", "class balance")
    ema_alpha: float = hparam(0.8, "EMA factor of the gradient-norm debiaser", min=0.0, max=1.0)
    gnd: bool = hparam(True, "weight the losses by gradient norm (GND)")
    ema: bool = hparam(True, "smooth the gradient norms with an EMA")
    buffer: int | None = hparam(None, "replay buffer size (None or 0: no buffer)", min=0)
    entropy_margin: float | None = hparam(None, "entropy filter (None: 0.4 ln C)", min=0.0)
    steps: int = hparam(1, "optimizer steps per batch", min=1)
    grad_mode: GradMode = hparam(
        "auto", "how the two gradients are computed ('approx': one backward pass, estimated norms)"
    )
    approx_proxy: ProxyName = hparam(
        "auto",
        "grad_mode='approx': norms estimated at the last norm layer, the head input, or "
        "auto (the first where there is one)",
    )
    approx_refresh: int | None = hparam(
        None, "grad_mode='approx': exact norms every this many steps (None: never)", min=1
    )
    autocast: bool = hparam(False, "bf16 autocast of the feature extractor")
    channels_last: bool = hparam(False, "channels-last memory format")


def config_selector(cfg: EATTAConfig) -> Selector:
    """The config's selector: an instance as given, or one made from its name (Table 7), the
    perturbation selector taking ``noise_std``, every named one ``seed``."""
    selector = cfg.selector or "perturbation"
    if not isinstance(selector, str):
        return selector
    kw = dict(cfg.selector_kwargs or {})
    if selector == "perturbation":
        kw.setdefault("std", cfg.noise_std)
    return make_selector(selector, seed=cfg.seed, **kw)


def _build_eatta(
    model: nn.Module,
    cfg: EATTAConfig,
    oracle: Oracle | None,
    budget: Budget,
    *,
    debiaser: GradNormDebiaser | None = None,
    late_labels: LateLabels | None = None,
    selector: Selector | None = None,
) -> AdaptiveMethod:
    """EATTA from a validated config (the registry's builder); ``debiaser`` replaces the
    config's GND, ``late_labels`` weighs late labels and ``selector`` replaces the config's
    selector (variants)."""
    params = configure(model, cfg.params)
    norm_params = None
    if cfg.params == "reference":
        norm_params, _ = collect_params(model, "norm")
    assert oracle is not None
    return EATTA(
        model,
        make_optimizer(params, cfg),
        oracle=oracle,
        budget=budget,
        selector=selector if selector is not None else config_selector(cfg),
        balance=cfg.balance,
        debiaser=debiaser
        if debiaser is not None
        else GradNormDebiaser(alpha=cfg.ema_alpha, normalize=cfg.gnd, ema=cfg.ema),
        buffer=LabelBuffer(cfg.buffer, seed=cfg.seed) if cfg.buffer else None,
        entropy_margin=cfg.entropy_margin,
        steps=cfg.steps,
        grad_norm_params=norm_params,
        split=cfg.split,
        grad_mode=cfg.grad_mode,
        autocast=cfg.autocast,
        channels_last=cfg.channels_last,
        approx_proxy=cfg.approx_proxy,
        approx_refresh=cfg.approx_refresh,
        label_expiry=cfg.label_expiry,
        late_labels=late_labels,
    )


register(
    MethodSpec(
        "eatta",
        _build_eatta,
        active=True,
        config=EATTAConfig,
        datasets=DATASET_PRESETS["eatta"],
        summary="EATTA: perturbation selection, class balancing, gradient-norm debiasing",
    )
)
