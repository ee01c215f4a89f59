"""The guard's test and policy: :class:`Guard` decides, from paired audits, when to reset.

Audits (each: was the adapted model right, was the source model right, on the same sample) are
grouped, in arrival order, into consecutive blocks of ``block`` audits. Each completed block ``j``
(counted over the guard's whole life) gets an interval for its mean paired gain
``g = acc(adapted) - acc(source)`` (observations in [-1, 1]) at level
``alpha_j = alpha / (j (j + 1))``: the tighter of Hoeffding's and the empirical Bernstein bound
(each valid at ``alpha_j / 2``, so both hold at ``alpha_j``). These levels sum to ``alpha``, so
with probability at least ``1 - alpha`` every block's interval holds at once, for the whole
stream (a union bound). Then:

- ``"source"``: reset when a block's upper bound is below 0: the adapted model is worse than the
  source model on that block's samples;
- ``"drift"``: reset when a block's upper bound is below the lower bound of an earlier block since
  the last reset: the adapted model's gain over the source has fallen (it is worse than it was);
- ``"paired"`` (the default): either.

So a reset where the adapted model is neither worse than the source nor than itself earlier
happens with probability at most ``alpha`` over the whole stream. The gain, rather than the
accuracy, is compared so that a harder stretch of the stream (where both models err more) is not
taken for degradation. After a reset the blocks since the last reset are forgotten (the model
starts again) and audits asked before the reset no longer count for the test.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from eatta.monitor.confseq import bernstein_radius, check_level, hoeffding_radius

__all__ = ["GUARD_POLICIES", "Guard", "ResetEvent", "check_policy"]

#: Known guard policies (see the module docstring).
GUARD_POLICIES = ("paired", "source", "drift")


def check_policy(policy: object) -> str:
    """``policy`` if it is a known guard policy, else a :class:`ValueError` listing them."""
    if policy not in GUARD_POLICIES:
        raise ValueError(f"unknown guard policy {policy!r}; known: {', '.join(GUARD_POLICIES)}")
    return str(policy)


@dataclass(frozen=True)
class ResetEvent:
    """One reset and its evidence: the block's gain and interval, the reference's (``drift``)."""

    reason: str  # "worse than source" or "worse than earlier"
    block: int  # the block's number over the guard's life
    audits: int  # audits in the block
    gain: float
    low: float
    high: float
    reference_block: int | None
    reference_low: float | None
    level: float  # alpha_j of the block
    step: int = -1  # the method's step (set by the monitor)
    audits_total: int = -1  # audits scored so far (set by the monitor)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Block:
    number: int
    n: int
    gain: float
    low: float
    high: float


class Guard:
    """Block tests on paired audits (see the module docstring).

    Args:
        policy: ``"paired"``, ``"source"`` or ``"drift"``.
        level: the stated error level ``alpha`` in (0, 1): the chance of any reset over the whole
            stream when the adapted model is never worse than the source nor than it was.
        block: audits per block (>= 2).
    """

    def __init__(self, policy: str = "paired", level: float = 0.05, block: int = 1000) -> None:
        self.policy = check_policy(policy)
        self.level = check_level(level, "guard level")
        if isinstance(block, bool) or not isinstance(block, int) or block < 2:
            raise ValueError(f"guard block must be an int >= 2 (audits), got {block!r}")
        self.block = block
        self.blocks = 0  # completed blocks, lifetime (the union bound's index)
        self._n = 0
        self._sum = 0  # sum of paired differences in the open block
        self._abs = 0  # audits in the open block where the two models differ in correctness
        self._segment: list[_Block] = []  # completed blocks since the last reset

    def block_level(self, j: int) -> float:
        """``alpha_j = alpha / (j (j + 1))`` of block ``j`` (1-based)."""
        return self.level / (j * (j + 1))

    @staticmethod
    def radius(n: int, total: int, absolute: int, alpha: float) -> float:
        """Radius of a block's mean gain: ``n`` differences in {-1, 0, 1} summing to ``total``,
        ``absolute`` of them nonzero; the tighter of Hoeffding and empirical Bernstein, each at
        ``alpha / 2``."""
        mean = total / n
        variance = (absolute - n * mean * mean) / (n - 1) if n > 1 else math.inf
        return min(
            hoeffding_radius(n, alpha / 2, span=2.0),
            bernstein_radius(n, max(variance, 0.0), alpha / 2, span=2.0),
        )

    def update(self, adapted: int, source: int) -> ResetEvent | None:
        """Add one paired audit; a :class:`ResetEvent` when the block it completes says reset."""
        d = int(adapted) - int(source)
        self._n += 1
        self._sum += d
        self._abs += abs(d)
        if self._n < self.block:
            return None
        self.blocks += 1
        j = self.blocks
        alpha_j = self.block_level(j)
        r = self.radius(self._n, self._sum, self._abs, alpha_j)
        gain = self._sum / self._n
        block = _Block(j, self._n, gain, gain - r, gain + r)
        self._n, self._sum, self._abs = 0, 0, 0
        event = None
        if self.policy in ("paired", "source") and block.high < 0.0:
            event = ResetEvent(
                "worse than source", j, block.n, gain, block.low, block.high, None, None, alpha_j
            )
        elif self.policy in ("paired", "drift") and self._segment:
            ref = max(self._segment, key=lambda b: b.low)
            if block.high < ref.low:
                event = ResetEvent(
                    "worse than earlier",
                    j,
                    block.n,
                    gain,
                    block.low,
                    block.high,
                    ref.number,
                    ref.low,
                    alpha_j,
                )
        self._segment.append(block)
        return event

    def restart(self) -> None:
        """After a reset: forget the open block and the blocks since the last reset."""
        self._n, self._sum, self._abs = 0, 0, 0
        self._segment = []

    def reset(self) -> None:
        """Everything back to creation (the lifetime block count too)."""
        self.blocks = 0
        self.restart()

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "level": self.level,
            "block": self.block,
            "blocks": self.blocks,
            "n": self._n,
            "sum": self._sum,
            "abs": self._abs,
            "segment": [asdict(b) for b in self._segment],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy = check_policy(state["policy"])
        self.level = check_level(state["level"], "guard level")
        self.block = int(state["block" if "block" in state else "window"])
        self.blocks, self._n, self._sum = int(state["blocks"]), int(state["n"]), int(state["sum"])
        self._abs = int(state["abs"])
        self._segment = [_Block(**b) for b in state["segment"]]
