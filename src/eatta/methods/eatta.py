"""EATTA's step (CVPR 2025, Sec. 3; ``docs/method.md`` section 1), read next to the paper.

With ``z = f(x)`` the features, ``o = h(z)`` the logits, ``p = softmax(o)``, ``H = -Σ p log p``:

* Eq. 3: ``diff_i = |p_i[ŷ_i] - softmax(h(z_i + ε))[ŷ_i]|``, ``ε ~ N(0, σ²)``: the selector
  scores the batch, the class balance picks up to ``k`` samples ``B_o``, the annotator labels them.
* Eq. 2: ``L = γ_sup·CE(B_o) + γ_unsup·E(B \\ B_o)``, the entropy ``E`` (Eq. 1) of the confident
  unlabelled samples (``H < 0.4 ln C``).
* Eq. 4-5: ``γ_sup = 2 g_u/(g_s + g_u)``, ``γ_unsup = 2 g_s/(g_s + g_u)`` with
  ``g_s = ‖∇L_sup‖₂``, ``g_u = ‖∇L_unsup‖₂``; Eq. 6: their EMA (:mod:`eatta.debias.gradnorm`).
* One optimizer step on ``γ_sup·∇L_sup + γ_unsup·∇L_unsup``; the logits returned are those
  computed before it.

:meth:`EATTA._step` is that, on one screen; each piece it calls is chosen once: the gradient
(:mod:`eatta.gradients`: exact, or approximate), the answers beyond fresh labels and replay
(:class:`~eatta.methods.replay.Replay`), the debiaser. A step whose update is not finite is
skipped. The registered variants and every key: :mod:`eatta.methods.eatta_family`.

On an accelerator the step waits for the device twice: for the request (scores, pseudo-labels,
the input's finiteness in one copy) and for the update's finiteness (``tests/test_sync_count.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta._finite import DeferredFiniteCheck
from eatta._warn import warn_at_caller
from eatta.annotate.asking import DEFAULT_LABEL_EXPIRY, AnswerRecord
from eatta.annotate.oracle import Oracle
from eatta.balance import ClassBalance, make_balance
from eatta.budget import Budget
from eatta.buffer import LabelBuffer, make_buffer
from eatta.debias import GradNormDebiaser, LossWeights, make_debiaser
from eatta.gradients import GradMode, check_gradient, make_gradient
from eatta.gradients.approx import ProxyName
from eatta.losses import default_entropy_margin, entropy, masked_mean
from eatta.methods.active import ActiveMethod
from eatta.methods.base import InvalidInputError, Options, read_logits, unique_params
from eatta.methods.late_labels import LateLabels
from eatta.methods.replay import Replay, commit_late
from eatta.methods.step_record import StepRecord, late_answers
from eatta.selection import make_selector
from eatta.selection.base import Selector
from eatta.split import backward_twice, is_compiled

__all__ = ["EATTA", "StepRecord"]


class EATTA(ActiveMethod):
    """Wraps a classifier; ``forward(x)`` predicts, labels at most ``budget`` samples, adapts.

    Args (beyond :class:`~eatta.methods.active.ActiveMethod`'s); a component is given by name
    (built with its defaults) or as an instance, the same values ``eatta.create`` takes:
        selector: sample selector, a name of :data:`eatta.selection.SELECTORS` or a
            :class:`~eatta.selection.base.Selector`; default ``"perturbation"`` (σ = 0.01).
        balance: ``"reference"`` (the authors' code, default), ``"last-k"`` (the paper's text),
            ``"none"`` or ``None``, or a :class:`~eatta.balance.ClassBalance`.
        debiaser: loss weighting, ``"gradnorm"`` (default, α = 0.8), ``"bounded"``
            (``eatta-stable``'s), ``"none"`` (weights 1, 1), or a :class:`GradNormDebiaser`.
        buffer: a :class:`LabelBuffer`, or an int capacity (the paper's BFS = 300), or None.
        entropy_margin: confidence threshold; default ``0.4 ln C``.
        steps: optimization steps per batch, each re-selecting (2 in the reference preset).
        grad_norm_params: what the two norms are measured over, if not the optimizer's (kept).
        grad_mode, approx_proxy, approx_refresh: how the update's gradient is computed
            (:func:`eatta.gradients.make_gradient`; ``docs/approx-step.md``).
        late_labels: how late answers count (:class:`~eatta.methods.late_labels.LateLabels`).

    ``eatta.create("eatta", ...)`` builds it with SGD and Nesterov momentum (the authors' code).
    """

    binary_feedback = True

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        oracle: Oracle,
        budget: int | Budget = 1,
        selector: str | Selector | None = None,
        balance: str | ClassBalance | None = "reference",
        debiaser: str | GradNormDebiaser | None = None,
        buffer: LabelBuffer | int | None = None,
        entropy_margin: float | None = None,
        steps: int = 1,
        grad_norm_params: Sequence[nn.Parameter] | None = None,
        grad_mode: GradMode = "auto",
        approx_proxy: ProxyName = "auto",
        approx_refresh: int | None = None,
        late_labels: LateLabels | None = None,
        label_expiry: int = DEFAULT_LABEL_EXPIRY,
        **options: Unpack[Options],
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        check_gradient(grad_mode, approx_proxy, approx_refresh)
        owned = {id(p) for p in model.parameters()}
        if grad_norm_params is not None and any(id(p) not in owned for p in grad_norm_params):
            raise ValueError("grad_norm_params must be parameters of the model")
        # the components, by name or instance, before anything of the model changes
        self.selector = make_selector("perturbation" if selector is None else selector)
        self.balance = make_balance(balance)
        self.debiaser: GradNormDebiaser = make_debiaser(debiaser)
        buffer = make_buffer(buffer)
        super().__init__(
            model, optimizer, oracle=oracle, budget=budget, label_expiry=label_expiry, **options
        )
        self.entropy_margin = entropy_margin
        self.steps, self.skipped_steps = steps, 0  # skipped: for non-finite gradients
        self._finite = self._deferred = DeferredFiniteCheck()
        measure = self._train if grad_norm_params is None else unique_params(grad_norm_params)
        for p in measure:
            p.requires_grad_(True)
        #: the norms and the weighted gradient, chosen once (:mod:`eatta.gradients`)
        self.gradient = make_gradient(
            grad_mode, model, self._train, measure, needs_norms=self.debiaser.needs_grad_norms,
            proxy=approx_proxy, refresh=approx_refresh, backbone=lambda: self.split.backbone,
        )  # fmt: skip
        self.grad_mode: GradMode = grad_mode
        late = late_labels if self.asynchronous else None  # None: no buffer, no late answer
        self.replay = None if buffer is None and not self.asynchronous else Replay(
            buffer=buffer, late=late, features=self.features, batchnorm=self._has_batchnorm
        )  # fmt: skip
        self._compiled = is_compiled(model)
        self.last_step: StepRecord | None = None

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        twice = backward_twice(self.model) if self._compiled else contextlib.nullcontext()
        with twice:  # a compiled backbone: its backward runs twice
            logits = self._step(x)
            for _ in range(self.steps - 1):
                self.snapshot_parts()  # the step before is committed: a failure rolls back here
                self._step(x)
        return logits

    def _step(self, x: Tensor) -> Tensor:
        backbone, head = split = self._split or self.split
        z = self.features(backbone, x)  # f(x)
        o = read_logits(head(z), self.model, what="the head")  # h(f(x))
        record = StepRecord(logits=o.detach(), pseudo_labels=o.detach().argmax(1))
        k, grad = self.budget.allowance(), self.gradient
        # cut points for the two backward passes, planned while an accelerator runs the forward
        plan = grad.plan(o) if k > 0 or self.asking.pending is not None else None

        # Eq. 3 and the class balance: up to k samples B_o, and the annotator's answers (no
        # state changes before they are validated; reading a deferred finite flag there is free)
        check = None if self._finite.flag is None else self._raise_if_not_finite  # a deferred flag
        lab = self.ask(x, z, o, k, self.selector, self.balance, check, self._finite)
        record.scores = None if lab.selection is None else lab.selection.update.get("scores")

        # Eq. 2, first term: L_sup = CE on B_o
        terms: list[Tensor] = []
        if len(lab.indices):
            idx, y = lab.on(o.device)  # the answer crosses to the device once, not blocking
            terms.append(F.cross_entropy(o[idx], y))
        # Eq. 1 on B \ B_o: the confident (H < margin) unanswered samples
        answered = torch.cat([lab.indices, lab.negatives]) if len(lab.negatives) else lab.indices
        h = entropy(o)
        margin = self.entropy_margin
        margin = default_entropy_margin(o.shape[1]) if margin is None else float(margin)
        mask = h.detach() < margin
        if len(answered):
            mask = mask.index_fill(0, answered.to(o.device, non_blocking=True), False)
        unsup = None
        if self.replay is not None:  # answers that are not a fresh label, and replay
            more = self.replay.terms(x, z, o, lab, split, self.request_step, (h, mask, margin))
            terms, unsup = terms + more.terms, more.unsup
            plan = None if more.second_forward else plan  # a second graph: plan from the losses
        loss_sup = sum(terms[1:], terms[0]) if terms else None
        loss_unsup, n_unsup = masked_mean(h, mask) if unsup is None else unsup

        # Eq. 4-6: γ_sup, γ_unsup from ‖∇L_sup‖₂, ‖∇L_unsup‖₂; the update's gradient (Eq. 2)
        if loss_sup is None:  # no label: the entropy term alone, weight 1
            w, g_sup, g_unsup = None, None, None
            grads = grad.entropy_only(loss_unsup)
        else:
            g_sup, g_unsup = grad.norms(loss_sup, loss_unsup, plan, z)
            w = self.debiaser.weights(g_sup, g_unsup, n_unsup > 0)
            grads = grad.weighted(w.sup, w.unsup)  # γ_sup·∇L_sup + γ_unsup·∇L_unsup

        # one update, or none if it is not finite
        if not self._finite_update(grads, w, g_sup, g_unsup):
            return self._skip(record)
        self._commit(lab)
        for p, g in zip(grad.train, grads, strict=False):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._record(record, lab, loss_sup, loss_unsup, n_unsup, w, g_sup, g_unsup)
        return o.detach()

    def _raise_if_not_finite(self, _: object = None) -> None:
        if not self._finite.read():  # read with the selection, when the selector read it
            raise InvalidInputError("input contains NaN or infinite values")

    def _finite_update(self, grads: list[Tensor], w: LossWeights | None, *norms: Any) -> bool:
        """Whether the update is finite, read with a deferred input flag not read yet."""
        flag = self.gradient.finite(grads, None if w is None else (w.sup, w.unsup), norms)
        if self._finite.flag is None and self._finite.known is None:  # nothing deferred
            return bool(flag)
        ok_input, ok = self._finite.with_update(flag)
        if not ok_input:
            raise InvalidInputError("input contains NaN or infinite values")
        return ok

    def _skip(self, record: StepRecord) -> Tensor:
        """Non-finite gradients: every part back as it was (this step's requests cancelled, the
        answers it collected kept for the next step), nothing applied."""
        self.restore_parts()
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

    def _commit(self, lab: AnswerRecord) -> None:
        """Record the answered labels: budget, class balance (annotated classes), selector."""
        self.charge(lab)
        if lab.selection is not None and len(lab.indices):
            assert lab.ctx is not None and lab.labels is not None
            self.balance.commit(lab.selection, lab.answered.tolist(), lab.labels.tolist())
            self.selector.commit(lab.ctx, lab.selection, lab.labels)
        if lab.late:
            commit_late(self.balance, self.selector, lab.late, lab.late_ctx)
        self.asking.committed()

    def _record(self, r: StepRecord, lab: AnswerRecord, *losses: Any) -> None:
        """Fill in what the step asked, learned and weighed, and keep it as :attr:`last_step`."""
        loss_sup, loss_unsup, r.num_unsup, w, g_sup, g_unsup = losses
        measured, r.grad_norms_approx = self.gradient.measured, self.gradient.estimated
        r.selected, r.labels, r.negatives = lab.indices, lab.targets, lab.negatives
        r.requested = lab.indices if lab.selection is None else lab.selection.indices
        r.late, r.late_answers = len(lab.late), late_answers(lab.late) if lab.late else []
        r.asked, r.answered = self.counts(lab)
        r.class_history = list(getattr(self.balance, "classes", []))
        r.loss_unsup, r.weights = loss_unsup.detach(), w
        r.loss_sup = None if loss_sup is None else loss_sup.detach()
        shown = measured or r.grad_norms_approx  # else the debiaser's 1, 1 without norms
        r.grad_norm_sup, r.grad_norm_unsup = (g_sup, g_unsup) if shown else (None, None)
        labelled = loss_sup is not None and w is not None  # else the entropy loss alone
        r.loss = (w.sup * loss_sup + w.unsup * loss_unsup if labelled else loss_unsup).detach()
        self.last_step = r

    # -- state -------------------------------------------------------------------------------
    def state_parts(self) -> dict[str, Any]:
        r, cal = self.replay, getattr(self.gradient, "calibration", None)
        return {
            "budget": self.budget,
            "selector": self.selector,
            "balance": self.balance,
            "debiaser": self.debiaser,
            "buffer": None if r is None else r.buffer,
            "pending": self.asking.pending,
            "late_labels": None if r is None else r.late,
            "nearest_replay": None if r is None else r.nearest,
            **({} if cal is None else {"grad_norm_estimate": cal}),
        }

    def method_state(self) -> dict[str, Any]:
        return {**super().method_state(), "skipped_steps": self.skipped_steps}

    def load_method_state(self, state: dict[str, Any]) -> None:
        super().load_method_state(state)
        self.skipped_steps = int(state.get("skipped_steps", 0))

    def reset_method_state(self) -> None:
        super().reset_method_state()
        self.skipped_steps = 0
