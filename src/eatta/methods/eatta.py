"""EATTA: effortless active test-time adaptation (CVPR 2025), one label per batch at most.

The method is described in ``docs/method.md``; its step reads as the paper's: select, ask,
losses, loss weights, one update. How the gradients are computed (and autocast, channels-last)
is :class:`~eatta.methods.step_options.StepOptions`' business, not the step's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eatta._warn import warn_at_caller
from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.configure import collect_params, configure
from eatta.debias import GradNormDebiaser, LossWeights
from eatta.history import ClassHistory, make_history
from eatta.losses import (
    default_entropy_margin,
    entropy,
    masked_mean,
)
from eatta.methods._active import DEFAULT_MAX_AGE, commit_late
from eatta.methods._approx import (
    NormCalibration,
    ProxyName,
    check_proxy,
    last_norm_params,
    proxy_norms,
)
from eatta.methods._grads import SegmentPlan
from eatta.methods.active import ActiveMethod, Answers, answer_terms, late_samples
from eatta.methods.base import AdaptiveMethod, InvalidInputError, unique_params
from eatta.methods.config import OptimizerConfig, ParamSelection, hparam
from eatta.methods.late_labels import LateLabels
from eatta.methods.nearest_replay import NearestReplay
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.step_options import DeferredFiniteCheck, GradMode, StepOptions
from eatta.selection import SELECTORS, make_selector
from eatta.selection.base import SelectionContext, Selector
from eatta.selection.perturbation import PerturbationSelector
from eatta.split import ModelSplit, SplitNotFoundError

__all__ = [
    "EATTA",
    "EATTAConfig",
    "GradMode",
    "ProxyName",
    "StepOptions",
    "StepRecord",
    "build_eatta",
    "config_selector",
]


@dataclass
class StepRecord:
    """What one adaptation step did; tensors stay on the device (reading them syncs).

    ``skipped``: the gradients were not finite, so no update was applied and no state changed.
    ``grad_norms_approx``: ``grad_norm_sup`` / ``grad_norm_unsup`` are the approximate step's
    estimates (``grad_mode="approx"`` between refreshes: the proxy norms, scaled as the last
    refresh said), not the exact global norms; the debiaser received them as they are.
    With an asynchronous annotator, ``negatives`` are this batch's samples answered "no" (learned
    as complementary labels) and ``late`` counts the earlier requests answered in this step.
    """

    logits: Tensor
    pseudo_labels: Tensor
    scores: Tensor | None = None
    selected: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    labels: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    class_history: list[int] = field(default_factory=list)
    loss_sup: Tensor | None = None
    loss_unsup: Tensor | None = None
    num_unsup: Tensor | None = None
    grad_norm_sup: Tensor | None = None
    grad_norm_unsup: Tensor | None = None
    weights: LossWeights | None = None
    loss: Tensor | None = None
    skipped: bool = False
    negatives: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    late: int = 0
    grad_norms_approx: bool = False


def _global_norm(grads: Sequence[Tensor | None]) -> Tensor:
    present = [g for g in grads if g is not None]
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(present)))


def _empty() -> Tensor:
    return torch.empty(0, dtype=torch.long)


class EATTA(ActiveMethod):
    """Wraps a classifier; ``forward(x)`` predicts, labels at most ``budget`` samples, adapts.

    Each step (``docs/method.md``, "One step"): features ``z`` and logits ``o``; the selector
    scores the batch (perturbation difference by default), the class history picks up to ``k``
    samples, the oracle labels them; ``L_sup`` = cross-entropy on the labelled samples (plus a
    replayed mini-batch when a buffer is used), ``L_unsup`` = mean entropy of the confident
    (``H < margin``) unlabelled samples; the debiaser weights the two by their gradient norms
    (EMA-smoothed) and the optimizer takes one step. The returned logits are those computed
    before the update. A step whose gradients are not finite is skipped (no update, no state
    change), counted in :attr:`skipped_steps` and warned about once.

    Args:
        model: a classifier prepared with :func:`eatta.configure` (in place).
        optimizer: optimizes the trainable parameters (SGD lr 2.5e-4, momentum 0.9 in the paper).
        oracle: ``oracle(selected_inputs, indices) -> labels`` (see :mod:`eatta.annotate`), or
            an asynchronous annotator (``submit``/``collect``/``cancel``) whose answers arrive in
            later steps: a class, or yes/no on the prediction (``feedback="binary"``).
        budget: labels per batch (int) or a :class:`~eatta.budget.Budget`.
        selector: sample selector; default :class:`PerturbationSelector` (σ = 0.01).
        history: class balancing: ``"reference"`` (the authors' code, default), ``"last-k"``
            (the paper's text), ``None`` (none), or a :class:`~eatta.history.ClassHistory`.
        debiaser: loss weighting; default :class:`GradNormDebiaser` (α = 0.8).
        buffer: a :class:`LabelBuffer`, or an int capacity (the paper's BFS = 300), or None.
        entropy_margin: confidence threshold; default ``0.4 ln C``.
        steps: optimization steps per batch, each re-selecting (the reference ImageNet-C preset
            uses 2); the budget is consulted per step.
        grad_norm_params: parameters over which the two gradient norms are measured, if not the
            optimizer's (the reference preset measures all norm layers); they are set to
            ``requires_grad=True`` but not updated.
        split: ``(backbone, head)`` for models whose split is not found automatically.
        options: performance options (:class:`StepOptions`); or give ``grad_mode``,
            ``autocast``, ``channels_last`` as keywords (not both).
        approx_proxy: with ``grad_mode="approx"`` (one backward pass on the weighted sum, its
            weights from estimated gradient norms): the estimate, ``"last-norm"`` (the norms
            over the backbone's last normalization layer's affine parameters) or ``"head"``
            (the norms of the gradients at the head's input features); see
            :mod:`eatta.methods._approx` and ``docs/approx-step.md``.
        approx_refresh: with ``grad_mode="approx"``: every this many steps the exact norms are
            computed (two backward passes, as the exact step) and each estimate is scaled by
            ``exact / estimate`` until the next refresh; None: never.
        label_expiry: steps an asynchronous request waits for its answer before it expires.
        late_labels: how late labels are weighed and the label-free fallback
            (:class:`~eatta.methods.late_labels.LateLabels`); None: full weight, no fallback.
            Used only with an asynchronous annotator, in steps without a fresh answer.
        nearest_replay: with an asynchronous annotator, keeps the labelled samples and, in steps
            without a fresh answer, replays those nearest the batch
            (:class:`~eatta.methods.nearest_replay.NearestReplay`).

    A late answer (docs/real-annotators.md) enters the step in which it arrives: the kept sample
    is re-run through the current model into ``L_sup`` (cross-entropy for a class,
    ``-log(1 - p_c)`` for a "no" on class ``c``) and, with a buffer, added to it; the class history
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
        history: str | ClassHistory | None = "reference",
        debiaser: GradNormDebiaser | None = None,
        buffer: LabelBuffer | int | None = None,
        entropy_margin: float | None = None,
        steps: int = 1,
        grad_norm_params: Sequence[nn.Parameter] | None = None,
        split: ModelSplit | tuple[nn.Module, nn.Module] | None = None,
        check_finite: bool = True,
        grad_mode: GradMode | None = None,
        autocast: bool | None = None,
        channels_last: bool | None = None,
        options: StepOptions | None = None,
        label_expiry: int = DEFAULT_MAX_AGE,
        late_labels: LateLabels | None = None,
        nearest_replay: NearestReplay | None = None,
        approx_proxy: ProxyName = "last-norm",
        approx_refresh: int | None = None,
    ) -> None:
        keywords = {"grad_mode": grad_mode, "autocast": autocast, "channels_last": channels_last}
        given = {k: v for k, v in keywords.items() if v is not None}
        if options is not None and given:
            raise ValueError(f"give either options= or {sorted(given)}, not both")
        options = options if options is not None else StepOptions(**given)  # type: ignore[arg-type]  # values checked by StepOptions
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
            label_expiry=label_expiry,
            split=split,
            check_finite=check_finite,
            prepare_model=options.prepare_model,
        )
        self.options = options
        self.gradients = options.gradient_strategy(model)
        self.selector: Selector = selector if selector is not None else PerturbationSelector()
        self.history = make_history(history)
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
        train_ids, measure_ids = {id(p) for p in self._train}, {id(p) for p in measure}
        self._all = self._train + [p for p in measure if id(p) not in train_ids]
        self._measure_pos = [i for i, p in enumerate(self._all) if id(p) in measure_ids]
        self._norms_cover_update = train_ids <= measure_ids and not approx
        self._calibration = calibration
        self._estimated = False  # whether the last step's norms were estimates
        self._approx_proxy: ProxyName = approx_proxy
        self._measure = measure
        self._proxy_params: list[nn.Parameter] | None = None  # found with the split (lazily)
        if approx and approx_proxy == "last-norm":
            try:  # the split may only be found on the first batch: the proxy then too
                backbone = self.split.backbone
            except SplitNotFoundError:
                pass
            else:
                self._find_proxy(backbone)
        self.last_step: StepRecord | None = None
        self.late_labels = late_labels if self._asking is not None else None
        self.nearest_replay = nearest_replay if self._asking is not None else None

    @property
    def grad_mode(self) -> GradMode:
        return self.options.grad_mode

    @property
    def approx_proxy(self) -> ProxyName | None:
        """The approximate step's norm estimate (None unless ``grad_mode="approx"``)."""
        return None if self._calibration is None else self._approx_proxy

    @property
    def approx_refresh(self) -> int | None:
        """Steps between the approximate step's exact refreshes (None: never, or not approx)."""
        return None if self._calibration is None else self._calibration.period

    @property
    def autocast(self) -> bool:
        return self.options.autocast

    @property
    def channels_last(self) -> bool:
        return self.options.channels_last

    def check_input(self, x: Tensor) -> None:
        """As :meth:`AdaptiveMethod.check_input`; on accelerators the finiteness is read later."""
        self._finite.flag = None
        if not (self.check_finite and isinstance(x, Tensor) and self._defer_finite(x)):
            super().check_input(x)
            return
        self.check_finite = False
        try:
            super().check_input(x)
        finally:
            self.check_finite = True
        self._finite.flag = torch.isfinite(x).all()

    def _defer_finite(self, x: Tensor) -> bool:
        return DeferredFiniteCheck.applies(x, self.model)

    def _raise_if_not_finite(self, _: object = None) -> None:
        flag = self._finite.take()
        if flag is not None and not bool(flag):
            raise InvalidInputError("input contains NaN or infinite values")

    def _find_proxy(self, backbone: nn.Module) -> None:
        """The approximate step's "last-norm" parameters, in the backbone once it is known."""
        params = last_norm_params(backbone, self._measure)
        if not params:
            raise ValueError(
                "approx_proxy='last-norm' needs a normalization layer with measured affine "
                "parameters in the backbone; use approx_proxy='head'"
            )
        self._proxy_params = params

    # -- the step ----------------------------------------------------------------------------
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        if self._calibration is not None and self._approx_proxy == "last-norm":
            if self._proxy_params is None:  # the split found on this batch: before any change
                self._find_proxy(self.split.backbone)
        x = self.options.prepare_input(x)
        logits = self._step(x)
        for _ in range(self.steps - 1):
            self.snapshot_parts()  # the step before is committed: a failure rolls back to here
            self._step(x)
        return logits

    def _step(self, x: Tensor) -> Tensor:
        z = self.options.features(self.split.backbone, x)
        o = self.split.head(z)
        if o.dim() != 2:
            shape = tuple(o.shape)
            raise RuntimeError(f"the head must return [batch, classes] logits, got {shape}")
        record = StepRecord(logits=o.detach(), pseudo_labels=o.detach().argmax(1))
        k = self.budget.allowance()
        # cut points for segmented gradients, planned while an accelerator runs the forward pass
        plan = self._plan(o) if k > 0 or self._asking is not None else None

        # 1. select the samples and ask the oracle (no state changes until it has answered)
        # the selection synchronised with the device: reading a deferred flag there is free
        lab = self.ask(x, z, o, k, self.selector, self.history, check=self._raise_if_not_finite)
        record.scores = None if lab.selection is None else lab.selection.update.get("scores")
        if self.late_labels is not None and self._asking is not None:
            self.late_labels.observe(self._asking.pending.step, z)

        # 2. the two losses (L_sup is None without a label)
        loss_sup, replayed = self._supervised_loss(x, o, lab)
        answered = torch.cat([lab.indices, lab.negatives]) if len(lab.negatives) else lab.indices
        if self._falls_back(lab):
            loss_unsup, n_unsup = self._fallback_entropy(o, answered)
        else:
            loss_unsup, n_unsup = self._confident_entropy(o, answered)
        if replayed:
            plan = None  # a second graph through the same weights: plan from the losses

        # 3. weights and the weighted gradient, γ_sup·∇L_sup + γ_unsup·∇L_unsup
        grads, weights, g_sup, g_unsup = self._gradients(loss_sup, loss_unsup, n_unsup, plan, z)

        # 4. one update, or none if the gradients are not finite
        if not self._update_is_finite(grads, weights, g_sup, g_unsup):
            return self._skip(record)
        self._commit(lab)
        for p, g in zip(self._train, grads, strict=False):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

        record.selected, record.labels = lab.indices, lab.targets
        record.negatives, record.late = lab.negatives, len(lab.late)
        record.class_history = list(getattr(self.history, "classes", []))
        record.loss_unsup, record.num_unsup = loss_unsup.detach(), n_unsup
        record.loss_sup = None if loss_sup is None else loss_sup.detach()
        record.grad_norm_sup, record.grad_norm_unsup, record.weights = g_sup, g_unsup, weights
        record.grad_norms_approx = self._estimated
        if loss_sup is None or weights is None:  # no label: the entropy loss alone
            record.loss = loss_unsup.detach()
        else:
            record.loss = (weights.sup * loss_sup + weights.unsup * loss_unsup).detach()
        self.last_step = record
        return o.detach()

    # -- the parts of the step ---------------------------------------------------------------
    def _supervised_loss(self, x: Tensor, o: Tensor, lab: Answers) -> tuple[Tensor | None, bool]:
        """Cross-entropy on the labelled samples plus, with a buffer, on a replayed mini-batch
        (the new samples are added first, so they can be replayed at once). With an asynchronous
        annotator also: ``-log(1 - p_c)`` for this batch's "no" answers, and the late answers'
        samples re-run through the current model (see the class docstring)."""
        terms = []
        if len(lab.indices):
            idx, y = lab.indices.to(o.device), lab.targets.to(o.device)
            terms.append(F.cross_entropy(o[idx], y))
            if self.buffer is not None:
                self.buffer.add(x[idx], y)
            if self.nearest_replay is not None and lab.ctx is not None:
                self.nearest_replay.add(x[idx], y, lab.ctx.features[idx])
        if lab.late:
            terms.extend(self._late_terms(x, o, lab))
        else:
            terms.extend(answer_terms(o, lab))  # the batch's "no" answers
        replayed = bool(lab.late) or (self.buffer is not None and len(self.buffer) > 0)
        near = self._nearest_term(x, lab)
        if near is not None:
            terms.append(near)
            replayed = True
        if self.buffer is not None and len(self.buffer) > 0:
            bx, by = self.buffer.sample()
            head = self.split.head
            terms.append(F.cross_entropy(head(self.options.features(self.split.backbone, bx)), by))
        return (sum(terms[1:], terms[0]) if terms else None), replayed

    def _late_terms(self, x: Tensor, o: Tensor, lab: Answers) -> list[Tensor]:
        """Terms of the batch's "no" answers and the late answers (their kept samples through
        the current model, :func:`~eatta.methods.active.answer_terms`); the late labelled
        samples join the buffer and the nearest replay, and give the selector's context."""
        late = lab.late
        xs = late_samples(late, x)
        backbone, head = self.split
        if self._has_batchnorm:  # normalized with the batch's statistics, as if asked now: a
            # few late samples alone would be normalized by their own statistics (measured on
            # digits-C: labels one batch late then help no more than labels that never come)
            zl = self.options.features(backbone, torch.cat([x, xs]))[x.shape[0] :]
        else:
            zl = self.options.features(backbone, xs)
        ol = head(zl)
        w = None
        if self.late_labels is not None:
            assert self._asking is not None
            now = self._asking.pending.step
            w = self.late_labels.weights([a.request.step for a in late], now)
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

    def _entropy_below_margin(self, o: Tensor, labelled: Tensor) -> tuple[Tensor, Tensor, float]:
        """Per-sample entropy, the mask of unlabelled samples below the margin, and the margin."""
        h = entropy(o)
        margin = self.entropy_margin
        if margin is None:
            margin = default_entropy_margin(o.shape[1])
        mask = h.detach() < margin
        if len(labelled):
            mask = mask.index_fill(0, labelled.to(o.device), False)
        return h, mask, float(margin)

    def _confident_entropy(self, o: Tensor, labelled: Tensor) -> tuple[Tensor, Tensor]:
        """Mean entropy of the unlabelled samples below the margin, and their count."""
        h, mask, _ = self._entropy_below_margin(o, labelled)
        return masked_mean(h, mask)

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

    def _falls_back(self, lab: Answers) -> bool:
        """Whether this step takes the label-free fallback: no fresh answer, and late labels
        that weigh too little (``LateLabels.anchor``)."""
        if self.late_labels is None or len(lab.indices) or len(lab.negatives):
            return False
        return self.late_labels.falls_back(lab.late_weight)

    def _fallback_entropy(self, o: Tensor, labelled: Tensor) -> tuple[Tensor, Tensor]:
        """The fallback's entropy term (ETA's reliable, non-redundant samples, weighted)."""
        assert self.late_labels is not None
        h, mask, margin = self._entropy_below_margin(o, labelled)
        return self.late_labels.entropy(h, o.detach().softmax(1), mask, margin)

    def _plan(self, o: Tensor) -> SegmentPlan | None:
        """Cut points below the logits: both losses are functions of ``o`` alone, so every
        path from them to the parameters runs through ``o``'s node."""
        if not self.debiaser.needs_grad_norms:
            return None
        if self._calibration is not None and not self._calibration.due:
            return None  # the approximate step between refreshes: one backward pass, no plan
        return self.gradients.plan(o, self._all)

    def _gradients(
        self,
        loss_sup: Tensor | None,
        loss_unsup: Tensor,
        n_unsup: Tensor,
        plan: SegmentPlan | None = None,
        features: Tensor | None = None,
    ) -> tuple[list[Tensor], LossWeights | None, Tensor | None, Tensor | None]:
        """The update's gradients for the trainable parameters, the weights and the two norms
        (estimated by the approximate step between refreshes: see :attr:`StepRecord`)."""
        train = self._train
        self._estimated = False
        if loss_sup is None:  # no label: plain confident-entropy step, weight 1
            g = torch.autograd.grad(loss_unsup, train, allow_unused=True)
            return [_zero_if_none(t, p) for t, p in zip(g, train, strict=True)], None, None, None
        if not self.debiaser.needs_grad_norms:  # one pass over the sum
            g = torch.autograd.grad(loss_sup + loss_unsup, train, allow_unused=True)
            one = torch.ones((), device=loss_sup.device)
            grads = [_zero_if_none(t, p) for t, p in zip(g, train, strict=True)]
            return grads, LossWeights(one, one, one, one), None, None
        cal = self._calibration
        if cal is not None:
            at: list[Tensor] = list(self._proxy_params or [])
            if self._approx_proxy == "head" and features is not None:
                at = [features]
            due = cal.due
            cal.advance()  # rolled back with the other parts if the step is skipped
            if not due:  # one backward pass on the weighted sum, weights from the estimates
                g_sup, g_unsup = cal.scale(*proxy_norms(loss_sup, loss_unsup, at))
                weights = self.debiaser.weights(g_sup, g_unsup, n_unsup > 0)
                total = weights.sup * loss_sup + weights.unsup * loss_unsup
                g = torch.autograd.grad(total, train, allow_unused=True)
                self._estimated = True
                grads = [_zero_if_none(t, p) for t, p in zip(g, train, strict=True)]
                return grads, weights, g_sup, g_unsup
            est = proxy_norms(loss_sup, loss_unsup, at)
        gs, gu = self.gradients.grads(loss_sup, loss_unsup, self._all, plan)
        zero = loss_sup.new_zeros(())
        g_sup = _global_norm([gs[i] for i in self._measure_pos] + [zero])
        g_unsup = _global_norm([gu[i] for i in self._measure_pos] + [zero])
        if cal is not None:
            cal.refresh(est, (g_sup, g_unsup))
        weights = self.debiaser.weights(g_sup, g_unsup, n_unsup > 0)
        sup = [_zero_if_none(g, p) for g, p in zip(gs, train, strict=False)]
        unsup = [_zero_if_none(g, p) for g, p in zip(gu, train, strict=False)]
        grads = list(torch._foreach_mul(sup, weights.sup))  # fused
        torch._foreach_add_(grads, torch._foreach_mul(unsup, weights.unsup))
        return list(grads), weights, g_sup, g_unsup

    def _update_is_finite(
        self,
        grads: list[Tensor],
        weights: LossWeights | None,
        g_sup: Tensor | None,
        g_unsup: Tensor | None,
    ) -> bool:
        """Whether the update is finite; also reads a deferred input flag not read yet (a step
        without selection), in the same host synchronisation."""
        if g_sup is not None and g_unsup is not None and weights is not None:
            if self._norms_cover_update:  # the norms already saw every gradient
                flag = torch.isfinite(g_sup + g_unsup + weights.sup + weights.unsup)
            else:
                flag = torch.isfinite(_global_norm(grads) + weights.sup + weights.unsup)
        else:
            flag = torch.isfinite(_global_norm(grads))
        pending = self._finite.take()
        if pending is None:
            return bool(flag)
        ok_input, ok_update = torch.stack([pending, flag]).tolist()
        if not ok_input:
            raise InvalidInputError("input contains NaN or infinite values")
        return bool(ok_update)

    def _skip(self, record: StepRecord) -> Tensor:
        """A step with non-finite gradients: every part back as it was, nothing applied (this
        step's requests are cancelled, the answers it collected kept for the next step)."""
        self.restore_parts()  # also cancels this step's requests (AdaptiveMethod.restore_parts)
        self.skipped_steps += 1
        if self.skipped_steps == 1:
            warn_at_caller(
                "EATTA skipped a step whose gradients were not finite (the model overflowed); "
                "later skips are counted in skipped_steps without a warning",
                RuntimeWarning,
            )
        record.skipped = True
        self.last_step = record
        return record.logits

    def _commit(self, lab: Answers) -> None:
        """Record the answered labels: budget, class history (annotated classes), selector."""
        self.charge(lab)
        if lab.selection is not None and len(lab.indices):
            assert lab.ctx is not None and lab.labels is not None
            self.history.commit(lab.selection, lab.answered.tolist(), lab.labels.tolist())
            self.selector.commit(lab.ctx, lab.selection, lab.labels)
        if lab.late:
            commit_late(self.history, self.selector, lab.late, lab.late_ctx)
        self.asking_committed()

    # -- state -------------------------------------------------------------------------------
    def state_parts(self) -> dict[str, Any]:
        parts = self.asking_parts()
        return {
            "budget": parts["budget"],
            "selector": self.selector,
            "history": self.history,
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


def _zero_if_none(g: Tensor | None, p: nn.Parameter) -> Tensor:
    return torch.zeros_like(p) if g is None else g


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
#: Class-history names ``history=`` takes (see :func:`eatta.history.make_history`).
HistoryName = Literal["reference", "last-k", "paper", "none"]


@dataclass(frozen=True)
class EATTAConfig(OptimizerConfig):
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
    history: HistoryName | ClassHistory | None = hparam("reference", "class-balancing history")
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
        "last-norm", "grad_mode='approx': norms estimated at the last norm layer or the head input"
    )
    approx_refresh: int | None = hparam(
        None, "grad_mode='approx': exact norms every this many steps (None: never)", min=1
    )
    autocast: bool = hparam(False, "bf16 autocast of the feature extractor")
    channels_last: bool = hparam(False, "channels-last memory format")
    label_expiry: int = hparam(
        DEFAULT_MAX_AGE, "steps an asynchronous annotator's request waits before it expires", min=0
    )


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


def build_eatta(
    model: nn.Module,
    cfg: EATTAConfig,
    oracle: Oracle | None,
    budget: Budget,
    *,
    debiaser: GradNormDebiaser | None = None,
    late_labels: LateLabels | None = None,
    nearest_replay: NearestReplay | None = None,
    selector: Selector | None = None,
) -> AdaptiveMethod:
    """EATTA from a validated config; ``debiaser`` replaces the config's GND, ``late_labels``
    weighs late labels and ``selector`` replaces the config's selector (variants)."""
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
        history=cfg.history,
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
        nearest_replay=nearest_replay,
    )


register(
    MethodSpec(
        "eatta",
        build_eatta,
        active=True,
        config=EATTAConfig,
        datasets=DATASET_PRESETS["eatta"],
        summary="EATTA: perturbation selection, class balancing, gradient-norm debiasing",
    )
)
