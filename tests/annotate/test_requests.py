"""Requests and answers: LabelRequest's derived values, Answer's checks, the AnswerInbox hand-in
point (every refusal names the request and keeps nothing) and QueuedAnnotator around it."""

from __future__ import annotations

import copy
import math
import threading

import numpy as np
import pytest
import torch

from eatta.annotate import (
    FEEDBACK,
    Answer,
    AnswerError,
    AnswerInbox,
    GroundTruthOracle,
    LabelRequest,
    QueuedAnnotator,
    SimulatedAnnotator,
    is_asynchronous,
)
from eatta.annotate.requests import check_feedback


def request(rid: str = "r1", logits=(0.5, 2.0, -1.0), kind="label", step=3, index=2):
    logits = torch.tensor(logits)
    return LabelRequest(rid, torch.zeros(3, 4, 4), logits, kind, step, index)


# -- LabelRequest ----------------------------------------------------------------------------------


def test_request_prediction_confidence_and_classes_are_the_logits():
    r = request(logits=(0.5, 2.0, -1.0))
    assert r.num_classes == 3
    assert r.prediction == 1
    e = [math.exp(v) for v in (0.5, 2.0, -1.0)]
    assert r.confidence == pytest.approx(e[1] / sum(e), rel=1e-6)
    other = request(logits=(3.0, 0.0, 0.0, 0.0))
    assert other.num_classes == 4 and other.prediction == 0
    assert other.confidence == pytest.approx(math.exp(3) / (math.exp(3) + 3), rel=1e-6)


def test_check_feedback_accepts_the_two_kinds_and_names_any_other():
    assert FEEDBACK == ("label", "binary")
    assert check_feedback("label") == "label" and check_feedback("binary") == "binary"
    for bad in ("yesno", "Label", None, 1):
        with pytest.raises(ValueError, match=f"unknown feedback kind {bad!r}"):
            check_feedback(bad)


# -- Answer --------------------------------------------------------------------------------------


def test_answer_takes_integer_like_labels_as_int():
    assert Answer("a", label=3).label == 3
    numpy_label = Answer("a", label=np.int64(4)).label
    assert numpy_label == 4 and type(numpy_label) is int
    tensor_label = Answer("a", label=torch.tensor(2)).label
    assert tensor_label == 2 and type(tensor_label) is int
    assert Answer("a", label=0).label == 0  # zero is a label, not "no label"
    assert Answer("a", correct=False).correct is False
    assert Answer("a", skip=True).skip is True


@pytest.mark.parametrize(
    ("value", "shown"),
    [(True, "True"), (False, "False"), (1.0, "float 1.0"), ("2", "str '2'"), (2.5, "2.5")],
)
def test_answer_refuses_a_label_that_is_not_an_integer(value, shown):
    with pytest.raises(AnswerError, match="answer to 'req-7': label must be an integer class") as e:
        Answer("req-7", label=value)
    assert shown in str(e.value)


@pytest.mark.parametrize("value", [1, 0, "yes", 1.0])
def test_a_yes_no_must_be_a_bool(value):
    with pytest.raises(AnswerError, match="answer to 'q': a yes/no answer must be a bool") as e:
        Answer("q", correct=value)
    assert repr(value) in str(e.value)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"label": 1, "correct": True},
        {"label": 1, "skip": True},
        {"correct": False, "skip": True},
    ],
)
def test_an_answer_gives_exactly_one_thing(kw):
    with pytest.raises(AnswerError, match="'x' must give exactly one of label, correct, skip"):
        Answer("x", **kw)


@pytest.mark.parametrize("rid", ["", None, 5])
def test_an_answer_needs_a_request_id(rid):
    with pytest.raises(AnswerError, match="needs a request id"):
        Answer(rid, label=1)


def test_skip_must_be_a_bool():
    with pytest.raises(AnswerError, match="skip must be a bool, got 1"):
        Answer("x", skip=1)


def test_check_refuses_labels_outside_the_classes_at_both_ends():
    Answer("x", label=0).check(3)
    Answer("x", label=2).check(3)
    Answer("x", correct=True).check(1)
    Answer("x", skip=True).check(1)
    with pytest.raises(AnswerError, match=r"answer to 'x': label 3 is outside \[0, 3\)"):
        Answer("x", label=3).check(3)
    with pytest.raises(AnswerError, match=r"label -1 is outside \[0, 3\)"):
        Answer("x", label=-1).check(3)


def test_from_mapping_round_trips_and_names_unknown_keys():
    for a in (
        Answer("a", label=2),
        Answer("b", correct=True),
        Answer("c", correct=False),
        Answer("d", skip=True),
    ):
        assert Answer.from_mapping(a.to_dict()) == a
    assert Answer("a", label=0).to_dict() == {"id": "a", "label": 0}
    assert Answer("a", correct=False).to_dict() == {"id": "a", "correct": False}
    assert Answer("a", skip=True).to_dict() == {"id": "a", "skip": True}
    with pytest.raises(AnswerError, match=r"unknown answer key\(s\) \['extra', 'lable'\]"):
        Answer.from_mapping({"id": "a", "lable": 1, "extra": 0})
    with pytest.raises(AnswerError, match="must be an object, got list"):
        Answer.from_mapping([("id", "a")])
    with pytest.raises(AnswerError, match="a yes/no answer must be a bool"):
        Answer.from_mapping({"id": "a", "correct": "true"})


# -- AnswerInbox -------------------------------------------------------------------------------


def inbox_with(*ids, classes=3):
    box = AnswerInbox()
    box.open([request(i, logits=(0.0,) * classes) for i in ids])
    return box


def test_inbox_keeps_answers_in_arrival_order_and_empties_on_take():
    box = inbox_with("a", "b", "c")
    box.hand_in(Answer("c", label=1))
    box.hand_in(Answer("a", skip=True))
    assert box.open_ids == ["b"]
    assert box.take() == [Answer("c", label=1), Answer("a", skip=True)]
    assert box.take() == []
    assert box.is_open("b") and not box.is_open("a")


def test_inbox_refusals_name_the_request_and_keep_nothing():
    box = inbox_with("a", "b")
    box.hand_in(Answer("a", label=0))
    box.close(["b"], "expired")
    before = box.state_dict()
    cases = [
        (Answer("zzz", label=0), "request 'zzz' is unknown; the answer was not taken"),
        (Answer("a", label=1), "request 'a' is already answered"),
        (Answer("b", label=1), "request 'b' is expired"),
    ]
    for answer, message in cases:
        with pytest.raises(AnswerError, match=message):
            box.hand_in(answer)
        assert box.state_dict() == before
    with pytest.raises(AnswerError, match="expected an Answer, got dict"):
        box.hand_in({"id": "a", "label": 1})


def test_inbox_refuses_an_out_of_range_label_and_the_request_stays_open():
    box = inbox_with("a", classes=4)
    with pytest.raises(AnswerError, match=r"answer to 'a': label 4 is outside \[0, 4\)"):
        box.hand_in(Answer("a", label=4))
    assert box.open_ids == ["a"] and box.take() == []
    box.hand_in(Answer("a", label=3))  # a valid answer is still taken
    assert box.take() == [Answer("a", label=3)]


def test_inbox_refuses_a_reused_id_and_opens_none_of_the_batch():
    box = inbox_with("a")
    box.hand_in(Answer("a", label=1))
    with pytest.raises(ValueError, match="request id 'a' was already used"):
        box.open([request("new"), request("a")])
    assert box.open_ids == []
    with pytest.raises(ValueError, match="'b' was already used"):
        inbox_with("b").open([request("b")])


def test_inbox_forgets_only_the_oldest_closed_ids_beyond_its_memory():
    box = AnswerInbox(remember=2)
    box.open([request(i) for i in "abc"])
    box.close(["a", "b", "c"], "cancelled")
    assert list(box.state_dict()["closed"]) == ["b", "c"]
    with pytest.raises(AnswerError, match="'a' is unknown"):
        box.hand_in(Answer("a", label=0))
    with pytest.raises(AnswerError, match="'b' is cancelled"):
        box.hand_in(Answer("b", label=0))


def test_closing_an_answered_id_keeps_why_it_was_closed():
    box = inbox_with("a")
    box.hand_in(Answer("a", label=0))
    box.close(["a", "unknown"], "expired")
    assert box.state_dict()["closed"] == {"a": "already answered"}


def test_inbox_state_round_trip_and_clear():
    box = inbox_with("a", "b", "c")
    box.hand_in(Answer("a", correct=True))
    box.close(["c"], "cancelled")
    state = copy.deepcopy(box.state_dict())
    assert state == {
        "open": {"b": 3},
        "closed": {"a": "already answered", "c": "cancelled"},
        "ready": [{"id": "a", "correct": True}],
    }
    other = AnswerInbox()
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert other.take() == [Answer("a", correct=True)]
    with pytest.raises(AnswerError, match="'c' is cancelled"):
        other.hand_in(Answer("c", label=0))
    other.clear()
    assert other.state_dict() == {"open": {}, "closed": {}, "ready": []}


def test_only_one_of_many_threads_answering_the_same_request_is_taken():
    box = inbox_with(*[f"r{i}" for i in range(20)])
    taken, refused = [], []
    start = threading.Barrier(8)

    def answer(worker):
        start.wait()
        for i in range(20):
            try:
                box.hand_in(Answer(f"r{i}", label=worker % 3))
                taken.append(i)
            except AnswerError:
                refused.append(i)

    threads = [threading.Thread(target=answer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == list(range(20)) and len(refused) == 7 * 20
    assert sorted(a.id for a in box.take()) == sorted(f"r{i}" for i in range(20))


# -- QueuedAnnotator ---------------------------------------------------------------------------


class Recording(QueuedAnnotator):
    def __init__(self, feedback="label"):
        super().__init__(feedback)
        self.calls = []

    def on_submit(self, requests):
        self.calls.append(("submit", [r.id for r in requests]))

    def on_collect(self):
        self.calls.append(("collect",))

    def on_cancel(self, ids):
        self.calls.append(("cancel", list(ids)))


def test_queued_annotator_hooks_and_public_answer():
    q = Recording()
    q.submit([request("a"), request("b")])
    q.answer("b", 2)
    with pytest.raises(AnswerError, match=r"answer to 'a': label 3 is outside \[0, 3\)"):
        q.answer("a", 3)
    with pytest.raises(AnswerError, match="label must be an integer class, got True"):
        q.answer("a", True)
    assert q.collect() == [Answer("b", label=2)]
    q.cancel(["a"])
    with pytest.raises(AnswerError, match="'a' is expired or cancelled"):
        q.answer("a", 0)
    with pytest.raises(AnswerError, match="'b' is already answered"):
        q.answer("b", skip=True)
    assert q.calls == [("submit", ["a", "b"]), ("collect",), ("cancel", ["a"])]
    assert q.collect() == []


def test_queued_annotator_refuses_requests_of_the_other_kind_before_opening_any():
    q = Recording("binary")
    with pytest.raises(
        ValueError, match="request 'b' asks for 'label' feedback; this annotator gives 'binary'"
    ):
        q.submit([request("a", kind="binary"), request("b", kind="label")])
    assert q.inbox.open_ids == [] and q.calls == []
    with pytest.raises(ValueError, match="unknown feedback kind 'full'"):
        Recording("full")


def test_queued_annotator_reset_and_state_round_trip():
    q = Recording()
    q.submit([request("a"), request("b")])
    q.answer("a", correct=True)
    other = Recording()
    other.load_state_dict(copy.deepcopy(q.state_dict()))
    assert other.state_dict() == q.state_dict()
    assert other.collect() == [Answer("a", correct=True)]
    q.reset()
    assert q.inbox.state_dict() == {"open": {}, "closed": {}, "ready": []}


def test_is_asynchronous_needs_all_three_calls():
    assert is_asynchronous(SimulatedAnnotator())
    assert not is_asynchronous(GroundTruthOracle())
    assert not is_asynchronous(lambda x, i: None)

    class TwoOfThree:
        def submit(self, r): ...
        def collect(self): ...

    assert not is_asynchronous(TwoOfThree())
    three = TwoOfThree()
    three.cancel = 5  # not callable
    assert not is_asynchronous(three)
