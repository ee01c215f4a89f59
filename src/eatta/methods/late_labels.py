"""Late labels weighed by how stale they are, and an entropy filter that does not collapse.

:class:`LateLabels` is the part of an active method (EATTA's ``late_labels=``) that decides how
much a label answered ``a`` steps after it was asked still counts, and what the entropy term
does in a step without a usable label. It acts only with an asynchronous annotator, and only in
steps where no answer to the step's own request arrived, so a zero-delay annotator (and every
synchronous oracle) takes exactly today's path.

Weightings of a late label (``weighting=``):

* ``"full"``: weight 1 (today's rule);
* ``"age"``: ``0.5 ** (age / half_life)`` (RoTTA's timeliness, in steps);
* ``"drift"``: how far the stream moved between asking and answering: with ``μ_t`` the mean
  feature of batch ``t`` and ``δ`` a running mean of ``1 - cos(μ_{t-1}, μ_t)`` (how much
  consecutive batches differ), ``r = (1 - cos(μ_ask, μ_now)) / δ`` counts the typical
  batch-to-batch moves between the two, and the weight is ``exp(-max(r - 1, 0) / drift_scale)``.
  A stream that stays put (mixed domains) keeps its late labels at full weight whatever their
  age; after a domain change they count for little (CPATTA's boundary measure, made graded).
  ``drift_scale`` was tuned on the CCC stream;
* ``"similarity"`` (the default): how close the late label's own sample is to the batch it
  arrives in, in the current model's feature space, ranked among the batch's own samples (a
  conformal p-value, 0 where it fails the test at level 0.05; no scale, no age, nothing tuned):
  see :func:`typicality`. A label stays at full weight as long as its sample looks like what
  the stream shows now (Csaba et al., NeurIPS 2024: replaying the labelled samples most similar
  to the current data, IWMS, is the rule least hurt by label delay), however old it is or
  however far the stream's mean moved.

Entropy filter (``entropy_filter="eta"``): in a step whose labels (fresh, or late with their
weights) add up to less than ``anchor`` (0.1), the entropy term is ETA's: reliable (below the
margin) and non-redundant samples only (cosine similarity of their softmax to a moving average of
earlier kept samples' softmax below ``d_margin``), weighted ``exp(margin - H)``. Without labels,
plain confident-entropy minimisation collapses on long streams; ETA's filter keeps it near the
source.

Memory: one mean feature per step for the last ``label_expiry`` steps (``drift`` only:
``label_expiry × D`` floats), and one ``C``-vector of softmax averages (``eta`` entropy filter).
``similarity`` keeps nothing: it uses the features of the step that uses the label.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from eatta.methods.nearest_replay import NearestReplay

__all__ = [
    "ENTROPY_FILTERS",
    "WEIGHTINGS",
    "EntropyFilter",
    "LateLabels",
    "Weighting",
    "typicality",
]

Weighting = Literal["full", "age", "drift", "similarity"]
EntropyFilter = Literal["none", "eta"]
WEIGHTINGS: tuple[str, ...] = get_args(Weighting)
#: The conformal test's level: a late sample whose p-value is at or below it is not like the
#: batch, and its label counts 0 (:func:`typicality`).
TYPICALITY_LEVEL = 0.05
ENTROPY_FILTERS: tuple[str, ...] = get_args(EntropyFilter)


def _number(value: object, name: str, *, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not low < float(value) < high:
        raise ValueError(f"{name} must be in ({low}, {high}), got {value!r}")
    return float(value)


def typicality(late: Tensor, batch: Tensor, level: float = TYPICALITY_LEVEL) -> Tensor:
    """The weight of late labels whose samples have features ``late`` (``m × D``), used in a
    step whose batch has features ``batch`` (``n × D``, the same model's): a conformal p-value.

    Each batch sample's distance to its nearest neighbour in the rest of the batch, and the late
    sample's distance to its nearest neighbour in the batch, are

        ``d_j = min_{k≠j} ||f_j - f_k||``,   ``d* = min_j ||f* - f_j||``,

    and the late label's rank among the batch's own samples and its weight are

        ``p = (1 + #{j : d_j ≥ d*}) / (n + 1)``,   ``w = min(1, 2p)`` if ``p > level``, else 0.

    ``p`` is the share of the batch (counting the late sample) that is no closer to the rest
    of the batch than the late sample is. If the late sample were drawn like the batch's, ``p``
    would be about uniform on ``(0, 1]`` (a conformal p-value with a nearest-neighbour
    nonconformity score, as in conformal anomaly detection): a typical sample ranks at the
    median, ``p ≈ 1/2``, and ``2p`` puts the median at full weight. So a label counts fully
    while its sample is at least as close to the batch as half of the batch's own samples are
    to each other, however old it is; below the median its weight falls linearly in the rank,
    to ``2 level``; at or below ``level`` (0.05) the sample fails the conformal test of being
    like the batch and its label counts 0. A label whose sample is drawn like the batch is
    dropped with probability at most ``level``; the test can only reject with ``n + 1 > 1 /
    level`` (20 samples at 0.05): in smaller batches the least typical sample keeps ``2/(n + 1)``.
    A sample identical to a batch sample has ``d* = 0``: full weight. On labels drawn like the
    batch the mean weight is about 3/4.

    Why these choices. Nearest neighbours, not the batch's mean: a batch holds several classes,
    so a sample belongs if it is close to some of them, not to their centroid. Distances, not
    cosines: a domain change moves the features' norms as well as their directions, and the
    cosine misses the first (on the digits CNN it kept labels asked before a change of domain
    at up to 0.94, and was 1.5 points worse than distances on the CCC stream at delay 16, seed
    0). The rank, not the distance: distances differ in level from model to model and stream to
    stream, a rank among the batch's own samples does not; it is unchanged by shifting or
    rescaling all features, so there is no scale to tune. With ``n = 2`` a late sample closer
    to one of the two than they are to each other counts fully, any other ``2/3``. The test,
    not a floor: a sample unlike the batch has a large cross-entropy through the current model,
    so at the old floor ``2/(n + 1)`` its gradient still matched a fresh label's, and on the
    recurring digits-C stream labels 64 batches late (four domains old) made ``eatta-stable``
    worse than no labels at all (``docs/real-annotators.md``). The level is the customary 5 %,
    not a value fitted to a stream.

    Cost: one ``(n + m) × n`` distance matrix of features the step already computed.
    """
    level = _number(level, "level", low=-1e-12, high=1.0)  # [0, 1): 0 never rejects
    f = batch.detach().flatten(1).float()
    m, n = late.shape[0], f.shape[0]
    if n < 2:
        return torch.ones(m, device=late.device)
    rows = torch.cat([f, late.detach().flatten(1).float().to(f.device)])
    dist = torch.cdist(rows, f, compute_mode="donot_use_mm_for_euclid_dist")  # exact zeros
    own = dist[:n].clone()  # rows: the batch, then the late samples; columns: the batch
    own.fill_diagonal_(math.inf)
    d = own.min(1).values  # d_j
    d_late = dist[n:].min(1).values  # d*
    p = (1 + (d.unsqueeze(0) >= d_late.unsqueeze(1)).sum(1)) / (n + 1)
    return torch.where(p > level, (2 * p).clamp(max=1.0), torch.zeros_like(p))


class LateLabels:
    """How late labels count, and the entropy filter (see the module docstring).

    Args:
        weighting: ``"full"``, ``"age"``, ``"drift"`` or ``"similarity"`` (the default).
        half_life: steps after which an ``"age"``-weighted label counts half.
        drift_scale: ``"drift"``: the weight is ``exp(-max(r - 1, 0) / drift_scale)``.
        entropy_filter: ``"none"`` or ``"eta"``.
        anchor: label weight a step needs not to fall back.
        d_margin: ETA's redundancy threshold; ``prob_momentum``: its moving average's factor.
        label_expiry: steps of mean features kept (the method's ``label_expiry``).
        replay: in steps without a fresh answer, also replay the kept labelled samples nearest
            the batch (:class:`~eatta.methods.nearest_replay.NearestReplay`); None: no replay.
    """

    def __init__(
        self,
        weighting: Weighting = "similarity",
        *,
        half_life: float = 2.0,
        drift_scale: float = 0.25,
        entropy_filter: EntropyFilter = "eta",
        anchor: float = 0.1,
        d_margin: float = 0.05,
        prob_momentum: float = 0.9,
        label_expiry: int = 256,
        replay: NearestReplay | None = None,
    ) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"unknown late-label weighting {weighting!r}; use {WEIGHTINGS}")
        if entropy_filter not in ENTROPY_FILTERS:
            raise ValueError(f"unknown entropy filter {entropy_filter!r}; use {ENTROPY_FILTERS}")
        self.weighting: Weighting = weighting
        self.entropy_filter: EntropyFilter = entropy_filter
        self.half_life = _number(half_life, "half_life", low=0.0)
        self.drift_scale = _number(drift_scale, "drift_scale", low=0.0)
        self.anchor = _number(anchor, "anchor", low=-1e-12)
        self.d_margin = _number(d_margin, "d_margin", low=0.0, high=1.0 + 1e-12)
        self.prob_momentum = _number(prob_momentum, "prob_momentum", low=-1e-12, high=1.0)
        if isinstance(label_expiry, bool) or not isinstance(label_expiry, int) or label_expiry < 0:
            raise ValueError(f"label_expiry must be an int >= 0, got {label_expiry!r}")
        self.label_expiry = label_expiry
        if replay is not None and not isinstance(replay, NearestReplay):
            raise TypeError(f"replay must be a NearestReplay or None, got {type(replay).__name__}")
        self.replay = replay
        self._means: OrderedDict[int, Tensor] = OrderedDict()
        self._move: float | None = None  # running mean of consecutive batches' 1 - cos
        self._probs: Tensor | None = None  # ETA's moving average of kept samples' softmax

    # -- what the stream looked like -----------------------------------------------------------
    def observe(self, step: int, features: Tensor) -> None:
        """Record batch ``step``'s mean feature (``"drift"`` only; bounded by ``label_expiry``)."""
        if self.weighting != "drift":
            return
        mu = features.detach().flatten(1).mean(0).float()
        if self._means:
            last = next(reversed(self._means.values()))
            d = 1.0 - float(torch.cosine_similarity(last, mu, dim=0))
            self._move = d if self._move is None else 0.9 * self._move + 0.1 * d
        self._means[step] = mu
        while len(self._means) > self.label_expiry + 1:
            self._means.popitem(last=False)

    def weights(
        self,
        asked: list[int],
        now: int,
        *,
        features: Tensor | None = None,
        batch: Tensor | None = None,
    ) -> Tensor:
        """The weight of each late label, asked at steps ``asked``, arriving at step ``now``;
        ``"similarity"`` also needs the late samples' ``features`` and the ``batch``'s, both
        from the current model (:func:`typicality`)."""
        if self.weighting == "similarity":
            if features is None or batch is None:
                raise ValueError("the similarity weighting needs the features and the batch's")
            return typicality(features, batch)
        if self.weighting == "full":
            return torch.ones(len(asked))
        if self.weighting == "age":
            ages = torch.tensor([now - s for s in asked], dtype=torch.float32)
            return torch.pow(0.5, ages / self.half_life)
        out = torch.ones(len(asked))
        current = self._means.get(now)
        if current is None or self._move is None or self._move <= 0:
            return out
        for i, s in enumerate(asked):
            then = self._means.get(s)
            if then is None:
                out[i] = 0.0  # asked before anything was recorded (a reset): nothing to go by
                continue
            r = (1.0 - float(torch.cosine_similarity(then, current, dim=0))) / self._move
            out[i] = math.exp(-max(r - 1.0, 0.0) / self.drift_scale)
        return out

    # -- the entropy filter --------------------------------------------------------------------
    def filters(self, label_weight: float) -> bool:
        """Whether a step whose labels weigh ``label_weight`` in all uses the entropy filter."""
        return self.entropy_filter == "eta" and label_weight < self.anchor

    def entropy(
        self, h: Tensor, probs: Tensor, mask: Tensor, margin: float
    ) -> tuple[Tensor, Tensor]:
        """ETA's weighted entropy over the reliable (``mask``), non-redundant samples, and their
        count; updates the moving average of the kept samples' softmax."""
        kept = mask
        if self._probs is not None:
            cos = torch.cosine_similarity(self._probs.to(probs.device).unsqueeze(0), probs, dim=1)
            kept = mask & (cos.abs() < self.d_margin)
        w = torch.where(kept, torch.exp(margin - h.detach()), torch.zeros_like(h))
        n = kept.sum()
        loss = (h * w).sum() / n.clamp(min=1)
        if bool(n > 0):
            mean = probs[kept].mean(0).detach()
            m = self.prob_momentum
            self._probs = mean if self._probs is None else m * self._probs.to(mean) + (1 - m) * mean
        return loss, n

    # -- state ---------------------------------------------------------------------------------
    def reset(self) -> None:
        self._means, self._move, self._probs = OrderedDict(), None, None

    def snapshot(self) -> tuple[Any, ...]:
        """A cheap token for :meth:`restore` (the kept tensors are never changed in place)."""
        return OrderedDict(self._means), self._move, self._probs

    def restore(self, token: tuple[Any, ...]) -> None:
        means, self._move, self._probs = token
        self._means = OrderedDict(means)

    def state_dict(self) -> dict[str, Any]:
        return {
            "means": {k: v.clone() for k, v in self._means.items()},
            "move": self._move,
            "probs": None if self._probs is None else self._probs.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._means = OrderedDict((int(k), v.clone()) for k, v in state["means"].items())
        self._move = None if state["move"] is None else float(state["move"])
        self._probs = None if state["probs"] is None else state["probs"].clone()
