"""Asynchronous annotation in the active methods (issue 17).

A zero-delay annotator gives bit-identical steps to the synchronous oracle; late answers are
applied exactly when they arrive and never after expiry; their update matches a hand computation
(cross-entropy for a class, ``-log(1 - p_c)`` for a "no"); a resumed run equals the uninterrupted
one whatever the delays; bad input is refused by name with nothing changed; the threaded path
streams on while answers come from other threads.
"""

from __future__ import annotations

import copy
import math
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

import eatta
import eatta.golden
from _state_checks import differences
from conftest import GOLDEN_DIR, confident_cnn, nested_equal, tiny_cnn
from eatta import EATTA, GroundTruthOracle
from eatta.annotate import (
    Answer,
    AnswerError,
    LabelRequest,
    ModelOracle,
    QueuedAnnotator,
    SimulatedAnnotator,
    ThreadedAnnotator,
)
from eatta.losses import complementary_cross_entropy, default_entropy_margin, entropy
from eatta.methods.baseline import baseline as make_baseline

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

C = 5
#: Keys that make SimATTA and CEMA quick on a tiny model (their defaults are for real streams).
SMALL = {
    "simatta": {
        "steps": 1,
        "train_batch_size": 8,
        "max_anchors": 5,
        "buffer": 20,
        "source_per_batch": 4,
    },
    "cema": {"buffer": 20},
}
ACTIVE = ["eatta", "eatta-stable", "baseline", "simatta", "cema"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is faster than two on a shared machine (as under xdist)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def stream(n, seed=0, size=12):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.rand(size, 3, 8, 8, generator=g) for _ in range(n)]
    ys = [torch.randint(0, C, (size,), generator=g) for _ in range(n)]
    return xs, ys


def build(name, oracle, budget=2, **kw):
    return eatta.create(
        name, confident_cnn(), oracle=oracle, budget=budget, **{**SMALL.get(name, {}), **kw}
    )


def model_state(m):
    return {k: v.detach().clone() for k, v in m.model.state_dict().items()}


def full_state(m):
    """Model, optimizer and every method part, exactly (a deep copy)."""
    return {
        "model": model_state(m),
        "optimizer": copy.deepcopy(m.optimizer.state_dict()),
        "method": copy.deepcopy(m.method_state()),
        "labels_used": m.labels_used,
        "stats": dict(m.annotation_stats),
    }


def run(m, xs, ys, balance=False):
    """Logits and late counts per step (and the class balance after each step)."""
    out, late, classes = [], [], []
    for x, y in zip(xs, ys, strict=True):
        out.append(m(x, labels=y))
        late.append(getattr(m.last_step, "late", None))
        classes.append(list(m.balance.classes) if balance else None)
    return (out, late, classes) if balance else (out, late)


class Manual(QueuedAnnotator):
    """An annotator answered by the test: keeps the requests, records cancellations."""

    def __init__(self, feedback="label"):
        super().__init__(feedback)
        self.requests = []
        self.cancelled = []

    def on_submit(self, requests):
        self.requests.extend(requests)

    def on_cancel(self, ids):
        self.cancelled.append(list(ids))

    def set_labels(self, labels):
        """The batch's labels are the test's business (answers come from ``answer``)."""


def requests_for(n):
    """``n`` hand-made requests (ids ``h0``...) for annotators driven without a method."""
    return [
        LabelRequest(f"h{i}", torch.zeros(3, 8, 8), torch.zeros(C), "label", 1, i) for i in range(n)
    ]


class Raw:
    """A bare asynchronous annotator whose collect returns whatever the test queues."""

    feedback = "label"

    def __init__(self):
        self.queued, self.submitted, self.cancelled = [], [], []

    def submit(self, requests):
        self.submitted.extend(requests)

    def collect(self):
        out, self.queued = self.queued, []
        return out

    def cancel(self, ids):
        self.cancelled.append(list(ids))

    def set_labels(self, labels):
        """Unused: the test queues the answers."""


# -- 1. zero delay is the synchronous path, bit for bit ----------------------------------------


@pytest.mark.parametrize("name", ACTIVE)
def test_zero_delay_is_bit_identical_to_the_synchronous_oracle(name):
    xs, ys = stream(4, seed=1)
    sync = build(name, GroundTruthOracle())
    ann = SimulatedAnnotator(delay=0)
    lazy = build(name, ann)
    initial = model_state(sync)
    for x, y in zip(xs, ys, strict=True):
        a, b = sync(x, labels=y), lazy(x, labels=y)
        assert torch.equal(a, b)
    assert sync.labels_used == lazy.labels_used > 0
    assert differences(model_state(sync), model_state(lazy)) == []
    assert differences(initial, model_state(sync)) != []  # it adapted
    assert nested_equal(sync.optimizer.state_dict(), lazy.optimizer.state_dict())
    parts_sync, parts_async = sync.method_state(), lazy.method_state()
    assert parts_sync.pop("pending") is None
    pending = parts_async.pop("pending")
    assert pending["requests"] == [] and pending["counts"]["received"] == lazy.labels_used
    # late-label weighting (eatta-stable) watches an asynchronous stream only; it never acted here
    assert parts_sync.pop("late_labels", None) is None
    late = parts_async.pop("late_labels", None)
    assert late is None or late["probs"] is None  # the fallback never ran
    assert differences(parts_sync, parts_async) == []
    stats = lazy.annotation_stats
    assert stats["requested"] == stats["received"] == lazy.labels_used and stats["pending"] == 0
    assert ann.stats()["requests"] == lazy.labels_used
    assert sync.annotation_stats == {}


def test_zero_delay_step_records_match_the_synchronous_ones():
    xs, ys = stream(3, seed=2)
    sync, lazy = build("eatta", GroundTruthOracle()), build("eatta", SimulatedAnnotator())
    for x, y in zip(xs, ys, strict=True):
        sync(x, labels=y)
        lazy(x, labels=y)
        a, b = sync.last_step, lazy.last_step
        for field in ("selected", "labels", "loss", "loss_sup", "loss_unsup", "grad_norm_sup"):
            assert nested_equal(getattr(a, field), getattr(b, field)), field
        assert a.class_history == b.class_history and b.late == 0 and len(b.negatives) == 0


@pytest.mark.parametrize("path", sorted(GOLDEN_DIR.glob("*.pt")), ids=lambda p: p.stem)
def test_golden_traces_replay_identically_with_a_zero_delay_annotator(path, monkeypatch):
    sync = eatta.golden.replay_trace(path)
    made = []

    def annotator():
        made.append(SimulatedAnnotator(delay=0))
        return made[-1]

    monkeypatch.setattr(eatta.golden, "GroundTruthOracle", annotator)
    lazy = eatta.golden.replay_trace(path)
    assert len(made) == 1 and made[0].stats()["requests"] > 0  # the asynchronous path ran
    assert made[0].stats()["answers"] == made[0].stats()["requests"]
    assert lazy.ok, {n: f.worst_ratio for n, f in lazy.fields.items() if not f.ok}
    for name, field in sync.fields.items():
        got = lazy.fields[name]
        assert (got.worst_ratio, got.worst_step, got.failures) == (
            field.worst_ratio,
            field.worst_step,
            field.failures,
        ), name


# -- 2. resume anywhere between request and answer ---------------------------------------------


def make_async(ann, expiry, buffer):
    model = tiny_cnn(seed=3)
    with torch.no_grad():
        model[-1].weight.mul_(6.0)
    params = eatta.configure(model)
    return EATTA(
        model,
        torch.optim.SGD(params, lr=0.05, momentum=0.9),
        oracle=ann,
        budget=2,
        buffer=buffer,
        balance="last-k",
        label_expiry=expiry,
    )


@settings(max_examples=12, deadline=None)
@example(lo=2, spread=2, abstain=0.3, noise=0.4, feedback="binary", expiry=3, split=3, seed=1)
@example(lo=1, spread=0, abstain=0.0, noise=0.0, feedback="label", expiry=1, split=2, seed=0)
@given(
    lo=st.integers(0, 3),
    spread=st.integers(0, 3),
    abstain=st.sampled_from([0.0, 0.3, 1.0]),
    noise=st.sampled_from([0.0, 0.4]),
    feedback=st.sampled_from(["label", "binary"]),
    expiry=st.integers(0, 4),
    split=st.integers(1, 6),
    seed=st.integers(0, 3),
)
def test_a_resumed_run_equals_the_uninterrupted_one(
    lo, spread, abstain, noise, feedback, expiry, split, seed
):
    n = 7
    xs, ys = stream(n, seed=seed, size=8)

    def annotator():
        return SimulatedAnnotator(
            delay=(lo, lo + spread), abstain=abstain, noise=noise, feedback=feedback, seed=seed
        )

    ann = annotator()
    m = make_async(ann, expiry, buffer=4 if seed % 2 else None)
    for t in range(split):
        m(xs[t], labels=ys[t])
    saved = copy.deepcopy(m.state_dict())
    saved_ann = copy.deepcopy(ann.state_dict())
    tail = run(m, xs[split:], ys[split:], balance=True)

    ann2 = annotator()
    m2 = make_async(ann2, expiry, buffer=4 if seed % 2 else None)
    m2.load_state_dict(saved)
    ann2.load_state_dict(saved_ann)
    tail2 = run(m2, xs[split:], ys[split:], balance=True)

    assert all(torch.equal(a, b) for a, b in zip(tail[0], tail2[0], strict=True))
    assert tail[1] == tail2[1] and tail[2] == tail2[2]
    assert differences(full_state(m), full_state(m2)) == []
    assert nested_equal(ann.state_dict(), ann2.state_dict())
    stats = m.annotation_stats
    # every request is answered, skipped, expired or still pending: nothing lost or doubled
    assert stats["requested"] == (
        stats["received"] + stats["skipped"] + stats["expired"] + stats["pending"]
    )
    assert stats["requested"] == m.labels_used == ann.stats()["requests"]
    assert sum(tail[1]) <= stats["received"]


# -- 3. when late answers are applied ------------------------------------------------------------


@pytest.mark.parametrize(("delay", "budget"), [(1, 1), (2, 1), (3, 2)])
def test_late_counts_per_step_follow_the_delay_exactly(delay, budget):
    n = 6
    xs, ys = stream(n, seed=4)
    ann = SimulatedAnnotator(delay=delay)
    m = build("baseline", ann, budget=budget)
    _, late = run(m, xs, ys)
    assert late == [0] * delay + [budget] * (n - delay)
    assert m.annotation_stats == {
        "requested": n * budget,
        "received": (n - delay) * budget,
        "skipped": 0,
        "expired": 0,
        "refused": 0,
        "dropped": 0,
        "pending": delay * budget,
    }
    assert m.labels_used == n * budget  # the budget counts requests


def test_a_late_label_reaches_the_class_history_when_it_arrives():
    xs, ys = stream(3, seed=5)
    ann = SimulatedAnnotator(delay=1)
    m = build("eatta", ann, budget=1, balance="last-k")
    m(xs[0], labels=ys[0])
    (r1,) = m.asking.pending.state_dict()["requests"]
    assert m.balance.classes == [] and m.last_step.class_history == []
    m(xs[1], labels=ys[1])
    assert m.last_step.late == 1
    assert m.balance.classes == [int(ys[0][r1["index"]])]
    assert m.last_step.class_history == m.balance.classes


def test_late_label_value_in_the_history_is_the_answer():
    xs, ys = stream(2, seed=6)
    ann = Manual()
    m = build("eatta", ann, budget=1, balance="last-k")
    m(xs[0], labels=ys[0])
    (r,) = ann.requests
    ann.answer(r.id, (r.prediction + 2) % C)
    m(xs[1], labels=ys[1])
    assert m.balance.classes == [(r.prediction + 2) % C] and m.last_step.late == 1


@pytest.mark.parametrize("expiry", [0, 1, 3])
def test_an_answer_arriving_at_the_expiry_step_is_applied_one_later_is_not(expiry):
    n = expiry + 4
    xs, ys = stream(n, seed=7)

    def go(delay):
        m = build("baseline", SimulatedAnnotator(delay=delay), budget=1, label_expiry=expiry)
        _, late = run(m, xs, ys)
        return m, late

    on_time, late_on_time = go(expiry)
    assert late_on_time == [0] * expiry + [1] * (n - expiry) if expiry else [0] * n
    assert on_time.annotation_stats["expired"] == 0
    assert on_time.annotation_stats["received"] == n - expiry

    too_late, late_too_late = go(expiry + 1)
    never, late_never = go("never")
    assert late_too_late == late_never == [0] * n
    old = n - expiry - 1  # requests of steps 1 .. n - expiry - 1 expired by step n
    assert too_late.annotation_stats == {
        "requested": n,
        "received": 0,
        "skipped": 0,
        "expired": old,
        "refused": old,
        "dropped": 0,
        "pending": expiry + 1,
    }
    assert never.annotation_stats == {**too_late.annotation_stats, "refused": 0}
    # an answer that came after its request expired changed nothing: as if it never came
    assert differences(model_state(too_late), model_state(never)) == []
    assert differences(model_state(on_time), model_state(never)) != []


def test_expired_requests_are_cancelled_at_the_annotator_once():
    xs, ys = stream(5, seed=8)
    ann = Manual()
    m = build("baseline", ann, budget=1, label_expiry=1)
    for t in range(5):
        m(xs[t], labels=ys[t])
        expected = [[r.id] for r in ann.requests[: max(0, t - 1)]]
        assert ann.cancelled == expected, t
    assert m.annotation_stats["expired"] == 3
    with pytest.raises(
        AnswerError, match=f"request '{ann.requests[0].id}' is expired or cancelled"
    ):
        ann.answer(ann.requests[0].id, 0)


def test_reset_drops_pending_cancels_them_and_ignores_their_answers():
    xs, ys = stream(4, seed=9)
    raw = Raw()
    m = build("baseline", raw, budget=2)
    initial_model = model_state(m)
    m(xs[0], labels=ys[0])
    m(xs[1], labels=ys[1])
    old = [r.id for r in raw.submitted]
    assert len(old) == 4 and m.annotation_stats["pending"] == 4
    m.reset()
    assert raw.cancelled == [old]
    assert m.annotation_stats == {
        "requested": 4,
        "received": 0,
        "skipped": 0,
        "expired": 0,
        "refused": 0,
        "dropped": 4,
        "pending": 0,
    }
    assert differences(initial_model, model_state(m)) == [] and m.labels_used == 0
    raw.queued = [Answer(old[0], label=1), Answer(old[3], label=2)]
    m(xs[2], labels=ys[2])
    assert m.last_step.late == 0 and m.annotation_stats["refused"] == 2
    assert not {r.id for r in raw.submitted[4:]} & set(old)  # a new epoch of ids
    # the refused answers changed nothing: the same as a fresh method's first step
    fresh = build("baseline", Raw(), budget=2)
    fresh(xs[2], labels=ys[2])
    assert differences(model_state(fresh), model_state(m)) == []


def test_refused_answers_are_counted_and_change_nothing():
    xs, ys = stream(2, seed=10)
    a, b = Raw(), Raw()
    ma, mb = build("eatta", a, budget=1), build("eatta", b, budget=1)
    ma(xs[0], labels=ys[0])
    mb(xs[0], labels=ys[0])
    rid = a.submitted[0].id
    a.queued = [Answer("made-up", label=1), Answer(rid, label=C), Answer(rid, label=99)]
    ma(xs[1], labels=ys[1])
    mb(xs[1], labels=ys[1])
    assert ma.annotation_stats["refused"] == 3 and ma.annotation_stats["pending"] == 2
    sa, sb = full_state(ma), full_state(mb)
    for s in (sa, sb):
        s["method"].pop("pending")
        s.pop("stats")
    assert differences(sa, sb) == []
    a.queued = [Answer(rid, label=1), Answer(rid, label=2)]  # the request is still open
    ma(xs[1], labels=ys[1])
    assert ma.last_step.late == 1 and ma.annotation_stats["refused"] == 4


def test_skipped_answers_are_counted_and_not_learned():
    xs, ys = stream(2, seed=11)
    ann = SimulatedAnnotator(delay=1, abstain=1.0)
    m = build("baseline", ann, budget=2)
    never = build("baseline", SimulatedAnnotator(delay="never"), budget=2)
    run(m, xs, ys)
    run(never, xs, ys)
    assert m.annotation_stats["skipped"] == 2 and m.last_step.late == 0
    assert differences(model_state(m), model_state(never)) == []


def test_a_failed_step_cancels_its_requests_and_the_method_goes_on(monkeypatch):
    xs, ys = stream(4, seed=12)
    ann = Manual()
    m = build("eatta", ann, budget=1)
    m(xs[0], labels=ys[0])
    before = full_state(m)
    import eatta.methods.eatta as eatta_module

    real = eatta_module.masked_mean

    def boom(*a):
        raise RuntimeError("boom")

    monkeypatch.setattr(eatta_module, "masked_mean", boom)  # fails inside the step
    with pytest.raises(RuntimeError, match="boom"):
        m(xs[1], labels=ys[1])
    failed = ann.requests[-1].id
    assert ann.cancelled == [[failed]]
    after = full_state(m)
    assert after["method"]["pending"].pop("retries") == 1
    before["method"]["pending"].pop("retries")
    assert differences(before, after) == []
    monkeypatch.setattr(eatta_module, "masked_mean", real)
    ann.answer(ann.requests[0].id, 3)
    m(xs[1], labels=ys[1])  # the retry asks under a new id and takes the late answer
    m(xs[2], labels=ys[2])
    assert len({r.id for r in ann.requests}) == len(ann.requests) == 4  # one per attempt
    assert m.annotation_stats["received"] == 1 and m.annotation_stats["requested"] == 3


def fail_once_after_collect(monkeypatch):
    """Make the next EATTA step fail after it collected its answers (then work again)."""
    import eatta.methods.eatta as eatta_module

    real = eatta_module.masked_mean

    def boom(*a):
        monkeypatch.setattr(eatta_module, "masked_mean", real)
        raise RuntimeError("boom")

    monkeypatch.setattr(eatta_module, "masked_mean", boom)  # fails inside the step


def test_answers_collected_by_a_failed_step_are_applied_by_the_next(monkeypatch):
    xs = stream(2, seed=31)[0]
    ann, twin_ann = Manual(), Manual()
    m, twin = build("eatta", ann, budget=1), build("eatta", twin_ann, budget=1)
    m(xs[0])
    twin(xs[0])
    ann.answer(ann.requests[0].id, 3)
    twin_ann.answer(twin_ann.requests[0].id, 3)
    fail_once_after_collect(monkeypatch)
    with pytest.raises(RuntimeError, match="boom"):
        m(xs[1])
    assert m.annotation_stats["received"] == 0 and m.annotation_stats["pending"] == 1
    assert m.method_state()["pending"]["carried"] == [{"id": ann.requests[0].id, "label": 3}]
    assert ann.collect() == []  # delivered once, kept by the method
    out = m(xs[1])
    assert m.last_step.late == 1 and m.annotation_stats["received"] == 1
    assert torch.equal(out, twin(xs[1]))
    assert differences(model_state(m), model_state(twin)) == []
    assert m.balance.classes == twin.balance.classes
    assert m.method_state()["pending"]["carried"] == []


def test_carried_answers_survive_a_second_failure_before_collecting(monkeypatch):
    xs, _ = stream(2, seed=32)
    ann = Manual()
    m = build("eatta", ann, budget=1)
    m(xs[0])
    ann.answer(ann.requests[0].id, 1)
    fail_once_after_collect(monkeypatch)
    with pytest.raises(RuntimeError, match="boom"):
        m(xs[1])

    def broken_submit(requests):
        raise ConnectionError("annotator down")

    monkeypatch.setattr(ann, "submit", broken_submit)
    with pytest.raises(eatta.OracleError, match="submit raised ConnectionError"):
        m(xs[1])
    assert m.method_state()["pending"]["carried"] == [{"id": ann.requests[0].id, "label": 1}]
    monkeypatch.undo()
    m(xs[1])
    assert m.last_step.late == 1 and m.annotation_stats["received"] == 1


def test_carried_answers_are_saved_and_dropped_by_reset(monkeypatch):
    xs, _ = stream(2, seed=33)
    ann = Manual()
    m = build("eatta", ann, budget=1, balance="last-k")
    m(xs[0])
    ann.answer(ann.requests[0].id, 4)
    fail_once_after_collect(monkeypatch)
    with pytest.raises(RuntimeError, match="boom"):
        m(xs[1])
    resumed = build("eatta", Manual(), budget=1, balance="last-k")
    resumed.load_state_dict(copy.deepcopy(m.state_dict()))
    resumed(xs[1])
    assert resumed.last_step.late == 1 and resumed.balance.classes == [4]
    m.reset()
    assert m.method_state()["pending"]["carried"] == []
    m(xs[1])
    assert m.last_step.late == 0 and m.annotation_stats["received"] == 0


def test_a_batch_without_labels_fails_once_and_the_next_one_works():
    xs, ys = stream(2, seed=13)
    ann = SimulatedAnnotator()
    m = build("eatta", ann, budget=1)
    before = full_state(m)
    with pytest.raises(eatta.OracleError, match="no labels for this batch"):
        m(xs[0])
    assert ann.inbox.open_ids == []
    after = full_state(m)
    after["method"]["pending"].pop("retries")
    before["method"]["pending"].pop("retries")
    assert differences(before, after) == []
    m(xs[0], labels=ys[0])
    assert m.annotation_stats["received"] == 1


# -- 4. the late update against a hand computation ----------------------------------------------

LR = 0.1


def hand_update(model, loss, params):
    grads = torch.autograd.grad(loss, [p for _, p in params])
    return {n: p.detach() - LR * g for (n, p), g in zip(params, grads, strict=True)}


def assert_params(m, expected):
    named = dict(m.model.named_parameters())
    for n, want in expected.items():
        torch.testing.assert_close(named[n].detach(), want, rtol=0, atol=2e-7, msg=n)


def baseline(ann, margin=None, buffer=None, budget=1):
    model = confident_cnn()
    params = eatta.configure(model)
    return make_baseline(
        model,
        torch.optim.SGD(params, lr=LR),
        oracle=ann,
        budget=budget,
        entropy_margin=margin,
        buffer=buffer,
    )


def test_a_late_label_is_cross_entropy_of_the_kept_sample_through_the_current_model():
    xs, ys = stream(2, seed=14)
    ann = Manual()
    m = baseline(ann)
    m(xs[0], labels=ys[0])
    (r,) = ann.requests
    y_late = (r.prediction + 1) % C  # not the prediction: a real correction
    ann.answer(r.id, y_late)
    current = copy.deepcopy(m.model)
    params = [(n, p) for n, p in current.named_parameters() if p.requires_grad]
    o = current(xs[1])
    h = entropy(o)
    mask = h.detach() < default_entropy_margin(C)
    assert 0 < int(mask.sum()) < len(mask)
    unsup = (h * mask).sum() / mask.sum()
    # with BatchNorm the kept sample is normalized together with the current batch
    late_logits = current(torch.cat([xs[1], r.sample.unsqueeze(0)]))[-1:]
    sup = F.cross_entropy(late_logits, torch.tensor([y_late]))
    expected = hand_update(current, sup + unsup, params)
    m(xs[1], labels=ys[1])
    assert m.last_step.late == 1 and len(m.last_step.selected) == 0
    torch.testing.assert_close(m.last_step.loss_sup, sup.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(m.last_step.loss_unsup, unsup.detach(), rtol=0, atol=1e-6)
    assert_params(m, expected)


def test_a_late_label_joins_the_buffer():
    xs, ys = stream(2, seed=15)
    ann = Manual()
    m = baseline(ann, buffer=8)
    m(xs[0], labels=ys[0])
    (r,) = ann.requests
    ann.answer(r.id, 4)
    m(xs[1], labels=ys[1])
    bx, by = m.replay.buffer.contents()
    assert len(by) == 1 and by.tolist() == [4] and torch.equal(bx[0], r.sample)


def test_a_late_no_is_the_complementary_loss_and_lowers_that_class():
    xs, ys = stream(2, seed=16)
    ann = Manual("binary")
    m = baseline(ann, margin=1e-12)  # no confident sample: the complementary term alone
    m(xs[0], labels=ys[0])
    (r,) = ann.requests
    assert r.kind == "binary"
    c = r.prediction
    ann.answer(r.id, correct=False)
    current = copy.deepcopy(m.model)
    p_before = current(torch.cat([xs[1], r.sample.unsqueeze(0)]))[-1:].softmax(1)[0, c]
    sup = -torch.log1p(-p_before)
    params = [(n, p) for n, p in current.named_parameters() if p.requires_grad]
    expected = hand_update(current, sup, params)
    m(xs[1], labels=ys[1])
    assert m.last_step.late == 1 and m.last_step.num_unsup == 0
    torch.testing.assert_close(m.last_step.loss_sup, sup.detach(), rtol=1e-6, atol=1e-7)
    assert_params(m, expected)
    with torch.no_grad():
        p_after = m.model(torch.cat([xs[1], r.sample.unsqueeze(0)]))[-1:].softmax(1)[0, c]
    assert p_after < p_before


def test_a_late_yes_is_a_label_of_the_prediction():
    xs, ys = stream(2, seed=17)
    ann = Manual("binary")
    m = baseline(ann, margin=1e-12)
    m(xs[0], labels=ys[0])
    (r,) = ann.requests
    ann.answer(r.id, correct=True)
    current = copy.deepcopy(m.model)
    late_logits = current(torch.cat([xs[1], r.sample.unsqueeze(0)]))[-1:]
    sup = F.cross_entropy(late_logits, torch.tensor([r.prediction]))
    params = [(n, p) for n, p in current.named_parameters() if p.requires_grad]
    expected = hand_update(current, sup, params)
    m(xs[1], labels=ys[1])
    assert_params(m, expected)


def test_this_batchs_no_is_complementary_and_left_out_of_the_entropy_term():
    x = stream(1, seed=18, size=16)[0][0]
    probe = copy.deepcopy(confident_cnn())
    with torch.no_grad():
        o = probe(x)
    ann = SimulatedAnnotator(feedback="binary")
    m = baseline(ann, budget=1)
    current = copy.deepcopy(m.model)
    pred = o.argmax(1)
    y = (pred + 1) % C  # every answer is "no"
    m(x, labels=y)
    (i,) = m.last_step.negatives.tolist()
    assert len(m.last_step.selected) == 0
    o = current(x)
    h = entropy(o)
    mask = h.detach() < default_entropy_margin(C)
    assert bool(mask[i])  # the "no" sample is confident: leaving it out matters
    mask[i] = False
    unsup = (h * mask).sum() / mask.sum()
    sup = complementary_cross_entropy(o[[i]], pred[[i]])
    params = [(n, p) for n, p in current.named_parameters() if p.requires_grad]
    assert_params(m, hand_update(current, sup + unsup, params))
    assert int(m.last_step.num_unsup) == int(mask.sum())


def test_complementary_cross_entropy_value_and_gradient():
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 3.0]], requires_grad=True)
    c = torch.tensor([0, 3])
    loss = complementary_cross_entropy(logits, c)
    p = logits.detach().softmax(1)
    rows = torch.arange(2)
    want = (-torch.log(1 - p[rows, c])).mean()
    torch.testing.assert_close(loss.detach(), want, rtol=1e-6, atol=0)
    (g,) = torch.autograd.grad(loss, logits)
    pc = p[rows, c].unsqueeze(1)
    expected = -p * pc / (1 - pc) / 2  # d/do_j = -p_j p_c / (1 - p_c), mean over 2 rows
    expected[rows, c] = p[rows, c] / 2  # d/do_c = p_c
    torch.testing.assert_close(g, expected, rtol=1e-5, atol=1e-7)
    confident = torch.tensor([[40.0, 0.0, 0.0]])
    value = complementary_cross_entropy(confident, torch.tensor([0]))
    assert math.isfinite(float(value))
    assert float(value) == pytest.approx(40.0 - math.log(2.0), rel=1e-6)
    assert float(complementary_cross_entropy(confident, torch.tensor([1]))) == pytest.approx(
        -math.log1p(-math.exp(-40.0) / (1 + 2 * math.exp(-40.0))), abs=1e-12
    )


# -- 5. bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["simatta", "cema"])
def test_class_label_methods_refuse_yes_no_annotators_and_leave_the_model(name):
    model = confident_cnn()
    before = copy.deepcopy(model.state_dict())
    grads = [p.requires_grad for p in model.parameters()]
    method = {"simatta": "SimATTA", "cema": "CEMA"}[name]
    with pytest.raises(TypeError, match=f"{method} learns from class labels only; yes/no"):
        eatta.create(name, model, oracle=SimulatedAnnotator(feedback="binary"))
    assert nested_equal(model.state_dict(), before)
    assert [p.requires_grad for p in model.parameters()] == grads
    build(name, SimulatedAnnotator(feedback="label"))  # a class-label annotator is fine


def test_binary_annotators_work_with_eatta_and_baseline():
    for name in ("eatta", "eatta-stable", "baseline"):
        m = build(name, SimulatedAnnotator(feedback="binary"))
        x, y = stream(1)[0][0], stream(1)[1][0]
        m(x, labels=y)
        assert m.annotation_stats["received"] == 2


def test_an_oracle_that_is_neither_is_refused():
    with pytest.raises(TypeError, match=r"oracle must be a callable .* got int"):
        build("eatta", 3)


def test_a_negative_expiry_is_refused():
    with pytest.raises(ValueError, match="label_expiry"):
        build("eatta", SimulatedAnnotator(), label_expiry=-1)
    with pytest.raises(ValueError, match="label_expiry must be an integer >= 0"):
        model = confident_cnn()
        EATTA(
            model,
            torch.optim.SGD(eatta.configure(model), lr=0.1),
            oracle=SimulatedAnnotator(),
            label_expiry=-1,
        )


def test_an_out_of_range_answer_is_refused_at_hand_in_and_the_request_stays_open():
    xs, ys = stream(2, seed=19)
    ann = Manual()
    m = build("eatta", ann, budget=1)
    m(xs[0], labels=ys[0])
    (r,) = ann.requests
    with pytest.raises(AnswerError, match=rf"answer to '{r.id}': label {C} is outside \[0, {C}\)"):
        ann.answer(r.id, C)
    with pytest.raises(AnswerError, match="unknown"):
        ann.answer("not-a-request", 1)
    with pytest.raises(AnswerError, match="must be a bool"):
        ann.answer(r.id, correct=1)
    ann.answer(r.id, 2)
    with pytest.raises(AnswerError, match="already answered"):
        ann.answer(r.id, 2)
    m(xs[1], labels=ys[1])
    assert m.last_step.late == 1 and m.annotation_stats["refused"] == 0


def test_a_state_of_another_method_is_refused_naming_both_and_changes_nothing():
    xs, ys = stream(2, seed=20)
    tent = eatta.create("tent", confident_cnn(seed=1))
    tent(xs[0])
    m = build("eatta", GroundTruthOracle())
    m(xs[0], labels=ys[0])
    before = full_state(m)
    with pytest.raises(
        ValueError,
        match=r"saved by Tent \(no state parts\) and cannot be loaded "
        r"into EATTA \(balance=ReferenceBalance, budget=Budget, .*nothing was changed",
    ):
        m.load_state_dict(tent.state_dict())
    assert differences(before, full_state(m)) == []


def test_states_of_other_configurations_are_refused():
    xs, ys = stream(1, seed=21)
    with_buffer = build("eatta", GroundTruthOracle(), buffer=4)
    with_buffer(xs[0], labels=ys[0])
    plain = build("eatta", GroundTruthOracle())
    before = full_state(plain)
    with pytest.raises(
        ValueError,
        match="buffer=LabelBuffer.*cannot be loaded into EATTA "
        r"\(balance=ReferenceBalance, budget=Budget, debiaser",
    ):
        plain.load_state_dict(with_buffer.state_dict())
    assert differences(before, full_state(plain)) == []
    lazy = build("eatta", SimulatedAnnotator(delay=2))
    lazy(xs[0], labels=ys[0])
    with pytest.raises(ValueError, match="pending=PendingLabels"):
        plain.load_state_dict(lazy.state_dict())
    assert differences(before, full_state(plain)) == []
    with pytest.raises(ValueError, match=r"saved by EATTA .*PerturbationSelector.* into EATTA"):
        build("baseline", GroundTruthOracle()).load_state_dict(plain.state_dict())


def test_a_state_saved_before_signatures_still_loads():
    xs, ys = stream(2, seed=22)
    a = build("eatta", SimulatedAnnotator(delay=1))
    a(xs[0], labels=ys[0])
    state = copy.deepcopy(a.state_dict())
    del state["_extra_state"]["signature"]
    b = build("eatta", SimulatedAnnotator(delay=1))
    b.load_state_dict(state)
    assert differences(full_state(a), full_state(b)) == []


def test_inference_mode_is_refused_no_grad_works_as_no_context():
    x, y = stream(1, seed=23)[0][0], stream(1, seed=23)[1][0]
    m = build("eatta", GroundTruthOracle())
    before = full_state(m)
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"use|torch\.no_grad\(\)"):
        m(x, labels=y)
    assert differences(before, full_state(m)) == []
    with torch.inference_mode(), pytest.raises(RuntimeError) as err:
        m(x, labels=y)
    assert "EATTA adapts with autograd and cannot run under torch.inference_mode()" in str(
        err.value
    ) and "torch.no_grad()" in str(err.value)
    plain = build("eatta", GroundTruthOracle())
    out_plain = plain(x, labels=y)
    with torch.no_grad():
        out = m(x, labels=y)
    assert torch.equal(out, out_plain)
    assert differences(full_state(m), full_state(plain)) == []
    assert differences(before, full_state(m)) != []
    with torch.inference_mode():
        made = torch.rand(4, 3, 8, 8)
    m(made, labels=y[:4])  # a tensor made under inference_mode is fine outside it
    source = eatta.create("source", confident_cnn())
    with torch.inference_mode():
        source(x)  # a method that does not adapt runs under inference_mode


def test_a_mistyped_budget_suggests_budget():
    model = confident_cnn()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(TypeError, match=r"no hyperparameter 'buget' \(did you mean 'budget'\?\)"):
        eatta.create("eatta", model, oracle=GroundTruthOracle(), buget=1)
    assert nested_equal(model.state_dict(), before)


# -- 6. the threaded, live path ---------------------------------------------------------------


def test_a_threaded_annotator_answers_in_later_steps_while_the_stream_goes_on():
    n = 4
    xs, ys = stream(n, seed=24)
    answered_in = []

    def label(request):
        answered_in.append(threading.current_thread().name)
        return int(ys[request.step - 1][request.index])

    with ThreadedAnnotator(label, delay_s=0.2) as ann:
        m = build("baseline", ann, budget=1)
        late = []
        for x in xs:
            m(x)
            late.append(m.last_step.late)
            assert len(m.last_step.selected) == 0  # never in the step that asked
            time.sleep(0.3)  # longer than the delay: answered by the next step
        assert ann.wait(timeout=10)
        m(xs[0])
        late.append(m.last_step.late)
    stats = m.annotation_stats
    assert late[0] == 0 and sum(late) == stats["received"] == n
    assert max(late[1:]) >= 1
    assert all(name.startswith("eatta-annotator") for name in answered_in)
    assert ann.stats() == {"requests": n + 1, "answers": n, "refused": 0, "errors": 0}


def test_threaded_errors_are_kept_and_their_requests_expire():
    xs = stream(5, seed=25)[0]

    def broken(request):
        raise KeyError(f"no label for {request.id}")

    ann = ThreadedAnnotator(broken)
    try:
        m = build("baseline", ann, budget=1, label_expiry=1)
        for x in xs:
            m(x)
            ann.wait(timeout=10)
        assert len(ann.errors) == 5 and all(isinstance(e, KeyError) for e in ann.errors)
        assert ann.stats()["errors"] == 5 and ann.stats()["answers"] == 0
        assert m.annotation_stats["expired"] == 3 and m.annotation_stats["received"] == 0
    finally:
        ann.close()


def test_closing_a_threaded_annotator_leaves_waiting_requests_unanswered():
    xs, _ = stream(1, seed=26)
    ann = ThreadedAnnotator(lambda r: 0, delay_s=0.2)
    m = build("baseline", ann, budget=2)
    m(xs[0])
    ann.close()
    assert ann.wait(timeout=5)  # cancelled work counts as done
    assert ann.stats()["answers"] == 0 and ann.collect() == []


def test_waiting_for_a_threaded_annotator_can_time_out():
    with ThreadedAnnotator(lambda r: 0, delay_s=0.3) as ann:
        ann.submit(requests_for(2))
        assert ann.wait(timeout=0.01) is False
        assert ann.wait(timeout=10) is True
        assert [a.label for a in ann.collect()] == [0, 0]


def test_a_model_oracle_answers_asynchronously_with_its_argmax():
    teacher = confident_cnn(seed=4)
    xs = stream(3, seed=27)[0]
    oracle = ModelOracle(teacher)
    with oracle.asynchronous(delay_s=0.2) as ann:
        assert isinstance(ann, ThreadedAnnotator) and ann.feedback == "label"
        m = build("eatta", ann, budget=2, balance="last-k")
        m(xs[0])
        requests = list(m.asking.pending.state_dict()["requests"])
        assert ann.wait(timeout=10)
        m(xs[1])
        with torch.no_grad():
            want = [int(teacher(r["sample"].unsqueeze(0)).argmax()) for r in requests]
        assert m.last_step.late == 2
        assert m.balance.classes == want


# -- SimATTA and CEMA: where a late label goes ------------------------------------------------


def test_simatta_puts_a_late_label_into_its_anchors_and_labelled_buffer():
    xs = stream(2, seed=28)[0]
    ann = Manual()
    m = build("simatta", ann, budget=2)
    m(xs[0])
    first = list(ann.requests)
    assert len(first) == 2 and m.selector.num_anchors == 0 and len(m.labelled) == 0
    ann.answer(first[1].id, 3)
    m(xs[1])
    assert m.selector.labels.tolist() == [3]
    assert torch.equal(m.selector.inputs[0], first[1].sample)
    bx, by = m.labelled.contents()
    assert by.tolist() == [3] and torch.equal(bx[0], first[1].sample)
    assert m.labels_used == len(ann.requests) == 4
    assert m.annotation_stats["received"] == 1 and m.annotation_stats["pending"] == 3


def test_cema_puts_a_late_label_into_its_buffer_and_its_update():
    xs = stream(2, seed=29)[0]
    ann, silent = Manual(), Manual()
    m, never = build("cema", ann, budget=2), build("cema", silent, budget=2)
    m(xs[0])
    never(xs[0])
    assert len(ann.requests) >= 1 and len(m.buffer) == 0
    r = ann.requests[0]
    ann.answer(r.id, 1)
    m(xs[1])
    never(xs[1])
    bx, by = m.buffer.contents()
    assert by.tolist() == [1] and torch.equal(bx[0], r.sample)
    assert m.last_step.loss_sup is not None and never.last_step.loss_sup is None
    assert m.labels_used == len(ann.requests) > m.annotation_stats["received"] == 1
    assert differences(model_state(m), model_state(never)) != []


def test_cemas_late_rows_join_the_update_as_labelled_rows():
    from eatta.methods.cema import CEMA

    xs = stream(2, seed=30)[0]
    ann = Manual()
    model = confident_cnn()
    m = CEMA(model, torch.optim.SGD(eatta.configure(model), lr=LR), oracle=ann, buffer=None)
    m(xs[0])
    (r,) = ann.requests
    ann.answer(r.id, 2)
    current = copy.deepcopy(m.model)
    m(xs[1])
    uploaded = m.last_step.band.nonzero().flatten()
    logits = current(torch.cat([xs[1][uploaded], r.sample.unsqueeze(0)]))
    margin = default_entropy_margin(C)
    h = entropy(logits)
    loss_sup = F.cross_entropy(logits[-1:], torch.tensor([2]))
    loss = 3.0 * (h * torch.exp(margin - h.detach())).mean() + (3.0 + 1.0) * loss_sup
    params = [(n, p) for n, p in current.named_parameters() if p.requires_grad]
    torch.testing.assert_close(m.last_step.loss_sup, loss_sup.detach(), rtol=0, atol=1e-6)
    assert_params(m, hand_update(current, loss, params))


def test_label_expiry_with_a_synchronous_oracle_is_an_error_naming_it():
    model = confident_cnn()
    with pytest.raises(ValueError, match="label_expiry=8"):
        eatta.create("eatta", model, oracle=eatta.GroundTruthOracle(), label_expiry=8)
    with pytest.raises(ValueError, match="label_expiry=3"):
        eatta.create("cema", confident_cnn(), oracle=eatta.GroundTruthOracle(), label_expiry=3)
    # the default is fine with either kind, and a non-default one with an asynchronous annotator
    eatta.create("eatta", confident_cnn(), oracle=eatta.GroundTruthOracle())
    m = eatta.create("eatta", confident_cnn(), oracle=SimulatedAnnotator(), label_expiry=8)
    assert m.asking.pending is not None and m.asking.pending.label_expiry == 8
