"""SimATTA (Gui et al., ICLR 2024): active TTA by incremental clustering and entropy balancing.

Per batch, following the official code (``ATTA/kernel/algorithms/SimATTA.py``):

1. Predict with the current model (the returned logits, computed before the update).
2. Incremental clustering (:class:`~eatta.selection.IncrementalClusteringSelector`) over the
   batch's high-entropy samples picks up to ``k`` new anchors (``k`` from the budget); the oracle
   labels them. At most ``max_anchors`` (50) anchors are kept for clustering.
3. Source-like samples: a frozen copy of the initial model (SimATTA's "teacher") labels, with its
   own predictions, the lowest-entropy samples of the batch (at most ``source_per_batch``, only
   those with entropy below ``low_entropy_bound``).
4. Both kinds go into FIFO buffers of ``buffer_size`` (300: the paper's BFS) samples each.
5. Fine-tune: ``steps`` optimizer steps, each on a mini-batch of ``train_batch_size`` (32) from
   each buffer, loss ``(1 - α) CE(source-like) + α CE(labelled)`` with ``α = n_lab / (n_lab +
   n_src)`` (buffer sizes); the optimizer's state starts afresh each batch, as SimATTA builds a
   new SGD optimizer per batch. Then the anchors' features are recomputed with the new model.

Deliberate differences from the official code: anchor and source-like sets are bounded (the
official lists grow without bound); clustering uses fixed anchor centres and ``k`` new clusters
per batch (see :mod:`eatta.selection.clustering`); the early-stopping window of the official
training loop is dropped (with 10 steps per batch it never triggers); both entropy bounds default
to ``0.4 ln C``, the EATTA paper's SimATTA setting, instead of SimATTA's per-dataset constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.asking import DEFAULT_LABEL_EXPIRY
from eatta.annotate.oracle import Oracle
from eatta.annotate.pending import Arrived
from eatta.balance import NoClassBalance
from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.configure import batch_statistics_of, configure
from eatta.losses import default_entropy_margin, entropy
from eatta.methods.active import ActiveMethod
from eatta.methods.base import AdaptiveMethod, Options
from eatta.methods.config import ActiveConfig, ParamSelection, hparam
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.replay import commit_late, late_samples
from eatta.selection.base import SelectionContext
from eatta.selection.clustering import IncrementalClusteringSelector

__all__ = ["SimATTA", "SimATTARecord"]


@dataclass
class SimATTARecord:
    """What one SimATTA step did."""

    logits: Tensor
    selected: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    labels: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    source_like: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    alpha: float | None = None
    losses: list[float] = field(default_factory=list)


class SimATTA(ActiveMethod):
    """SimATTA around ``model``: clustering-selected labels plus source-like pseudo-labels.

    Args:
        model: a classifier prepared with :func:`eatta.configure` (SimATTA's code fine-tunes
            every parameter: ``configure(model, "all")``).
        optimizer: over the parameters to adapt (EATTA's setting: SGD lr 2.5e-4, momentum 0.9).
        oracle: ``oracle(selected_inputs, indices) -> labels``, or an asynchronous annotator
            (class labels only): a late label joins the labelled buffer and the anchors when it
            arrives.
        budget: labels per batch (the paper compares SimATTA with 3).
        max_anchors: anchors kept for clustering (50).
        buffer_size: capacity of each of the two sample buffers (300).
        train_batch_size: mini-batch drawn from each buffer per optimizer step (32).
        high_entropy_bound: clustering candidates need at least this entropy (``0.4 ln C``).
        low_entropy_bound: source-like samples need less than this entropy (``0.4 ln C``).
        source_per_batch: at most this many source-like samples per batch (100).
        steps: optimizer steps per batch (10, SimATTA's ImageNet setting).
        fresh_optimizer: clear the optimizer's state (momentum) before each batch's steps.
        use_teacher: pseudo-label source-like samples with a frozen copy of the initial model
            (SimATTA's teacher) rather than the current model.
        refresh_anchors: recompute the anchors' features after each update.
        seed: seed of the buffers' sampling.
        label_expiry: steps an asynchronous request waits for its answer before it expires.
        options: what every method takes (:class:`~eatta.methods.base.Options`: the parts,
            ``split``, ``check_finite``, ``autocast``, ``channels_last``).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        oracle: Oracle,
        budget: int | Budget = 1,
        max_anchors: int = 50,
        buffer_size: int = 300,
        train_batch_size: int = 32,
        high_entropy_bound: float | None = None,
        low_entropy_bound: float | None = None,
        source_per_batch: int = 100,
        steps: int = 10,
        fresh_optimizer: bool = True,
        use_teacher: bool = True,
        refresh_anchors: bool = True,
        seed: int = 0,
        label_expiry: int = DEFAULT_LABEL_EXPIRY,
        **options: Unpack[Options],
    ) -> None:
        for name, value, low in (
            ("steps", steps, 0),
            ("source_per_batch", source_per_batch, 0),
            ("train_batch_size", train_batch_size, 1),
            ("buffer_size", buffer_size, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if low_entropy_bound is not None and not low_entropy_bound > 0:
            raise ValueError(f"low_entropy_bound must be > 0, got {low_entropy_bound}")
        super().__init__(
            model,
            optimizer,
            oracle=oracle,
            budget=budget,
            label_expiry=label_expiry,
            **options,
        )
        self.selector = IncrementalClusteringSelector(
            max_anchors, entropy_bound=high_entropy_bound, keep_inputs=refresh_anchors
        )
        self.balance = NoClassBalance()
        self.labelled = LabelBuffer(buffer_size, train_batch_size, seed=seed)
        self.source_buffer = LabelBuffer(buffer_size, train_batch_size, seed=seed + 1)
        self.low_entropy_bound = low_entropy_bound
        self.source_per_batch = source_per_batch
        self.steps = steps
        self.fresh_optimizer = fresh_optimizer
        self.refresh_anchors = refresh_anchors
        for p in self._train:
            p.requires_grad_(True)
        # Kept out of the module tree: constant, so not part of state_dict() or parameters().
        self.use_teacher = bool(use_teacher)
        self.last_step: SimATTARecord | None = None

    @property
    def teacher(self) -> nn.Module | None:
        """The frozen initial model that labels source-like samples: the method's copy of the
        model as given, on the batch's statistics as the adapted model (None: the current
        model labels them)."""
        return self.given if self.use_teacher else None

    # -- the step ----------------------------------------------------------------------------
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            z, o = self.features_and_logits(x)
        num_classes = o.shape[1]

        # 1. select and ask; nothing changes before the oracle's answer is validated
        k = self.budget.allowance()
        ans = self.ask(x, z, o, k, self.selector, self.balance)
        lab_idx, lab_y = ans.indices, ans.targets
        src_idx, src_y = self._source_like(x, num_classes)

        # 2. commit: budget, anchors, buffers
        self.charge(ans)
        if len(lab_idx):
            assert ans.ctx is not None and ans.selection is not None and ans.labels is not None
            self.selector.commit(ans.ctx, ans.selection, ans.labels)
            self.labelled.add(x[lab_idx.to(x.device)], lab_y.to(x.device))
        self._add_late(x, ans.late)
        if len(src_idx):
            self.source_buffer.add(x[src_idx], src_y)
        self.asking.committed()

        # 3. fine-tune on both buffers, then refresh the anchors' features
        record = SimATTARecord(
            logits=o.detach(), selected=lab_idx, labels=lab_y, source_like=src_idx.cpu()
        )
        self._fine_tune(record)
        backbone = self.split.backbone
        if self.refresh_anchors and (self.selector.num_anchors > 1 or not self.has_batchnorm):
            self.selector.refresh(lambda inputs: self.features(backbone, inputs))
        self.last_step = record
        return o.detach()

    def _add_late(self, x: Tensor, late: list[Arrived]) -> None:
        """Late labels join the labelled buffer and the anchors (features by the current model,
        computed with the batch so that BatchNorm sees more than one sample)."""
        late = [a for a in late if a.label is not None]
        if not late:
            return
        xs = late_samples(late, x)
        ys = torch.tensor([a.label for a in late], dtype=torch.long, device=x.device)
        backbone, head = self.split
        with torch.no_grad():
            zl = self.features(backbone, torch.cat([x, xs]))[x.shape[0] :]
            ctx = SelectionContext(inputs=xs, features=zl, logits=head(zl), head=head)
        commit_late(self.balance, self.selector, late, ctx)
        self.labelled.add(xs, ys)

    def _source_like(self, x: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        """Indices and pseudo-labels of the batch's most confident samples (teacher's view)."""
        empty = torch.empty(0, dtype=torch.long, device=x.device)
        if self.source_per_batch == 0:
            return empty, empty
        with torch.no_grad():
            if self.use_teacher:
                with batch_statistics_of(self.given):
                    logits = self.given_logits(x)
            else:
                logits = self.logits(x)
        h = entropy(logits)
        bound = (
            self.low_entropy_bound
            if self.low_entropy_bound is not None
            else default_entropy_margin(num_classes)
        )
        order = torch.argsort(h, stable=True)[: self.source_per_batch]
        keep = order[h[order] < bound]
        return keep, logits.argmax(dim=1)[keep]

    def _fine_tune(self, record: SimATTARecord) -> None:
        n_lab, n_src = len(self.labelled), len(self.source_buffer)
        if self.steps == 0 or n_lab + n_src == 0:
            return
        alpha = n_lab / (n_lab + n_src)
        record.alpha = alpha
        if self.fresh_optimizer:
            self.optimizer.state.clear()
        for _ in range(self.steps):
            parts = []
            if n_src:
                parts.append(self.source_buffer.sample())
            if n_lab:
                parts.append(self.labelled.sample())
            if self.has_batchnorm and sum(len(px) for px, _ in parts) < 2:
                return  # a single sample cannot be normalized by its own batch statistics
            outs = self._forward_parts(parts)
            ce = [F.cross_entropy(out, y) for out, (_, y) in zip(outs, parts, strict=True)]
            loss = (1 - alpha) * ce[0] + alpha * ce[1] if len(ce) == 2 else ce[0]
            grads = torch.autograd.grad(loss, self._train, allow_unused=True)
            for p, g in zip(self._train, grads, strict=True):
                p.grad = g
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            record.losses.append(float(loss.detach()))

    def _forward_parts(self, parts: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
        """Logits of each part, each part a batch of its own (as SimATTA's two forward passes);
        parts are joined when one of them is a single sample and the model has BatchNorm."""
        if self.has_batchnorm and any(len(px) < 2 for px, _ in parts) and len(parts) > 1:
            joint = self.logits(torch.cat([px for px, _ in parts]))
            return list(joint.split([len(px) for px, _ in parts]))
        return [self.logits(px) for px, _ in parts]

    # -- state -------------------------------------------------------------------------------
    def state_parts(self) -> dict[str, Any]:
        parts = self.asking_parts()
        return {
            "budget": parts["budget"],
            "selector": self.selector,
            "labelled": self.labelled,
            "source_like": self.source_buffer,
            "pending": parts["pending"],
        }


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimATTAConfig(ActiveConfig):
    """SimATTA's keys. EATTA supplementary: SGD 2.5e-4 (momentum 0.9), 50 anchors, entropy
    threshold 0.4 ln C, buffer 300; SimATTA's own code: every parameter trained, 10 steps per
    batch (30 on PACS, see :mod:`eatta.methods.presets`)."""

    params: ParamSelection = hparam("all", "parameters to adapt (eatta.configure preset)")
    steps: int = hparam(10, "optimizer steps per batch", min=1)
    max_anchors: int = hparam(50, "most labelled anchors kept", min=1)
    buffer: int = hparam(300, "size of the labelled and source-like buffers", min=1)
    train_batch_size: int = hparam(32, "batch size of each training step", min=1)
    high_entropy_bound: float | None = hparam(None, "labelling threshold (None: 0.4 ln C)")
    low_entropy_bound: float | None = hparam(None, "source-like threshold (None: automatic)")
    source_per_batch: int = hparam(100, "source-like samples kept per batch", min=0)
    fresh_optimizer: bool = hparam(True, "reset the optimizer state every batch")
    use_teacher: bool = hparam(True, "pseudo-label source-like samples with the source model")
    refresh_anchors: bool = hparam(True, "recompute the anchors' features each batch")
    seed: int = hparam(0, "seed of the clustering and the buffers")


def _build_simatta(
    model: nn.Module, cfg: SimATTAConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    assert oracle is not None
    params = configure(model, cfg.params)
    return SimATTA(
        model,
        make_optimizer(params, cfg),
        oracle=oracle,
        budget=budget,
        max_anchors=cfg.max_anchors,
        buffer_size=cfg.buffer,
        train_batch_size=cfg.train_batch_size,
        high_entropy_bound=cfg.high_entropy_bound,
        low_entropy_bound=cfg.low_entropy_bound,
        source_per_batch=cfg.source_per_batch,
        steps=cfg.steps,
        fresh_optimizer=cfg.fresh_optimizer,
        use_teacher=cfg.use_teacher,
        refresh_anchors=cfg.refresh_anchors,
        seed=cfg.seed,
        **cfg.options(),
        label_expiry=cfg.label_expiry,
        **parts,
    )


register(
    MethodSpec(
        "simatta",
        _build_simatta,
        active=True,
        config=SimATTAConfig,
        datasets=DATASET_PRESETS["simatta"],
        summary="SimATTA: incremental-clustering labels + source-like pseudo-labels, buffer 300",
    )
)
