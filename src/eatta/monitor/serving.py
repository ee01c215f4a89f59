"""What serves each batch, and why: the decision rule of the source-model fallback.

Three predictors can serve a batch: the adapted model ``f_a``, the model as given ``f_g``
(``"source"``), and their *blend*, the mean of the two models' probabilities::

    blend(x) = log((softmax(f_a(x)) + softmax(f_g(x))) / 2)

(served as logits: its softmax is that mean). Each served batch is recorded with one of four
reasons (:data:`WHY`):

- ``"evidence"``: the answers decided (:class:`~eatta.monitor.evidence.SignTest`). ``"better"``
  serves the adapted model; ``"worse"`` serves the given one (and, with ``reset``, resets the
  adapted method). A "worse" while the given model serves already is a decision too, recorded as
  ``"adapted found worse"``: the evidence starts over from every decision.
- ``"default"``: no decision; what ``start`` serves without evidence: the given model for
  ``"source"`` and ``"blend"``, the adapted model for ``"adapted"``.
- ``"lean"``: ``start="blend"``, no decision, but the answers since the last decision lean
  toward the adapted model (their mean paired difference is above 0): the blend serves.
- ``"promise"`` / ``"bound"``: ``start="promise"`` (``eatta-safe``'s default): what served is the
  first of the adapted model, the adapted model on part of its disagreements (``"part"``) and the
  given model that the certified bound of :mod:`eatta.monitor.promise` allows; no test decides.
- ``"sign"``: ``start="auto"`` only: the label-free signs of :mod:`eatta.monitor.signs` chose,
  until the first decision (they can choose the adapted model, and the safety study's
  ``mnist-far`` stream misleads them).

``"blend"`` (``eatta-safe``'s rule before the promise: measured, not guaranteed; on the safety
study's misleading streams it let the served error pass the given model's by more than 0.5 points
in 28 of 104 runs, by up to +10.6: docs/safety.md) reads no label-free sign: the given model serves
wherever there is no answer, so without answers it *is* the given model, and the answers' lean only
moves it between the given model and the blend, never to the adapted model alone. Measured on every
stream of the safety study, the two built to mislead it included (docs/safety.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torch import Tensor

from eatta.monitor.evidence import SignTest
from eatta.monitor.signs import LabelFreeSigns

__all__ = ["SERVED", "START", "WHY", "FallbackEvent", "ServingRule", "blend_logits"]

#: The rules: ``"promise"`` (:mod:`eatta.monitor.promise`: what the stated guarantee allows), and
#: what is served before there is evidence under the decision test.
START = ("promise", "blend", "source", "adapted", "auto")
#: What can serve a batch (``"part"``: under the promise, the adapted model on some of the
#: samples where it differs from the given model, the given model elsewhere).
SERVED = ("adapted", "source", "blend", "part")
#: Why it serves (``"promise"``: the certified bound allows the adapted model or a part of it;
#: ``"bound"``: under ``start="promise"``, it allows only the given model).
WHY = ("evidence", "default", "sign", "lean", "promise", "bound")
#: The serving record's code of a batch: ``SERVED`` index * ``_STRIDE`` + ``WHY`` index (a record
#: saved before ``WHY`` grew used a stride of 4: ``state_dict``'s ``"stride"``).
_STRIDE = 8


def blend_logits(adapted: Tensor, given: Tensor) -> Tensor:
    """``log((softmax(adapted) + softmax(given)) / 2)`` in float32, returned in ``adapted``'s
    dtype (the blend's logits; its argmax is the blend's prediction)."""
    p = 0.5 * (adapted.detach().float().softmax(1) + given.detach().float().softmax(1))
    return p.log().to(adapted.dtype)


@dataclass(frozen=True)
class FallbackEvent:
    """A switch of what is served, a reset of the adapted method, or the adapted model found worse
    while the source model is served, with its evidence."""

    kind: str  # "serve adapted", "serve given", "adapted found worse", "reset: worse than given"
    step: int
    answers: int  # answers since the last decision, all of which the decision read
    gain: float  # their mean paired difference (adapted - given accuracy)
    up: float  # the wealth betting on the adapted model
    down: float  # the wealth betting against it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ServingRule:
    """What serves now and why, the decisions taken, and a tally of every served batch.

    Args:
        start: what serves before the first decision (:data:`START`).
        act: whether decisions are taken (False: the adapted model always serves).
        reset: whether a "worse" decision also asks for the adapted method's reset.
    """

    def __init__(self, start: str, *, act: bool = True, reset: bool = False) -> None:
        if start not in START:
            raise ValueError(f"start must be one of {', '.join(START)}, got {start!r}")
        self.start, self.act, self.reset_on_evidence = start, bool(act), bool(reset)
        self.clear()

    def clear(self) -> None:
        """Back to creation: no decision, nothing served."""
        if not self.act:
            self.serving = "adapted"
        else:  # "auto", "blend", "promise": the given model until signs, answers or bound say
            given_first = self.start in ("auto", "blend", "promise")
            self.serving = "source" if given_first else self.start
        self.why = "sign" if self.act and self.start == "auto" else "default"
        if self.act and self.start == "promise":
            self.why = "bound"
        self._decided = False
        self.events: list[FallbackEvent] = []
        self.epoch = 0  # resets of the adapted method so far
        self.prior_switches = 0  # switches made by the label-free signs
        # per served batch, one byte: SERVED index * len(WHY) + WHY index (a long deployment's
        # record stays small); the counts beside it
        self._log = bytearray()
        self._counts = [0] * (len(SERVED) * _STRIDE)

    def serve(
        self,
        logits: Tensor,
        given: Tensor | None,
        test: SignTest,
        signs: LabelFreeSigns,
        *,
        note: bool,
        refresh: bool = True,
    ) -> Tensor:
        """What serves a batch: ``logits`` (the adapted model's), ``given`` (the given model's,
        None while the adapted model is served) or their blend. ``refresh``: after a step,
        first read what serves it off the answers (``start="blend"``); ``note``: the batch is
        served (not a window's step, whose predictions nobody sees)."""
        if refresh and self.start == "blend":
            self.refresh(signs, test.mean)
        return self.output(logits, given, note=note)

    def put(self, serving: str, why: str) -> None:
        """What serves now and why, chosen outside the decision test (``start="promise"``)."""
        if serving not in SERVED or why not in WHY:
            raise ValueError(f"unknown serving state {serving!r}, {why!r}")
        self.serving, self.why = serving, why

    def output(self, logits: Tensor, given: Tensor | None, *, note: bool) -> Tensor:
        """The predictions of what serves now: ``logits`` (the adapted model's), ``given`` (the
        given model's) or their blend; recorded as one served batch when ``note``."""
        out = logits
        if self.serving != "adapted":
            assert given is not None  # predicted on the whole batch while it serves
            if given.shape[1] != logits.shape[1]:
                raise ValueError(
                    f"the adapted model predicts {logits.shape[1]} classes, the given model "
                    f"{given.shape[1]}: the fallback cannot serve one in place of the other"
                )
            out = blend_logits(logits, given) if self.serving == "blend" else given.to(logits.dtype)
        if note:
            self.note()
        return out

    def decide(self, test: SignTest, step: int, signs: LabelFreeSigns) -> bool:
        """Act on ``test``'s verdict after ``step`` (a decision clears it: the evidence starts
        over); True when the adapted method must be reset."""
        evidence = (test.answers, test.mean, test.up, test.down)
        reset = self._act(test.decided(), step, evidence, signs)
        if self._decided:
            test.clear()
        return reset

    def _act(
        self,
        verdict: str | None,
        step: int,
        evidence: tuple[int, float, float, float],
        signs: LabelFreeSigns,
    ) -> bool:
        """Act on the test's ``verdict`` (``"better"``, ``"worse"`` or None) after ``step``;
        True when the adapted method must be reset."""
        self._decided = False
        if not self.act:
            return False
        if verdict is None:
            if self.start == "auto":
                self.refresh(signs, evidence[1])
            return False
        if verdict == "better" and self.serving == "adapted":
            return False
        self._decided = True
        self.why = "evidence"
        if verdict == "better":
            self._event("serve adapted", step, evidence)
            self.serving = "adapted"
            return False
        if self.serving != "source":
            self._event("serve given", step, evidence)
            self.serving = "source"
        elif not self.reset_on_evidence:  # changes nothing served; left standing, the detector
            # (which does not fall while the recent answers favour the adapted model) would
            # block every later "better"
            self._event("adapted found worse", step, evidence)
        if self.reset_on_evidence:
            self._event("reset: worse than given", step, evidence)
            self.epoch += 1
        return self.reset_on_evidence

    def refresh(self, signs: LabelFreeSigns, lean: float) -> None:
        """Before the first decision, what serves: ``"auto"``, the signs' choice (read after a
        batch, for the next); ``"blend"``, the blend while the answers since the last decision
        lean toward the adapted model (``lean``, their mean paired difference, above 0), else the
        given model (no answer yet, or a lean against it), read after the batch's predictions,
        for this batch."""
        if not self.act or self.why == "evidence" or self.start not in ("auto", "blend"):
            return
        if self.start == "auto":
            want, why = signs.choice(), "sign"
        elif lean > 0:
            want, why = "blend", "lean"
        else:  # no answer yet (nan), or they lean against the adapted model
            want, why = "source", "default"
        if want != self.serving:
            self.prior_switches += 1
            self.serving = want
        self.why = why

    def _event(self, kind: str, step: int, evidence: tuple[int, float, float, float]) -> None:
        m, mean, up, down = evidence
        self.events.append(FallbackEvent(kind, step, m, mean, up, down))

    def note(self) -> None:
        """One batch (or one request between steps) served by what serves now."""
        code = SERVED.index(self.serving) * _STRIDE + WHY.index(self.why)
        self._log.append(code)
        self._counts[code] += 1

    def history(self) -> list[tuple[str, str]]:
        """Per served batch, in order: what served it and why."""
        return [(SERVED[c // _STRIDE], WHY[c % _STRIDE]) for c in self._log]

    def served(self, what: str) -> int:
        """Batches served by ``what`` (:data:`SERVED`)."""
        i = SERVED.index(what) * _STRIDE
        return sum(self._counts[i : i + len(WHY)])

    def tally(self) -> dict[str, dict[str, int]]:
        """Served batches by what served them and by why."""
        why = {w: sum(self._counts[j::_STRIDE]) for j, w in enumerate(WHY)}
        return {"served": {s: self.served(s) for s in SERVED}, "why": why}

    def state_dict(self) -> dict[str, Any]:
        return {
            "serving": self.serving,
            "why": self.why,
            "events": [e.to_dict() for e in self.events],
            "epoch": self.epoch,
            "prior_switches": self.prior_switches,
            "log": bytes(self._log),
            "stride": _STRIDE,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["serving"] not in SERVED or state["why"] not in WHY:
            raise ValueError(f"unknown serving state {state['serving']!r}, {state['why']!r}")
        self.serving, self.why = str(state["serving"]), str(state["why"])
        self.events = [FallbackEvent(**e) for e in state["events"]]
        self.epoch = int(state["epoch"])
        self.prior_switches = int(state["prior_switches"])
        log, stride = bytearray(state["log"]), int(state.get("stride", 4))
        if stride != _STRIDE:  # a record saved before WHY grew
            log = bytearray((c // stride) * _STRIDE + c % stride for c in log)
        if any(c >= len(self._counts) or c % _STRIDE >= len(WHY) for c in log):
            raise ValueError("unknown entries in the serving record")
        self._log = log
        self._counts = [log.count(c) for c in range(len(self._counts))]
