"""CEMA (Chen et al., ICLR 2024) as an active TTA baseline, with oracle labels.

CEMA adapts an edge model from a cloud foundation model. The edge keeps only the samples whose
entropy lies between a low and a dynamic high threshold (:class:`~eatta.selection.
DynamicMarginSelector`) and uploads them; the cloud distils the foundation model into the edge
model on the uploaded samples plus samples replayed from a buffer, with the loss of the public
code (``TTADistillationLoss``)::

    α · mean_i[H_i · exp(E_max - H_i)] + β · KL(teacher ‖ student) + γ · CE(student, argmax teacher)

(the KL and CE terms weighted per sample by the teacher's ``exp(E_max - H_teacher)``).

In the active TTA comparison the annotator takes the foundation model's place: up to ``k``
(budget) samples of the band, the most uncertain first, are labelled. With a one-hot teacher
the KL term equals the cross-entropy, so the supervised part becomes ``(β + γ) · CE`` on the
labelled samples; the teacher-entropy weight of a one-hot teacher is the constant
``exp(E_max)``, which is dropped (weight 1). The entropy term covers every uploaded sample,
labelled or not, and the replayed ones. The replay buffer holds labelled samples (FIFO, 300:
the paper's BFS); each step replays a mini-batch of at most 32 of them, concatenated with the
uploaded samples into one forward pass as in CEMA. CEMA's cloud-side adaptation of the
foundation model itself and its redundancy filter (cosine similarity to a moving average of
predictions) have no counterpart here. Predictions come from a forward pass on the batch alone,
before the update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.asking import DEFAULT_LABEL_EXPIRY
from eatta.annotate.oracle import Oracle
from eatta.balance import NoClassBalance, Selection
from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.configure import configure
from eatta.losses import entropy
from eatta.methods.active import ActiveMethod
from eatta.methods.base import AdaptiveMethod, Options
from eatta.methods.config import ActiveConfig, ParamSelection, hparam
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.replay import late_samples
from eatta.selection.dynamic_margin import DynamicMarginSelector

__all__ = ["CEMA", "CEMARecord"]


@dataclass
class CEMARecord:
    """What one CEMA step did."""

    logits: Tensor
    band: Tensor
    thresholds: tuple[float, float]
    selected: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    labels: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    replayed: int = 0
    loss_entropy: Tensor | None = None
    loss_sup: Tensor | None = None
    loss: Tensor | None = None


class CEMA(ActiveMethod):
    """CEMA's selective entropy distillation with the oracle as the teacher.

    Args:
        model: a classifier prepared with :func:`eatta.configure` (norm affine parameters, as in
            CEMA).
        optimizer: over the trainable parameters (EATTA's setting: SGD lr 2.5e-4, momentum 0.9).
        oracle: ``oracle(selected_inputs, indices) -> labels``, or an asynchronous annotator
            (class labels only): a late label joins the replay buffer and the update of the step
            it arrives in.
        budget: labels per batch at most (CEMA labels only samples in the band).
        selector: the band rule; default ``DynamicMarginSelector(0.4, 0.02, 1.0, strict=True)``
            (EATTA's settings). It is consulted on every batch, so that its running entropy
            statistics see the whole stream.
        buffer: replay buffer of labelled samples (capacity, or a :class:`LabelBuffer`; 300).
        alpha, beta, gamma: CEMA's loss weights (3, 3, 1 in its public configuration).
        entropy_margin: ``E_max`` of the entropy weights; default ``0.4 ln C``.
        label_expiry: steps an asynchronous request waits for its answer before it expires.
        options: what every method takes (:class:`~eatta.methods.base.Options`: the parts,
            ``split``, ``check_finite``, ``autocast``, ``channels_last``).
    """

    selects_every_batch = True

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        oracle: Oracle,
        budget: int | Budget = 1,
        selector: DynamicMarginSelector | None = None,
        buffer: LabelBuffer | int | None = 300,
        alpha: float = 3.0,
        beta: float = 3.0,
        gamma: float = 1.0,
        entropy_margin: float | None = None,
        label_expiry: int = DEFAULT_LABEL_EXPIRY,
        **options: Unpack[Options],
    ) -> None:
        for name, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if entropy_margin is not None and not entropy_margin > 0:
            raise ValueError(f"entropy_margin must be > 0, got {entropy_margin}")
        super().__init__(
            model,
            optimizer,
            oracle=oracle,
            budget=budget,
            label_expiry=label_expiry,
            **options,
        )
        self.selector = selector if selector is not None else DynamicMarginSelector(strict=True)
        self.balance = NoClassBalance()
        self.buffer = LabelBuffer(buffer) if isinstance(buffer, int) else buffer
        self.alpha, self.beta, self.gamma = float(alpha), float(beta), float(gamma)
        self.entropy_margin = entropy_margin
        for p in self._train:
            p.requires_grad_(True)
        self.last_step: CEMARecord | None = None

    def thresholds(self, num_classes: int) -> tuple[float, float]:
        """The current ``(E_max^t, E_min)``."""
        return self.selector.thresholds(num_classes)

    # -- the step ----------------------------------------------------------------------------
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            z, o = self.features_and_logits(x)
        num_classes = o.shape[1]

        # 1. band and selection, then the oracle; state restored if anything fails
        def inside_band(selection: Selection) -> None:
            idx, band = selection.indices, selection.update["band"]
            if len(idx) and not bool(band[idx.to(band.device)].all()):
                raise RuntimeError("CEMA labels only samples inside the entropy band")

        k = self.budget.allowance()
        ans = self.ask(x, z, o, k, self.selector, self.balance, check=inside_band)
        assert ans.selection is not None  # selects on every batch
        band = ans.selection.update["band"]
        lab_idx, lab_y = ans.indices, ans.targets
        record = CEMARecord(
            logits=o.detach(),
            band=band,
            thresholds=ans.selection.update["thresholds"],
            selected=lab_idx,
            labels=lab_y,
        )

        # 2. commit: budget and replay buffer, then one update on uploaded + replayed samples
        self.charge(ans)
        if len(lab_idx) and self.buffer is not None:
            self.buffer.add(x[lab_idx.to(x.device)], lab_y.to(x.device))
        late = [a for a in ans.late if a.label is not None]
        late_x = late_y = None
        if late:  # late labels: into the buffer, and into this update as labelled rows
            late_x = late_samples(late, x)
            late_y = torch.tensor([a.label for a in late], dtype=torch.long, device=x.device)
            if self.buffer is not None:
                self.buffer.add(late_x, late_y)
        self._update(x, band, lab_idx, lab_y, num_classes, record, late_x, late_y)
        self.asking.committed()
        self.last_step = record
        return o.detach()

    def _update(
        self,
        x: Tensor,
        band: Tensor,
        lab_idx: Tensor,
        lab_y: Tensor,
        num_classes: int,
        record: CEMARecord,
        late_x: Tensor | None = None,
        late_y: Tensor | None = None,
    ) -> None:
        uploaded = band.nonzero().flatten()
        rows = [x[uploaded]]
        # targets of the uploaded rows: the oracle's label where given, -100 (ignored) elsewhere
        targets = torch.full((len(uploaded),), -100, dtype=torch.long, device=x.device)
        if len(lab_idx):
            position = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
            position[uploaded] = torch.arange(len(uploaded), device=x.device)
            targets[position[lab_idx.to(x.device)]] = lab_y.to(x.device)
        if late_x is not None and late_y is not None:
            rows.append(late_x)
            targets = torch.cat([targets, late_y])
        if self.buffer is not None and len(self.buffer):
            bx, by = self.buffer.sample()
            rows.append(bx)
            targets = torch.cat([targets, by.to(x.device)])
            record.replayed = len(bx)
        inputs = torch.cat(rows)
        if len(inputs) == 0 or (self.has_batchnorm and len(inputs) < 2):
            return  # nothing uploaded, or one sample that BatchNorm cannot normalize alone
        logits = self.logits(inputs)
        margin = (
            self.entropy_margin if self.entropy_margin is not None else 0.4 * math.log(num_classes)
        )
        h = entropy(logits)
        loss_ent = (h * torch.exp(margin - h.detach())).mean()
        loss = self.alpha * loss_ent
        supervised = targets >= 0
        if bool(supervised.any()):
            loss_sup = F.cross_entropy(logits[supervised], targets[supervised])
            loss = loss + (self.beta + self.gamma) * loss_sup
            record.loss_sup = loss_sup.detach()
        grads = torch.autograd.grad(loss, self._train, allow_unused=True)
        for p, g in zip(self._train, grads, strict=True):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        record.loss_entropy, record.loss = loss_ent.detach(), loss.detach()

    # -- state -------------------------------------------------------------------------------
    def state_parts(self) -> dict[str, Any]:
        parts = self.asking_parts()
        return {
            "budget": parts["budget"],
            "selector": self.selector,
            "buffer": self.buffer,
            "pending": parts["pending"],
        }


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CEMAConfig(ActiveConfig):
    """CEMA's keys. EATTA supplementary: SGD 2.5e-4 (momentum 0.9); entropy thresholds
    0.4 ln C / 0.02 ln C, decreasing factor 1.0, buffer 300. PACS is not given for CEMA: Adam 5e-3
    as for the other active baselines (:mod:`eatta.methods.presets`)."""

    params: ParamSelection = hparam("norm", "parameters to adapt (eatta.configure preset)")
    high_factor: float = hparam(0.4, "upper entropy bound, times ln C", min=0.0)
    low_factor: float = hparam(0.02, "lower entropy bound, times ln C", min=0.0)
    decreasing_factor: float = hparam(1.0, "decay of the upper bound", min=0.0)
    warmup_samples: int = hparam(1, "samples seen before the bounds adapt", min=0)
    buffer: int | None = hparam(300, "replay buffer size (None or 0: no buffer)", min=0)
    alpha: float = hparam(3.0, "weight of the entropy term")
    beta: float = hparam(3.0, "weight of the cross-entropy term")
    gamma: float = hparam(1.0, "weight of the replay term")
    entropy_margin: float | None = hparam(None, "entropy filter (None: 0.4 ln C)", min=0.0)
    seed: int = hparam(0, "seed of the buffer's draws")


def _build_cema(
    model: nn.Module, cfg: CEMAConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    assert oracle is not None
    params = configure(model, cfg.params)
    selector = DynamicMarginSelector(
        high_factor=cfg.high_factor,
        low_factor=cfg.low_factor,
        decreasing_factor=cfg.decreasing_factor,
        warmup_samples=cfg.warmup_samples,
        strict=True,
    )
    return CEMA(
        model,
        make_optimizer(params, cfg),
        oracle=oracle,
        budget=budget,
        selector=selector,
        buffer=LabelBuffer(cfg.buffer, seed=cfg.seed) if cfg.buffer else None,
        alpha=cfg.alpha,
        beta=cfg.beta,
        gamma=cfg.gamma,
        entropy_margin=cfg.entropy_margin,
        **cfg.options(),
        label_expiry=cfg.label_expiry,
        **parts,
    )


register(
    MethodSpec(
        "cema",
        _build_cema,
        active=True,
        config=CEMAConfig,
        datasets=DATASET_PRESETS["cema"],
        summary="CEMA: dynamic entropy band, oracle labels, entropy + CE with replay buffer 300",
    )
)
