"""The source model, one step away: serve it whenever the answers say adapting is worse.

:class:`SourceFallback` keeps the model exactly as the user gave it (a frozen copy: its
parameters, its running statistics, eval mode) and, at every step, predicts with it beside the
adapted model. Each answered label request is scored for both models and, through the request's
known inclusion probability (:mod:`eatta.selection.drawn`), gives an unbiased estimate of the
batch's mean paired difference ``acc(adapted) - acc(given)``. So the labels that teach the
adapted model also measure it, and measuring costs no extra label:

- an active method draws its own requests with :class:`~eatta.selection.drawn.DisagreementDraw`
  and asks through :meth:`SourceFallback.listen` (the registered ``eatta-safe`` does both);
- a label-free method gets ``audits`` requests a batch drawn the same way, answered by
  ``auditor`` (these audits are its labels: count them in its budget).

Decisions, after every step, by :class:`~eatta.monitor.betting.SignTest` over every answer since
the last decision, at any arrival rate (one answer a batch, a person's pace, answers many batches
late), each answer's range known before its draw (:func:`~eatta.selection.drawn.answer_bound`):

- **serve the adapted model** once its bettor's wealth reaches ``1 / level``: an anytime-valid
  level-``level`` test of "the adapted model was never better on the answered batches since the
  last decision" (Ville's inequality; no repeated-look inflation);
- **serve the source model** once the drift detector's wealth reaches ``1 / level`` (average run
  length ``>= 1 / level`` answers while the adapted model is never worse): a model that drifts
  after it was trusted, so that every answer shows it wrong where the two differ and the given
  model right, is caught within :func:`~eatta.monitor.betting.drift_answers` answers (22 at the
  defaults ``recent=16``, ``level=0.05``), however long it was trusted before;
  with ``reset=True`` the adapted method is then also reset to its state at creation
  (``method.reset(keep_monitor=True)``). An alarm while the source model is served already is
  a decision too (``"adapted found worse"``): it changes nothing served, and the evidence starts
  over from it, so that later answers for the adapted model can still decide for it.

Without answers there is no evidence, and ``start`` says what serves
(:mod:`eatta.monitor.serving`): ``"source"`` (the default here) the given model,
``"blend"`` (``eatta-safe``'s default) the mean of the two models' probabilities, ``"adapted"``
the adapted model, ``"auto"`` the label-free signs of :mod:`eatta.monitor.signs`. What served each
batch and why (evidence, sign or default) is in :meth:`SourceFallback.history` and
:meth:`SourceFallback.stats`. The parts: :mod:`eatta.monitor.scoring` (answers into
observations), :mod:`eatta.monitor.betting` (the test), :mod:`eatta.monitor.signs`,
:mod:`eatta.monitor.serving` (the decision rule); this module wires them to a method.

State: :meth:`state_dict` (part of the method's ``state_dict()``: a stream resumes
bit-identically); the method's own ``reset()`` clears it, a fallback's reset of the method keeps
it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from eatta.annotate.base import is_asynchronous
from eatta.annotate.oracle import ABSTAIN, OracleError, validate_labels
from eatta.annotate.requests import Answer, LabelRequest
from eatta.monitor.betting import SignTest
from eatta.monitor.scoring import AnswerBook, Asked, drawn_weight
from eatta.monitor.serving import START, FallbackEvent, ServingRule, blend_logits
from eatta.monitor.signs import LabelFreeSigns
from eatta.selection.drawn import (
    DisagreementDraw,
    Draw,
    answer_bound,
    check_explore,
    inclusion_probabilities,
)

__all__ = ["START", "FallbackEvent", "SourceFallback"]


def _int_at_least(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


class _SyncTee:
    """A synchronous oracle whose answers the fallback also reads (everything else delegated)."""

    def __init__(self, oracle: Any, fallback: SourceFallback) -> None:
        self._oracle = oracle
        self._fallback = fallback

    def __call__(self, inputs: Tensor, indices: Tensor) -> Any:
        answer = self._oracle(inputs, indices)
        self._fallback.book.hear_sync(indices, answer)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._oracle, name)


class _AsyncTee:
    """An asynchronous annotator whose requests and answers the fallback also reads."""

    def __init__(self, annotator: Any, fallback: SourceFallback) -> None:
        self._annotator = annotator
        self._fallback = fallback

    def submit(self, requests: list[LabelRequest]) -> None:
        self._annotator.submit(requests)
        self._fallback._heard_requests(requests)

    def collect(self) -> list[Answer]:
        answers = list(self._annotator.collect())
        self._fallback.book.hear(answers)
        return answers

    def cancel(self, ids: list[str]) -> None:
        self._annotator.cancel(ids)
        self._fallback.book.forget(ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._annotator, name)


class SourceFallback:
    """See the module docstring.

    Args:
        given: the model as the user gave it (trained, BatchNorm with its running statistics);
            a frozen copy is kept, in eval mode.
        recent: answers the bets are sized from (the evidence is every answer since the last
            decision), >= 1.
        level: error level of each decision (the test's level, the detector's 1 / run length),
            in (0, 1).
        start: what is served before the first decision: ``"source"`` (the default),
            ``"blend"``, ``"adapted"``, or ``"auto"`` (the label-free signs, which the safety
            study's misleading streams defeat: docs/safety.md).
        prior_ratio: ``"auto"``'s threshold on the ratio of the two prediction entropies.
        prior_disagreement: ``"auto"``'s threshold on the share of samples the two disagree on.
        prior_batches: batches ``"auto"`` reads, >= 1.
        reset: whether evidence also resets the adapted method (else it only switches serving).
        draw: the active method's :class:`DisagreementDraw` (its :attr:`reference` is set here
            before each step); None for a label-free method.
        auditor: for a label-free method, who answers the audits: a callable
            ``oracle(inputs, indices)`` or an asynchronous annotator; None for an active one.
        audits: audit requests per batch (label-free methods; default 1), >= 1.
        explore: the audits' share drawn by entropy rather than disagreement, in (0, 1]
            (default 0.25). Both are refused with ``draw=``.
        sample: samples of each batch the source model predicts on while the adapted model is
            served (a uniform subset: the draw is made within it, see
            :mod:`eatta.selection.drawn`); None: all. While the source model or the blend is
            served it predicts on the whole batch.
        label_expiry: steps an audit may wait for its answer before it is dropped.
        seed: the audits' generator seed.
        act: whether the decisions are taken (False: measure only; the adapted model is always
            served and never reset, e.g. to see what drawing the requests costs).
    """

    def __init__(
        self,
        given: nn.Module,
        *,
        recent: int = 16,
        level: float = 0.05,
        start: str = "source",
        prior_ratio: float = 0.9,
        prior_disagreement: float = 0.3,
        prior_batches: int = 3,
        reset: bool = True,
        draw: DisagreementDraw | None = None,
        auditor: object = None,
        audits: int | None = None,
        explore: float | None = None,
        sample: int | None = 16,
        label_expiry: int = 256,
        seed: int = 0,
        act: bool = True,
    ) -> None:
        if not isinstance(given, nn.Module):
            raise TypeError(f"given must be the model as given (an nn.Module), got {given!r}")
        test = SignTest(level, recent)  # checks both
        self.recent, self.level = test.recent, test.level
        if isinstance(prior_ratio, bool) or not isinstance(prior_ratio, int | float):
            raise TypeError(f"prior_ratio must be a number in (0, 1], got {prior_ratio!r}")
        if not 0.0 < float(prior_ratio) <= 1.0:
            raise ValueError(f"prior_ratio must be in (0, 1], got {prior_ratio!r}")
        self.prior_ratio = float(prior_ratio)
        if isinstance(prior_disagreement, bool) or not isinstance(prior_disagreement, int | float):
            raise TypeError(
                f"prior_disagreement must be a number in [0, 1], got {prior_disagreement!r}"
            )
        if not 0.0 <= float(prior_disagreement) <= 1.0:
            raise ValueError(f"prior_disagreement must be in [0, 1], got {prior_disagreement!r}")
        self.prior_disagreement = float(prior_disagreement)
        self.prior_batches = _int_at_least("prior_batches", prior_batches, 1)
        self.rule = ServingRule(start, act=act, reset=reset)  # checks start
        self.start, self.act = start, self.rule.act
        self.reset_on_evidence = self.rule.reset_on_evidence
        self.signs = LabelFreeSigns(self.prior_batches, self.prior_ratio, self.prior_disagreement)
        self.book = AnswerBook()
        if draw is not None and not isinstance(draw, DisagreementDraw):
            raise TypeError(f"draw must be a DisagreementDraw or None, got {type(draw).__name__}")
        if draw is not None and auditor is not None:
            raise ValueError(
                "give draw= (an active method's own requests measure) or auditor= (audits for a "
                "label-free method), not both"
            )
        self.draw = draw
        self.auditor: Any = auditor
        if draw is not None and (audits is not None or explore is not None):
            raise ValueError(
                "audits= and explore= configure the audits of a label-free method; with draw= "
                "the method's own requests measure (set explore on the DisagreementDraw)"
            )
        self.audits = _int_at_least("audits", 1 if audits is None else audits, 1)
        self.explore = check_explore(0.25 if explore is None else explore)
        self.sample = None if sample is None else _int_at_least("sample", sample, 2)
        self.label_expiry = _int_at_least("label_expiry", label_expiry, 0)
        if auditor is not None and not (is_asynchronous(auditor) or callable(auditor)):
            raise TypeError(
                "auditor must be a callable oracle(inputs, indices) or an asynchronous "
                f"annotator (submit/collect/cancel), got {type(auditor).__name__}"
            )
        self.given = copy.deepcopy(given).eval().requires_grad_(False)
        self.test = test
        self._head = _last_linear_outputs(self.given)  # its last Linear's outputs, if any
        self._classes: int | None = None  # its logits' width, read on the first request
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)
        self.period = 0  # set by the caller (e.g. the round)
        self._clear()

    def _clear(self) -> None:
        self.step = 0
        self.rule.clear()
        self.signs.clear()
        self.book.clear()
        self.requested = 0  # audits this fallback asked for itself (label-free methods)
        self.test = SignTest(self.level, self.recent)
        self._source_pred: Tensor | None = None  # -1 where the source model did not predict
        self._source_logits: Tensor | None = None  # when it predicted on the whole batch
        self._subset: Tensor | None = None  # where it predicted (None: everywhere)

    @property
    def serving(self) -> str:
        """What serves now: ``"adapted"``, ``"source"`` or ``"blend"``."""
        return self.rule.serving

    @property
    def epoch(self) -> int:
        """Resets of the adapted method so far."""
        return self.rule.epoch

    @property
    def events(self) -> list[FallbackEvent]:
        """The decisions, with their evidence."""
        return self.rule.events

    @property
    def prior_switches(self) -> int:
        """Switches made by the label-free signs."""
        return self.rule.prior_switches

    @property
    def answers(self) -> int:
        """Answers scored (lifetime)."""
        return self.book.answers

    @property
    def served_source(self) -> int:
        """Batches whose served predictions were the source model's."""
        return self.rule.served("source")

    # -- wiring ------------------------------------------------------------------------------
    def listen(self, oracle: object) -> Any:
        """``oracle`` wrapped so that its answers also measure (give the result to the method
        as its oracle); everything else it has is passed through."""
        if self.draw is None:
            raise ValueError("listen() needs the method's DisagreementDraw (draw=)")
        if is_asynchronous(oracle):
            return _AsyncTee(oracle, self)
        if not callable(oracle):
            raise TypeError(
                "oracle must be a callable oracle(inputs, indices) or an asynchronous annotator "
                f"(submit/collect/cancel), got {type(oracle).__name__}"
            )
        return _SyncTee(oracle, self)

    @torch.no_grad()
    def source_logits(self, x: Tensor) -> Tensor:
        """The source model's logits for ``x`` (its own statistics: per sample, batch-free)."""
        ref = next(self.given.parameters(), None)
        if ref is not None and (ref.device != x.device or ref.dtype != x.dtype):
            self.given.to(device=x.device, dtype=x.dtype)
        return self.given(x.detach())

    def bind(self, method: Any) -> None:
        """Check that this fallback can act for ``method`` (called when it is attached): the two
        models must predict the same number of classes."""
        if self.draw is not None:  # the method's own requests measure: they must be drawn here
            oracle = getattr(method, "oracle", None)
            if getattr(method, "selector", None) is not self.draw or not (
                isinstance(oracle, _SyncTee | _AsyncTee) and oracle._fallback is self
            ):
                raise ValueError(
                    "a fallback with draw= measures by the method's own requests: build the "
                    "method with selector=fallback.draw, oracle=fallback.listen(oracle) and "
                    "balance=None (or give the fallback auditor= instead of draw=)"
                )
        elif self.auditor is None:
            raise ValueError(
                "a fallback without draw= or auditor= has no answers and would never act: give "
                "it the method's DisagreementDraw (draw=) or an auditor (auditor=)"
            )
        theirs = _last_linear_outputs(method.model)
        if self._head is not None and theirs is not None and theirs != self._head:
            raise ValueError(
                f"the source model predicts {self._head} classes and the adapted model "
                f"{theirs}: the fallback can only serve one in place of the other when they agree"
            )

    def check(self, x: Tensor, labels: Tensor | None) -> None:
        """Before anything changes: the source model's number of classes (found on the first
        request, on one sample) must cover ``labels``."""
        if self._classes is None:
            self._classes = int(self.source_logits(x[:1]).shape[1])
        if labels is not None and len(labels):
            bad = {v for v in labels.tolist() if (v < 0 and v != ABSTAIN) or v >= self._classes}
            if bad:
                raise ValueError(
                    f"labels {sorted(bad)} are outside the source model's {self._classes} "
                    "classes; nothing was changed"
                )

    def serve(self, x: Tensor, logits: Tensor) -> Tensor:
        """A request served between steps (a window): ``logits`` (the adapted model's), the
        source model's or their blend, whichever is served now."""
        self._check_classes(logits)
        self.rule.note()
        if self.serving == "adapted":
            return logits
        if self.serving == "blend":
            return blend_logits(logits, self.source_logits(x))
        return self.source_logits(x).to(logits.dtype)

    def _check_classes(self, logits: Tensor) -> None:
        if self._classes is not None and logits.shape[1] != self._classes:
            raise ValueError(
                f"the adapted model predicts {logits.shape[1]} classes, the source model "
                f"{self._classes}: the fallback cannot serve one in place of the other"
            )

    # -- the step ----------------------------------------------------------------------------
    def before(self, x: Tensor) -> None:
        """Before the method's step on ``x``: the source model's predictions, on the whole batch
        while it or the blend is served, else on a uniform subset of ``sample`` (and, for an
        active method, the draw's reference and candidates)."""
        n = x.shape[0]
        self.book.begin()
        if self.serving != "adapted" or self.sample is None or self.sample >= n:
            self._source_logits = self.source_logits(x)
            self._source_pred = self._source_logits.argmax(1)
            self._subset = None
        else:
            subset = torch.randperm(n, generator=self._gen)[: self.sample].sort().values
            logits = self.source_logits(x[subset.to(x.device)])
            self._source_logits = None
            self._source_pred = torch.full((n,), -1, dtype=torch.long, device=logits.device)
            self._source_pred[subset.to(logits.device)] = logits.argmax(1)
            self._subset = subset
        if self.draw is not None:
            self.draw.reference = self._source_pred
            self.draw.candidates = self._subset

    def after(
        self,
        method: Any,
        x: Tensor,
        logits: Tensor,
        labels: Tensor | None = None,
        *,
        served: bool = True,
    ) -> Tensor:
        """After the step (``logits``: the adapted model's, before its update): score the answers
        that arrived, audit (label-free), decide; return the logits to serve (``served``: False
        for a window's step, whose predictions are not served)."""
        assert self._source_pred is not None
        self._check_classes(logits)
        self.step += 1
        adapted = logits.detach().argmax(1)
        if self.draw is not None:
            draw = self.draw.last_draw
            self.book.score_sync(self.test, draw, adapted, self._source_pred, self.period)
        elif self.auditor is not None:
            self._audit(x, logits, adapted, labels)
        self.book.score_answers(self.test, self.epoch)
        self._expire()
        self.signs.record(self._source_pred, adapted)
        if self.start == "blend":  # what serves this batch, read off its predictions
            self.rule.refresh(self.signs, self.test.mean)
        out = logits
        if self.serving != "adapted":
            assert self._source_logits is not None  # predicted on the whole batch while served
            given = self._source_logits
            blend = self.serving == "blend"
            out = blend_logits(logits, given) if blend else given.to(logits.dtype)
        if served:
            self.rule.note()
        self._decide(method)
        self._source_logits = self._source_pred = self._subset = None
        return out

    # -- what the tees hear ------------------------------------------------------------------
    def _heard_requests(self, requests: list[LabelRequest]) -> None:
        draw = self.draw.last_draw if self.draw is not None else None
        for r in requests:
            hit = drawn_weight(draw, r.index)
            if hit is None or self._source_pred is None or draw is None:
                continue
            given = int(self._source_pred[r.index])
            self.book.pending[r.id] = Asked(
                hit[0],
                draw.bound,
                hit[1],
                r.prediction,
                given,
                self.period,
                self.epoch,
                self.step + 1,
            )

    # -- audits (label-free methods) ---------------------------------------------------------
    def _audit(self, x: Tensor, logits: Tensor, adapted: Tensor, labels: Tensor | None) -> None:
        """A label-free method's audits: ``audits`` draws by disagreement (and entropy)."""
        assert self._source_pred is not None
        if labels is not None and hasattr(self.auditor, "set_labels"):
            self.auditor.set_labels(labels)
        p = logits.detach().float().softmax(1)
        ent = (-(p * p.clamp_min(1e-12).log()).sum(1)).cpu()
        pool = torch.arange(x.shape[0]) if self._subset is None else self._subset.cpu()
        disagree = (adapted.cpu() != self._source_pred.cpu())[pool]
        q = inclusion_probabilities(ent[pool], disagree, self.explore).cpu()
        drawn = torch.multinomial(q.float(), self.audits, replacement=True, generator=self._gen)
        pos, counts = torch.unique(drawn, sorted=True, return_counts=True)
        idx = pool[pos]
        n_dis, bound = int(disagree.sum()), answer_bound(q, disagree)
        draw = Draw(idx, q[pos], counts, self.audits, len(pool), n_dis, bound)
        self.requested += len(idx)
        rows = idx.to(x.device)
        try:
            if not is_asynchronous(self.auditor):
                try:
                    answer = self.auditor(x.detach()[rows], idx.clone())
                except Exception as err:
                    raise OracleError(f"the auditor raised {type(err).__name__}: {err}") from err
                got = validate_labels(answer, len(idx), logits.shape[1])
                if got is not None:
                    self.book.score_labels(
                        self.test, idx, got, draw, adapted, self._source_pred, self.period
                    )
                return
            requests = []
            for j, i in enumerate(idx.tolist()):
                rid = f"fallback-{self.seed}-{self.step}-{j}"
                requests.append(
                    LabelRequest(
                        rid,
                        x.detach()[i].clone(),
                        logits.detach()[i].clone(),
                        getattr(self.auditor, "feedback", "label"),
                        self.step,
                        i,
                    )
                )
                hit = drawn_weight(draw, i)
                assert hit is not None
                self.book.pending[rid] = Asked(
                    hit[0],
                    draw.bound,
                    hit[1],
                    int(adapted[i]),
                    int(self._source_pred[i]),
                    self.period,
                    self.epoch,
                    self.step,
                )
            try:
                self.auditor.submit(requests)
                answers = list(self.auditor.collect())
            except Exception as err:
                raise OracleError(f"the auditor raised {type(err).__name__}: {err}") from err
            self.book.check_audits(answers, f"fallback-{self.seed}-", self.step, self.audits)
            self.book.hear(answers)
        finally:
            end = getattr(self.auditor, "end_batch", None)
            if end is not None:
                end()

    def _expire(self) -> None:
        if self.draw is not None:  # the method's own requests expire with the method
            return
        old = self.book.expire(self.step, self.label_expiry)
        if old and is_asynchronous(self.auditor):
            self.auditor.cancel(old)

    # -- decisions ---------------------------------------------------------------------------
    def evidence(self) -> tuple[int, float, float, float]:
        """Answers since the last decision, their mean paired difference (adapted - given), and
        the two wealths (the adapted model shown better at ``up >= 1 / level``, worse at
        ``down >= 1 / level``)."""
        t = self.test
        return t.answers, t.mean, t.up, t.down

    def disagreement_rate(self) -> float:
        """Share of the last ``prior_batches`` batches' samples (where the source model predicted)
        on which the two models predict different classes (nan before any batch)."""
        return self.signs.disagreement_rate()

    def collapse_ratio(self) -> float:
        """Entropy of the source model's predicted classes over that of the adapted model's, on
        the same samples of the last ``prior_batches`` batches (nan before any batch)."""
        return self.signs.collapse_ratio()

    def prior_choice(self) -> str:
        """What the label-free signs say to serve (:meth:`LabelFreeSigns.choice`)."""
        return self.signs.choice()

    def _decide(self, method: Any) -> None:
        reset = self.rule.decide(self.test.decided(), self.step, self.evidence(), self.signs)
        if reset:
            method.reset(keep_monitor=True)
        if self.rule.decided_now():
            self.test.clear()

    # -- what it reports ---------------------------------------------------------------------
    @property
    def resets(self) -> list[FallbackEvent]:
        """The resets of the adapted method, with their evidence."""
        return [e for e in self.events if e.kind.startswith("reset")]

    def period_gain(self, period: int) -> tuple[int, float]:
        """Answers and mean estimated paired difference (adapted - given accuracy) in a period."""
        return self.book.period_gain(period)

    def history(self) -> list[tuple[str, str]]:
        """Per served batch, in order: what served it (``"adapted"``, ``"source"``, ``"blend"``)
        and why (:data:`~eatta.monitor.serving.WHY`: ``"evidence"``, ``"default"``, ``"lean"``,
        ``"sign"``)."""
        return self.rule.history()

    def stats(self) -> dict[str, Any]:
        """Answers scored, batches served by the source model, switches and resets, what is
        served now and why, answers pending, and served batches by what and why."""
        return {
            "answers": self.answers,
            "requested": self.requested,
            "served_source": self.served_source,
            "steps": self.step,
            "switches": sum(e.kind.startswith("serve") for e in self.events),
            "prior_switches": self.prior_switches,
            "resets": len(self.resets),
            "serving": self.serving,
            "reason": self.rule.why,
            "pending": len(self.book.pending),
            **self.rule.tally(),
        }

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Back to creation (a new stream): evidence, events, pending audits (cancelled)."""
        if self.book.pending and self.auditor is not None and is_asynchronous(self.auditor):
            self.auditor.cancel(list(self.book.pending))
        self._clear()
        self._gen.manual_seed(self.seed)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "period": self.period,
            "requested": self.requested,
            "rule": self.rule.state_dict(),
            "signs": self.signs.state_dict(),
            "book": self.book.state_dict(),
            "test": self.test.state_dict(),
            "generator": self._gen.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.period = int(state["step"]), int(state["period"])
        self.requested = int(state["requested"])
        self.rule.load_state_dict(state["rule"])
        self.signs.load_state_dict(state["signs"])
        self.book.load_state_dict(state["book"])
        self.test.load_state_dict(state["test"])
        self._gen.set_state(state["generator"])


def _last_linear_outputs(model: nn.Module) -> int | None:
    """``out_features`` of the model's last ``nn.Linear`` (its classes, for a usual
    classifier); None without one."""
    last = None
    for m in model.modules():
        if isinstance(m, nn.Linear):
            last = m.out_features
    return last
