"""What serves is one consistent snapshot: the method's serving predictions, never a mix of two
states, and a method that does not adapt is served as it is."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
import torch

import eatta
from conftest import tiny_cnn
from eatta.annotate import LabelQueue
from eatta.realtime import serve_without_adapting
from eatta.serve.snapshot import Snapshots, fill, what_serves

pytestmark = pytest.mark.small_batches


def publish(snapshots: Snapshots, method: eatta.AdaptiveMethod, version: int) -> None:
    """What the adapter does after a step: write a spare copy, then swap it in."""
    spare = snapshots.reserve()
    assert spare is not None
    fill(snapshots.copies()[spare], method.serving_model)
    snapshots.swap_in(spare, what_serves(method), version)


@pytest.mark.parametrize("start", ["adapted", "source", "blend"])
def test_a_snapshot_serves_what_the_method_serves_without_adapting(
    tmp_path: Path, start: str
) -> None:
    queue = LabelQueue(tmp_path / "q.db")
    method = eatta.create(
        "eatta-safe", tiny_cnn(), oracle=queue, window=8, fallback_start=start, lr=0.05
    )
    snapshots = Snapshots.of_method(method, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    for version in range(1, 6):  # steps every 8 samples: the served model moves
        method(torch.randn(4, 3, 8, 8, generator=g))
        publish(snapshots, method, version)
    x = torch.randn(5, 3, 8, 8, generator=g)
    logits, snap = snapshots.predict(x)
    expected = {"adapted": "adapted", "source": "source", "blend": "source"}[start]  # no answers
    assert snap.serving == what_serves(method) == expected and snap.version == 5
    assert torch.allclose(logits, serve_without_adapting(method, x), atol=1e-6, rtol=0)
    if start == "adapted":
        given = method.given_logits(x)
        assert not torch.allclose(logits, given, atol=1e-3)  # the adapted model, moved
    queue.close()


def test_a_request_never_reads_a_half_published_model(tmp_path: Path) -> None:
    method = eatta.create("tent", tiny_cnn(), window=8)
    snapshots = Snapshots.of_method(method, torch.device("cpu"))
    x = torch.randn(3, 3, 8, 8)
    versions = 30

    def set_all(k: int) -> None:  # every parameter k/10: the output is a function of k alone
        with torch.no_grad():
            for p in method.model.parameters():
                p.fill_(k / 10)

    outputs = {}
    for k in range(versions):
        set_all(k)
        probe = Snapshots.of_method(method, torch.device("cpu"))
        outputs[k] = probe.predict(x)[0]
    assert len({tuple(o.flatten().tolist()) for o in outputs.values()}) == versions
    set_all(0)
    publish(snapshots, method, 0)
    stop, seen, mixed = threading.Event(), [], []

    def reader() -> None:
        while not stop.is_set():
            logits, snap = snapshots.predict(x)
            seen.append(snap.version)
            if not torch.equal(logits, outputs[snap.version]):
                mixed.append(snap.version)

    thread = threading.Thread(target=reader)  # the server predicts in one thread (the batcher)
    thread.start()
    try:
        for k in range(1, versions):
            set_all(k)
            publish(snapshots, method, k)  # one reader holds one copy at most: a spare is left
    finally:
        stop.set()
        thread.join(10)
    assert mixed == [] and len(seen) > 0


def test_a_method_that_does_not_adapt_is_served_as_it_is() -> None:
    model = tiny_cnn()
    reference = copy.deepcopy(model).eval()
    method = eatta.create("source", model)
    snapshots = Snapshots.of_method(method, torch.device("cpu"))
    x = torch.randn(2, 3, 8, 8)
    logits, snap = snapshots.predict(x)
    assert snap.serving == "source" and snap.model is method.model
    with torch.no_grad():
        assert torch.equal(logits, reference(x))
