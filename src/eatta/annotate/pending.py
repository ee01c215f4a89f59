"""The method's side of an asynchronous annotator: the requests it waits for.

:class:`PendingLabels` is a method's state part (``reset()``, ``state_dict()``, cheap
``snapshot()``/``restore()`` for the step transaction). Per pending request it keeps the
:class:`~eatta.annotate.requests.LabelRequest` (the selected sample and its logits, on the model's
device) and the step's :class:`~eatta.balance.Selection` (a few integers, for the class balance),
so its memory is ``label_expiry x labels per step x (sample + logits)`` at most: with one label per
batch and the default ``label_expiry=256``, 256 samples (about 150 MB of 224 x 224 float32 images,
negligible for digits).

A request of step ``s`` may be answered up to step ``s + label_expiry``; at the start of the next
step it expires (counted, never applied later, and cancelled at the annotator). ``reset()`` drops
every pending request and starts a new epoch of ids, so no answer to a request from before the reset
is ever applied.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from eatta.annotate.requests import Answer, Feedback, LabelRequest, check_feedback
from eatta.balance import Selection

__all__ = ["Arrived", "PendingLabels"]

_COUNTERS = ("requested", "received", "skipped", "expired", "refused", "dropped")


@dataclass(frozen=True)
class _Entry:
    request: LabelRequest
    position: int  # the sample's position in its step's selection


@dataclass
class Arrived:
    """An answer matched with its request: what the method learns from it.

    ``label``: the class learned (the answer's label, or the prediction on "yes"); ``not_label``:
    the class ruled out (the prediction on "no"). ``selection`` and ``position`` locate the sample
    in the selection of the step that asked (for the class balance).
    """

    request: LabelRequest
    answer: Answer
    label: int | None
    not_label: int | None
    selection: Selection | None
    position: int
    late: bool


class PendingLabels:
    """Requests sent and not answered yet, their expiry, and lifetime counters (see module doc).

    Counters (``stats()``): ``requested``, ``received`` (answers applied), ``skipped`` (the
    annotator declined), ``expired``, ``refused`` (answers for requests no longer pending),
    ``dropped`` (by ``reset()``); ``pending`` is the current count. They are lifetime totals:
    ``reset()`` does not zero them.
    """

    def __init__(self, label_expiry: int = 256) -> None:
        if isinstance(label_expiry, bool) or not isinstance(label_expiry, int) or label_expiry < 0:
            raise ValueError(f"label_expiry must be an integer >= 0 (steps), got {label_expiry!r}")
        self.label_expiry = label_expiry
        self.nonce = uuid.uuid4().hex[:8]  # distinguishes runs that share one annotator or queue
        self.epoch = 0
        self.step = 0  # steps begun in this epoch
        self.retries = 0  # steps rolled back (restore); not itself rolled back, so ids stay unique
        self._entries: dict[str, _Entry] = {}
        self._selections: dict[int, Selection] = {}
        self.counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self.dropped_ids: list[str] = []  # dropped by the last reset, for the annotator
        self.carried: list[Answer] = []  # collected by a step that was rolled back: kept

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def ids(self) -> list[str]:
        """Pending request ids, oldest first."""
        return list(self._entries)

    def stats(self) -> dict[str, int]:
        return {**self.counts, "pending": len(self._entries)}

    # -- a step ------------------------------------------------------------------------------
    def begin_step(self) -> list[str]:
        """Start a step; expire requests older than ``label_expiry`` steps and return their ids."""
        self.step += 1
        old = [
            i for i, e in self._entries.items() if self.step - e.request.step > self.label_expiry
        ]
        for i in old:
            self._forget(i)
        self.counts["expired"] += len(old)
        return old

    def ask(
        self, selection: Selection, inputs: Tensor, logits: Tensor, kind: Feedback
    ) -> list[LabelRequest]:
        """Requests for the selected samples of this step's batch (``inputs``, ``logits``)."""
        check_feedback(kind)
        idx = selection.indices.tolist()
        if not idx:
            return []
        dev = inputs.device
        rows = selection.indices.to(dev)
        samples = inputs.detach()[rows].clone()
        scores = logits.detach()[rows.to(logits.device)].clone()
        # a retried step asks again under new ids: the failed attempt's are closed (cancelled)
        step = f"{self.step}" if not self.retries else f"{self.step}r{self.retries}"
        requests = [
            LabelRequest(
                id=f"{self.nonce}-{self.epoch}-{step}-{j}",
                sample=samples[j],
                logits=scores[j],
                kind=kind,
                step=self.step,
                index=int(i),
            )
            for j, i in enumerate(idx)
        ]
        self._selections[self.step] = selection
        for j, r in enumerate(requests):
            self._entries[r.id] = _Entry(r, j)
        self.counts["requested"] += len(requests)
        return requests

    def resolve(self, answers: list[Answer]) -> tuple[list[Arrived], list[Arrived]]:
        """Match answers with pending requests: ``(this step's, earlier steps')``; answers
        :attr:`carried` over from a rolled-back step come first.

        Answers for requests that are not pending (unknown, expired, answered, dropped) are
        counted as refused and not applied; skips are counted.
        """
        current: list[Arrived] = []
        late: list[Arrived] = []
        answers, self.carried = [*self.carried, *answers], []
        for a in answers:
            entry = self._entries.get(a.id)
            if entry is None or (
                a.label is not None and not 0 <= a.label < entry.request.num_classes
            ):
                self.counts["refused"] += 1
                continue
            r = entry.request
            selection = self._selections.get(r.step)
            self._forget(a.id)
            if a.skip:
                self.counts["skipped"] += 1
                continue
            self.counts["received"] += 1
            label = not_label = None
            if a.label is not None:
                label = a.label
            elif a.correct:
                label = entry.request.prediction
            else:
                not_label = entry.request.prediction
            is_late = r.step != self.step
            arrived = Arrived(r, a, label, not_label, selection, entry.position, is_late)
            (late if is_late else current).append(arrived)
        return current, late

    def _forget(self, rid: str) -> None:
        entry = self._entries.pop(rid)
        s = entry.request.step
        if not any(e.request.step == s for e in self._entries.values()):
            self._selections.pop(s, None)

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop every pending request (ids kept in :attr:`dropped_ids` for the annotator) and
        start a new epoch of ids; the counters are lifetime totals and stay."""
        self.dropped_ids = list(self._entries)
        self.counts["dropped"] += len(self._entries)
        self.carried = []
        self._entries.clear()
        self._selections.clear()
        self.epoch += 1
        self.step = 0

    def snapshot(self) -> tuple[Any, ...]:
        return (
            dict(self._entries),
            dict(self._selections),
            self.step,
            self.epoch,
            dict(self.counts),
        )

    def restore(self, token: tuple[Any, ...]) -> None:
        entries, selections, self.step, self.epoch, counts = token
        self.retries += 1
        self._entries, self._selections, self.counts = dict(entries), dict(selections), dict(counts)

    def to(self, device: torch.device | str) -> PendingLabels:
        """Move the kept samples and logits to ``device``."""
        for rid, e in list(self._entries.items()):
            r = e.request
            moved = LabelRequest(
                r.id, r.sample.to(device), r.logits.to(device), r.kind, r.step, r.index
            )
            self._entries[rid] = _Entry(moved, e.position)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "label_expiry": self.label_expiry,
            "nonce": self.nonce,
            "epoch": self.epoch,
            "step": self.step,
            "retries": self.retries,
            "counts": dict(self.counts),
            "requests": [
                {
                    "id": e.request.id,
                    "sample": e.request.sample,
                    "logits": e.request.logits,
                    "kind": e.request.kind,
                    "step": e.request.step,
                    "index": e.request.index,
                    "position": e.position,
                }
                for e in self._entries.values()
            ],
            "carried": [a.to_dict() for a in self.carried],
            "selections": {
                s: {"indices": sel.indices, "classes": list(sel.classes), "update": sel.update}
                for s, sel in self._selections.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        entries = {}
        for r in state["requests"]:
            req = LabelRequest(
                str(r["id"]),
                r["sample"],
                r["logits"],
                check_feedback(r["kind"]),
                int(r["step"]),
                int(r["index"]),
            )
            entries[req.id] = _Entry(req, int(r["position"]))
        selections = {
            int(s): Selection(v["indices"], list(v["classes"]), dict(v["update"]))
            for s, v in state["selections"].items()
        }
        self.label_expiry = int(state["label_expiry" if "label_expiry" in state else "max_age"])
        self.nonce, self.epoch, self.step = (
            str(state["nonce"]),
            int(state["epoch"]),
            int(state["step"]),
        )
        self.retries = int(state.get("retries", 0))
        self.counts = {k: int(state["counts"].get(k, 0)) for k in _COUNTERS}
        self._entries, self._selections = entries, selections
        self.dropped_ids = []
        self.carried = [Answer.from_mapping(a) for a in state.get("carried", [])]
