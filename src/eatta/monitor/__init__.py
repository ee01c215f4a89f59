"""Measure a deployed method with audited answers, beside the frozen source model, and guard it.

- :mod:`eatta.monitor.audit`: which samples are audited (a uniform random share);
- :mod:`eatta.monitor.confseq`: anytime-valid confidence sequences and fixed-sample bounds;
- :mod:`eatta.monitor.guard`: the paired block test and the reset policy;
- :mod:`eatta.monitor.monitor`: the monitor a method carries as ``method.monitor``
  (``monitor=AccuracyMonitor(auditor)``);
- :mod:`eatta.monitor.fallback`: the source model beside the adapted one, served when the answers
  (the method's own, drawn with known probabilities, or audits) say adapting is worse; its parts:
  :mod:`eatta.monitor.evidence` (answers into observations, and the test on them),
  :mod:`eatta.monitor.signs` (label-free signs), :mod:`eatta.monitor.serving` (what serves each
  batch and why, the blend).

See ``docs/guard.md``.
"""

from eatta.monitor.audit import AuditSampler, check_share
from eatta.monitor.fallback import FallbackEvent, SourceFallback, safe_parts
from eatta.monitor.guard import GUARD_POLICIES, Guard, ResetEvent, check_policy
from eatta.monitor.monitor import AccuracyMonitor, Estimate, Interval

__all__ = [
    "GUARD_POLICIES",
    "AccuracyMonitor",
    "AuditSampler",
    "Estimate",
    "FallbackEvent",
    "Guard",
    "Interval",
    "ResetEvent",
    "SourceFallback",
    "check_policy",
    "check_share",
    "safe_parts",
]
