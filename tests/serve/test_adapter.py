"""The adapter: it takes a batch when idle and skips it while a step runs, survives a failing
step, and its checkpoint restores the method exactly."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from _serve_helpers import batches, make_service

from _state_checks import differences, exact_state
from _threaded import wait_until
from eatta.annotate import LabelRequest

pytestmark = pytest.mark.small_batches


def test_a_batch_offered_while_a_step_runs_is_skipped_and_serving_goes_on(tmp_path: Path) -> None:
    service = make_service(tmp_path / "s", method="tent")
    method, adapter = service.stepper.method, service.adapter
    entered, release = threading.Event(), threading.Event()
    plain = method.forward

    def slow(x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        entered.set()
        release.wait(10)
        return plain(x, labels)

    method.forward = slow  # type: ignore[method-assign]
    adapter.start()
    xs, rows = batches(4, 2), [("r", 0), ("r", 1)]
    try:
        assert adapter.offer(xs[0], rows) and adapter.stats.steps == 0  # gathered: 2 of 8
        for x in xs[1:]:
            assert adapter.offer(x, rows)  # 8 gathered: the step starts
        assert entered.wait(5)
        assert not adapter.offer(xs[0], rows)  # a step runs: skipped
        logits, _ = service.snapshots.predict(xs[1])  # serving does not wait for the step
        assert logits.shape == (2, 5)
        release.set()
        wait_until(lambda: adapter.stats.steps == 1, what="the step done")
        assert adapter.offer(xs[1], rows)
    finally:
        release.set()
        adapter.stop()
    stats = adapter.stats
    assert (stats.taken, stats.skipped, stats.errors, stats.steps) == (5, 1, 0, 1)


def test_a_failing_step_is_counted_and_the_next_batch_adapts(tmp_path: Path) -> None:
    service = make_service(tmp_path / "s", method="tent", window=4)
    method, adapter = service.stepper.method, service.adapter
    plain, calls = method.forward, []

    def flaky(x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        calls.append(x.shape[0])
        if len(calls) == 1:
            raise RuntimeError("out of memory, say")
        return plain(x, labels)

    method.forward = flaky  # type: ignore[method-assign]
    adapter.start()
    xs = batches(2, 4)
    try:
        for n, x in enumerate(xs, 1):
            assert adapter.offer(x, [("r", i) for i in range(4)])
            wait_until(lambda n=n: adapter.stats.steps + adapter.stats.errors == n)
    finally:
        adapter.stop()
    stats = adapter.stats
    assert (stats.errors, stats.taken, stats.steps) == (1, 2, 1)
    assert stats.last_error == "RuntimeError: out of memory, say"


def test_a_checkpoint_restores_the_method_and_the_origins_exactly(tmp_path: Path) -> None:
    service = make_service(tmp_path / "s")
    service.adapter.start()
    for i, x in enumerate(
        batches(7, 3)
    ):  # 21 samples: two steps on a window of 8, one request each
        origins = [(f"r{i}", r) for r in range(3)]
        wait_until(lambda x=x, o=origins: service.adapter.offer(x, o))
        wait_until(lambda i=i: service.adapter.stats.taken == i + 1)
    service.adapter.stop()  # the last checkpoint
    assert service.adapter.stats.steps == 2 and service.adapter.stats.checkpoints >= 1
    pending = service.queue.pending()
    assert len(pending) == 2 and all(p["request_id"] for p in pending)
    saved = exact_state(service.stepper.method)
    window = service.stepper.method.window.contents()
    again = make_service(tmp_path / "s")
    assert again.resumed_steps == 2 and again.orphans == 0
    assert differences(saved, exact_state(again.stepper.method)) == []
    assert torch.equal(again.stepper.method.window.contents(), window)
    last = [("r3", 1), ("r3", 2)] + [(f"r{i}", r) for i in (4, 5) for r in range(3)]
    asks = [LabelRequest("q", window[i], torch.zeros(5), "label", 3, i) for i in range(8)]
    assert [again.stepper.origins.of(r) for r in asks] == last  # the window's samples, found again
    again.stepper.queue.close()
    again.queue.close()
