"""What an operator watches: the server's numbers in Prometheus' text format (``GET /metrics``).

Requests by outcome, rows, batches and their sizes, what served each batch (the adapted model,
the given one, or their blend), the adapter's batches, steps, skipped batches and errors, the
labels asked, answered and pending (the method's counts and the queue's), the fallback's numbers
(``eatta-safe``: its evidence, and any bound it reports, read generically from its ``stats()``),
checkpoints, and the latency of the requests served (quantiles over the last ``window``
requests, the sum and count over all). Counters start at 0 when the server starts.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from eatta.monitor.serving import SERVED
from eatta.serve.adapter import AdapterStats

__all__ = ["OUTCOMES", "QUANTILES", "Metrics"]

#: How a request ended: served (200), refused as invalid (4xx), refused as the server was full or
#: closing (503), or failed (500).
OUTCOMES = ("ok", "invalid", "overloaded", "error")
QUANTILES = (0.5, 0.9, 0.99)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, doc: str, samples: Iterable[tuple[Mapping[str, str], float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {doc}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            where = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(
                f"{name}{{{where}}} {_number(value)}" if where else f"{name} {_number(value)}"
            )

    def one(self, name: str, kind: str, doc: str, value: float) -> None:
        self.family(name, kind, doc, [({}, value)])


class Metrics:
    """The server's counters (thread-safe) and their rendering (see the module docstring)."""

    def __init__(self, window: int = 10000) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.rows = 0
        self.batches = 0
        self.batch_rows = 0
        self.largest_batch = 0
        self.served = dict.fromkeys(SERVED, 0)
        self._latency: collections.deque[float] = collections.deque(maxlen=window)
        self._latency_sum = 0.0
        self._latency_count = 0

    def request(self, outcome: str, latency: float | None = None, rows: int = 0) -> None:
        """A request that ended with ``outcome`` after ``latency`` seconds (served ones)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        with self._lock:
            self.outcomes[outcome] += 1
            self.rows += rows
            if latency is not None:
                self._latency.append(latency)
                self._latency_sum += latency
                self._latency_count += 1

    def batch(self, rows: int, served: str) -> None:
        """A batch of ``rows`` predicted by ``served`` (adapted, source or blend)."""
        with self._lock:
            self.batches += 1
            self.batch_rows += rows
            self.largest_batch = max(self.largest_batch, rows)
            self.served[served] = self.served.get(served, 0) + 1

    def latency_quantiles(self) -> dict[float, float]:
        """The latency quantiles (seconds) over the last requests; NaN before any."""
        with self._lock:
            values = list(self._latency)
        if len(values) < 2:
            return {q: values[0] if values else math.nan for q in QUANTILES}
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        return {q: cuts[round(q * 100) - 1] for q in QUANTILES}

    def render(
        self,
        adapter: AdapterStats,
        queue: Mapping[str, Any],
        serving: str,
        version: int,
        waiting_rows: int,
        stepping: bool = False,
    ) -> str:
        """The Prometheus text: these counters, the adapter's, the queue's (``LabelQueue.stats``)
        and what serves now."""
        quantiles = self.latency_quantiles()
        with self._lock:
            outcomes, served = dict(self.outcomes), dict(self.served)
            rows, batches, batch_rows = self.rows, self.batches, self.batch_rows
            largest, lat_sum, lat_count = self.largest_batch, self._latency_sum, self._latency_count
        t = _Text()
        t.family(
            "eatta_requests_total", "counter", "Inference requests, by outcome.",
            [({"outcome": k}, v) for k, v in outcomes.items()],
        )  # fmt: skip
        t.one("eatta_rows_total", "counter", "Rows (samples) served.", rows)
        t.one("eatta_batches_total", "counter", "Batches predicted.", batches)
        t.one("eatta_batch_rows_total", "counter", "Rows in the batches predicted.", batch_rows)
        t.one("eatta_batch_rows_max", "gauge", "The largest batch so far.", largest)
        t.one("eatta_waiting_rows", "gauge", "Rows waiting for a batch.", waiting_rows)
        t.family(
            "eatta_served_batches_total", "counter",
            "Batches by what served them: the adapted model, the given (source) one, their blend.",
            [({"by": k}, v) for k, v in served.items()],
        )  # fmt: skip
        t.family(
            "eatta_serving", "gauge", "What serves now (1) and what does not (0).",
            [({"by": k}, float(k == serving)) for k in SERVED],
        )  # fmt: skip
        t.one("eatta_snapshot_version", "gauge", "Snapshots published (what serves).", version)
        t.one(
            "eatta_adapted_batches_total", "counter", "Batches given to the method.", adapter.taken
        )
        t.one(
            "eatta_skipped_batches_total", "counter",
            "Batches served while a step ran, not adapted on (the real-time protocol).",
            adapter.skipped,
        )  # fmt: skip
        t.one("eatta_steps_total", "counter", "Steps the method took.", adapter.steps)
        t.one("eatta_stepping", "gauge", "Whether a step runs now.", float(stepping))
        t.one("eatta_adapter_up", "gauge", "Whether the adapting side runs.", float(adapter.alive))
        t.one("eatta_adapter_errors_total", "counter", "Steps that failed.", adapter.errors)
        _adapter_part(t, adapter, queue)
        t.family(
            "eatta_request_latency_seconds", "summary",
            "From a request's arrival to its reply: batching wait and one forward of what serves.",
            [({"quantile": str(q)}, v) for q, v in quantiles.items()],
        )  # fmt: skip
        t.lines.append(f"eatta_request_latency_seconds_sum {_number(lat_sum)}")
        t.lines.append(f"eatta_request_latency_seconds_count {lat_count}")
        t.one(
            "eatta_uptime_seconds",
            "gauge",
            "Seconds since the server started.",
            time.time() - self.started,
        )
        return "\n".join(t.lines) + "\n"


def _adapter_part(t: _Text, adapter: AdapterStats, queue: Mapping[str, Any]) -> None:
    """The labels, the queue's numbers, the fallback's and the checkpoints."""
    ann = adapter.annotation
    t.family(
        "eatta_labels_total", "counter",
        "Label requests by the method: asked, answered (applied), skipped, expired, refused.",
        [
            ({"what": "asked"}, ann.get("requested", 0)),
            ({"what": "answered"}, ann.get("received", 0)),
            ({"what": "skipped"}, ann.get("skipped", 0)),
            ({"what": "expired"}, ann.get("expired", 0)),
            ({"what": "refused"}, ann.get("refused", 0)),
        ],
    )  # fmt: skip
    t.one(
        "eatta_labels_pending",
        "gauge",
        "Label requests the method waits for.",
        ann.get("pending", 0),
    )
    t.one("eatta_labels_used_total", "counter", "Labels the budget granted.", adapter.labels_used)
    if adapter.budget is not None:
        t.one(
            "eatta_budget_per_step",
            "gauge",
            "Labels the method may ask per step.",
            adapter.budget,
        )
    t.one("eatta_queue_pending", "gauge", "Requests pending on the page.", queue.get("pending", 0))
    t.one(
        "eatta_queue_answered_total",
        "counter",
        "Answers in the queue.",
        queue.get("answered", 0),
    )
    numbers = {
        k: float(v)
        for k, v in adapter.fallback.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    if numbers:
        t.family(
            "eatta_fallback", "gauge", "The fallback's numbers (eatta-safe's evidence).",
            [({"stat": k}, v) for k, v in sorted(numbers.items())],
        )  # fmt: skip
    bounds = {k: v for k, v in numbers.items() if "bound" in k}
    if bounds:
        t.family(
            "eatta_certified_bound", "gauge", "The bound the fallback certifies (if any).",
            [({"stat": k}, v) for k, v in sorted(bounds.items())],
        )  # fmt: skip
    t.one("eatta_checkpoints_total", "counter", "Checkpoints written.", adapter.checkpoints)
    if adapter.checkpoint_time:
        t.one(
            "eatta_checkpoint_age_seconds", "gauge", "Seconds since the last checkpoint.",
            time.time() - adapter.checkpoint_time,
        )  # fmt: skip
        t.one(
            "eatta_checkpoint_bytes",
            "gauge",
            "Size of the last checkpoint.",
            adapter.checkpoint_bytes,
        )
        t.one(
            "eatta_checkpoint_write_seconds", "gauge", "Time the last checkpoint took.",
            adapter.checkpoint_seconds,
        )  # fmt: skip
