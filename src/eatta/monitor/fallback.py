"""The given model, one step away: serve it whenever the answers say adapting is worse.

:class:`SourceFallback` is a part of any method (``fallback=``, a
:class:`~eatta.hooks.Hook`). It predicts with the method's copy of the model as the user gave it
(:attr:`eatta.AdaptiveMethod.given`: its parameters, its running statistics, eval mode) beside
the adapted model, scores every answered label request for both, and, through the request's
known inclusion probability (:mod:`eatta.selection.drawn`), gets an unbiased estimate of the
batch's mean paired difference ``acc(adapted) - acc(given)``. So the labels that teach the
adapted model also measure it, and measuring costs no extra label:

- an active method whose selector draws (``DisagreementDraw``; :func:`safe_parts` makes the two
  together, as ``eatta-safe`` does) has its own answers scored: the fallback gives the draw the
  given model's predictions before each step (``batch.reference``) and reads the step's answers
  after it (``batch.asked``);
- a label-free method gets ``audits`` requests a batch drawn the same way, answered by
  ``auditor`` (these audits are its labels: count them in its budget).

``start="promise"`` (``eatta-safe``'s default): no test decides; each batch is served by the
first of the adapted model, the adapted model on part of its disagreements and the given model
that keeps the promise of :mod:`eatta.monitor.promise` (with probability at least ``1 - level``,
at every batch, the error served so far exceeds the given model's by at most ``tolerance``
points; its assumptions and proof are there), chosen once the batch's predictions are known and
before its draw, which then goes where what served differs from the given model
(:meth:`SourceFallback.focus`), so that its answer measures that batch. A window's step draws
among the requests served since its last draw. :attr:`SourceFallback.bound` is the certified
bound at any time, and ``stats()["promise"]`` reports it beside what served and why;
:meth:`SourceFallback.bounds` gives it after every served batch.

The other starts take decisions, after every step, by :class:`~eatta.monitor.evidence.SignTest`
over every answer since the last decision, at any arrival rate, each answer's range known before
its draw (:func:`~eatta.selection.drawn.answer_bound`): serve the adapted model once its bettor's
wealth reaches ``1 / level`` (an anytime-valid level-``level`` test of "the adapted model was never
better on the answered batches since the last decision"), serve the given model once the drift
detector's does (with ``reset=True`` the adapted method is then reset too, through the batch:
``batch.reset``). Without answers there is no evidence, and ``start`` says what serves
(:mod:`eatta.monitor.serving`). What served each batch and why is in :meth:`history` and
:meth:`stats`.

State: :meth:`state_dict` (part of the method's ``state_dict()``); the method's own ``reset()``
clears it, a reset the fallback asked for keeps it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from eatta.annotate.base import is_asynchronous
from eatta.annotate.oracle import OracleError, validate_labels
from eatta.annotate.requests import LabelRequest, check_feedback
from eatta.hooks import Batch, HostMethod
from eatta.monitor.evidence import AnswerBook, Asked, SignTest, drawn_weight, measure
from eatta.monitor.promise import Cover, Plan, Promise, decide
from eatta.monitor.serving import START, FallbackEvent, ServingRule
from eatta.monitor.signs import LabelFreeSigns
from eatta.selection.base import ScoreSelector, SelectionContext
from eatta.selection.drawn import (
    DisagreementDraw,
    Draw,
    answer_bound,
    check_explore,
    inclusion_probabilities,
)

__all__ = ["START", "FallbackEvent", "SourceFallback", "safe_parts"]


def _int_at_least(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


def _fraction(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    if not low <= float(value) <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return float(value)


class SourceFallback:
    """See the module docstring.

    Args:
        recent: answers the bets are sized from (the evidence is every answer since the last
            decision), >= 1.
        level: error level of each decision (the test's level, the detector's 1 / run length),
            in (0, 1).
        start: ``"promise"`` (the guarantee: no decision, ``tolerance`` and ``level``), or what is
            served before the first decision: ``"source"`` (the default), ``"blend"`` (the lean
            rule: measured, not guaranteed), ``"adapted"``, or ``"auto"`` (the label-free signs,
            which the safety study's misleading streams defeat: docs/safety.md).
        tolerance: with ``start="promise"``, the points of error the served predictions may
            exceed the given model's by, >= 0 (``level``: the chance it may fail).
        prior_ratio, prior_disagreement, prior_batches: ``"auto"``'s thresholds and batches.
        reset: whether evidence against the adapted model also resets the method.
        auditor: for a method whose own requests are not drawn (a label-free one), who answers
            the audits: a callable ``oracle(inputs, indices)`` or an asynchronous annotator.
            None: the method's own drawn answers measure.
        audits: audit requests per batch (with ``auditor``; default 1), >= 1.
        explore: the audits' share drawn by entropy rather than disagreement, in (0, 1]
            (with ``auditor``; default 0.25).
        sample: samples of each batch the given model predicts on while the adapted model is
            served (a uniform subset: the draw is made within it); None: all. While the given
            model or the blend is served it predicts on the whole batch.
        label_expiry: steps an answer may wait before its request is forgotten.
        seed: the subsets' and the audits' generator seed.
        act: whether the decisions are taken (False: measure only; the adapted model is always
            served and never reset).
    """

    name = "fallback"
    measures = True

    def __init__(
        self,
        *,
        recent: int = 16,
        level: float = 0.05,
        start: str = "source",
        prior_ratio: float = 0.9,
        prior_disagreement: float = 0.3,
        prior_batches: int = 3,
        reset: bool = True,
        auditor: object = None,
        audits: int | None = None,
        explore: float | None = None,
        sample: int | None = 16,
        label_expiry: int = 256,
        seed: int = 0,
        act: bool = True,
        tolerance: float = 0.5,
    ) -> None:
        test = SignTest(level, recent)  # checks both
        self.recent, self.level = test.recent, test.level
        if isinstance(prior_ratio, bool) or not isinstance(prior_ratio, int | float):
            raise TypeError(f"prior_ratio must be a number in (0, 1], got {prior_ratio!r}")
        if not 0.0 < float(prior_ratio) <= 1.0:
            raise ValueError(f"prior_ratio must be in (0, 1], got {prior_ratio!r}")
        self.prior_ratio = float(prior_ratio)
        self.prior_disagreement = _fraction("prior_disagreement", prior_disagreement, 0.0, 1.0)
        self.prior_batches = _int_at_least("prior_batches", prior_batches, 1)
        self.rule = ServingRule(start, act=act, reset=reset)  # checks start
        self.start, self.act = start, self.rule.act
        self.reset_on_evidence = self.rule.reset_on_evidence
        self.signs = LabelFreeSigns(self.prior_batches, self.prior_ratio, self.prior_disagreement)
        promised = start == "promise"
        if auditor is None and (audits is not None or explore is not None):
            raise ValueError(
                "audits= and explore= configure the audits of auditor=; without one the "
                "method's own drawn requests measure (set explore on its DisagreementDraw)"
            )
        if auditor is not None and not (is_asynchronous(auditor) or callable(auditor)):
            raise TypeError(
                "auditor must be a callable oracle(inputs, indices) or an asynchronous "
                f"annotator (submit/collect/cancel), got {type(auditor).__name__}"
            )
        self.auditor: Any = auditor
        self.audits = _int_at_least("audits", 1 if audits is None else audits, 1)
        self.explore = check_explore(0.25 if explore is None else explore)
        self.promise = Promise(tolerance, level) if promised else None
        self.tolerance = None if self.promise is None else self.promise.tolerance
        self.book = AnswerBook(self.promise)
        self.sample = None if sample is None else _int_at_least("sample", sample, 2)
        self.label_expiry = _int_at_least("label_expiry", label_expiry, 0)
        self.test = test
        self._checked = False
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)
        self.period = 0  # set by the caller (e.g. the round)
        self._clear()

    def _clear(self) -> None:
        self.step = 0
        self.rule.clear()
        self.signs.clear()
        self.book.clear()
        self.requested = 0  # audits this fallback asked for itself (with an auditor)
        self.test = SignTest(self.level, self.recent)
        if self.promise is not None:
            self.promise.clear()
        self._given_sub: Tensor | None = None  # its logits on the subset
        self._given_pred: Tensor | None = None  # -1 where the given model did not predict
        self._given_logits: Tensor | None = None  # when it predicted on the whole batch
        self._subset: Tensor | None = None  # where it predicted (None: everywhere)
        # the promise: the request this call serves (a window's, chosen before its step), what
        # the step's draw measures, and the served samples no draw has measured yet (a window's
        # requests: served class, given class or -1 where the given model did not predict)
        self._plan: Plan | None = None
        self._cover: Cover | None = None
        self._done: Tensor | None = None  # the output of the request a window's step served
        self._window = False
        self._open: list[tuple[Tensor, Tensor]] = []

    # -- what it reports ---------------------------------------------------------------------
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
    def resets(self) -> list[FallbackEvent]:
        """The resets of the adapted method, with their evidence."""
        return [e for e in self.events if e.kind.startswith("reset")]

    @property
    def answers(self) -> int:
        """Answers scored (lifetime)."""
        return self.book.answers

    @property
    def served_source(self) -> int:
        """Batches whose served predictions were the given model's."""
        return self.rule.served("source")

    @property
    def bound(self) -> float | None:
        """The certified bound: the most the error served so far can exceed the given model's
        on the same batches, in points, with probability at least ``1 - level`` (None without
        ``start="promise"``)."""
        return None if self.promise is None else self.promise.bound

    def bounds(self) -> list[float]:
        """The certified bound after each served batch, in points ([] without the promise)."""
        return [] if self.promise is None else self.promise.bounds()

    def evidence(self) -> tuple[int, float, float, float]:
        """Answers since the last decision, their mean paired difference (adapted - given), and
        the two wealths (the adapted model shown better at ``up >= 1 / level``, worse at
        ``down >= 1 / level``)."""
        t = self.test
        return t.answers, t.mean, t.up, t.down

    def period_gain(self, period: int) -> tuple[int, float]:
        """Answers and mean estimated paired difference (adapted - given accuracy) in a period."""
        return self.book.period_gain(period)

    def history(self) -> list[tuple[str, str]]:
        """Per served batch, in order: what served it (``"adapted"``, ``"source"``, ``"blend"``)
        and why (:data:`~eatta.monitor.serving.WHY`)."""
        return self.rule.history()

    def stats(self) -> dict[str, Any]:
        """Answers scored, batches served by the given model, switches and resets, what is
        served now and why, answers pending, and served batches by what and why."""
        return {
            "answers": self.answers,
            "requested": self.requested,
            "served_source": self.served_source,
            "steps": self.step,
            "switches": sum(e.kind.startswith("serve") for e in self.events),
            "prior_switches": self.rule.prior_switches,
            "resets": len(self.resets),
            "serving": self.serving,
            "reason": self.rule.why,
            "pending": len(self.book.pending),
            **self.rule.tally(),
            **({} if self.promise is None else {"promise": self.promise.stats()}),
        }

    # -- the hook ----------------------------------------------------------------------------
    def check(self, method: HostMethod, batch: Batch) -> None:
        """On the first request, before anything changes: the fallback must have answers to
        read (the method's own, drawn, or its auditor's)."""
        if self._checked:
            return
        selector = getattr(method, "selector", None)
        if self.auditor is None and not getattr(selector, "draws", False):
            raise ValueError(
                "a fallback without auditor= reads the method's own answers, which must be "
                "drawn with known probabilities: build the method with a DisagreementDraw "
                "selector and balance=None (eatta.monitor.safe_parts), or give the fallback "
                "auditor="
            )
        if (
            self.promise is not None
            and self.auditor is None
            and getattr(selector, "focus", None) != self.focus
        ):
            raise ValueError(
                "the promise measures what served: the method's DisagreementDraw must draw where "
                "this fallback says (DisagreementDraw(focus=fallback.focus); eatta.monitor."
                "safe_parts makes the two together)"
            )
        self._checked = True

    def before_step(self, method: HostMethod, batch: Batch) -> None:
        """Before the method's step on ``batch.step_x``: the given model's predictions, on the
        whole batch while it or the blend may serve, else on a uniform subset of ``sample``;
        for the method's draw, as ``batch.reference`` and ``batch.candidates``. Under the
        promise, a window's request is served by what is chosen now, before its step's draw."""
        self._plan = self._cover = self._done = None
        x = batch.step_x
        if x is None:  # a request served between a window's steps
            return
        n = x.shape[0]
        self._window = x is not batch.x
        if self.promise is None or not self.act:
            alone = self.rule.serving == "adapted"
        else:  # a window's step measures its requests: the given model predicts on all of it
            alone = not self._window and self.promise.adapted_alone(n)
        if not alone or self.sample is None or self.sample >= n:
            self._given_logits = method.given_logits(x)
            self._given_pred = self._given_logits.argmax(1)
            self._subset = None
        else:
            subset = torch.randperm(n, generator=self._gen)[: self.sample].sort().values
            logits = method.given_logits(x[subset.to(x.device)])
            self._given_logits = None
            self._given_sub = logits
            self._given_pred = torch.full((n,), -1, dtype=torch.long, device=logits.device)
            self._given_pred[subset.to(logits.device)] = logits.argmax(1)
            self._subset = subset
        if self.promise is not None and self._window:
            assert batch.adapted is not None
            k = batch.x.shape[0]
            given = None if self._given_logits is None else self._given_logits[-k:]
            self._plan = decide(
                self.promise, batch.adapted, given, self._given_pred[-k:], force=not self.act
            )
        if self.auditor is None:
            batch.reference, batch.candidates = self._given_pred, self._subset

    def focus(self, ctx: SelectionContext) -> Tensor | None:
        """Under the promise, the samples of the step the draw goes to (the method's
        :class:`~eatta.selection.drawn.DisagreementDraw` asks, before drawing): where what its
        answers measure served differently from the given model (None: nowhere, or no promise)."""
        if self.promise is None or self._given_pred is None:
            return None
        return self._measure(ctx.logits).focus

    def _measure(self, logits: Tensor) -> Cover:
        """What this step's draw measures (chosen once a step): a batch's own serving, chosen now
        from ``logits`` (the adapted model's, before any answer of this batch); a window's, the
        requests served since its last draw."""
        if self._cover is not None:
            return self._cover
        assert self.promise is not None and self._given_pred is not None
        given, n = self._given_pred, self._given_pred.shape[0]
        if self._window:
            self._cover = self._window_cover(given)
            return self._cover
        if self._plan is None:
            self._plan = decide(self.promise, logits, self._given_logits, given, force=not self.act)
        plan = self._plan
        focus = (plan.served != given) & (given >= 0)
        if self._subset is None:
            self._cover = Cover(plan.served, focus if plan.charge else None, plan.charge,
                                plan.charge)  # fmt: skip
        else:  # the adapted model alone, the given model on a subset of m
            m = len(self._subset)
            seen = plan.charge - (n - m)  # its disagreements there
            self._cover = Cover(
                plan.served, focus if seen else None, plan.charge, n / m * seen, n / m,
                n * n / m, single=True,
            )  # fmt: skip
        return self._cover

    def _window_cover(self, given: Tensor) -> Cover:
        """A window step's: its last samples are the requests served since the last draw (the
        one this call serves last); the rest measure nothing (served = given). Where the given
        model did not predict on a request, it does now: the charge that finds no difference
        there is released (``refund``)."""
        assert self._plan is not None
        n, k = given.shape[0], self._plan.n
        rows = [*self._open, (self._plan.served, given[-k:])]
        served_then = torch.cat([r[0].to(given.device) for r in rows])
        given_then = torch.cat([r[1].to(given.device) for r in rows])
        take = min(len(served_then), n)
        served = given.clone()
        served[n - take :] = served_then[-take:]
        then, now = given_then[-take:], given[n - take :]
        differ = served[n - take :] != now
        charged = (then < 0) | (served_then[-take:] != then)
        refund, count = torch.stack([(charged & ~differ).sum(), differ.sum()]).tolist()
        focus = torch.zeros_like(given, dtype=torch.bool)
        focus[n - take :] = differ
        cover = Cover(served, focus if count else None, float(count), float(count))
        cover.refund = float(refund)
        return cover

    def after_step(self, method: HostMethod, batch: Batch) -> None:
        """After the step: score the answers, audit (with an auditor), decide, and choose what
        serves the request (a reset the evidence asks for: ``batch.reset``)."""
        if batch.step_logits is not None:  # the method stepped
            assert batch.step_x is not None
            served = batch.step_x is batch.x
            # an auditor's failure or bad answer raises before the evidence changes; what the
            # audit changed before it (the step, the draw, the pending requests) is put back
            mark = self._mark() if self.auditor is not None else None
            try:
                out = self._stepped(method, batch, batch.step_x, batch.step_logits, served)
            except BaseException:
                if mark is not None:
                    self._back(mark)
                raise
            if served:
                batch.served = out
        if batch.step_x is not batch.x:  # a request served between a window's steps
            assert batch.adapted is not None
            batch.served = self.serve(method, batch.x, batch.adapted, windowed=True)

    def _stepped(
        self, method: HostMethod, batch: Batch, x: Tensor, logits: Tensor, served: bool
    ) -> Tensor:
        given_pred, test = self._given_pred, self.test
        assert given_pred is not None
        self.step += 1
        adapted = logits.detach().argmax(1)
        out, cover = logits, None
        if self.promise is not None:  # what serves was chosen before this batch's answers
            cover = self._measure(logits)
            assert self._plan is not None
            if served:
                out = self._commit(self._plan, None)
            else:  # a window's step: the request it serves, then what the draw covers
                self._done = self._commit(self._plan, given_pred[-self._plan.n :])
                self._plan = None
                self.promise.refine(cover.refund)
        if self.auditor is None:
            self.book.score_step(
                test, batch.asked, adapted, given_pred, self.period, self.rule.epoch, self.step,
                cover,
            )  # fmt: skip
            pending = getattr(getattr(method, "asking", None), "pending", None)
            if pending is not None:  # what the method no longer awaits never comes back
                self.book.keep(pending.ids)
            drew = any(lab.selection is not None and len(lab.selection.indices)
                       for lab in batch.asked)  # fmt: skip
        else:
            self._audit(x, logits, adapted, batch.step_labels, cover)
            drew = True
        if self.promise is not None:  # what a draw measured leaves the open requests
            self._open = [] if drew or served else self._trim(x.shape[0])
        if self.start == "auto":
            self.signs.record(given_pred, adapted)
        if self.promise is None:
            out = self.rule.serve(logits, self._given_logits, test, self.signs, note=served)
            if self.rule.decide(test, self.step, self.signs):
                batch.reset = "the fallback's evidence: the adapted model is worse than the given"
        self._given_logits = self._given_pred = self._subset = self._given_sub = None
        self._plan = self._cover = None  # this step's: a request served without one chooses anew
        return out

    def _commit(self, plan: Plan, given: Tensor | None) -> Tensor:
        """Serve ``plan`` (the promise charges it; the rule records it); ``given``: the given
        model's predictions on a request a window's draw will measure (-1 where unknown)."""
        assert self.promise is not None
        self.promise.serve(plan.n, plan.charge, force=not self.act)
        self.rule.put(plan.what, "bound" if plan.what == "source" else "promise")
        self.rule.note()
        if given is not None:
            self._open.append((plan.served, given))
        return plan.out

    def _trim(self, size: int) -> list[tuple[Tensor, Tensor]]:
        """The open requests' last ``size`` samples (older ones left the window unmeasured)."""
        if not self._open:
            return []
        served = torch.cat([r[0] for r in self._open])[-size:]
        given = torch.cat([r[1] for r in self._open])[-size:]
        return [(served, given)]

    def _mark(self) -> tuple[Any, ...]:
        """What an audit changes before its answer is checked (the requests are immutable)."""
        promise = None if self.promise is None else self.promise.state_dict()
        rule = self.rule.state_dict()
        return (self.step, self.requested, self._gen.get_state(), dict(self.book.pending),
                promise, rule, list(self._open))  # fmt: skip

    def _back(self, mark: tuple[Any, ...]) -> None:
        self.step, self.requested, generator, self.book.pending, promise, rule, opened = mark
        self._gen.set_state(generator)
        if self.promise is not None:
            self.promise.load_state_dict(promise)
        self.rule.load_state_dict(rule)
        self._open = opened

    def serve(
        self, method: HostMethod, x: Tensor, logits: Tensor, *, windowed: bool = False
    ) -> Tensor:
        """A request served without a step (between a window's steps, or skipped by the online
        protocol): ``logits`` (the adapted model's), the given model's or their blend, whichever
        is served now; recorded as served. ``windowed``: it joins the method's window, whose next
        draw measures it (else, under the promise, its charge stays)."""
        if self.promise is not None:
            done, self._done = self._done, None
            if done is not None:  # served by the window's step
                return done
            plan, self._plan = self._plan, None
            if plan is not None:  # chosen before a window's step that did not happen
                given = self._given_pred
                assert given is not None
                self._given_logits = self._given_pred = self._subset = None
                return self._commit(plan, given[-plan.n :])
            n = x.shape[0]
            alone = not self.act or self.promise.adapted_alone(n, measured=windowed)
            given = None if alone else method.given_logits(x)
            if given is None:
                pred = torch.full((n,), -1, dtype=torch.long, device=logits.device)
            else:
                pred = given.argmax(1)
            plan = decide(self.promise, logits, given, pred, force=not self.act, measured=windowed)
            return self._commit(plan, pred if windowed else None)
        given = None if self.rule.serving == "adapted" else method.given_logits(x)
        return self.rule.serve(logits, given, self.test, self.signs, note=True, refresh=False)

    # -- audits (with an auditor) ------------------------------------------------------------
    def _audit(
        self,
        x: Tensor,
        logits: Tensor,
        adapted: Tensor,
        labels: Tensor | None,
        cover: Cover | None = None,
    ) -> None:
        """``audits`` draws by disagreement (and entropy), answered by the auditor; under the
        promise, by where what served differs from the given model (``cover``)."""
        assert self._given_pred is not None
        self.book.begin()
        old = self.book.expire(self.step, self.label_expiry)
        if old and is_asynchronous(self.auditor):
            self.auditor.cancel(old)
        if labels is not None and hasattr(self.auditor, "set_labels"):
            self.auditor.set_labels(labels)
        p = logits.detach().float().softmax(1)
        ent = (-(p * p.clamp_min(1e-12).log()).sum(1)).cpu()
        pool = torch.arange(x.shape[0]) if self._subset is None else self._subset.cpu()
        if cover is not None and cover.focus is not None:
            disagree = cover.focus.cpu()[pool]
        else:
            disagree = (adapted.cpu() != self._given_pred.cpu())[pool]
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
                        self.test, idx, got, draw, adapted, self._given_pred, self.period, cover
                    )
                return
            self._ask_audits(x, logits, adapted, idx, draw, cover)
            self.book.score_answers(self.test, self.rule.epoch)
        finally:
            end = getattr(self.auditor, "end_batch", None)
            if end is not None:
                end()

    def _ask_audits(
        self,
        x: Tensor,
        logits: Tensor,
        adapted: Tensor,
        idx: Tensor,
        draw: Draw,
        cover: Cover | None = None,
    ) -> None:
        assert self._given_pred is not None
        requests = []
        n = len(self._given_pred)
        for j, i in enumerate(idx.tolist()):
            rid = f"fallback-{self.seed}-{self.step}-{j}"
            feedback = check_feedback(getattr(self.auditor, "feedback", "label"))
            sample, logit = x.detach()[i].clone(), logits.detach()[i].clone()
            requests.append(LabelRequest(rid, sample, logit, feedback, self.step, i))
            hit = drawn_weight(draw, i)
            assert hit is not None
            given = int(self._given_pred[i])
            served = given if cover is None else int(cover.served[i])
            self.book.pending[rid] = Asked(
                hit[0], draw.bound, hit[1], int(adapted[i]), given, self.period, self.epoch,
                self.step, draw.n, draw.disagreements,
                **measure(cover, draw, hit[0], served, n),
            )  # fmt: skip
        try:
            self.auditor.submit(requests)
            answers = list(self.auditor.collect())
        except Exception as err:
            raise OracleError(f"the auditor raised {type(err).__name__}: {err}") from err
        self.book.check_audits(answers, f"fallback-{self.seed}-", self.step, self.audits)
        self.book.hear(answers)

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
            **({} if self.promise is None else {"promise": self.promise.state_dict()}),
            **({} if not self._open else {"open": [t.cpu() for t in self._trim(2**62)[0]]}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.period = int(state["step"]), int(state["period"])
        self.requested = int(state["requested"])
        self.rule.load_state_dict(state["rule"])
        self.signs.load_state_dict(state["signs"])
        self.book.load_state_dict(state["book"])
        self.test.load_state_dict(state["test"])
        self._gen.set_state(state["generator"])
        if self.promise is not None:
            self.promise.load_state_dict(state["promise"])
        opened = state.get("open")
        self._open = [] if opened is None else [(opened[0].clone(), opened[1].clone())]


def safe_parts(
    base: object = None, *, explore: float = 0.25, seed: int = 0, **fallback: Any
) -> dict[str, Any]:
    """The parts that make a method never knowingly worse than its given model, made together:
    ``selector`` (a :class:`~eatta.selection.drawn.DisagreementDraw` over ``base``'s scores, so
    the answers that teach also measure), ``balance=None`` (a class balance would change the
    draw), and ``fallback`` (a :class:`SourceFallback` reading those answers; ``fallback``:
    its keywords). ``EATTA(model, optimizer, oracle=..., **safe_parts())`` is ``eatta-safe``'s
    assembly."""
    if base is not None and not isinstance(base, ScoreSelector):
        raise TypeError(f"eatta-safe draws by a per-sample score; {base!r} has none")
    if "auditor" in fallback:
        raise TypeError("safe_parts' fallback reads the method's own answers: no auditor=")
    made = SourceFallback(**fallback)  # the draw goes where it measures (under the promise)
    draw = DisagreementDraw(base, explore=explore, seed=seed, focus=made.focus)
    return {"selector": draw, "balance": None, "fallback": made}
