"""The person-paced simulated annotator: delays that follow from the load, order, drops."""

from __future__ import annotations

import pytest
import torch

from eatta.annotate.paced import PersonPace, pace_from
from eatta.annotate.requests import Answer, LabelRequest
from eatta.annotate.simulated import SimulatedAnnotator


def _request(step: int, index: int = 0) -> LabelRequest:
    return LabelRequest(f"r{step}-{index}", torch.zeros(3), torch.zeros(4), "label", step, index)


def _run(annotator: SimulatedAnnotator, steps: int, per_step: int = 1) -> dict[str, int]:
    """Submit ``per_step`` requests each step, collect; the step each request was answered at."""
    answered: dict[str, int] = {}
    labels = torch.arange(per_step) % 4
    for t in range(steps):
        annotator.set_labels(labels)
        annotator.submit([_request(t, i) for i in range(per_step)])
        for a in annotator.collect():
            answered[a.id] = t
    return answered


def test_one_answer_per_two_steps_newest_first() -> None:
    ann = SimulatedAnnotator(capacity=0.5)  # newest first by default
    answered = _run(ann, 7)
    # free at 0: takes r0 (done at 2); at 2 the newest is r2 (done at 4); then r4 (done at 6)
    assert answered == {"r0-0": 2, "r2-0": 4, "r4-0": 6}


def test_oldest_first_answers_the_backlog_in_order() -> None:
    ann = SimulatedAnnotator(capacity=0.5, order="oldest")
    answered = _run(ann, 7)
    assert answered == {"r0-0": 2, "r1-0": 4, "r2-0": 6}
    # the delay grows with the backlog: 2, 3, 4 steps
    assert [answered[k] - int(k[1]) for k in sorted(answered)] == [2, 3, 4]


def test_requests_waiting_past_patience_are_dropped_and_counted() -> None:
    ann = SimulatedAnnotator(capacity=0.25, order="oldest", patience=3)
    answered = _run(ann, 12)
    # r0 done at 4; at 4 r1 has waited 3 (kept) and is taken, done at 8; r2, r3 and r4 wait
    # more than 3 steps meanwhile (dropped at 6, 7, 8); at 8 r5 (waited 3) is taken; r6, r7
    # are dropped at 10 and 11; r8..r11 wait, r5 is being answered
    assert answered == {"r0-0": 4, "r1-0": 8}
    assert ann.stats()["dropped"] == 5
    assert ann.stats()["scheduled"] == 5


def test_pace_in_seconds_uses_the_cost_defaults() -> None:
    assert pace_from(capacity=None, stream_rate=1, seconds_per_answer=None, feedback="label") == (
        pytest.approx(1 / 11.7)
    )
    assert pace_from(
        capacity=None, stream_rate=4, seconds_per_answer=None, feedback="binary"
    ) == pytest.approx(1 / 6.4)
    ann = SimulatedAnnotator(stream_rate=0.5, seconds_per_answer=1.0)  # 2 s a batch, 1 s a label
    assert ann.pace is not None and ann.pace.capacity == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": 0}, "capacity .* > 0, got 0"),
        ({"capacity": -1.5}, "got -1.5"),
        ({"capacity": 1, "order": "fifo"}, "unknown queue order 'fifo'"),
        ({"capacity": 1, "stream_rate": 2}, "not both"),
        ({"capacity": 1, "seconds_per_answer": 2}, "not both"),
        ({"stream_rate": 0}, "stream_rate .* > 0, got 0"),
        ({"stream_rate": -2.0}, "got -2.0"),
        ({"seconds_per_answer": 3}, "needs a stream_rate"),
        ({"order": "newest"}, "apply to a paced annotator"),
        ({"capacity": 1, "delay": 4}, "follows from its load"),
        ({"capacity": 1, "patience": -1}, "patience must be an int >= 0"),
    ],
)
def test_bad_pace_is_a_clear_error(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimulatedAnnotator(**kwargs)  # type: ignore[arg-type]  # bad values on purpose


def test_state_dict_resumes_bit_identical_and_reset_clears() -> None:
    a = SimulatedAnnotator(capacity=0.4, order="oldest", noise=0.3, seed=3)
    _run(a, 5, per_step=2)
    state = a.state_dict()
    b = SimulatedAnnotator(capacity=0.4, order="oldest", noise=0.3, seed=3)
    b.load_state_dict(state)
    rest_a, rest_b = [], []
    for t in range(5, 12):
        for ann, rest in ((a, rest_a), (b, rest_b)):
            ann.set_labels(torch.tensor([1, 2]))
            ann.submit([_request(t, 0), _request(t, 1)])
            rest.extend((x.id, x.label) for x in ann.collect())
    assert rest_a == rest_b and rest_a
    a.reset()
    assert a.pace is not None and len(a.pace) == 0 and a.stats()["dropped"] == 0


def test_cancelled_requests_are_not_answered() -> None:
    ann = SimulatedAnnotator(capacity=0.5, order="oldest")
    ann.set_labels(torch.tensor([0]))
    ann.submit([_request(0)])
    ann.set_labels(torch.tensor([0]))
    ann.submit([_request(1)])
    ann.cancel(["r0-0"])  # the one being worked on
    got = []
    for _ in range(2, 6):
        ann.set_labels(torch.tensor([0]))
        got += [a.id for a in ann.collect()]
    assert got == ["r1-0"]


def test_person_pace_idles_until_a_request_arrives() -> None:
    p = PersonPace(1.0)
    assert p.release(0) == []
    p.add(5, 0, Answer("x", label=1))
    assert p.release(5) == []  # started at 5, done at 6
    assert [a.id for a in p.release(6)] == ["x"]
