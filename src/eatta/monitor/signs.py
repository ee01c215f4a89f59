"""Label-free signs of which model to serve, read only while there is no evidence.

Two signs compare the predictions of the model as given (``g``) and the adapted model (``a``) on
the same samples of the last ``batches`` batches:

- **collapse**: ``H(hist(g)) / H(hist(a))``, the entropy of the given model's predicted-class
  histogram over the adapted model's. A model trained on clean data sends corrupted inputs to a
  few classes; predicting one class for many more samples than the stream holds is wrong on at
  least the excess. Under ``ratio`` it says "the given model has collapsed".
- **disagreement**: the share of samples on which ``g != a``. Over ``disagreement`` it says "the
  two are far apart". It does not say which of the two is wrong.

Both thresholds (0.9 and 0.3) were read off digits-C's recurring stream and one look at CCC.
"Far apart" is no sign that the adapted model is better: on the safety study's ``mnist-far``
stream (every method at 10x the learning rate, the adapted model worse and far from the given
one), ``fallback_start="auto"`` at a person's pace served the adapted model on the signs' word
and ended at 29.9 against the given model's 28.8 (seed 0). So ``eatta-safe`` no longer lets
them choose the adapted model; its default start uses the disagreement sign only to serve the
given model (:mod:`eatta.monitor.serving`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch
from torch import Tensor

__all__ = ["LabelFreeSigns", "entropy"]


def entropy(counts: Tensor) -> float:
    """Entropy (nats) of a class histogram."""
    total = float(counts.sum())
    if total <= 0:
        return 0.0
    p = counts[counts > 0].double() / total
    return float(-(p * p.log()).sum())


class LabelFreeSigns:
    """The two signs over the last ``batches`` batches (module docstring).

    Args:
        batches: batches the signs read, >= 1.
        ratio: the collapse threshold, in (0, 1].
        disagreement: the disagreement threshold, in [0, 1].
    """

    def __init__(self, batches: int, ratio: float, disagreement: float) -> None:
        self.batches, self.ratio, self.disagreement = batches, ratio, disagreement
        self.clear()

    def clear(self) -> None:
        # per recent batch: class histograms of the given and the adapted model's predictions
        self._marginals: deque[tuple[Tensor, Tensor]] = deque(maxlen=self.batches)
        self._disagreement: deque[tuple[int, int]] = deque(maxlen=self.batches)

    def record(self, given: Tensor, adapted: Tensor) -> None:
        """One batch's predictions (``given``: -1 where the given model did not predict)."""
        given = given.cpu()
        where = given >= 0
        classes = max(int(given.max()), int(adapted.max())) + 1
        g, a = given[where], adapted.cpu()[where]
        self._marginals.append(
            (torch.bincount(g, minlength=classes), torch.bincount(a, minlength=classes))
        )
        self._disagreement.append((int((g != a).sum()), g.numel()))

    def disagreement_rate(self) -> float:
        """Share of the recent batches' samples (where the given model predicted) on which the two
        models predict different classes (nan before any batch)."""
        seen = sum(n for _, n in self._disagreement)
        return sum(d for d, _ in self._disagreement) / seen if seen else math.nan

    def last_disagreement(self) -> float:
        """The disagreement rate of the last batch alone (nan before any batch)."""
        if not self._disagreement:
            return math.nan
        d, n = self._disagreement[-1]
        return d / n if n else math.nan

    def collapse_ratio(self) -> float:
        """``H(hist(g)) / H(hist(a))`` on the same samples of the recent batches (nan before any
        batch; 1 where the adapted model's histogram has no entropy)."""
        if not self._marginals:
            return math.nan
        width = max(max(len(g), len(a)) for g, a in self._marginals)
        g_sum = torch.zeros(width, dtype=torch.float64)
        a_sum = torch.zeros(width, dtype=torch.float64)
        for g, a in self._marginals:
            g_sum[: len(g)] += g
            a_sum[: len(a)] += a
        h_a = entropy(a_sum)
        return entropy(g_sum) / h_a if h_a > 0 else 1.0

    def choice(self) -> str:
        """``"adapted"`` when the given model's predictions have collapsed or the two disagree on
        more than ``disagreement`` of the samples, else ``"source"``."""
        collapsed = self.collapse_ratio() < self.ratio
        apart = self.disagreement_rate() > self.disagreement
        return "adapted" if collapsed or apart else "source"

    def state_dict(self) -> dict[str, Any]:
        return {
            "marginals": [(g.clone(), a.clone()) for g, a in self._marginals],
            "disagreement": [list(p) for p in self._disagreement],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._marginals = deque(
            ((g.clone(), a.clone()) for g, a in state["marginals"]), maxlen=self.batches
        )
        self._disagreement = deque(
            ((int(d), int(n)) for d, n in state["disagreement"]), maxlen=self.batches
        )
