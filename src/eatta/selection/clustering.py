"""SimATTA's incremental clustering as a selection rule (Gui et al., ICLR 2024).

SimATTA keeps the features of the samples labelled so far ("anchors"). For each batch it
clusters the anchors together with the batch's uncertain samples (entropy at least a bound) and
labels the sample nearest the centre of every cluster that holds no anchor: new, representative
regions of the target distribution, and none that the anchors already cover.

Here the anchors are fixed centres and ``k`` free centres are fitted to the candidates by
k-means (Lloyd iterations from a deterministic farthest-point start): a candidate joins whichever
centre, fixed or free, is nearest, and each free centre moves to the mean of its candidates. Each
free cluster contributes its member nearest the centre. This differs from SimATTA's code, which
runs scikit-learn's weighted k-means (random restarts) over anchors and candidates together, with
``10 + t`` clusters at batch ``t`` and no per-batch cap; fixing the anchors as centres yields
exactly one representative per free cluster, so the budget's ``k`` labels per batch map onto
``k`` new clusters. At most ``max_anchors`` anchors are kept (50 in the EATTA paper's SimATTA
setting), the oldest evicted first; they are added in :meth:`commit`, never in :meth:`select`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from eatta.annotate.oracle import ABSTAIN
from eatta.balance import ClassBalance, Selection
from eatta.selection.base import ScoreSelector, SelectionContext

__all__ = ["Clustering", "IncrementalClusteringSelector", "cluster_with_anchors"]


class Clustering:
    """Result of :func:`cluster_with_anchors`.

    ``candidates``: batch indices clustered; ``centroids``: the free centres ``[m, D]``;
    ``assignment``: for each candidate, its centre (``< A`` an anchor, ``A + j`` free centre
    ``j``); ``representatives``: for each free centre with members, the batch index of its member
    nearest the centre (in centre order).
    """

    def __init__(
        self, candidates: Tensor, centroids: Tensor, assignment: Tensor, representatives: Tensor
    ) -> None:
        self.candidates = candidates
        self.centroids = centroids
        self.assignment = assignment
        self.representatives = representatives


def _farthest_point_start(points: Tensor, anchors: Tensor, m: int) -> Tensor:
    """``m`` starting centres among ``points``: each the point farthest from all centres so far.

    Without anchors the first is the point nearest the mean of all points. Ties go to the lowest
    index.
    """
    if len(anchors):
        nearest = torch.cdist(points, anchors).min(dim=1).values
        first = int(nearest.argmax())
    else:
        first = int(torch.cdist(points, points.mean(0, keepdim=True)).squeeze(1).argmin())
        nearest = torch.full((len(points),), math.inf, device=points.device, dtype=points.dtype)
    chosen = [first]
    nearest = torch.minimum(nearest, (points - points[first]).norm(dim=1))
    for _ in range(m - 1):
        nxt = int(nearest.argmax())
        chosen.append(nxt)
        nearest = torch.minimum(nearest, (points - points[nxt]).norm(dim=1))
    return points[chosen].clone()


def cluster_with_anchors(
    features: Tensor, candidates: Tensor, anchors: Tensor, k: int, max_iter: int = 100
) -> Clustering:
    """k-means with ``anchors`` ``[A, D]`` as fixed centres and ``min(k, n)`` free centres.

    ``features`` ``[B, D]`` are the batch's features, ``candidates`` the indices to cluster.
    Deterministic: farthest-point start, Lloyd iterations until the assignment is stable.
    """
    points = features[candidates]
    n, a = len(points), len(anchors)
    m = min(k, n)
    empty = torch.empty(0, dtype=torch.long)
    if m == 0:
        return Clustering(
            candidates, points.new_empty((0, points.shape[1])), empty.to(points.device), empty
        )
    centres = _farthest_point_start(points, anchors, m)
    assignment = None
    for _ in range(max_iter):
        new = torch.cdist(points, torch.cat([anchors, centres])).argmin(dim=1)
        if assignment is not None and torch.equal(new, assignment):
            break
        assignment = new
        for j in range(m):
            members = assignment == a + j
            if bool(members.any()):
                centres[j] = points[members].mean(0)
    distances = torch.cdist(points, torch.cat([anchors, centres]))
    assignment = distances.argmin(dim=1)
    reps = []
    for j in range(m):
        members = (assignment == a + j).nonzero().flatten()
        if len(members):
            reps.append(int(members[distances[members, a + j].argmin()]))
    representatives = candidates.cpu()[torch.tensor(reps, dtype=torch.long)]
    return Clustering(candidates, centres, assignment, representatives)


class IncrementalClusteringSelector(ScoreSelector):
    """Labels the representatives of new clusters: SimATTA's incremental clustering.

    Candidates are the samples with entropy ``>= entropy_bound`` (SimATTA's "high-entropy"
    samples; default ``0.4 ln C``, the EATTA paper's threshold for SimATTA; 0 admits all), clustered
    on the features ``ctx.features`` with the anchors as fixed centres (see the module docstring).

    The score ranks the free clusters' representatives first (nearest its centre first), then the
    other candidates, then the remaining samples, each group by closeness to the nearest free centre
    (to the nearest anchor when there is none): ``tier + 1 / (1 + distance)`` with tiers 2, 1, 0.
    So under no class balancing the selection is exactly the representatives, filled up to ``k``
    when there are fewer.

    Args:
        max_anchors: anchors kept (oldest evicted first).
        entropy_bound: candidates need at least this entropy; default ``0.4 ln C``.
        keep_inputs: also keep the anchors' inputs, so :meth:`refresh` can recompute their
            features after the model changes (SimATTA does so after each update).
        max_iter: Lloyd iterations at most.
    """

    #: the anchors (oldest first): features ``[A, D]``, labels ``[A]`` (on the CPU) and, with
    #: ``keep_inputs``, inputs; None before the first anchor
    features: Tensor | None
    labels: Tensor | None
    inputs: Tensor | None

    def __init__(
        self,
        max_anchors: int = 50,
        entropy_bound: float | None = None,
        keep_inputs: bool = False,
        max_iter: int = 100,
    ) -> None:
        if not isinstance(max_anchors, int) or max_anchors < 1:
            raise ValueError(f"max_anchors must be an integer >= 1, got {max_anchors!r}")
        if entropy_bound is not None and not entropy_bound >= 0:
            raise ValueError(f"entropy_bound must be >= 0, got {entropy_bound}")
        if max_iter < 1:
            raise ValueError(f"max_iter must be >= 1, got {max_iter}")
        self.max_anchors = max_anchors
        self.entropy_bound = entropy_bound
        self.keep_inputs = keep_inputs
        self.max_iter = max_iter
        self.reset()

    # -- anchors -------------------------------------------------------------------------------
    @property
    def num_anchors(self) -> int:
        return 0 if self.features is None else len(self.features)

    def _anchors_like(self, z: Tensor) -> Tensor:
        if self.features is None:
            return z.new_empty((0, z.shape[1]))
        if self.features.shape[1] != z.shape[1]:
            raise ValueError(
                f"anchors have {self.features.shape[1]} features, the batch {z.shape[1]}"
            )
        return self.features.to(device=z.device, dtype=z.dtype)

    def resolve_bound(self, num_classes: int) -> float:
        """The candidates' entropy bound for ``num_classes`` classes."""
        if self.entropy_bound is not None:
            return self.entropy_bound
        return 0.4 * math.log(num_classes)

    # -- selection -------------------------------------------------------------------------------
    def cluster(self, ctx: SelectionContext, k: int) -> Clustering:
        """Cluster this batch's candidates around the anchors with ``k`` new centres (pure)."""
        z = ctx.features.detach()
        if z.dim() != 2:
            raise ValueError(f"clustering needs features [B, D], got shape {tuple(z.shape)}")
        bound = self.resolve_bound(ctx.logits.shape[1])
        candidates = (ctx.entropy >= bound).nonzero().flatten()
        return cluster_with_anchors(z, candidates, self._anchors_like(z), k, self.max_iter)

    def score(self, ctx: SelectionContext, k: int = 1) -> Tensor:
        return self._score(ctx, self.cluster(ctx, k))

    def _score(self, ctx: SelectionContext, result: Clustering) -> Tensor:
        z = ctx.features.detach()
        centres = result.centroids if len(result.centroids) else self._anchors_like(z)
        if len(centres):
            distance = torch.cdist(z, centres).min(dim=1).values
        else:
            distance = torch.zeros(len(z), device=z.device, dtype=z.dtype)
        tier = torch.zeros(len(z), device=z.device, dtype=z.dtype)
        tier[result.candidates] = 1.0
        tier[result.representatives.to(z.device)] = 2.0
        return tier + 1.0 / (1.0 + distance)

    def select(self, ctx: SelectionContext, k: int, balance: ClassBalance) -> Selection:
        result = self.cluster(ctx, k)
        scores = self._score(ctx, result)
        selection = balance.plan(scores, ctx.pseudo_labels, k)
        selection.update.setdefault("scores", scores)
        selection.update["centroids"] = result.centroids
        selection.update["representatives"] = result.representatives
        return selection

    def commit(self, ctx: SelectionContext, selection: Selection, labels: Tensor) -> None:
        """Add the labelled samples as anchors (oldest beyond ``max_anchors`` evicted)."""
        answered = labels.cpu() != ABSTAIN
        idx = selection.indices[answered]
        if not len(idx):
            return
        dev = ctx.features.device
        feats = ctx.features.detach()[idx.to(dev)].clone()
        ys = labels.cpu()[answered].clone()
        self.features = feats if self.features is None else torch.cat([self.features, feats])
        self.labels = ys if self.labels is None else torch.cat([self.labels, ys])
        if self.keep_inputs:
            xs = ctx.inputs.detach()[idx.to(ctx.inputs.device)].clone()
            self.inputs = xs if self.inputs is None else torch.cat([self.inputs, xs])
        self._evict()

    def _evict(self) -> None:
        extra = self.num_anchors - self.max_anchors
        if extra > 0:
            assert self.features is not None and self.labels is not None
            self.features = self.features[extra:].clone()
            self.labels = self.labels[extra:].clone()
            if self.inputs is not None:
                self.inputs = self.inputs[extra:].clone()

    @torch.no_grad()
    def refresh(self, backbone: Callable[[Tensor], Tensor]) -> None:
        """Recompute the anchors' features with ``backbone`` (all anchors in one batch): the
        feature extractor, or the method's call of it (under its autocast)."""
        if self.inputs is None:
            if self.num_anchors and not self.keep_inputs:
                raise RuntimeError("refresh needs the anchors' inputs: create with keep_inputs")
            return
        self.features = backbone(self.inputs).detach()

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        self.features = None
        self.labels = None
        self.inputs = None

    def state_dict(self) -> dict[str, Any]:
        def copy(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.clone()

        return {
            "features": copy(self.features),
            "labels": copy(self.labels),
            "inputs": copy(self.inputs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def copy(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.clone()

        self.features = copy(state["features"])
        self.labels = copy(state["labels"])
        self.inputs = copy(state["inputs"])
