"""Audits, the guard and the source fallback in a benchmark: :class:`MonitorOptions`
(``--audit``, ``--guard``, ``--fallback``) and the summaries stored with each result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from eatta.annotate.oracle import GroundTruthOracle
from eatta.annotate.simulated import SimulatedAnnotator
from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.flags import flag, is_int
from eatta.methods.registry import MethodSpec
from eatta.monitor import (
    GUARD_POLICIES,
    AccuracyMonitor,
    Guard,
    SourceFallback,
    check_policy,
    check_share,
)
from eatta.monitor.confseq import check_level

__all__ = [
    "DEFAULT_AUDIT_SHARE",
    "MonitorOptions",
    "check_fallback_budget",
    "fallback_summary",
    "monitor_summary",
]

#: ``--guard``'s audit share when ``--audit`` is not given, and its level (tuned in docs/guard.md).
DEFAULT_AUDIT_SHARE = 0.2
DEFAULT_GUARD_LEVEL = 0.2
#: Seed offsets of the monitor's and the fallback's auditors (distinct from the annotator's).
AUDITOR_SEED = 104729
FALLBACK_SEED = 130363
#: Audits a batch of ``--fallback`` (an active method's come out of its label budget).
FALLBACK_AUDITS = 1


@dataclass(frozen=True)
class MonitorOptions:
    """What is audited and what the audits may do (see each flag's help)."""

    audit: float = flag(
        "share of the stream's samples sent as audits (uniform random) to an auditor like the "
        "annotator: the monitor's accuracy of the adapted and the source model per round "
        f"(default with --guard: {DEFAULT_AUDIT_SHARE:g})",
        0.0,
        type=float,
        metavar="FRACTION",
        cli_default=None,
    )
    guard: str | None = flag(
        "reset to the source state when the audits show the model worse than the source "
        f"or than it was ({', '.join(GUARD_POLICIES)}; default paired: either)",
        nargs="?",
        const="paired",
        metavar="POLICY",
    )
    level: float = 0.05
    guard_level: float = flag(
        "the guard's error level: chance of any reset over the stream where nothing "
        f"degrades (default {DEFAULT_GUARD_LEVEL:g}, tuned in docs/guard.md)",
        DEFAULT_GUARD_LEVEL,
        type=float,
        metavar="ALPHA",
    )
    block: int = flag(
        "audits per block of the guard's test", 1000, name="guard-block", type=int, metavar="N"
    )
    fallback: bool = flag(
        "the source model beside every adapting method: one audit a batch (drawn where the "
        "two disagree) decides which predictions are served and resets a method found worse "
        "(eatta-safe has its own, measured by its own requests; docs/guard.md)",
        False,
    )

    def __post_init__(self) -> None:
        check_share(self.audit)
        check_level(self.level, "interval level")
        check_level(self.guard_level, "guard level")
        if self.guard is not None:
            check_policy(self.guard)
            if self.audit == 0.0:
                raise ValueError("--guard needs audits: give an audit share > 0 (--audit FRACTION)")
        if not is_int(self.block) or self.block < 2:
            raise ValueError(f"guard block must be an int >= 2 audits, got {self.block!r}")

    @property
    def active(self) -> bool:
        return self.audit > 0.0 or self.fallback

    def describe(self) -> dict[str, Any]:
        """Plain description for fingerprints and ``results.json``."""
        out = dataclasses.asdict(self)
        if not self.fallback:  # only when set: earlier fingerprints stay as they were
            del out["fallback"]
        return out

    def text(self) -> str:
        """Short text for table titles."""
        guard = f", guard {self.guard} (level {self.guard_level:g}, block {self.block})"
        parts = [
            f"audit {self.audit:g}{guard if self.guard is not None else ''}" if self.audit else "",
            "fallback to the source model (1 audit/batch)" if self.fallback else "",
        ]
        return ", ".join(part for part in parts if part)

    def fallback_part(
        self, annotator: AnnotatorOptions, seed: int
    ) -> tuple[SourceFallback, GroundTruthOracle | SimulatedAnnotator]:
        """A :class:`SourceFallback` for a method (its ``fallback=``) and its auditor (needs
        ``set_labels``)."""
        auditor = annotator.build(seed + FALLBACK_SEED)
        return SourceFallback(auditor=auditor, audits=FALLBACK_AUDITS, seed=seed), auditor

    def monitor_part(
        self, annotator: AnnotatorOptions, seed: int
    ) -> tuple[AccuracyMonitor, GroundTruthOracle | SimulatedAnnotator]:
        """A monitor for a method (its ``monitor=``) and its auditor (needs ``set_labels``)."""
        auditor = annotator.build(seed + AUDITOR_SEED)
        guard = None if self.guard is None else Guard(self.guard, self.guard_level, self.block)
        monitor = AccuracyMonitor(
            auditor, share=self.audit, level=self.level, guard=guard, seed=seed
        )
        return monitor, auditor


def monitor_summary(
    monitor: AccuracyMonitor, rounds: int, annotator: AnnotatorOptions
) -> dict[str, Any]:
    """Audited error estimates (%) with intervals, per round and overall; resets; counts."""

    def err(e: Any) -> dict[str, Any]:
        out = {"audits": e.audits}
        for prefix, accuracy in (("", e.adapted), ("source_", e.source)):
            out[f"{prefix}error"] = 100 * (1 - accuracy.value)
            out[f"{prefix}low"] = 100 * (1 - accuracy.high)
            out[f"{prefix}high"] = 100 * (1 - accuracy.low)
        d = e.difference
        out |= {"gain": 100 * d.value, "gain_low": 100 * d.low, "gain_high": 100 * d.high}
        return out

    stats = monitor.stats()
    return {
        "rounds": [err(monitor.estimate(r)) for r in range(rounds)],
        "overall": err(monitor.estimate("overall")),
        "recent": err(monitor.estimate("recent")),
        "resets": [e.to_dict() for e in monitor.resets],
        "stats": stats,
        "seconds": annotator.cost.seconds(stats["requested"], annotator.feedback),
        "level": monitor.level,
    }


def check_fallback_budget(spec: MethodSpec, labels: int, every: int) -> int:
    """Audits a batch that ``--fallback`` takes out of the method's label budget (0 for a
    label-free method or one that builds its own fallback); an error when they would exceed it."""
    if not spec.active or spec.builds_fallback:
        return 0
    if every != 1 or labels < FALLBACK_AUDITS:
        raise ValueError(
            f"--fallback takes {FALLBACK_AUDITS} audit every batch out of {spec.name}'s label "
            f"budget ({labels} every {every} batch(es)): the split exceeds the budget; use a "
            "method whose own answers measure (eatta-safe), or --labels >= 1 with --every 1"
        )
    return FALLBACK_AUDITS


def fallback_summary(fallback: SourceFallback, rounds: int) -> dict[str, Any]:
    """Per round: answers and the adapted model's estimated gain (points); events; counts."""
    gains = [fallback.period_gain(r) for r in range(rounds)]
    return {
        "rounds": [{"answers": n, "gain": 100 * g if n else None} for n, g in gains],
        "events": [e.to_dict() for e in fallback.events],
        "stats": fallback.stats(),
    }
