"""The given model, one step away: serve it whenever the answers say adapting is worse.

:class:`GivenModelFallback` keeps the model exactly as the user gave it (a frozen copy: its
parameters, its running statistics, eval mode) and, at every step, predicts with it beside the
adapted model. Each answered label request is scored for both models and, through the request's
known inclusion probability (:mod:`eatta.selection.drawn`), gives an unbiased estimate of the
batch's mean paired difference ``acc(adapted) - acc(given)``. So the labels that teach the
adapted model also measure it, and measuring costs no extra label:

- an active method draws its own requests with :class:`~eatta.selection.drawn.DisagreementDraw`
  and asks through :meth:`GivenModelFallback.listen` (the registered ``eatta-safe`` does both);
- a label-free method gets ``audits`` requests a batch drawn the same way, answered by
  ``auditor`` (these audits are its labels: count them in its budget).

Decisions, after every step, over the last ``window`` answers since the adapted model was last
reset (the window is counted in answers, so it follows the rate at which answers arrive: one a
batch, or a person's pace), with the normal-approximation interval ``mean +/- z sd / sqrt(m)``
at two-sided level ``level`` per look:

- **serve**: the adapted model's predictions once the interval's lower end is above 0, the given
  model's once its upper end is below 0; an interval around 0 keeps what is served. Before there
  are ``min_answers`` answers (since the last reset) ``start`` decides: ``"given"`` or
  ``"adapted"`` serve that, and ``"auto"`` (the default) reads two label-free signs over the
  last ``prior_batches`` (3) batches. The *collapse* of the given model's predictions: the
  entropy of the histogram of the classes it predicts against the adapted model's, on the same
  samples, below ``prior_ratio`` (0.9); a model whose statistics no longer fit the data (a heavy
  corruption under running statistics) piles its predictions onto few classes (read off
  digits-C's fifteen corruptions: given-model entropy 0.0-1.3 nats on the collapsed ones, 1.8 on
  pixelate, 2.3 on zoom blur and JPEG, the adapted model's 2.0-2.3). And the two models
  *disagreeing* on more than ``prior_disagreement`` (30 %) of the samples (added after one look
  at the CCC stream, where a given model that still spreads its predictions erred on many
  more samples). Either sign serves the adapted model; neither keeps the given one;
- **reset** (``reset=True``): when the adapted model is worse than the given one (upper end below
  0), or its gain over the given model has fallen (the window's upper end below the best lower
  end of an earlier, disjoint window since the reset), the adapted method is reset to its state
  at creation (``method.reset(keep_monitor=True)``) and its evidence starts again. After a reset
  for being worse the given model is served until the fresh adapted model shows it is better;
  after a fall in gain what was served stays, and the fresh model is tested like any other.

The per-look level is stated, not a stream-wide guarantee: the test is repeated at every answer,
so over a long stream where the two models are equal a switch happens more often than ``level``
(docs/guard.md measures how often, and what it costs). With no answers at all nothing can be
measured, and the given model is served throughout.

State: :meth:`state_dict` (part of the method's ``state_dict()``: a stream resumes
bit-identically); the method's own ``reset()`` clears it, a fallback's reset of the method keeps
it.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import torch
from torch import Tensor, nn

from eatta.annotate.base import is_asynchronous
from eatta.annotate.oracle import ABSTAIN, OracleError, validate_labels
from eatta.annotate.requests import Answer, LabelRequest
from eatta.monitor.confseq import check_level
from eatta.selection.drawn import DisagreementDraw, Draw, check_explore, inclusion_probabilities

__all__ = ["START", "FallbackEvent", "GivenModelFallback"]

#: What is served before there is evidence.
START = ("auto", "given", "adapted")


@dataclass(frozen=True)
class FallbackEvent:
    """A switch of what is served, or a reset of the adapted method, with its evidence."""

    kind: str  # "serve adapted", "serve given", "reset: worse than given", "reset: gain fell"
    step: int
    answers: int  # answers in the window the decision read
    gain: float  # the window's mean paired difference (adapted - given accuracy)
    low: float
    high: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Asked:
    """A request waiting for its answer: what the estimate needs when it arrives."""

    weight: float  # 1 / (n q): the answer's Horvitz-Thompson weight (one draw)
    count: int  # how often the draw picked the sample (each pick is one observation)
    adapted: int
    given: int
    period: int
    epoch: int
    step: int


def _int_at_least(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


class _SyncTee:
    """A synchronous oracle whose answers the fallback also reads (everything else delegated)."""

    def __init__(self, oracle: Any, fallback: GivenModelFallback) -> None:
        self._oracle = oracle
        self._fallback = fallback

    def __call__(self, inputs: Tensor, indices: Tensor) -> Any:
        answer = self._oracle(inputs, indices)
        self._fallback._heard_sync(indices, answer)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._oracle, name)


class _AsyncTee:
    """An asynchronous annotator whose requests and answers the fallback also reads."""

    def __init__(self, annotator: Any, fallback: GivenModelFallback) -> None:
        self._annotator = annotator
        self._fallback = fallback

    def submit(self, requests: list[LabelRequest]) -> None:
        self._annotator.submit(requests)
        self._fallback._heard_requests(requests)

    def collect(self) -> list[Answer]:
        answers = list(self._annotator.collect())
        self._fallback._heard_answers(answers)
        return answers

    def cancel(self, ids: list[str]) -> None:
        self._annotator.cancel(ids)
        self._fallback._forget(ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._annotator, name)


class GivenModelFallback:
    """See the module docstring.

    Args:
        given: the model as the user gave it (trained, BatchNorm with its running statistics);
            a frozen copy is kept, in eval mode.
        window: answers the decisions read (the most recent since the last reset), >= 2.
        level: two-sided error level of each look's interval, in (0, 1).
        min_answers: answers needed before any decision, >= 2.
        start: what is served without decisive evidence: ``"auto"`` (the label-free collapse
            test), ``"given"`` or ``"adapted"`` (kept until evidence says otherwise).
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
        sample: samples of each batch the given model predicts on while the adapted model is
            served (a uniform subset: the draw is made within it, see
            :mod:`eatta.selection.drawn`); None: all. While the given model is served it predicts
            on the whole batch.
        max_age: steps an audit may wait for its answer before it is dropped.
        seed: the audits' generator seed.
        act: whether the decisions are taken (False: measure only; the adapted model is always
            served and never reset, e.g. to see what drawing the requests costs).
    """

    def __init__(
        self,
        given: nn.Module,
        *,
        window: int = 64,
        level: float = 0.05,
        min_answers: int = 8,
        start: str = "auto",
        prior_ratio: float = 0.9,
        prior_disagreement: float = 0.3,
        prior_batches: int = 3,
        reset: bool = True,
        draw: DisagreementDraw | None = None,
        auditor: object = None,
        audits: int | None = None,
        explore: float | None = None,
        sample: int | None = 16,
        max_age: int = 256,
        seed: int = 0,
        act: bool = True,
    ) -> None:
        if not isinstance(given, nn.Module):
            raise TypeError(f"given must be the model as given (an nn.Module), got {given!r}")
        self.window = _int_at_least("fallback window", window, 2)
        self.level = check_level(level, "fallback level")
        self.min_answers = _int_at_least("min_answers", min_answers, 2)
        if self.min_answers > self.window:
            raise ValueError(f"min_answers ({min_answers}) must not exceed window ({window})")
        if start not in START:
            raise ValueError(f"start must be one of {', '.join(START)}, got {start!r}")
        self.start = start
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
        self.reset_on_evidence = bool(reset)
        self.act = bool(act)
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
        self.max_age = _int_at_least("max_age", max_age, 0)
        if auditor is not None and not (is_asynchronous(auditor) or callable(auditor)):
            raise TypeError(
                "auditor must be a callable oracle(inputs, indices) or an asynchronous "
                f"annotator (submit/collect/cancel), got {type(auditor).__name__}"
            )
        self.given = copy.deepcopy(given).eval().requires_grad_(False)
        self.z = NormalDist().inv_cdf(1.0 - self.level / 2.0)
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)
        self.period = 0  # set by the caller (e.g. the round)
        self._clear()

    def _clear(self) -> None:
        self.step = 0
        self.epoch = 0  # resets of the adapted method so far
        self.serving = "adapted" if self.start == "adapted" or not self.act else "given"
        self.prior_switches = 0  # switches made by the label-free collapse test
        # per recent batch: class histograms of the given and the adapted model's predictions
        self._marginals: deque[tuple[Tensor, Tensor]] = deque(maxlen=self.prior_batches)
        self._disagreement: deque[tuple[int, int]] = deque(maxlen=self.prior_batches)
        self.events: list[FallbackEvent] = []
        self.answers = 0  # answers scored (lifetime)
        self.requested = 0  # audits this fallback asked for itself (label-free methods)
        self.served_given = 0  # batches whose served predictions were the given model's
        self._window: deque[float] = deque(maxlen=self.window)
        self._since_block = 0  # answers since the last disjoint block closed
        self._best_low = -math.inf  # best lower end of a closed block since the reset
        self._periods: dict[int, list[float]] = {}  # period -> [answers, sum of estimates]
        self._pending: dict[str, _Asked] = {}
        self._heard: list[tuple[Tensor, Tensor | None]] = []  # sync answers in this step
        self._answered: list[Answer] = []  # async answers in this step
        self._given_pred: Tensor | None = None  # -1 where the given model did not predict
        self._given_logits: Tensor | None = None  # when it predicted on the whole batch
        self._subset: Tensor | None = None  # where it predicted (None: everywhere)

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
    def given_logits(self, x: Tensor) -> Tensor:
        """The given model's logits for ``x`` (its own statistics: per sample, batch-free)."""
        ref = next(self.given.parameters(), None)
        if ref is not None and (ref.device != x.device or ref.dtype != x.dtype):
            self.given.to(device=x.device, dtype=x.dtype)
        return self.given(x.detach())

    # -- the step ----------------------------------------------------------------------------
    def before(self, x: Tensor) -> None:
        """Before the method's step on ``x``: the given model's predictions, on the whole batch
        while it is served, else on a uniform subset of ``sample`` (and, for an active method,
        the draw's reference and candidates)."""
        n = x.shape[0]
        self._heard = []
        self._answered = []
        if self.serving == "given" or self.sample is None or self.sample >= n:
            self._given_logits = self.given_logits(x)
            self._given_pred = self._given_logits.argmax(1)
            self._subset = None
        else:
            subset = torch.randperm(n, generator=self._gen)[: self.sample].sort().values
            logits = self.given_logits(x[subset.to(x.device)])
            self._given_logits = None
            self._given_pred = torch.full((n,), -1, dtype=torch.long, device=logits.device)
            self._given_pred[subset.to(logits.device)] = logits.argmax(1)
            self._subset = subset
        if self.draw is not None:
            self.draw.reference = self._given_pred
            self.draw.candidates = self._subset

    def after(self, method: Any, x: Tensor, logits: Tensor, labels: Tensor | None = None) -> Tensor:
        """After the step (``logits``: the adapted model's, before its update): score the answers
        that arrived, audit (label-free), decide; return the logits to serve."""
        assert self._given_pred is not None
        self.step += 1
        adapted = logits.detach().argmax(1)
        if self.draw is not None:
            self._score_sync(adapted)
        elif self.auditor is not None:
            self._audit(x, logits, adapted, labels)
        for ans in self._answered:
            self._score_answer(ans)
        self._answered = []
        self._expire()
        self._record_marginals(adapted)
        served = logits
        if self.serving == "given":
            assert self._given_logits is not None  # predicted on the whole batch while served
            served = self._given_logits.to(logits.dtype)
            self.served_given += 1
        self._decide(method)
        self._given_logits = self._given_pred = self._subset = None
        return served

    # -- what the tees hear ------------------------------------------------------------------
    def _heard_sync(self, indices: Tensor, answer: object) -> None:
        """A synchronous answer, kept as it came: the method validates it (a bad one fails the
        step, and the fallback never scores it)."""
        if answer is None:
            return
        try:
            got = torch.as_tensor(answer).reshape(-1).long().cpu()
        except (TypeError, ValueError, RuntimeError):
            return
        if len(got) == len(indices):
            self._heard.append((indices.detach().cpu().clone(), got))

    def _heard_requests(self, requests: list[LabelRequest]) -> None:
        draw = self.draw.last_draw if self.draw is not None else None
        for r in requests:
            hit = _weight(draw, r.index)
            if hit is None or self._given_pred is None:
                continue
            given = int(self._given_pred[r.index])
            self._pending[r.id] = _Asked(
                *hit, r.prediction, given, self.period, self.epoch, self.step + 1
            )

    def _heard_answers(self, answers: list[Answer]) -> None:
        self._answered.extend(a for a in answers if isinstance(a, Answer))

    def _forget(self, ids: list[str]) -> None:
        for i in ids:
            self._pending.pop(i, None)

    # -- scoring -----------------------------------------------------------------------------
    def _score_sync(self, adapted: Tensor) -> None:
        draw = self.draw.last_draw if self.draw is not None else None
        for indices, got in self._heard:
            self._score_labels(indices, got, adapted, draw)
        self._heard = []

    def _score_labels(
        self, indices: Tensor, got: Tensor | None, adapted: Tensor, draw: Draw | None
    ) -> None:
        """Score labels answered at once for the drawn ``indices`` of this step's batch."""
        assert self._given_pred is not None
        if got is None:
            return
        for j, i in enumerate(indices.tolist()):
            y, hit = int(got[j]), _weight(draw, i)
            if y == ABSTAIN or hit is None:
                continue
            a, g = int(y == int(adapted[i])), int(y == int(self._given_pred[i]))
            self._add(hit[0] * (a - g), hit[1], self.period)

    def _score_answer(self, ans: Answer) -> None:
        asked = self._pending.pop(ans.id, None)
        if asked is None or ans.skip:
            return
        if ans.label is not None:
            a, g = int(ans.label == asked.adapted), int(ans.label == asked.given)
        else:  # yes/no on the adapted prediction: after a "no" where they differ the given
            # model's correctness is unknown; it is counted right (the safe side)
            a = int(bool(ans.correct))
            g = a if asked.given == asked.adapted else int(not a)
        if asked.epoch == self.epoch:
            self._add(asked.weight * (a - g), asked.count, asked.period)

    def _add(self, value: float, count: int, period: int) -> None:
        """One answer: ``count`` draws of the same sample, each an observation ``value``."""
        self.answers += 1
        tally = self._periods.setdefault(period, [0.0, 0.0])
        tally[0] += count
        tally[1] += value * count
        for _ in range(count):
            self._window.append(value)
        self._since_block += count

    def _audit(self, x: Tensor, logits: Tensor, adapted: Tensor, labels: Tensor | None) -> None:
        """A label-free method's audits: ``audits`` draws by disagreement (and entropy)."""
        assert self._given_pred is not None
        if labels is not None and hasattr(self.auditor, "set_labels"):
            self.auditor.set_labels(labels)
        p = logits.detach().float().softmax(1)
        ent = (-(p * p.clamp_min(1e-12).log()).sum(1)).cpu()
        pool = torch.arange(x.shape[0]) if self._subset is None else self._subset.cpu()
        disagree = (adapted.cpu() != self._given_pred.cpu())[pool]
        q = inclusion_probabilities(ent[pool], disagree, self.explore).cpu()
        drawn = torch.multinomial(q.float(), self.audits, replacement=True, generator=self._gen)
        pos, counts = torch.unique(drawn, sorted=True, return_counts=True)
        idx = pool[pos]
        draw = Draw(idx, q[pos], counts, self.audits, len(pool), int(disagree.sum()))
        self.requested += len(idx)
        rows = idx.to(x.device)
        try:
            if not is_asynchronous(self.auditor):
                try:
                    answer = self.auditor(x.detach()[rows], idx.clone())
                except Exception as err:
                    raise OracleError(f"the auditor raised {type(err).__name__}: {err}") from err
                got = validate_labels(answer, len(idx), logits.shape[1])
                self._score_labels(idx, got, adapted, draw)
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
                hit = _weight(draw, i)
                assert hit is not None
                self._pending[rid] = _Asked(
                    *hit,
                    int(adapted[i]),
                    int(self._given_pred[i]),
                    self.period,
                    self.epoch,
                    self.step,
                )
            try:
                self.auditor.submit(requests)
                self._answered.extend(list(self.auditor.collect()))
            except Exception as err:
                raise OracleError(f"the auditor raised {type(err).__name__}: {err}") from err
        finally:
            end = getattr(self.auditor, "end_batch", None)
            if end is not None:
                end()

    def _expire(self) -> None:
        if self.draw is not None:  # the method's own requests expire with the method
            return
        old = [i for i, a in self._pending.items() if self.step - a.step > self.max_age]
        for i in old:
            del self._pending[i]
        if old and is_asynchronous(self.auditor):
            self.auditor.cancel(old)

    # -- decisions ---------------------------------------------------------------------------
    def interval(self) -> tuple[int, float, float, float]:
        """The window's answers, mean paired difference and interval ends."""
        m = len(self._window)
        if m < 2:
            return m, math.nan, -math.inf, math.inf
        mean = sum(self._window) / m
        var = sum((v - mean) ** 2 for v in self._window) / (m - 1)
        r = self.z * math.sqrt(var / m)
        return m, mean, mean - r, mean + r

    def _record_marginals(self, adapted: Tensor) -> None:
        assert self._given_pred is not None
        given = self._given_pred.cpu()
        where = given >= 0  # the samples the given model predicted on
        classes = max(int(given.max()), int(adapted.max())) + 1
        self._marginals.append(
            (
                torch.bincount(given[where], minlength=classes),
                torch.bincount(adapted.cpu()[where], minlength=classes),
            )
        )
        differ = int((given[where] != adapted.cpu()[where]).sum())
        self._disagreement.append((differ, int(where.sum())))

    def disagreement_rate(self) -> float:
        """Share of the last ``prior_batches`` batches' samples (where the given model predicted)
        on which the two models predict different classes (nan before any batch)."""
        seen = sum(n for _, n in self._disagreement)
        return sum(d for d, _ in self._disagreement) / seen if seen else math.nan

    def prior_choice(self) -> str:
        """What the label-free signs say to serve: the adapted model when the given model's
        predictions have collapsed or the two disagree on more than ``prior_disagreement`` of
        the samples, else the given model."""
        collapsed = self.collapse_ratio() < self.prior_ratio
        apart = self.disagreement_rate() > self.prior_disagreement
        return "adapted" if collapsed or apart else "given"

    def collapse_ratio(self) -> float:
        """Entropy of the given model's predicted classes over that of the adapted model's, on
        the same samples of the last ``prior_batches`` batches (nan before any batch)."""
        if not self._marginals:
            return math.nan
        width = max(max(len(g), len(a)) for g, a in self._marginals)
        g_sum = torch.zeros(width, dtype=torch.float64)
        a_sum = torch.zeros(width, dtype=torch.float64)
        for g, a in self._marginals:
            g_sum[: len(g)] += g
            a_sum[: len(a)] += a
        h_a = _entropy(a_sum)
        return _entropy(g_sum) / h_a if h_a > 0 else 1.0

    def _decide(self, method: Any) -> None:
        if not self.act:
            return
        m, mean, low, high = self.interval()
        if m >= self.min_answers:  # evidence: decisive, or undecided and what is served stays
            if low > 0.0 or high < 0.0:
                want = "adapted" if low > 0.0 else "given"
                if want != self.serving:
                    self._event(f"serve {want}", m, mean, low, high)
                    self.serving = want
        elif self.start == "auto":  # no evidence yet: the label-free signs
            want = self.prior_choice()
            if want != self.serving:
                self.prior_switches += 1
                self.serving = want
        if m < self.min_answers:
            return
        fell = high < self._best_low
        if self._since_block >= self.window:  # a disjoint block closed: its lower end counts
            self._best_low = max(self._best_low, low)
            self._since_block = 0
        if self.reset_on_evidence and (high < 0.0 or fell):
            kind = "reset: worse than given" if high < 0.0 else "reset: gain fell"
            self._event(kind, m, mean, low, high)
            if high < 0.0:  # worse than the given model: serve it; a fall in gain alone keeps
                self.serving = "given"  # what is served (the reset model is tested afresh)
            method.reset(keep_monitor=True)
            self.epoch += 1
            self._window.clear()
            self._since_block = 0
            self._best_low = -math.inf

    def _event(self, kind: str, m: int, mean: float, low: float, high: float) -> None:
        self.events.append(FallbackEvent(kind, self.step, m, mean, low, high))

    # -- what it reports ---------------------------------------------------------------------
    @property
    def resets(self) -> list[FallbackEvent]:
        """The resets of the adapted method, with their evidence."""
        return [e for e in self.events if e.kind.startswith("reset")]

    def period_gain(self, period: int) -> tuple[int, float]:
        """Answers and mean estimated paired difference (adapted - given accuracy) in a period."""
        n, total = self._periods.get(period, [0.0, 0.0])
        return int(n), (total / n if n else math.nan)

    def stats(self) -> dict[str, Any]:
        """Answers scored, batches served by the given model, switches and resets, what is
        served now, answers pending."""
        return {
            "answers": self.answers,
            "requested": self.requested,
            "served_given": self.served_given,
            "steps": self.step,
            "switches": sum(e.kind.startswith("serve") for e in self.events),
            "prior_switches": self.prior_switches,
            "resets": len(self.resets),
            "serving": self.serving,
            "pending": len(self._pending),
        }

    # -- state -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Back to creation (a new stream): evidence, events, pending audits (cancelled)."""
        if self._pending and self.auditor is not None and is_asynchronous(self.auditor):
            self.auditor.cancel(list(self._pending))
        self._clear()
        self._gen.manual_seed(self.seed)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "period": self.period,
            "serving": self.serving,
            "events": [e.to_dict() for e in self.events],
            "answers": self.answers,
            "requested": self.requested,
            "served_given": self.served_given,
            "prior_switches": self.prior_switches,
            "marginals": [(g.clone(), a.clone()) for g, a in self._marginals],
            "disagreement": [list(p) for p in self._disagreement],
            "window": list(self._window),
            "since_block": self._since_block,
            "best_low": self._best_low,
            "periods": {p: list(t) for p, t in self._periods.items()},
            "pending": {k: asdict(v) for k, v in self._pending.items()},
            "generator": self._gen.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.period = int(state["period"])
        if state["serving"] not in START:
            raise ValueError(f"unknown serving state {state['serving']!r}")
        self.serving = str(state["serving"])
        self.events = [FallbackEvent(**e) for e in state["events"]]
        self.answers, self.served_given = int(state["answers"]), int(state["served_given"])
        self.requested = int(state["requested"])
        self.prior_switches = int(state["prior_switches"])
        self._marginals = deque(
            ((g.clone(), a.clone()) for g, a in state["marginals"]), maxlen=self.prior_batches
        )
        self._disagreement = deque(
            ((int(d), int(n)) for d, n in state["disagreement"]), maxlen=self.prior_batches
        )
        self._window = deque((float(v) for v in state["window"]), maxlen=self.window)
        self._since_block = int(state["since_block"])
        self._best_low = float(state["best_low"])
        self._periods = {int(p): [float(t[0]), float(t[1])] for p, t in state["periods"].items()}
        self._pending = {str(k): _Asked(**v) for k, v in state["pending"].items()}
        self._gen.set_state(state["generator"])


def _entropy(counts: Tensor) -> float:
    """Entropy (nats) of a class histogram."""
    total = float(counts.sum())
    if total <= 0:
        return 0.0
    p = counts[counts > 0].double() / total
    return float(-(p * p.log()).sum())


def _weight(draw: Draw | None, index: int) -> tuple[float, int] | None:
    """``(1 / (n q), count)`` of a drawn position (None if it was not drawn)."""
    if draw is None:
        return None
    hits = (draw.indices == index).nonzero()
    if not len(hits):
        return None
    j = int(hits[0])
    return 1.0 / (draw.n * float(draw.q[j])), int(draw.counts[j])
