"""What serves, as one consistent snapshot: requests never read parameters a step is updating.

The adapting side (a thread or a process: :mod:`eatta.serve.adapter`) owns the method and steps
it; the serving thread predicts with a :class:`Snapshot`: a copy of the values of the model the
method serves (parameters and buffers: a window's served statistics included), written after a
step, together with what the method served then (``"adapted"``, ``"source"`` or ``"blend"`` for
a method with a fallback: ``eatta-safe``). :class:`Snapshots` keeps three copies: the one
published, the one a request may still be reading, and a spare. The adapting side writes the
spare it was given (:meth:`Snapshots.reserve`), and :meth:`Snapshots.swap_in` publishes it under
a lock held for a pointer swap only, so serving never waits for a step and never sees half of
one. In another process the copies live in shared memory.

A method that does not adapt (``source``) is served from its model directly: it never changes.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from eatta.methods.base import AdaptiveMethod, read_logits
from eatta.monitor.serving import SERVED, blend_logits

__all__ = ["COPIES", "Snapshot", "Snapshots", "fill", "frozen_copy", "what_serves"]

#: Copies of the serving model: published, still read by a request, written by a step.
COPIES = 3


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


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` without gradients (what a snapshot holds)."""
    twin = copy.deepcopy(model)
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


def fill(target: nn.Module, source: nn.Module) -> None:
    """Copy every parameter and buffer of ``source`` into ``target`` (same structure)."""
    dest = list(target.state_dict(keep_vars=True).values())
    values = list(source.state_dict(keep_vars=True).values())
    if len(dest) != len(values) or any(
        a.shape != b.shape for a, b in zip(dest, values, strict=True)
    ):
        raise RuntimeError("the served model's structure changed; a snapshot cannot hold it")
    with torch.no_grad():
        for d, s in zip(dest, values, strict=True):
            d.copy_(s)


@dataclass(eq=False)
class Snapshot:
    """A copy of the serving model's values and what serves, after ``version`` steps."""

    model: nn.Module
    serving: str
    version: int
    users: int = field(default=0, repr=False)
    reserved: bool = field(default=False, repr=False)


class Snapshots:
    """The published snapshot and the copies beside it (see the module docstring).

    Args:
        copies: :data:`COPIES` copies of the serving model, the first holding what serves now
            (one model, for a method that does not adapt).
        given: the model as given, for ``"source"`` and ``"blend"`` (None: never served).
        serving: what serves now.
        version: steps behind the first copy.
        device: where requests are predicted.
    """

    def __init__(
        self,
        copies: list[nn.Module],
        given: nn.Module | None,
        serving: str,
        version: int,
        device: torch.device,
    ) -> None:
        if serving not in SERVED:
            raise ValueError(f"serving must be one of {SERVED}, got {serving!r}")
        self.device = device
        self._given = given
        self._lock = threading.Lock()
        self._all = [Snapshot(m, serving, version) for m in copies]
        self._front = self._all[0]

    @classmethod
    def of_method(cls, method: AdaptiveMethod, device: torch.device, version: int = 0) -> Snapshots:
        """Snapshots of ``method`` as it is now (after ``version`` steps): copies of its serving
        model (the model itself for a method that does not adapt) and of the model as given when
        a fallback may serve it."""
        if not method.adapts:
            return cls([method.model], None, "source", version, device)
        live = method.serving_model
        given = None
        if method.fallback is not None:
            given = frozen_copy(method.given).to(device)
        copies = [frozen_copy(live).to(device) for _ in range(COPIES)]
        return cls(copies, given, what_serves(method), version, device)

    @property
    def given(self) -> nn.Module | None:
        """The model as given, where a fallback may serve it."""
        return self._given

    @property
    def current(self) -> Snapshot:
        """The snapshot requests are served from now."""
        with self._lock:
            return self._front

    def copies(self) -> list[nn.Module]:
        return [s.model for s in self._all]

    def reserve(self) -> int | None:
        """A copy a step may write (not published, not read by a request), reserved until
        :meth:`swap_in` or :meth:`release`; None when there is none."""
        with self._lock:
            for i, s in enumerate(self._all):
                if s is not self._front and s.users == 0 and not s.reserved:
                    s.reserved = True
                    return i
        return None

    def release(self, index: int) -> None:
        """Give back a reserved copy that was not published (a failed step)."""
        with self._lock:
            self._all[index].reserved = False

    def swap_in(self, index: int, serving: str, version: int) -> None:
        """Publish the reserved copy ``index``, written with what serves after ``version``
        steps: the requests that arrive from now on are served by it."""
        if serving not in SERVED:
            raise ValueError(f"serving must be one of {SERVED}, got {serving!r}")
        with self._lock:
            snap = self._all[index]
            snap.serving, snap.version, snap.reserved = serving, version, False
            self._front = snap

    def predict(self, x: Tensor) -> tuple[Tensor, Snapshot]:
        """The logits served for ``x`` (on the CPU) and the snapshot that served them."""
        with self._lock:
            snap = self._front
            snap.users += 1
            serving, version = snap.serving, snap.version
        try:
            with torch.no_grad():
                x = x.to(self.device)
                if serving == "source" and self._given is not None:
                    out = read_logits(self._given(x), self._given)
                else:
                    out = read_logits(snap.model(x), snap.model)
                    if serving == "blend" and self._given is not None:
                        out = blend_logits(out, read_logits(self._given(x), self._given))
            return out.float().cpu(), Snapshot(snap.model, serving, version)
        finally:
            with self._lock:
                snap.users -= 1
