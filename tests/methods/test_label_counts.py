"""What the label counts count (issue 66): ``labels_used`` is the budget spent (answers with labels
at once, requests with a late annotator), ``labels_asked`` the samples sent to the annotator,
``labels_answered`` the answers heard; in ``stats()`` and in each step's record."""

from __future__ import annotations

import pytest
import torch

import eatta
from conftest import confident_cnn
from eatta.annotate import SimulatedAnnotator
from eatta.annotate.oracle import ABSTAIN

#: The counts of a method that has asked nothing.
NONE = {"labels_used": 0, "labels_asked": 0, "labels_answered": 0, "labels_pending": 0}


def _stream(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.rand(16, 3, 8, 8, generator=g), torch.randint(0, 5, (16,), generator=g))
        for _ in range(n)
    ]


@pytest.mark.parametrize("name", ["eatta", "eatta-stable", "baseline", "simatta", "cema"])
def test_a_late_annotator_is_asked_six_times_and_answers_twice(name: str) -> None:
    method = eatta.create(name, confident_cnn(), oracle=SimulatedAnnotator(delay=4), budget=1)
    answered_by_step = []
    for x, y in _stream(6):
        method(x, labels=y)
        record = method.last_step
        if hasattr(record, "answered"):
            answered_by_step.append((record.asked, record.answered))
    stats = method.stats()
    # a request every batch; answers 4 batches later: the first two arrived by the sixth batch
    assert method.labels_used == stats["labels_used"] == 6  # the budget counts requests
    assert method.labels_asked == stats["labels_asked"] == 6
    assert method.labels_answered == stats["labels_answered"] == 2
    assert stats["labels_pending"] == 4
    if answered_by_step:  # EATTA's step record: one request a step, answers from the fifth
        assert answered_by_step == [(1, 0)] * 4 + [(1, 1)] * 2
    method.reset()
    assert method.stats() == NONE


def test_labels_at_once_count_what_was_answered_and_what_was_not() -> None:
    """An oracle that abstains on every other request: asked 2 a batch, answered 1."""
    calls = []

    def half(inputs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        calls.append(len(indices))
        out = torch.zeros(len(indices), dtype=torch.long)
        out[1::2] = ABSTAIN
        return out

    method = eatta.create("eatta", confident_cnn(), oracle=half, budget=2, balance="none")
    for x, _ in _stream(3):
        method(x)
        assert (method.last_step.asked, method.last_step.answered) == (2, 1)
    assert calls == [2, 2, 2]
    assert (method.labels_asked, method.labels_answered, method.labels_used) == (6, 3, 3)


def test_a_label_free_method_counts_no_labels() -> None:
    method = eatta.create("tent", confident_cnn())
    method(_stream(1)[0][0])
    assert method.stats() == NONE


def test_the_counts_resume_from_the_state() -> None:
    method = eatta.create("eatta", confident_cnn(), oracle=SimulatedAnnotator(delay=2))
    for x, y in _stream(4):
        method(x, labels=y)
    again = eatta.create("eatta", confident_cnn(), oracle=SimulatedAnnotator(delay=2))
    again.load_state_dict(method.state_dict())
    assert (
        again.stats()
        == method.stats()
        == {
            "labels_used": 4,
            "labels_asked": 4,
            "labels_answered": 2,
            "labels_pending": 2,
        }
    )
