"""What serves, as one consistent snapshot: requests never read parameters a step is updating.

The adapter thread owns the method and steps it; the serving thread predicts with a
:class:`Snapshot`, a copy of the values of the model the method serves (parameters and buffers:
a window's served statistics included), taken after a step, together with what the method served
then (``"adapted"``, ``"source"`` or ``"blend"`` for a method with a fallback: ``eatta-safe``).
:meth:`Snapshots.publish` fills a spare copy and swaps it in under a lock held for a pointer
swap only, so serving never waits for a step and never sees half of one.

A method that does not adapt (``source``) is served from its model directly: it never changes.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from eatta.methods.base import AdaptiveMethod, read_logits
from eatta.monitor.serving import SERVED, blend_logits

__all__ = ["Snapshot", "Snapshots", "serving_model", "what_serves"]


def serving_model(method: AdaptiveMethod) -> nn.Module:
    """The model a method serves its predictions from: a mean teacher where it keeps one
    (CoTTA's ``teacher``), else its model."""
    teacher = getattr(method, "teacher", None)
    return teacher if isinstance(teacher, nn.Module) else method.model


def what_serves(method: AdaptiveMethod) -> str:
    """``"adapted"``, ``"source"`` or ``"blend"``: what the method serves now (its fallback's
    choice; the given model for a method that does not adapt)."""
    if not method.adapts:
        return "source"
    fallback = method.fallback
    serving = "adapted" if fallback is None else str(fallback.serving)
    if serving not in SERVED:
        raise RuntimeError(f"the fallback serves {serving!r}, none of {SERVED}")
    return serving


def _tensors(model: nn.Module) -> list[Tensor]:
    return list(model.state_dict(keep_vars=True).values())


@dataclass(eq=False)
class Snapshot:
    """A copy of the serving model's values and what serves, after ``version`` adapter calls."""

    model: nn.Module
    serving: str
    version: int
    users: int = field(default=0, repr=False)


class Snapshots:
    """The published snapshot and its spares (see the module docstring).

    Args:
        method: the method whose serving model is copied (read on the caller's thread: build
            this before the adapter thread starts).
        device: where requests are predicted (the method's device).
    """

    def __init__(self, method: AdaptiveMethod, device: torch.device) -> None:
        self.device = device
        self.adapts = method.adapts
        live = serving_model(method)
        self._given: nn.Module | None = None
        if method.adapts and method.fallback is not None:
            self._given = copy.deepcopy(method.given).to(device)
        self._lock = threading.Lock()
        # spares: snapshots no longer published, reused once no request reads them
        self._free: list[Snapshot] = []
        if self.adapts:
            self._free = [Snapshot(self._copy(live), "adapted", -1) for _ in range(2)]
            self._front = Snapshot(self._copy(live), what_serves(method), 0)
        else:  # never changes: served as it is
            self._front = Snapshot(live, "source", 0)

    @staticmethod
    def _copy(model: nn.Module) -> nn.Module:
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.requires_grad_(False)
        return twin

    @property
    def current(self) -> Snapshot:
        """The snapshot requests are served from now."""
        with self._lock:
            return self._front

    def publish(self, method: AdaptiveMethod, version: int) -> None:
        """Copy the method's serving model and what it serves into a spare, then make it the
        one requests are served from (the adapter thread calls this after a step)."""
        if not self.adapts:
            return
        live = serving_model(method)
        with self._lock:
            spare = next((s for s in self._free if s.users == 0), None)
            if spare is not None:
                self._free.remove(spare)
        target: nn.Module = spare.model if spare is not None else self._copy(live)
        source, dest = _tensors(live), _tensors(target)
        if len(source) != len(dest) or any(
            a.shape != b.shape for a, b in zip(source, dest, strict=True)
        ):
            target = self._copy(live)  # the model changed shape (a method's own choice): copy anew
        else:
            with torch.no_grad():
                for d, s in zip(dest, source, strict=True):
                    d.copy_(s)
        fresh = Snapshot(target, what_serves(method), version)
        with self._lock:
            old, self._front = self._front, fresh
            self._free.append(old)

    def predict(self, x: Tensor) -> tuple[Tensor, Snapshot]:
        """The logits served for ``x`` (on the CPU) and the snapshot that served them."""
        with self._lock:
            snap = self._front
            snap.users += 1
        try:
            with torch.no_grad():
                x = x.to(self.device)
                if snap.serving == "source" and self._given is not None:
                    out = read_logits(self._given(x), self._given)
                else:
                    out = read_logits(snap.model(x), snap.model)
                    if snap.serving == "blend" and self._given is not None:
                        out = blend_logits(out, read_logits(self._given(x), self._given))
            return out.float().cpu(), snap
        finally:
            with self._lock:
                snap.users -= 1

    def describe(self) -> dict[str, Any]:
        snap = self.current
        return {"serving": snap.serving, "version": snap.version}
