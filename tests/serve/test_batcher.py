"""The batcher: requests gathered into batches of at most max_batch rows, each answered with its
own rows; refused when full or closing; an error reaches every request of its batch."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from eatta.serve.batcher import Batch, Batcher, Closed, Overloaded


class Recorder:
    """A predict that records its batches and can be held until released."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, int]:
        self.entered.set()
        self.hold.wait(10)
        self.batches.append(batch)
        return batch.x[:, :1] * 10, len(self.batches)  # one "logit" per row: its value × 10


def _request(value: float, rows: int) -> torch.Tensor:
    return torch.full((rows, 2), value)


def test_requests_that_wait_together_share_a_batch_of_at_most_max_batch_rows() -> None:
    rec = Recorder()
    rec.hold.clear()
    batcher = Batcher(rec, max_batch=6, max_wait=0.0, max_queue=100)
    try:
        first = batcher.submit(_request(0, 1), "r0")  # occupies the worker
        assert rec.entered.wait(5)
        futures = [batcher.submit(_request(i, n), f"r{i}") for i, n in ((1, 2), (2, 3), (3, 4))]
        rec.hold.set()
        results = [f.result(5) for f in [first, *futures]]
    finally:
        batcher.close()
    assert [b.names for b in rec.batches] == [("r0",), ("r1", "r2"), ("r3",)]  # 2+3 fit, +4 not
    assert [b.rows for b in rec.batches] == [(1,), (2, 3), (4,)]
    for i, (rows, (logits, _)) in enumerate(zip((1, 2, 3, 4), results, strict=True)):
        assert logits.shape == (rows, 1) and bool((logits == 10 * i).all())  # its own rows
    assert [info for _, info in results] == [1, 2, 2, 3]
    assert rec.batches[1].origins() == [("r1", 0), ("r1", 1), ("r2", 0), ("r2", 1), ("r2", 2)]


def test_a_lone_request_waits_at_most_max_wait_for_company() -> None:
    rec = Recorder()
    batcher = Batcher(rec, max_batch=8, max_wait=0.5, max_queue=100)
    try:
        a = batcher.submit(_request(1, 1), "a")
        time.sleep(0.05)
        b = batcher.submit(_request(2, 1), "b")  # within a's wait: same batch
        a.result(5), b.result(5)
        c = batcher.submit(_request(3, 1), "c")
        c.result(5)
    finally:
        batcher.close()
    assert [batch.names for batch in rec.batches] == [("a", "b"), ("c",)]


def test_a_full_queue_refuses_and_a_closed_batcher_refuses_and_finishes_what_waits() -> None:
    rec = Recorder()
    rec.hold.clear()
    batcher = Batcher(rec, max_batch=4, max_wait=0.0, max_queue=6)
    first = batcher.submit(_request(0, 4), "r0")
    assert rec.entered.wait(5)
    waiting = batcher.submit(_request(1, 4), "r1")
    with pytest.raises(Overloaded, match="4 rows wait already"):
        batcher.submit(_request(2, 3), "r2")
    assert batcher.waiting_rows == 4
    closer = threading.Thread(target=batcher.close)
    closer.start()
    time.sleep(0.05)
    with pytest.raises(Closed):
        batcher.submit(_request(3, 1), "r3")
    rec.hold.set()
    closer.join(10)
    assert first.result(1)[0].shape == (4, 1) and waiting.result(1)[0].shape == (4, 1)


def test_an_error_in_predict_reaches_every_request_of_its_batch_and_the_next_batch_is_served() -> (
    None
):
    calls = []
    entered, release = threading.Event(), threading.Event()

    def predict(batch: Batch) -> tuple[torch.Tensor, None]:
        calls.append(batch.names)
        if len(calls) == 2:
            raise RuntimeError("the model broke")
        entered.set()
        release.wait(10)
        return batch.x, None

    batcher = Batcher(predict, max_batch=8, max_wait=0.0, max_queue=100)
    try:
        first = batcher.submit(_request(0, 1), "r0")
        assert entered.wait(5)
        bad = [batcher.submit(_request(i, 1), f"r{i}") for i in (1, 2)]  # gathered behind r0
        release.set()
        first.result(5)
        for f in bad:
            with pytest.raises(RuntimeError, match="the model broke"):
                f.result(5)
        assert batcher.submit(_request(3, 1), "r3").result(5)[0].shape == (1, 2)
    finally:
        batcher.close()
    assert calls == [("r0",), ("r1", "r2"), ("r3",)]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(lambda b: (b.x, None), max_batch=0, max_wait=0, max_queue=1)
    with pytest.raises(ValueError, match="max_queue"):
        Batcher(lambda b: (b.x, None), max_batch=8, max_wait=0, max_queue=4)
    batcher = Batcher(lambda b: (b.x, None), max_batch=2, max_wait=0, max_queue=4)
    with pytest.raises(ValueError, match="1 to 2 rows"):
        batcher.submit(torch.zeros(3, 1), "x")
    batcher.close()
