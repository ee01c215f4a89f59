"""What EATTA's step learns from beyond this batch's fresh labels, in one call.

:meth:`Replay.terms` gives the supervised terms of every answer that is not a fresh class label,
and of what is replayed, with the entropy term of a step that falls back:

- a "no" on the predicted class ``c`` (yes/no annotators): ``-log(1 - p_c)``
  (:func:`~eatta.losses.complementary_cross_entropy`);
- late answers (asynchronous annotators): their kept samples re-run through the current model,
  cross-entropy on a late class and ``-log(1 - p_c)`` on a late "no", each at its weight
  (:class:`~eatta.methods.late_labels.LateLabels`); the class balance and the selector learn of
  them when the step commits (:func:`commit_late`);
- the kept labelled samples nearest the batch, in a step without a fresh answer
  (:class:`~eatta.methods.nearest_replay.NearestReplay`);
- a mini-batch from the replay buffer (:class:`~eatta.buffer.LabelBuffer`), run alone as in the
  authors' code; one sample (the buffer's first, with one label a batch) that a BatchNorm model
  cannot normalize alone (its features 1x1: a small input, where their code fails) runs with the
  batch instead, as late answers do;
- in a step whose labels weigh too little (``LateLabels.anchor``), the entropy term is ETA's
  filtered one instead of Eq. 1's.

A synchronous oracle without a buffer has nothing to replay: the step then makes no call here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eatta.annotate.asking import AnswerRecord
from eatta.annotate.oracle import ABSTAIN
from eatta.annotate.pending import Arrived
from eatta.balance import ClassBalance, Selection
from eatta.buffer import LabelBuffer
from eatta.losses import complementary_cross_entropy
from eatta.methods.late_labels import LateLabels
from eatta.methods.nearest_replay import NearestReplay
from eatta.selection.base import SelectionContext, Selector

__all__ = ["Replay", "ReplayTerms", "answer_terms", "commit_late", "late_samples"]

#: torch's refusal of BatchNorm over one value per channel (``F.batch_norm``, training mode).
_ONE_VALUE = "Expected more than 1 value per channel"


@dataclass
class ReplayTerms:
    """The supervised terms beyond the fresh labels' cross-entropy; whether any ran a second
    forward pass (the gradient's plan from the logits then no longer holds); and the entropy term
    ``(loss, count)`` of a step that falls back (None: Eq. 1's)."""

    terms: list[Tensor] = field(default_factory=list)
    second_forward: bool = False
    unsup: tuple[Tensor, Tensor] | None = None


class Replay:
    """The answers beyond fresh labels, and what is replayed (see the module docstring).

    ``features(backbone, x)``: the step's feature extractor call (under autocast when asked);
    ``batchnorm``: whether the model normalizes with the batch's statistics (late or replayed
    samples then run with the batch, as if asked now).
    """

    def __init__(
        self,
        *,
        buffer: LabelBuffer | None,
        late: LateLabels | None,
        features: Callable[[nn.Module, Tensor], Tensor],
        batchnorm: bool,
    ) -> None:
        self.buffer = buffer
        self.late = late
        self.nearest: NearestReplay | None = None if late is None else late.replay
        self.features = features
        self.batchnorm = batchnorm

    def terms(
        self,
        x: Tensor,
        z: Tensor,
        o: Tensor,
        lab: AnswerRecord,
        split: tuple[nn.Module, nn.Module],
        step: int,
        entropy: tuple[Tensor, Tensor, float],
    ) -> ReplayTerms:
        """The terms for the batch ``x`` (features ``z``, logits ``o``) and its answers ``lab``,
        at the annotator's step ``step``; ``entropy``: Eq. 1's per-sample entropy, mask of
        confident unanswered samples, and margin, for the fallback's entropy term."""
        if self.late is not None:  # (asynchronous only)
            self.late.observe(step, z)
        if len(lab.indices):
            idx, y = lab.on(o.device)
            if self.buffer is not None:
                self.buffer.add(x[idx], y)
            if self.nearest is not None and lab.ctx is not None:
                self.nearest.add(x[idx], y, lab.ctx.features[idx])
        out = ReplayTerms()
        out.terms = self._late(x, z, o, lab, split, step) if lab.late else answer_terms(o, lab)
        out.second_forward = bool(lab.late) or (self.buffer is not None and len(self.buffer) > 0)
        near = self._nearest(x, lab, split)
        if near is not None:
            out.terms.append(near)
            out.second_forward = True
        backbone, head = split
        if self.buffer is not None and len(self.buffer) > 0:
            bx, by = self.buffer.sample()
            out.terms.append(F.cross_entropy(head(self._replayed(backbone, x, bx)), by))
        late = self.late
        if late is not None and not len(lab.indices) and not len(lab.negatives):
            if late.filters(lab.late_weight):  # labels weigh too little: ETA's entropy term
                h, mask, margin = entropy
                out.unsup = late.entropy(h, o.detach().softmax(1), mask, margin)
        return out

    def _late(
        self,
        x: Tensor,
        z: Tensor,
        o: Tensor,
        lab: AnswerRecord,
        split: tuple[nn.Module, nn.Module],
        step: int,
    ) -> list[Tensor]:
        """Terms of the batch's "no" answers and the late answers (their kept samples through
        the current model); the late labelled samples join the buffer and the nearest replay,
        and give the selector's context."""
        late = lab.late
        xs = late_samples(late, x)
        backbone, head = split
        if self.batchnorm:  # normalized with the batch's statistics, as if asked now: a few
            # late samples alone would be normalized by their own statistics (measured on
            # digits-C: labels one batch late then help no more than labels that never come)
            both = self.features(backbone, torch.cat([x, xs]))
            zb, zl = both[: x.shape[0]], both[x.shape[0] :]  # the batch's: the same forward's
        else:
            zb, zl = z, self.features(backbone, xs)
        ol = head(zl)
        w = None
        if self.late is not None:
            asked = [a.request.step for a in late]
            w = self.late.weights(asked, step, features=zl.detach(), batch=zb.detach())
            w = w.to(ol.device, ol.dtype)
            lab.late_weight = float(w.sum())
        terms = answer_terms(o, lab, ol, w)
        pos = [i for i, a in enumerate(late) if a.label is not None]
        if pos:
            rows = torch.tensor(pos, device=ol.device)
            ys = torch.tensor([late[i].label for i in pos], dtype=torch.long, device=ol.device)
            if self.buffer is not None:
                self.buffer.add(xs[rows.to(xs.device)], ys)
            if self.nearest is not None:
                self.nearest.add(xs[rows.to(xs.device)], ys, zl[rows])
            lab.late_ctx = SelectionContext(
                inputs=xs[rows.to(xs.device)],
                features=zl.detach()[rows],
                logits=ol.detach()[rows],
                head=head,
                backbone=backbone,
            )
        return terms

    def _replayed(self, backbone: nn.Module, x: Tensor, bx: Tensor) -> Tensor:
        """The buffer's mini-batch ``bx`` through ``backbone``, alone as the authors' code runs
        it; one sample that BatchNorm cannot normalize alone (1x1 features: a small input) runs
        with the batch ``x`` instead, as a late answer's does."""
        try:
            return self.features(backbone, bx)
        except ValueError as err:
            if not (self.batchnorm and bx.shape[0] == 1 and _ONE_VALUE in str(err)):
                raise
        return self.features(backbone, torch.cat([x, bx]))[x.shape[0] :]

    def _nearest(
        self, x: Tensor, lab: AnswerRecord, split: tuple[nn.Module, nn.Module]
    ) -> Tensor | None:
        """In a step without a fresh answer: the kept labelled samples nearest the batch, run
        with it, their cross-entropies weighted by their similarity (NearestReplay)."""
        replay = self.nearest
        if replay is None or not len(replay) or len(lab.indices) or lab.ctx is None:
            return None
        near = replay.nearest(lab.ctx.features)
        if near is None:
            return None
        rx, ry, rw = near
        backbone, head = split
        rx = rx.to(x.device, x.dtype)
        if self.batchnorm:
            zr = self.features(backbone, torch.cat([x, rx]))[x.shape[0] :]
        else:
            zr = self.features(backbone, rx)
        ce = F.cross_entropy(head(zr), ry.to(x.device), reduction="none")
        w = rw.to(ce.device, ce.dtype)
        lab.late_weight += float(w.mean())
        return (ce * w).mean()


def late_samples(late: list[Arrived], like: Tensor) -> Tensor:
    """The kept samples of late answers, stacked on ``like``'s device and dtype."""
    return torch.stack([a.request.sample for a in late]).to(like.device, like.dtype)


def answer_terms(
    o: Tensor,
    answers: AnswerRecord,
    late_logits: Tensor | None = None,
    late_weights: Tensor | None = None,
) -> list[Tensor]:
    """Supervised terms of the answers that are not this batch's class labels.

    ``-log(1 - p_c)`` (:func:`~eatta.losses.complementary_cross_entropy`) on this batch's
    samples answered "no" on class ``c``; and, given ``late_logits`` (the late answers' samples
    through the current model, rows in the order of ``answers.late``), cross-entropy on the late
    class labels and ``-log(1 - p_c)`` on the late "no" answers, each late label at its weight
    when ``late_weights`` are given (the mean over the late labels as without weights).
    """
    terms = []
    if len(answers.negatives):
        neg = answers.negatives.to(o.device)
        terms.append(complementary_cross_entropy(o[neg], answers.not_labels.to(o.device)))
    if late_logits is None:
        return terms
    late, ol, w = answers.late, late_logits, late_weights
    pos = [i for i, a in enumerate(late) if a.label is not None]
    if pos:
        rows = torch.tensor(pos, device=ol.device)
        ys = torch.tensor([late[i].label for i in pos], dtype=torch.long, device=ol.device)
        if w is None:
            terms.append(F.cross_entropy(ol[rows], ys))
        else:
            terms.append((F.cross_entropy(ol[rows], ys, reduction="none") * w[rows]).mean())
    neg_rows = [i for i, a in enumerate(late) if a.not_label is not None]
    if neg_rows:
        rows = torch.tensor(neg_rows, device=ol.device)
        cs = torch.tensor([late[i].not_label for i in neg_rows], dtype=torch.long, device=ol.device)
        term = complementary_cross_entropy(ol[rows], cs)
        terms.append(term if w is None else term * w[rows].mean())
    return terms


def commit_late(
    balance: ClassBalance,
    selector: Selector,
    late: list[Arrived],
    ctx: SelectionContext | None,
) -> None:
    """Tell the class balance and the selector about late labels, as if they had come in their
    own step: the balance gets each label with the selection of the step that asked; the selector
    gets them with ``ctx``, the late samples' context (inputs, features, logits by the current
    model, rows in the order of ``late``'s labelled arrivals)."""
    labelled = [a for a in late if a.label is not None]
    for a in labelled:
        if a.selection is None:
            continue
        n = len(a.selection.indices)
        answered = [j == a.position for j in range(n)]
        labels = [a.label if j == a.position else ABSTAIN for j in range(n)]
        balance.commit(a.selection, answered, labels)  # type: ignore[arg-type]  # ints
    if labelled and ctx is not None:
        rows = torch.arange(len(labelled))
        selection = Selection(rows, [int(a.label) for a in labelled])  # type: ignore[arg-type]
        labels_t = torch.tensor([a.label for a in labelled], dtype=torch.long)
        selector.commit(ctx, selection, labels_t)
