"""EATTA: effortless active test-time adaptation (CVPR 2025), one label per batch at most."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.debias import GradNormDebiaser, LossWeights
from eatta.history import ClassHistory, Selection, make_history
from eatta.losses import default_entropy_margin, entropy, masked_mean
from eatta.methods._active import select_and_ask, split_answer
from eatta.methods._grads import (
    EDGES_SUPPORTED,
    SegmentPlan,
    batched_grads,
    plan_segments,
    segmented_grads,
    two_pass_grads,
)
from eatta.methods.base import AdaptiveMethod, InvalidInputError, unique_params
from eatta.oracle import Oracle
from eatta.selection.base import SelectionContext, Selector
from eatta.selection.perturbation import PerturbationSelector
from eatta.split import ModelSplit

__all__ = ["EATTA", "GradMode", "StepRecord"]

#: How EATTA computes the two gradients it needs (see :mod:`eatta.methods._grads`).
GradMode = Literal["auto", "two-pass", "segmented", "batched"]


@dataclass
class StepRecord:
    """What one adaptation step did; tensors stay on the device (reading them syncs)."""

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


def _global_norm(grads: Sequence[Tensor | None]) -> Tensor:
    present = [g for g in grads if g is not None]
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(present)))


_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def _has_module_hooks(model: nn.Module) -> bool:
    """Whether any forward/backward hook is registered on ``model``'s modules or globally."""
    registry = nn.modules.module
    if any(getattr(registry, name, None) for name in _GLOBAL_HOOKS):
        return True
    return any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for m in model.modules()
    )


class EATTA(AdaptiveMethod):
    """Wraps a classifier; ``forward(x)`` predicts, labels at most ``budget`` samples, adapts.

    Each step (method.md §1): features ``z`` and logits ``o``; the selector scores the batch
    (perturbation difference by default), the class history picks up to ``k`` samples, the oracle
    labels them; ``L_sup`` = cross-entropy on the labelled samples (plus a replayed mini-batch
    when a buffer is used), ``L_unsup`` = mean entropy of the confident (``H < margin``) unlabelled
    samples; the debiaser weights the two by their gradient norms (EMA-smoothed) and the optimizer
    takes one step. The returned logits are those computed before the update.

    Args:
        model: a classifier prepared with :func:`eatta.configure` (in place).
        optimizer: optimizes the trainable parameters (SGD lr 2.5e-4, momentum 0.9 in the paper).
        oracle: ``oracle(selected_inputs, indices) -> labels`` (see :mod:`eatta.oracle`).
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
        grad_mode: how the two gradients are computed; all give the same update (to float
            rounding). ``"segmented"``: two backward passes run segment by segment between cut
            points of the graph, as fast as ``"two-pass"`` and with about TENT's peak memory
            (a gradient hook on a tensor at a cut point runs twice per pass). ``"two-pass"``:
            one pass retaining the whole graph, then one freeing it (+14-19% peak memory over
            TENT on ResNets). ``"batched"``: one vmapped pass over both losses
            (``is_grads_batched``); low memory, but slower in PyTorch 2.13. ``"auto"``:
            ``"segmented"``, or ``"two-pass"`` when the model has module hooks or its graph is
            small (:attr:`segment_min_bytes`).
        autocast: run the feature extractor under bfloat16 autocast (CPU or GPU). The head, the
            perturbation scores and the losses stay in float32 (the perturbation difference is
            ~1e-3 and would drown in bfloat16 rounding). Off by default.
        channels_last: convert the model (in place) and each 4-d input batch to the channels-last
            memory format, which convolutions on GPUs and oneDNN CPUs run faster. Off by default.

    On accelerators the input's finiteness check is read at the step's one host synchronisation
    (the selection), not before the forward pass; the forward pass must then have no side effects
    (true for a model prepared with :func:`eatta.configure`), else the check runs up front.
    """

    #: Segments of the ``"segmented"`` gradient computation (more: less memory, more calls).
    grad_segments: int = 4
    #: ``"auto"`` segments only graphs whose gradients total at least this many bytes; below,
    #: little memory is at stake and plain two passes are a little faster (digits-C CNN: 12 MiB).
    segment_min_bytes: int = 32 * 2**20

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
        grad_mode: GradMode = "auto",
        autocast: bool = False,
        channels_last: bool = False,
    ) -> None:
        if optimizer is None:
            raise TypeError("EATTA needs an optimizer over the trainable parameters")
        if grad_mode not in get_args(GradMode):
            raise ValueError(f"grad_mode must be one of {get_args(GradMode)}, got {grad_mode!r}")
        if not callable(oracle):
            raise TypeError(f"oracle must be callable, got {type(oracle).__name__}")
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if channels_last:
            model.to(memory_format=torch.channels_last)
        super().__init__(model, optimizer, split=split, check_finite=check_finite)
        self.grad_mode: GradMode = grad_mode
        self.autocast = bool(autocast)
        self.channels_last = bool(channels_last)
        self._finite: Tensor | None = None  # deferred finiteness flag (accelerators)
        self.oracle = oracle
        self.budget = Budget.coerce(budget)
        self.selector: Selector = selector if selector is not None else PerturbationSelector()
        self.history = make_history(history)
        self.debiaser = debiaser if debiaser is not None else GradNormDebiaser()
        self.buffer = LabelBuffer(buffer) if isinstance(buffer, int) else buffer
        self.entropy_margin = entropy_margin
        self.steps = steps
        self._train = unique_params(self.params)
        if not self._train:
            raise ValueError("the optimizer holds no parameters")
        owned = {id(p) for p in model.parameters()}
        measure = self._train if grad_norm_params is None else unique_params(grad_norm_params)
        if any(id(p) not in owned for p in measure):
            raise ValueError("grad_norm_params must be parameters of the model")
        for p in measure:
            p.requires_grad_(True)
        train_ids = {id(p) for p in self._train}
        self._all = self._train + [p for p in measure if id(p) not in train_ids]
        measure_ids = {id(p) for p in measure}
        self._measure_pos = [i for i, p in enumerate(self._all) if id(p) in measure_ids]
        self.last_step: StepRecord | None = None

    @property
    def labels_used(self) -> int:
        return self.budget.labels_used

    # -- input -------------------------------------------------------------------------------
    def check_input(self, x: Tensor) -> None:
        """As :meth:`AdaptiveMethod.check_input`; on accelerators the finiteness is read later.

        ``bool(torch.isfinite(x).all())`` would stall the host on the device at the start of
        every step; instead the flag is computed on the device and read at the selection's sync
        (or before the update in a step without labels), before any state changes.
        """
        if not (self.check_finite and isinstance(x, Tensor) and self._defer_finite(x)):
            self._finite = None
            super().check_input(x)
            return
        self.check_finite = False
        try:
            super().check_input(x)
        finally:
            self.check_finite = True
        self._finite = torch.isfinite(x).all()

    def _defer_finite(self, x: Tensor) -> bool:
        if x.device.type == "cpu":  # no sync to save
            return False
        return not any(  # a forward pass that updates running statistics must not see bad input
            isinstance(m, nn.modules.batchnorm._BatchNorm)
            and m.training
            and m.track_running_stats
            and m.running_mean is not None
            for m in self.model.modules()
        )

    def _raise_if_not_finite(self) -> None:
        flag, self._finite = self._finite, None
        if flag is not None and not bool(flag):
            raise InvalidInputError("input contains NaN or infinite values")

    def _features(self, x: Tensor) -> Tensor:
        if not self.autocast:
            return self.split.backbone(x)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            z = self.split.backbone(x)
        return z.float()

    # -- the step ----------------------------------------------------------------------------
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        logits = self._step(x)
        for _ in range(self.steps - 1):
            self._step(x)
        return logits

    def _select(
        self, x: Tensor, z: Tensor, o: Tensor, k: int
    ) -> tuple[SelectionContext, Selection, Tensor | None]:
        backbone, head = self.split
        ctx = SelectionContext(inputs=x, features=z, logits=o, head=head, backbone=backbone)
        # the selection synchronised with the device: reading a deferred finiteness flag is free
        selection, labels = select_and_ask(
            self.selector,
            self.history,
            ctx,
            k,
            self.oracle,
            check=lambda _: self._raise_if_not_finite(),
        )
        return ctx, selection, labels

    def _step(self, x: Tensor) -> Tensor:
        head = self.split.head
        z = self._features(x)
        o = head(z)
        if o.dim() != 2:
            raise RuntimeError(
                f"the head must return [batch, classes] logits, got {tuple(o.shape)}"
            )
        num_classes = o.shape[1]
        record = StepRecord(logits=o.detach(), pseudo_labels=o.detach().argmax(1))

        # segment plan of the backward graph below the logits, made while an accelerator still
        # runs the forward pass (the selection below synchronises)
        k = self.budget.allowance()
        plan = self._plan(o) if k > 0 else None

        # 1. select and ask (no state changes until the oracle's answer is validated)
        ctx = selection = labels = None
        if k > 0:
            ctx, selection, labels = self._select(x, z, o, k)
            record.scores = selection.update.get("scores")
        asked = torch.empty(0, dtype=torch.long) if selection is None else selection.indices
        lab_idx, lab_y, answered = split_answer(asked, labels)
        n_lab = len(lab_idx)
        self._raise_if_not_finite()  # no-op unless deferred and not yet read (no selection)

        # 2. losses and gradients (parameters untouched)
        h = entropy(o)
        margin = (
            self.entropy_margin
            if self.entropy_margin is not None
            else default_entropy_margin(num_classes)
        )
        unsup_mask = h.detach() < margin
        lab_dev = lab_idx.to(o.device)
        if n_lab:
            unsup_mask = unsup_mask.index_fill(0, lab_dev, False)
        loss_unsup, n_unsup = masked_mean(h, unsup_mask)
        undo = rng = None
        if self.buffer is not None:
            rng = self.buffer.generator.get_state()
            if n_lab:
                undo = self.buffer.add(x[lab_dev], lab_y.to(o.device))
        try:
            terms = []
            if n_lab:
                terms.append(F.cross_entropy(o[lab_dev], lab_y.to(o.device)))
            if self.buffer is not None and len(self.buffer):
                bx, by = self.buffer.sample()
                terms.append(F.cross_entropy(head(self._features(bx)), by))
                plan = None  # a second graph through the same weights: plan from the losses
            loss_sup = sum(terms[1:], terms[0]) if terms else None
            grads, weights, g_sup, g_unsup = self._gradients(loss_sup, loss_unsup, n_unsup, plan)
        except BaseException:
            if self.buffer is not None:
                if undo is not None:
                    self.buffer.undo(undo)
                self.buffer.generator.set_state(rng)
            raise

        # 3. commit: budget, history, selector, debiaser EMA, optimizer
        self.budget.commit(n_lab)
        if selection is not None and n_lab:
            self.history.commit(selection, answered.tolist())
            assert ctx is not None
            self.selector.commit(ctx, selection, labels)
        for p, g in zip(self._train, grads, strict=False):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

        record.selected, record.labels = lab_idx, lab_y
        record.class_history = list(getattr(self.history, "classes", []))
        record.loss_unsup, record.num_unsup = loss_unsup.detach(), n_unsup
        if loss_sup is not None:
            assert weights is not None
            record.loss_sup = loss_sup.detach()
            record.grad_norm_sup, record.grad_norm_unsup = g_sup, g_unsup
            record.weights = weights
            record.loss = (weights.sup * loss_sup + weights.unsup * loss_unsup).detach()
        else:
            record.loss = loss_unsup.detach()
        self.last_step = record
        return o.detach()

    def _plan(self, o: Tensor) -> SegmentPlan | None:
        """Cut points below the logits ``o`` for ``"segmented"`` gradients, else None.

        Both losses are functions of ``o`` alone, so every path from them to the parameters runs
        through ``o``'s node and cuts found below it are cuts of the losses' graph.
        """
        if not self._segmenting() or not self.debiaser.needs_grad_norms or o.grad_fn is None:
            return None
        return plan_segments([o.grad_fn], self._all, self.grad_segments, self._min_bytes())

    def _min_bytes(self) -> float:
        return self.segment_min_bytes if self.grad_mode == "auto" else 0.0

    def _segmenting(self) -> bool:
        """Whether this step's gradients are computed segment by segment.

        ``"auto"`` segments unless the model has module hooks: a gradient hook registered on a
        tensor at a cut point would run once when the segment above captures its gradient and
        again when the segment below starts from it, so with hooks (which might register such
        tensor hooks) it keeps the plain two passes.
        """
        if not EDGES_SUPPORTED:
            return False
        if self.grad_mode == "segmented":
            return True
        return self.grad_mode == "auto" and not _has_module_hooks(self.model)

    def _gradients(
        self,
        loss_sup: Tensor | None,
        loss_unsup: Tensor,
        n_unsup: Tensor,
        plan: SegmentPlan | None = None,
    ) -> tuple[list[Tensor], LossWeights | None, Tensor | None, Tensor | None]:
        """Gradients for the trainable parameters, using at most two backward passes each."""
        params = self._all
        if loss_sup is None:  # no label: plain confident-entropy step, weight 1
            g = torch.autograd.grad(loss_unsup, self._train, allow_unused=True)
            return (
                [self._zero_if_none(t, p) for t, p in zip(g, self._train, strict=True)],
                None,
                None,
                None,
            )
        if not self.debiaser.needs_grad_norms:
            g = torch.autograd.grad(loss_sup + loss_unsup, self._train, allow_unused=True)
            one = torch.ones((), device=loss_sup.device)
            grads = [self._zero_if_none(t, p) for t, p in zip(g, self._train, strict=True)]
            return grads, LossWeights(one, one, one, one), None, None
        gs, gu = self._two_grads(loss_sup, loss_unsup, params, plan)
        zero = loss_sup.new_zeros(())
        g_sup = _global_norm([gs[i] for i in self._measure_pos] + [zero])
        g_unsup = _global_norm([gu[i] for i in self._measure_pos] + [zero])
        weights = self.debiaser.weights(g_sup, g_unsup, n_unsup > 0)
        train = self._train
        sup = [self._zero_if_none(g, p) for g, p in zip(gs, train, strict=False)]
        unsup = [self._zero_if_none(g, p) for g, p in zip(gu, train, strict=False)]
        grads = torch._foreach_mul(sup, weights.sup)  # γ_sup·∇L_sup + γ_unsup·∇L_unsup, fused
        torch._foreach_add_(grads, torch._foreach_mul(unsup, weights.unsup))
        return list(grads), weights, g_sup, g_unsup

    def _two_grads(
        self,
        loss_sup: Tensor,
        loss_unsup: Tensor,
        params: list[nn.Parameter],
        plan: SegmentPlan | None = None,
    ) -> tuple[list[Tensor | None], list[Tensor | None]]:
        """``∇L_sup`` and ``∇L_unsup`` over ``params`` as ``grad_mode`` says (same values)."""
        if self.grad_mode == "batched":
            return batched_grads(loss_sup, loss_unsup, params)
        if plan is None and not self._segmenting():
            return two_pass_grads(loss_sup, loss_unsup, params)
        return segmented_grads(
            loss_sup, loss_unsup, params, self.grad_segments, plan, self._min_bytes()
        )

    @staticmethod
    def _zero_if_none(g: Tensor | None, p: nn.Parameter) -> Tensor:
        return torch.zeros_like(p) if g is None else g

    # -- state -------------------------------------------------------------------------------
    def state_parts(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "selector": self.selector,
            "history": self.history,
            "debiaser": self.debiaser,
            "buffer": self.buffer,
        }
