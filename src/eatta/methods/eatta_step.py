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

:meth:`EATTAStep._step` is that, on one screen. What plugs in around it, each a part of its own:
how the two gradients and norms are computed (:mod:`eatta.methods.update`: exact, or the
approximate step's estimates), performance options (:class:`~eatta.methods.step_options.
StepOptions`: autocast, channels-last), answers that are not a fresh label and replay (late and
yes/no answers, the buffer, nearest replay: :meth:`EATTAStep._replay_terms`), the late-label
fallback's entropy (:meth:`EATTAStep._entropy_term`), and the finiteness check (a step whose
update is not finite is skipped: :meth:`EATTAStep._skip`).

On an accelerator the step waits for the device twice: once for the request (the scores and
pseudo-labels reach the host in one copy, with the input's finiteness flag, and the class
balance ranks them there), once at the end (whether the update is finite, i.e. whether the step
is skipped). The answer crosses to the device once, in a copy that does not block
(:meth:`~eatta.methods.active.Answers.on`); indices, labels, weights and norms stay on the
device in between. ``tests/test_sync_count.py`` counts this for every method on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from eatta._warn import warn_at_caller
from eatta.balance import ClassBalance
from eatta.buffer import LabelBuffer
from eatta.debias import GradNormDebiaser, LossWeights
from eatta.losses import default_entropy_margin, entropy, masked_mean
from eatta.methods._active import commit_late
from eatta.methods._grads import SegmentPlan
from eatta.methods.active import ActiveMethod, Answers
from eatta.methods.base import InvalidInputError
from eatta.methods.step_options import DeferredFiniteCheck, StepOptions
from eatta.methods.update import ExactUpdate, global_norm
from eatta.selection.base import Selector

__all__ = ["EATTAStep", "StepRecord"]


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


class EATTAStep(ActiveMethod):
    """The step of :class:`~eatta.methods.eatta.EATTA` and the parts it reads (the class that
    builds them is :class:`~eatta.methods.eatta.EATTA`)."""

    options: StepOptions
    _update: ExactUpdate
    selector: Selector
    balance: ClassBalance
    debiaser: GradNormDebiaser
    buffer: LabelBuffer | None
    entropy_margin: float | None
    skipped_steps: int
    _finite: DeferredFiniteCheck

    def _step(self, x: Tensor) -> Tensor:
        z = self.options.features(self.split.backbone, x)  # f(x)
        o = self.split.head(z)  # h(f(x))
        if o.dim() != 2:
            shape = tuple(o.shape)
            raise RuntimeError(f"the head must return [batch, classes] logits, got {shape}")
        record = StepRecord(logits=o.detach(), pseudo_labels=o.detach().argmax(1))
        k = self.budget.allowance()
        # cut points for the two backward passes, planned while an accelerator runs the forward
        plan = self._plan(o) if k > 0 or self.asynchronous else None

        # Eq. 3 and the class balance: up to k samples B_o, and the annotator's answers (no
        # state changes before they are validated; reading a deferred finite flag there is free)
        lab = self.ask(
            x, z, o, k, self.selector, self.balance,
            check=self._raise_if_not_finite, deferred=self._finite,
        )  # fmt: skip
        record.scores = None if lab.selection is None else lab.selection.update.get("scores")

        # Eq. 2, first term: L_sup = CE on B_o, plus answers that are not a fresh label and replay
        terms: list[Tensor] = []
        if len(lab.indices):
            idx, y = lab.on(o.device)  # the answer crosses to the device once, not blocking
            terms.append(F.cross_entropy(o[idx], y))
        more, replayed = self._replay_terms(x, z, o, lab)
        terms += more
        loss_sup = sum(terms[1:], terms[0]) if terms else None
        if replayed:
            plan = None  # a second graph through the same weights: plan from the losses

        # Eq. 1 on B \ B_o: mean entropy of the confident (H < margin) unanswered samples
        if len(lab.negatives):
            answered = torch.cat([lab.indices, lab.negatives]).to(o.device, non_blocking=True)
        else:
            answered = lab.on(o.device)[0] if len(lab.indices) else lab.indices
        loss_unsup, n_unsup = self._entropy_term(o, answered, lab)

        # Eq. 4-6: γ_sup, γ_unsup from ‖∇L_sup‖₂, ‖∇L_unsup‖₂; the update's gradient (Eq. 2)
        if loss_sup is None:  # no label: the entropy term alone, weight 1
            w, g_sup, g_unsup = None, None, None
            grads = self._update.entropy_only(loss_unsup)
        else:
            needs = self.debiaser.needs_grad_norms
            g_sup, g_unsup = self._update.norms(loss_sup, loss_unsup, needs, plan, z)
            w = self.debiaser.weights(g_sup, g_unsup, n_unsup > 0)
            # γ_sup·∇L_sup + γ_unsup·∇L_unsup
            grads = self._update.weighted_gradient(w.sup, w.unsup)

        # one update, or none if it is not finite
        if not self._update_is_finite(grads, w, g_sup, g_unsup):
            return self._skip(record)
        self._commit(lab)
        for p, g in zip(self._update.train, grads, strict=False):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._record(record, lab, loss_sup, loss_unsup, n_unsup, w, g_sup, g_unsup)
        return o.detach()

    # -- hooks the class fills in ------------------------------------------------------------
    def _replay_terms(
        self, x: Tensor, z: Tensor, o: Tensor, lab: Answers
    ) -> tuple[list[Tensor], bool]:
        """Supervised terms beyond the fresh labels' cross-entropy, and whether any of them ran
        a second forward pass (the buffer, late answers, nearest replay)."""
        raise NotImplementedError

    def _entropy_term(self, o: Tensor, answered: Tensor, lab: Answers) -> tuple[Tensor, Tensor]:
        """``L_unsup`` and the number of samples it averages (Eq. 1 on the confident samples)."""
        return self._confident_entropy(o, answered)

    def _plan(self, o: Tensor) -> SegmentPlan | None:
        """Cut points below the logits: both losses are functions of ``o`` alone."""
        return self._update.plan(o, self.debiaser.needs_grad_norms)

    # -- Eq. 1 ------------------------------------------------------------------------------
    def _entropy_below_margin(self, o: Tensor, labelled: Tensor) -> tuple[Tensor, Tensor, float]:
        """Per-sample entropy, the mask of unlabelled samples below the margin, and the margin."""
        h = entropy(o)
        margin = self.entropy_margin
        if margin is None:
            margin = default_entropy_margin(o.shape[1])
        mask = h.detach() < margin
        if len(labelled):
            mask = mask.index_fill(0, labelled.to(o.device, non_blocking=True), False)
        return h, mask, float(margin)

    def _confident_entropy(self, o: Tensor, labelled: Tensor) -> tuple[Tensor, Tensor]:
        """Mean entropy of the unlabelled samples below the margin, and their count."""
        h, mask, _ = self._entropy_below_margin(o, labelled)
        return masked_mean(h, mask)

    # -- around the update ------------------------------------------------------------------
    def _raise_if_not_finite(self, _: object = None) -> None:
        if not self._finite.read():  # read with the selection, when the selector read it
            raise InvalidInputError("input contains NaN or infinite values")

    def _update_is_finite(
        self,
        grads: list[Tensor],
        w: LossWeights | None,
        g_sup: Tensor | None,
        g_unsup: Tensor | None,
    ) -> bool:
        """Whether the update is finite; also reads a deferred input flag not read yet (a step
        without selection), in the same host synchronisation."""
        upd = self._update
        if (
            w is not None
            and g_sup is not None
            and g_unsup is not None
            and (upd.measured or upd.estimated)
        ):
            if upd.covers_update:  # the norms already saw every gradient
                flag = torch.isfinite(g_sup + g_unsup + w.sup + w.unsup)
            else:
                flag = torch.isfinite(global_norm(grads) + w.sup + w.unsup)
        else:
            flag = torch.isfinite(global_norm(grads))
        if self._finite.known is False:  # read with the selection (a check raises before)
            raise InvalidInputError("input contains NaN or infinite values")
        self._finite.known = None
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

    def _commit(self, lab: Answers) -> None:
        """Record the answered labels: budget, class balance (annotated classes), selector."""
        self.charge(lab)
        if lab.selection is not None and len(lab.indices):
            assert lab.ctx is not None and lab.labels is not None
            self.balance.commit(lab.selection, lab.answered.tolist(), lab.labels.tolist())
            self.selector.commit(lab.ctx, lab.selection, lab.labels)
        if lab.late:
            commit_late(self.balance, self.selector, lab.late, lab.late_ctx)
        self.asking_committed()

    def _record(
        self,
        record: StepRecord,
        lab: Answers,
        loss_sup: Tensor | None,
        loss_unsup: Tensor,
        n_unsup: Tensor,
        w: LossWeights | None,
        g_sup: Tensor | None,
        g_unsup: Tensor | None,
    ) -> None:
        """Fill in what the step did and keep it as :attr:`last_step`."""
        measured = self._update.measured or self._update.estimated
        record.selected, record.labels = lab.indices, lab.targets
        record.negatives, record.late = lab.negatives, len(lab.late)
        record.class_history = list(getattr(self.balance, "classes", []))
        record.loss_unsup, record.num_unsup = loss_unsup.detach(), n_unsup
        record.loss_sup = None if loss_sup is None else loss_sup.detach()
        record.grad_norm_sup = g_sup if measured else None
        record.grad_norm_unsup = g_unsup if measured else None
        record.weights = w
        record.grad_norms_approx = self._update.estimated
        if loss_sup is None or w is None:  # no label: the entropy loss alone
            record.loss = loss_unsup.detach()
        else:
            record.loss = (w.sup * loss_sup + w.unsup * loss_unsup).detach()
        self.last_step = record
