"""SimulatedAnnotator (delay, noise, confusion, yes/no, abstention, state), ThreadedAnnotator's
checks and conversions, and AnnotatorCost, driven through submit/collect by hand."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from eatta.annotate import (
    AnnotatorCost,
    Answer,
    LabelRequest,
    SimulatedAnnotator,
    ThreadedAnnotator,
    parse_delay,
)

C = 5


def requests(n, step=1, pred=0, kind="label", prefix="r", classes=C, start=0):
    """``n`` requests for batch positions ``start..start+n-1``, all predicting ``pred``."""
    logits = torch.zeros(classes)
    logits[pred] = 4.0
    return [
        LabelRequest(f"{prefix}{start + j}", torch.zeros(2), logits.clone(), kind, step, start + j)
        for j in range(n)
    ]


def ask(ann, labels, **kw):
    """Submit one request per label (positions 0..n-1) with the batch's labels set."""
    labels = torch.as_tensor(labels)
    ann.set_labels(labels)
    rs = requests(len(labels), **kw)
    ann.submit(rs)
    return rs


def by_id(answers):
    return {a.id: a for a in answers}


# -- checks of the configuration ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        (-1, "got -1"),
        ((3, 1), r"got \(3, 1\)"),
        ((-1, 2), r"got \(-1, 2\)"),
        (1.5, "got 1.5"),
        (True, "got True"),
        ("sometimes", "got 'sometimes'"),
        ((1, 2, 3), r"got \(1, 2, 3\)"),
        ((1.0, 2), r"got \(1.0, 2\)"),
    ],
)
def test_bad_delays_are_named(bad, shown):
    with pytest.raises(ValueError, match=shown):
        SimulatedAnnotator(delay=bad)
    with pytest.raises(ValueError, match="label delay must be"):
        parse_delay(bad)


def test_parse_delay_accepts_the_three_forms():
    assert parse_delay(0) == 0 and parse_delay(7) == 7
    assert parse_delay((2, 2)) == (2, 2) and parse_delay([0, 3]) == (0, 3)
    assert parse_delay("never") is None and parse_delay(None) is None


@pytest.mark.parametrize("name", ["noise", "abstain"])
@pytest.mark.parametrize("bad", [-0.01, 1.01, float("nan"), float("inf")])
def test_probabilities_outside_0_1_or_nan_are_refused(name, bad):
    with pytest.raises(ValueError, match=rf"must be in \[0, 1\], got {bad!r}"):
        SimulatedAnnotator(**{name: bad})


@pytest.mark.parametrize("name", ["noise", "abstain"])
@pytest.mark.parametrize("bad", ["0.1", True, None])
def test_probabilities_must_be_numbers(name, bad):
    with pytest.raises(TypeError, match=rf"must be a number in \[0, 1\], got {bad!r}"):
        SimulatedAnnotator(**{name: bad})


def test_probability_bounds_are_inclusive():
    SimulatedAnnotator(noise=0, abstain=1)
    SimulatedAnnotator(noise=1.0, abstain=0.0)


def test_unknown_feedback_is_named():
    with pytest.raises(ValueError, match="unknown feedback kind 'yes/no'"):
        SimulatedAnnotator(feedback="yes/no")


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        (torch.ones(2, 3) / 3, "square"),
        (torch.tensor([[1.2, -0.2], [0.0, 1.0]]), "entries >= 0"),
        (torch.tensor([[0.5, 0.4], [0.0, 1.0]]), "sum to 1"),
        (torch.ones(4) / 4, "square"),
    ],
)
def test_bad_confusion_matrices(matrix, message):
    with pytest.raises(ValueError, match=message):
        SimulatedAnnotator(noise=matrix)


# -- answering ---------------------------------------------------------------------------------


def test_clean_answers_are_the_true_labels_at_once():
    ann = SimulatedAnnotator()
    y = torch.tensor([3, 1, 4, 1, 0])
    rs = ask(ann, y)
    got = by_id(ann.collect())
    want = [Answer(r.id, label=int(v)) for r, v in zip(rs, y, strict=True)]
    assert [got[r.id] for r in rs] == want
    assert ann.stats() == {"requests": 5, "answers": 5, "wrong": 0, "skipped": 0, "scheduled": 0}


def test_a_request_of_step_t_is_collected_exactly_at_step_t_plus_d():
    for d in (0, 1, 3):
        ann = SimulatedAnnotator(delay=d)
        arrivals = {}
        for t in range(8):
            ann.set_labels(torch.tensor([t % C]))
            ann.submit(requests(1, step=t, prefix=f"s{t}-"))
            for a in ann.collect():
                arrivals[a.id] = t
        assert arrivals == {f"s{t}-0": t + d for t in range(8 - d)}
        assert ann.stats()["scheduled"] == d


def test_never_answers_nothing_and_schedules_nothing():
    ann = SimulatedAnnotator(delay="never")
    for t in range(5):
        ask(ann, [1, 2], prefix=f"s{t}-")
        assert ann.collect() == []
    assert ann.stats() == {"requests": 10, "answers": 10, "wrong": 0, "skipped": 0, "scheduled": 0}
    assert len(ann.inbox.open_ids) == 10


def test_a_range_of_delays_answers_out_of_order_within_the_range():
    ann = SimulatedAnnotator(delay=(1, 4), seed=3)
    arrivals, order = {}, []
    for t in range(30):
        ann.set_labels(torch.tensor([0, 1]))
        ann.submit(requests(2, step=t, prefix=f"s{t}-"))
        got = ann.collect()
        order.extend(a.id for a in got)
        for a in got:
            arrivals[a.id] = t
    delays = [arrivals[i] - int(i[1:].split("-")[0]) for i in arrivals]
    assert set(delays) == {1, 2, 3, 4}
    submitted = sorted(order, key=lambda i: (int(i[1:].split("-")[0]), i))
    assert order != submitted  # some later request overtook an earlier one
    # within one collect, answers come in due order, then submission order
    for t in range(30):
        same = [i for i in order if arrivals[i] == t]
        assert same == sorted(same, key=lambda i: (int(i[1:].split("-")[0]), i))


def test_label_noise_flips_at_the_rate_and_never_to_the_truth():
    n, p = 2000, 0.25
    ann = SimulatedAnnotator(noise=p, seed=1)
    y = torch.arange(n) % C
    rs = ask(ann, y)
    got = by_id(ann.collect())
    labels = torch.tensor([got[r.id].label for r in rs])
    wrong = labels != y
    flips = int(wrong.sum())
    assert abs(flips / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert ann.stats()["wrong"] == flips and ann.stats()["answers"] == n
    # a flip lands uniformly on the other classes: offsets 1..C-1 equally often
    offsets = ((labels - y) % C)[wrong]
    counts = torch.bincount(offsets, minlength=C)
    assert counts[0] == 0
    expected = flips / (C - 1)
    assert all(abs(int(c) - expected) < 5 * math.sqrt(expected) for c in counts[1:])


def test_noise_one_always_flips_and_noise_zero_never():
    for p, wrong in ((1.0, True), (0.0, False)):
        ann = SimulatedAnnotator(noise=p)
        y = torch.arange(200) % C
        rs = ask(ann, y)
        got = by_id(ann.collect())
        assert all((got[r.id].label != int(v)) == wrong for r, v in zip(rs, y, strict=True))


def test_confusion_matrix_draws_follow_the_true_class_row():
    m = torch.tensor([[0.2, 0.5, 0.3], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    ann = SimulatedAnnotator(noise=m, seed=2)
    n = 3000
    y = torch.zeros(n, dtype=torch.long)
    y[-100:] = 1
    rs = ask(ann, y, classes=3)
    got = by_id(ann.collect())
    labels = torch.tensor([got[r.id].label for r in rs])
    assert (labels[-100:] == 1).all()
    share = torch.bincount(labels[:-100], minlength=3).double() / (n - 100)
    assert torch.allclose(share, m[0].double(), atol=0.035), share
    assert ann.stats()["wrong"] == int((labels != y).sum())


def test_yes_no_answers_say_whether_the_prediction_is_the_truth():
    ann = SimulatedAnnotator(feedback="binary")
    y = torch.tensor([2, 0, 2, 4])
    rs = ask(ann, y, pred=2, kind="binary")
    got = by_id(ann.collect())
    assert [got[r.id].correct for r in rs] == [True, False, True, False]
    assert all(got[r.id].label is None for r in rs)
    assert ann.stats()["wrong"] == 0


def test_flipped_yes_no_answers_are_all_wrong():
    ann = SimulatedAnnotator(feedback="binary", noise=1.0)
    y = torch.tensor([2, 0, 2, 4, 1, 3])
    rs = ask(ann, y, pred=2, kind="binary")
    got = by_id(ann.collect())
    assert [got[r.id].correct for r in rs] == [False, True, False, True, True, True]
    assert ann.stats()["wrong"] == 6


def test_yes_no_noise_rate():
    n, p = 2000, 0.1
    ann = SimulatedAnnotator(feedback="binary", noise=p, seed=4)
    y = torch.arange(n) % C  # prediction 0: one sample in five is right
    rs = ask(ann, y, pred=0, kind="binary")
    got = by_id(ann.collect())
    said = torch.tensor([got[r.id].correct for r in rs])
    wrong = int((said != (y == 0)).sum())
    assert abs(wrong / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert ann.stats()["wrong"] == wrong


def test_yes_no_with_a_confusion_matrix_compares_the_drawn_class_with_the_prediction():
    m = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # 0 is taken for 1
    ann = SimulatedAnnotator(feedback="binary", noise=m)
    y = torch.tensor([0, 1, 2])
    rs = ask(ann, y, pred=1, kind="binary", classes=3)
    got = by_id(ann.collect())
    assert [got[r.id].correct for r in rs] == [True, True, False]
    assert ann.stats()["wrong"] == 1  # the 0 said to be a 1


def test_abstention_skips_at_the_rate_and_counts_skips_not_answers():
    n, p = 2000, 0.3
    ann = SimulatedAnnotator(abstain=p, seed=5)
    rs = ask(ann, torch.arange(n) % C)
    got = by_id(ann.collect())
    skipped = sum(got[r.id].skip for r in rs)
    assert abs(skipped / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert ann.stats() == {
        "requests": n,
        "answers": n - skipped,
        "wrong": 0,
        "skipped": skipped,
        "scheduled": 0,
    }
    every = SimulatedAnnotator(abstain=1.0)
    assert all(a.skip for a in (ask(every, [0, 1]) and every.collect()))


def test_draws_use_only_the_annotators_generator():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    ann = SimulatedAnnotator(noise=0.5, abstain=0.2, delay=(0, 3))
    ask(ann, torch.arange(50) % C)
    ann.collect()
    assert torch.equal(torch.get_rng_state(), before)


def test_same_seed_same_answers_other_seed_other_answers():
    def answers(seed):
        ann = SimulatedAnnotator(noise=0.5, seed=seed)
        ask(ann, torch.arange(100) % C)
        return [a.label for a in ann.collect()]

    assert answers(7) == answers(7)
    assert answers(7) != answers(8)


def test_submitting_without_labels_or_beyond_them_fails_before_anything_is_kept():
    ann = SimulatedAnnotator()
    with pytest.raises(RuntimeError, match="no labels for this batch"):
        ann.submit(requests(1))
    ann.set_labels(torch.tensor([0, 1]))
    with pytest.raises(IndexError, match="request index 2 beyond 2 labels"):
        ann.submit(requests(3))
    assert ann.stats()["requests"] == 0 and ann.stats()["scheduled"] == 0
    assert ann.inbox.state_dict() == {"open": {}, "closed": {}, "ready": []}
    with pytest.raises(ValueError, match="labels must be 1-d"):
        ann.set_labels(torch.zeros(2, 2))
    ann.end_batch()
    with pytest.raises(RuntimeError, match="no labels"):
        ann.submit(requests(1, prefix="x"))
    with ann.labels(torch.tensor([4])):
        ann.submit(requests(1, prefix="y"))
    assert ann.collect() == [Answer("y0", label=4)]
    with pytest.raises(RuntimeError, match="no labels"):
        ann.submit(requests(1, prefix="z"))


def test_empty_submit_needs_no_labels():
    ann = SimulatedAnnotator()
    ann.submit([])
    assert ann.stats()["requests"] == 0


def test_cancelled_requests_are_never_answered():
    ann = SimulatedAnnotator(delay=2)
    rs = ask(ann, [1, 2, 3])
    ann.collect()
    ann.cancel([rs[1].id])
    assert ann.stats()["scheduled"] == 2
    ann.collect()
    assert ann.collect() == [Answer("r0", label=1), Answer("r2", label=3)]


def test_an_answer_whose_request_was_closed_meanwhile_is_not_handed_in():
    ann = SimulatedAnnotator(delay=1)
    rs = ask(ann, [1, 2])
    ann.collect()
    ann.inbox.close([rs[0].id], "expired")  # closed without telling on_cancel
    assert ann.collect() == [Answer("r1", label=2)]


def test_state_round_trip_continues_identically():
    def drive(ann, steps, start):
        out = []
        for t in range(start, start + steps):
            ann.set_labels(torch.arange(4) % C)
            ann.submit(requests(2, step=t, prefix=f"s{t}-", start=t % 3))
            out.append([a.to_dict() for a in ann.collect()])
        return out

    a = SimulatedAnnotator(delay=(0, 3), noise=0.4, abstain=0.2, seed=9)
    drive(a, 5, 0)
    saved = copy.deepcopy(a.state_dict())
    b = SimulatedAnnotator(delay=(0, 3), noise=0.4, abstain=0.2, seed=9)
    b.load_state_dict(saved)
    assert b.stats() == a.stats()
    expected = drive(a, 6, 5)
    assert drive(b, 6, 5) == expected
    assert b.stats() == a.stats() and b.state_dict()["now"] == 11
    fresh = SimulatedAnnotator(delay=(0, 3), noise=0.4, abstain=0.2, seed=9)
    fresh.inbox.load_state_dict(saved["inbox"])  # the open requests, not the draws nor schedule
    assert drive(fresh, 6, 5) != expected


def test_reset_replays_the_same_draws_from_zero():
    ann = SimulatedAnnotator(delay=(0, 2), noise=0.5, abstain=0.3, seed=2)
    first = []
    for t in range(6):
        ask(ann, torch.arange(4) % C, prefix=f"a{t}-")
        first.append([a.to_dict() for a in ann.collect()])
    ann.reset()
    assert ann.stats() == {"requests": 0, "answers": 0, "wrong": 0, "skipped": 0, "scheduled": 0}
    assert ann.inbox.state_dict() == {"open": {}, "closed": {}, "ready": []}
    again = []
    for t in range(6):
        ask(ann, torch.arange(4) % C, prefix=f"a{t}-")
        again.append([a.to_dict() for a in ann.collect()])
    assert again == first


# -- ThreadedAnnotator: checks and conversions (the live path is tested with the methods) -------


@pytest.mark.parametrize("bad", [-0.1, float("nan"), True, "1"])
def test_threaded_delay_must_be_seconds(bad):
    with pytest.raises(ValueError, match="delay_s must be a number of seconds >= 0"):
        ThreadedAnnotator(lambda r: 0, delay_s=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_threaded_workers_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"workers must be an int >= 1, got {bad!r}"):
        ThreadedAnnotator(lambda r: 0, workers=bad)


def test_threaded_answer_fn_must_be_callable():
    with pytest.raises(TypeError, match="answer_fn must be callable, got int"):
        ThreadedAnnotator(3)


def test_threaded_answer_values_become_answers():
    (r,) = requests(1)
    conv = ThreadedAnnotator._as_answer
    assert conv(r, 3) == Answer("r0", label=3)
    assert conv(r, 0) == Answer("r0", label=0)
    assert conv(r, True) == Answer("r0", correct=True)
    assert conv(r, False) == Answer("r0", correct=False)
    assert conv(r, None) == Answer("r0", skip=True)
    assert conv(r, Answer("r0", label=1)) == Answer("r0", label=1)


def test_threaded_annotator_answers_requests_and_counts_refusals():
    with ThreadedAnnotator(lambda r: 7 if r.index == 1 else r.index) as ann:
        ann.submit(requests(2))
        assert ann.wait(timeout=10)
        assert ann.collect() == [Answer("r0", label=0)]
        assert ann.stats() == {"requests": 2, "answers": 1, "refused": 1, "errors": 0}


# -- AnnotatorCost -----------------------------------------------------------------------------


def test_cost_defaults_and_arithmetic():
    cost = AnnotatorCost()
    assert cost.per_request("label") == 11.7 and cost.per_request("binary") == 1.6
    assert cost.seconds(3, "label") == pytest.approx(35.1)
    assert cost.seconds(10, "binary") == pytest.approx(16.0)
    assert cost.seconds(0, "label") == 0
    mine = AnnotatorCost(seconds_per_label=4, seconds_per_binary=0.5)
    assert mine.seconds(2, "label") == 8 and mine.seconds(2, "binary") == 1.0
    assert AnnotatorCost(0, 0).seconds(5, "label") == 0


@pytest.mark.parametrize("name", ["seconds_per_label", "seconds_per_binary"])
@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan")])
def test_cost_refuses_negative_or_infinite_seconds(name, bad):
    with pytest.raises(ValueError, match=f"{name} must be a finite number >= 0, got {bad!r}"):
        AnnotatorCost(**{name: bad})


@pytest.mark.parametrize("name", ["seconds_per_label", "seconds_per_binary"])
@pytest.mark.parametrize("bad", [True, "3", None])
def test_cost_refuses_non_numbers(name, bad):
    with pytest.raises(TypeError, match=f"{name} must be a number of seconds, got {bad!r}"):
        AnnotatorCost(**{name: bad})


def test_cost_of_an_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown feedback kind 'voice'"):
        AnnotatorCost().seconds(1, "voice")


_EXIT_SCRIPT = """
import gc, torch
from eatta.annotate import ModelOracle
model = torch.nn.Linear(4, 3)
closed = ModelOracle(model).asynchronous()
closed.close()                                  # closed by hand, alive at exit
gone = ModelOracle(model).asynchronous()
del gone
gc.collect()                                    # never closed, collected mid-run
kept = ModelOracle(model).asynchronous()        # never closed, alive at exit
print("done")
"""


def test_threaded_annotator_ends_the_interpreter_silently():
    """A closed or forgotten ThreadedAnnotator prints nothing at interpreter exit (its __del__
    once used ``warnings`` after the module was torn down: "Exception ignored in ...")."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _EXIT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    assert done.stderr == ""
