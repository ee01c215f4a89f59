"""Each label request names the inference request and row its sample came from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import eatta
from conftest import tiny_cnn
from eatta.annotate import LabelQueue, LabelRequest
from eatta.annotate.queue import sample_digest
from eatta.serve.origins import Origins

pytestmark = pytest.mark.small_batches


def _ask(sample: torch.Tensor, index: int) -> LabelRequest:
    return LabelRequest("q", sample.clone(), torch.zeros(5), "label", 1, index)


def test_a_window_position_and_a_value_both_find_the_origin() -> None:
    origins = Origins(keep=12, window=4)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 2, generator=g), torch.randn(2, 2, generator=g)
    origins.add(a, [("a", 0), ("a", 1), ("a", 2)])
    origins.add(b, [("b", 0), ("b", 1)])
    window = torch.cat([a, b])[-4:]  # the window, oldest first: a1 a2 b0 b1
    assert [origins.of(_ask(window[i], i)) for i in range(4)] == [
        ("a", 1), ("a", 2), ("b", 0), ("b", 1),
    ]  # fmt: skip
    assert origins.of(_ask(a[0], 0)) == ("a", 0)  # not where the window's order says: by value
    assert origins.of(_ask(torch.ones(2), 0)) is None
    big = torch.randn(5, 2, generator=g)  # a batch at least the window: stepped on as given
    origins.add(big, [("c", r) for r in range(5)])
    assert origins.of(_ask(big[3], 3)) == ("c", 3)
    state = origins.state_dict(held=4)
    restored = Origins(keep=12, window=4)
    restored.load_state_dict(state, big[-4:])
    assert restored.of(_ask(big[-1], 3)) == ("c", 4)
    restored.load_state_dict(state, big[-3:])  # counts differ: nothing paired
    assert restored.of(_ask(big[-1], 2)) is None


def test_every_request_a_windowed_method_asks_names_the_sample_it_came_from(tmp_path: Path) -> None:
    origins = Origins(keep=8 + 3, window=8)
    queue = LabelQueue(tmp_path / "q.db", origin=origins.of)
    method = eatta.create("eatta-safe", tiny_cnn(), oracle=queue, window=8)
    g = torch.Generator().manual_seed(3)
    sent: dict[tuple[str, int], str] = {}
    for t in range(20):
        x = torch.randn(1 + t % 3, 3, 8, 8, generator=g)
        rows = [(f"req-{t}", r) for r in range(x.shape[0])]
        sent.update({o: sample_digest(x[r]) for r, o in enumerate(rows)})
        origins.add(x, rows)
        method(x)
    pending = queue.pending(100)
    assert len(pending) == method.annotation_stats["requested"] >= 3
    for item in pending:
        where = (item["request_id"], item["row"])
        assert sent[where] == queue.request(item["id"])["digest"], item
    queue.close()
