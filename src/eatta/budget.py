"""Labelling budgets: k labels per batch, one label every N batches, an optional total cap."""

from __future__ import annotations

from typing import Any

__all__ = ["Budget"]


class Budget:
    """How many labels the next batch may ask for, and how many have been used.

    ``per_batch`` labels on every ``every``-th batch (the first batch included), never more than
    ``total`` labels overall. ``Budget(1)`` is the paper's one label per batch (``*``),
    ``Budget(3)`` its ``†`` setting, ``Budget(1, every=3)`` one label per three batches.

    Two counts of what it granted: ``labels_used`` (since the last :meth:`reset`: what the
    method's ``labels_used`` reports) and ``lifetime_used`` (every label this budget ever
    granted, which no ``reset()`` clears). Beside them, since the last reset, what was asked of
    the annotator and what it answered (``asked``, ``answered``: a method's ``labels_asked`` and
    ``labels_answered``): with labels at once the budget is spent on answers, with a late
    annotator on requests, so an answer can come long after the label it used. The ``total``
    cap binds the lifetime count: a method's ``reset()``, whether a guard's or your own,
    restarts the every-N schedule and ``labels_used`` but never grants labels beyond ``total``.
    To spend a new total (a new stream you pay for again), call ``reset(lifetime=True)`` on the
    budget or build a new one.
    """

    def __init__(self, per_batch: int = 1, every: int = 1, total: int | None = None) -> None:
        for name, value, low in (("per_batch", per_batch, 0), ("every", every, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"budget {name} must be an integer >= {low}, got {value!r}")
        if total is not None and (
            not isinstance(total, int) or isinstance(total, bool) or total < 0
        ):
            raise ValueError(f"budget total must be None or an integer >= 0, got {total!r}")
        self.per_batch = per_batch
        self.every = every
        self.total = total
        self.labels_used = 0
        self.batches_seen = 0
        self._lifetime = 0
        self.asked = 0
        self.answered = 0

    @property
    def lifetime_used(self) -> int:
        """Labels granted since creation (or the last ``reset(lifetime=True)``)."""
        return self._lifetime

    @classmethod
    def coerce(cls, budget: int | Budget) -> Budget:
        """A Budget from an int (labels per batch) or a Budget."""
        return budget if isinstance(budget, Budget) else cls(per_batch=budget)

    def allowance(self) -> int:
        """Labels the next batch may use."""
        if self.batches_seen % self.every:
            return 0
        k = self.per_batch
        if self.total is not None:
            k = min(k, self.total - self._lifetime)
        return max(k, 0)

    def commit(self, labels: int, *, asked: int | None = None, answered: int | None = None) -> None:
        """Record a finished batch that used ``labels`` labels, asked the annotator for ``asked``
        samples and heard ``answered`` answers (each default: ``labels``)."""
        if labels > self.allowance():
            raise RuntimeError(f"{labels} labels exceed this batch's allowance {self.allowance()}")
        self.labels_used += labels
        self._lifetime += labels
        self.batches_seen += 1
        self.asked += labels if asked is None else asked
        self.answered += labels if answered is None else answered

    def reset(self, *, lifetime: bool = False) -> None:
        """Restart the schedule and ``labels_used``; ``lifetime=True`` also clears the lifetime
        count, granting the ``total`` cap afresh (a method's ``reset()`` never does)."""
        if not isinstance(lifetime, bool):
            raise TypeError(f"lifetime must be True or False, got {lifetime!r}")
        self.labels_used = 0
        self.batches_seen = 0
        self.asked = self.answered = 0
        if lifetime:
            self._lifetime = 0

    def snapshot(self) -> tuple[int, ...]:
        """A cheap token for :meth:`restore` (the method's per-step transaction)."""
        return self.labels_used, self.batches_seen, self._lifetime, self.asked, self.answered

    def restore(self, token: tuple[int, ...]) -> None:
        self.labels_used, self.batches_seen, self._lifetime, self.asked, self.answered = token

    def state_dict(self) -> dict[str, Any]:
        return {
            "labels_used": self.labels_used,
            "batches_seen": self.batches_seen,
            "lifetime_used": self._lifetime,
            "asked": self.asked,
            "answered": self.answered,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counts (a state saved before the lifetime, asked and
        answered counts existed takes ``labels_used`` for each)."""
        self.labels_used = int(state["labels_used"])
        self.batches_seen = int(state["batches_seen"])
        self._lifetime = int(state.get("lifetime_used", self.labels_used))
        self.asked = int(state.get("asked", self.labels_used))
        self.answered = int(state.get("answered", self.labels_used))

    def __repr__(self) -> str:
        return f"Budget(per_batch={self.per_batch}, every={self.every}, total={self.total})"
