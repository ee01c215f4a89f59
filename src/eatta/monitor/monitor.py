"""The live accuracy monitor: audited answers score the adapted model and the source model.

:class:`AccuracyMonitor` is a part of any method (``monitor=AccuracyMonitor(auditor)``, a
:class:`~eatta.hooks.Hook`) and runs after each step: it draws the batch's audited samples
(:class:`~eatta.monitor.audit.AuditSampler`, a uniform random share), records the prediction the
model served for each (the step's logits, before its update) and the given model's prediction on the
same samples (the method's one copy of the model as given, :attr:`eatta.AdaptiveMethod.given`: one
extra forward pass of the audited samples only), and asks the auditor for their labels. Each answer,
whenever it arrives, scores both predictions; yes/no answers score the adapted prediction exactly,
and the source one when the two agree or the answer is "yes" (the source is then wrong); after a
"no" on a sample where they differ the source is counted wrong, so with yes/no feedback the source
accuracy is a lower bound.

Estimates (:meth:`AccuracyMonitor.estimate`): accuracy of the adapted and the source model and
their paired difference, each with an anytime-valid interval (:mod:`eatta.monitor.confseq`),
overall, since the last reset, over the last ``recent`` audits, or per period (an integer the
caller sets, e.g. the round). These figures are unbiased: the audited samples are drawn uniformly.
The method's own label requests (the selected, most uncertain samples) are not used: their
accuracy is biased low.

With a :class:`~eatta.monitor.guard.Guard`, each audit of the current model also feeds its test,
and on a positive test the method is reset to its source state (through the batch,
``batch.reset``: the method resets once, the monitor kept): the event is counted and logged in
:attr:`AccuracyMonitor.resets`.

State: :meth:`state_dict` (part of the method's ``state_dict()``, so a resumed stream continues
bit-identically); ``method.reset()`` by the user clears the monitor too (a new stream), a guard's
reset keeps it (it restarts only the guard's blocks and the since-reset tallies).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from torch import Tensor, nn

from eatta.annotate.base import is_asynchronous
from eatta.annotate.oracle import ABSTAIN, OracleError, validate_labels
from eatta.annotate.requests import Answer, LabelRequest, check_feedback
from eatta.hooks import Batch, HostMethod
from eatta.monitor.audit import AuditSampler, check_share
from eatta.monitor.confseq import check_level, mixture_radius
from eatta.monitor.evidence import paired
from eatta.monitor.guard import GUARD_POLICIES, Guard, ResetEvent

__all__ = ["AccuracyMonitor", "Estimate", "Interval"]

_COUNTERS = ("requested", "received", "skipped", "expired", "refused", "dropped")


@dataclass(frozen=True)
class Interval:
    """An estimate and its interval (fractions in [0, 1], or [-1, 1] for a difference)."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class Estimate:
    """Audited accuracy of the adapted and the source model, and adapted minus source."""

    audits: int
    adapted: Interval
    source: Interval
    difference: Interval

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _interval(total: int, n: int, alpha: float, lo: float, hi: float) -> Interval:
    if n == 0:
        return Interval(float("nan"), lo, hi)
    mean = total / n
    r = mixture_radius(n, alpha, span=hi - lo)
    return Interval(mean, max(lo, mean - r), min(hi, mean + r))


class _Tally:
    __slots__ = ("adapted", "n", "source")

    def __init__(self, n: int = 0, adapted: int = 0, source: int = 0) -> None:
        self.n, self.adapted, self.source = n, adapted, source

    def add(self, a: int, s: int) -> None:
        self.n += 1
        self.adapted += a
        self.source += s

    def as_list(self) -> list[int]:
        return [self.n, self.adapted, self.source]


@dataclass(frozen=True)
class _Audit:
    step: int
    epoch: int
    period: int
    adapted: int  # the adapted model's class at request time
    source: int  # the source model's class
    classes: int  # the number of classes (an answer's label must be below it)


class AccuracyMonitor:
    """See the module docstring.

    Args:
        auditor: who labels the audits: a synchronous ``oracle(inputs, indices)`` or an
            asynchronous annotator (``submit``/``collect``/``cancel``, label or yes/no feedback).
            The adapted model is compared with the method's copy of the model as given (a given
            model whose BatchNorm normalizes with batch statistics predicts on the whole batch).
        share: the share of the stream's samples audited, in [0, 1].
        level: error level of the intervals, in (0, 1) (0.05: 95 % intervals).
        guard: a :class:`Guard` (resets the method on evidence), a policy name
            (:data:`~eatta.monitor.guard.GUARD_POLICIES`, with ``guard_level`` and ``block``),
            or None (only measure).
        recent: audits in the recent window.
        label_expiry: steps an asynchronous audit may wait for its answer before it expires.
        seed: the audit sampler's seed.
    """

    name = "monitor"
    measures = True

    def __init__(
        self,
        auditor: object,
        *,
        share: float = 0.05,
        level: float = 0.05,
        guard: Guard | str | None = None,
        guard_level: float = 0.05,
        block: int = 1000,
        recent: int = 500,
        label_expiry: int = 256,
        seed: int = 0,
    ) -> None:
        share = check_share(share)
        if isinstance(guard, str):
            if guard not in GUARD_POLICIES:
                raise ValueError(f"guard must be one of {GUARD_POLICIES}, got {guard!r}")
            guard = Guard(guard, guard_level, block)
        self.level = check_level(level)
        if auditor is None:
            raise ValueError("the monitor needs an auditor (an oracle or annotator for audits)")
        self.asynchronous = is_asynchronous(auditor)
        if self.asynchronous:
            self.feedback = check_feedback(getattr(auditor, "feedback", "label"))
        elif callable(auditor):
            self.feedback = "label"
        else:
            raise TypeError(
                "auditor must be a callable oracle(inputs, indices) or an asynchronous annotator "
                f"(submit/collect/cancel), got {type(auditor).__name__}"
            )
        if guard is not None and not isinstance(guard, Guard):
            raise TypeError(f"guard must be a Guard or None, got {type(guard).__name__}")
        if guard is not None and share == 0.0:
            raise ValueError("a guard needs audits: give an audit share > 0")
        for name, v, least in (("recent", recent, 1), ("label_expiry", label_expiry, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ValueError(f"{name} must be an int >= {least}, got {v!r}")
        self.auditor = auditor
        self._sees_batch: bool | None = None  # whether the given model needs the whole batch
        self.sampler = AuditSampler(share, seed)
        self.guard = guard
        self.recent = recent
        self.label_expiry = label_expiry
        self.period = 0  # set by the caller (e.g. the round); audits count for their request's
        self.on_reset: Callable[[ResetEvent], None] | None = None  # called after a guard reset
        self._nonce = uuid.uuid4().hex[:8]
        self._clear()

    def _clear(self) -> None:
        self.step = 0
        self.epoch = 0  # guard resets so far: audits asked before the last one are not tested
        self.counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self._pending: dict[str, _Audit] = {}
        self._overall = _Tally()
        self._segment = _Tally()
        self._periods: dict[int, _Tally] = {}
        self._recent: deque[int] = deque(maxlen=self.recent)  # 2 * adapted + source
        self.resets: list[ResetEvent] = []

    # -- the hook -------------------------------------------------------------------------------
    def check(self, method: HostMethod, batch: Batch) -> None:
        """Nothing to refuse."""

    def before_step(self, method: HostMethod, batch: Batch) -> None:
        """Nothing before the step."""

    def after_step(self, method: HostMethod, batch: Batch) -> None:
        """Audit the request (its adapted predictions), score, and ask for a reset when the
        guard says so."""
        assert batch.adapted is not None
        self.observe(method, batch.x, batch.adapted, batch.labels)
        if self._due is not None:
            batch.reset = "the monitor's guard: the adapted model degraded"
            self._reset_logged()

    def observe(
        self, method: HostMethod, x: Tensor, logits: Tensor, labels: Tensor | None = None
    ) -> None:
        """``x`` was served ``logits`` (the adapted model's): audit, score.

        ``labels``: the batch's true labels for an auditor simulated from them (``set_labels``).
        """
        self.step += 1
        if labels is not None and hasattr(self.auditor, "set_labels"):
            self.auditor.set_labels(labels)
        try:
            self._expire()
            idx = self.sampler.draw(x.shape[0])
            if len(idx):
                self._ask(method, x, logits, idx)
            if self.asynchronous:
                before = self._overall.n
                self._collect()
                publish = getattr(self.auditor, "publish_monitor", None)
                if publish is not None and self._overall.n > before:  # the label page shows it
                    publish(self.page_summary())
        finally:
            end = getattr(self.auditor, "end_batch", None)
            if end is not None:
                end()

    def _ask(self, method: HostMethod, x: Tensor, logits: Tensor, idx: Tensor) -> None:
        rows = idx.to(x.device)
        adapted = logits.detach()[rows.to(logits.device)].argmax(1).cpu()
        if self._sees_batch is None:  # BatchNorm on batch statistics: a sample's prediction
            # depends on its batch, so the given model then sees the whole batch
            self._sees_batch = any(
                isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats
                for m in method.given.modules()
            )
        if self._sees_batch:
            source = method.given_logits(x.detach())[rows].argmax(1).cpu()
        else:
            source = method.given_logits(x.detach()[rows]).argmax(1).cpu()
        if not self.asynchronous:
            try:
                answer = self.auditor(x.detach()[rows], idx.clone())  # type: ignore[operator]
            except Exception as err:
                raise OracleError(f"the auditor raised {type(err).__name__}: {err}") from err
            got = validate_labels(answer, len(idx), logits.shape[1])
            self.counts["requested"] += len(idx)
            for j in range(len(idx)):
                y = ABSTAIN if got is None else int(got[j])
                if y == ABSTAIN:
                    self.counts["skipped"] += 1
                    continue
                self.counts["received"] += 1
                self._score(
                    *paired(y, None, int(adapted[j]), int(source[j])), self.period, self.epoch
                )
            return
        samples = x.detach()[rows].clone()
        scores = logits.detach()[rows.to(logits.device)].clone()
        requests = []
        for j, i in enumerate(idx.tolist()):
            rid = f"audit-{self._nonce}-{self.step}-{j}"
            requests.append(LabelRequest(rid, samples[j], scores[j], self.feedback, self.step, i))
        try:
            self.auditor.submit(requests)  # type: ignore[attr-defined]
        except Exception as err:
            name = type(err).__name__
            raise OracleError(f"the auditor's submit raised {name}: {err}") from err
        self.counts["requested"] += len(requests)
        for j, r in enumerate(requests):
            self._pending[r.id] = _Audit(
                self.step, self.epoch, self.period, int(adapted[j]), int(source[j]), r.num_classes
            )

    def _expire(self) -> None:
        old = [i for i, a in self._pending.items() if self.step - a.step > self.label_expiry]
        for i in old:
            del self._pending[i]
        if old:
            self.counts["expired"] += len(old)
            self.auditor.cancel(old)  # type: ignore[attr-defined]

    def _collect(self) -> None:
        try:
            answers = list(self.auditor.collect())  # type: ignore[attr-defined]
        except Exception as err:
            name = type(err).__name__
            raise OracleError(f"the auditor's collect raised {name}: {err}") from err
        for ans in answers:
            self.answer(ans)

    def answer(self, ans: Answer) -> bool:
        """Score one answer to an audit; False (nothing changed but the refused count) when it is
        for no pending audit (unknown, expired, answered) or not a valid answer."""
        audit = self._pending.get(getattr(ans, "id", None))  # type: ignore[arg-type]
        if not isinstance(ans, Answer) or audit is None:
            self.counts["refused"] += 1
            return False
        if ans.label is not None and not 0 <= ans.label < audit.classes:
            self.counts["refused"] += 1
            return False
        del self._pending[ans.id]
        if ans.skip:
            self.counts["skipped"] += 1
            return True
        self.counts["received"] += 1
        # yes/no: the given model counted wrong after a "no" where the two differ (a lower bound)
        a, s = paired(ans.label, ans.correct, audit.adapted, audit.source, unknown=0)
        self._score(a, s, audit.period, audit.epoch)
        return True

    def _score(self, a: int, s: int, period: int, epoch: int) -> None:
        self._overall.add(a, s)
        self._periods.setdefault(period, _Tally()).add(a, s)
        self._recent.append(2 * a + s)
        if epoch == self.epoch:
            self._segment.add(a, s)
            if self.guard is not None:
                event = self.guard.update(a, s)
                if event is not None:
                    self._due = event

    _due: ResetEvent | None = None

    def _reset_logged(self) -> None:
        """The guard's reset, asked for: logged, and the guard's test restarted."""
        event, self._due = self._due, None
        if event is None:
            return
        event = ResetEvent(
            **{**event.to_dict(), "step": self.step, "audits_total": self._overall.n}
        )
        self.resets.append(event)
        self.epoch += 1
        self._segment = _Tally()
        if self.guard is not None:
            self.guard.restart()
        if self.on_reset is not None:
            self.on_reset(event)

    # -- what it reports ----------------------------------------------------------------------
    def _estimate(self, t: _Tally) -> Estimate:
        a = _interval(t.adapted, t.n, self.level, 0.0, 1.0)
        s = _interval(t.source, t.n, self.level, 0.0, 1.0)
        d = _interval(t.adapted - t.source, t.n, self.level, -1.0, 1.0)
        return Estimate(t.n, a, s, d)

    def estimate(self, which: str | int = "overall") -> Estimate:
        """Audited accuracies with intervals: ``"overall"``, ``"segment"`` (since the last guard
        reset), ``"recent"`` (the last ``recent`` audits) or a period (an int)."""
        if isinstance(which, int) and not isinstance(which, bool):
            return self._estimate(self._periods.get(which, _Tally()))
        if which == "overall":
            return self._estimate(self._overall)
        if which == "segment":
            return self._estimate(self._segment)
        if which == "recent":
            w = list(self._recent)
            return self._estimate(_Tally(len(w), sum(v >> 1 for v in w), sum(v & 1 for v in w)))
        raise ValueError(f"estimate of {which!r}: use 'overall', 'segment', 'recent' or a period")

    def page_summary(self) -> dict[str, Any]:
        """The overall figures for the label page (plain JSON): audits, adapted and source
        accuracy with their interval bounds, the level, the resets."""
        e = self.estimate("overall")
        out: dict[str, Any] = {"audits": e.audits, "level": self.level, "resets": len(self.resets)}
        for name, iv in (("adapted", e.adapted), ("source", e.source), ("gain", e.difference)):
            out[name], out[f"{name}_low"], out[f"{name}_high"] = iv.value, iv.low, iv.high
        return out

    @property
    def periods(self) -> list[int]:
        """Periods with scored audits, in order."""
        return sorted(self._periods)

    @property
    def pending(self) -> int:
        """Audits waiting for their answer."""
        return len(self._pending)

    def stats(self) -> dict[str, int]:
        """Audit requests sent, answers received, skipped, expired, refused; resets; pending."""
        return {**self.counts, "pending": len(self._pending), "resets": len(self.resets)}

    # -- state --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Clear everything (a new stream): tallies, pending audits (cancelled at the auditor),
        resets, the sampler's draws and the guard."""
        dropped = list(self._pending)
        self.counts["dropped"] += len(dropped)
        if dropped and self.asynchronous:
            self.auditor.cancel(dropped)  # type: ignore[attr-defined]
        self._clear()
        self.sampler.reset()
        if self.guard is not None:
            self.guard.reset()
        self._nonce = uuid.uuid4().hex[:8]

    def state_dict(self) -> dict[str, Any]:
        return {
            "nonce": self._nonce,
            "step": self.step,
            "epoch": self.epoch,
            "period": self.period,
            "counts": dict(self.counts),
            "pending": {k: asdict(v) for k, v in self._pending.items()},
            "overall": self._overall.as_list(),
            "segment": self._segment.as_list(),
            "periods": {p: t.as_list() for p, t in self._periods.items()},
            "recent": list(self._recent),
            "resets": [e.to_dict() for e in self.resets],
            "sampler": self.sampler.state_dict(),
            "guard": None if self.guard is None else self.guard.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._nonce = str(state["nonce"])
        self.step, self.epoch, self.period = (
            int(state["step"]),
            int(state["epoch"]),
            int(state["period"]),
        )
        self.counts = {k: int(state["counts"].get(k, 0)) for k in _COUNTERS}
        self._pending = {str(k): _Audit(**v) for k, v in state["pending"].items()}
        self._overall = _Tally(*state["overall"])
        self._segment = _Tally(*state["segment"])
        self._periods = {int(p): _Tally(*t) for p, t in state["periods"].items()}
        self._recent = deque(
            (int(v) for v in state["recent" if "recent" in state else "window"]), maxlen=self.recent
        )
        self.resets = [ResetEvent(**e) for e in state["resets"]]
        self.sampler.load_state_dict(state["sampler"])
        if self.guard is not None and state.get("guard") is not None:
            self.guard.load_state_dict(state["guard"])
