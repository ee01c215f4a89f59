"""PendingLabels, the method's side of an asynchronous annotator: request ids, expiry at exactly
``label_expiry`` steps, matching answers, counters, reset, snapshot/restore and state round trips;
Asking's cancellations (an asynchronous annotator) and ``commit_late``'s bookkeeping."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import bytes_round_trip, nested_equal
from eatta.annotate import Answer, PendingLabels, SimulatedAnnotator
from eatta.annotate.asking import Asking
from eatta.annotate.asking import _current as current_answers
from eatta.annotate.base import QueuedAnnotator
from eatta.balance import Selection
from eatta.methods.replay import commit_late

C = 4


def batch(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 2, 2, generator=g)
    logits = torch.randn(n, C, generator=g)
    return x, logits


def asked(p: PendingLabels, indices, seed=0, kind="label", n=6):
    x, o = batch(n, seed)
    sel = Selection(torch.tensor(indices, dtype=torch.long), [int(o[i].argmax()) for i in indices])
    return p.ask(sel, x, o, kind), sel, x, o


def fresh(label_expiry=256):
    p = PendingLabels(label_expiry)
    p.nonce = "n0"  # fixed, for readable ids
    return p


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_label_expiry_must_be_a_non_negative_int(bad):
    message = f"label_expiry must be an integer >= 0 \\(steps\\), got {bad!r}"
    with pytest.raises(ValueError, match=message):
        PendingLabels(bad)


def test_requests_carry_the_selected_samples_logits_step_and_index():
    p = fresh()
    p.begin_step()
    p.begin_step()
    rs, _, x, o = asked(p, [4, 1])
    assert [r.id for r in rs] == ["n0-0-2-0", "n0-0-2-1"]
    assert [(r.step, r.index, r.kind) for r in rs] == [(2, 4, "label"), (2, 1, "label")]
    assert torch.equal(rs[0].sample, x[4]) and torch.equal(rs[1].sample, x[1])
    assert torch.equal(rs[0].logits, o[4]) and torch.equal(rs[1].logits, o[1])
    x.add_(1.0)  # the request keeps a copy, not a view of the batch
    o.add_(1.0)
    assert not torch.equal(rs[0].sample, x[4]) and not torch.equal(rs[0].logits, o[4])
    assert p.ids == ["n0-0-2-0", "n0-0-2-1"] and len(p) == 2
    assert p.stats() == {
        "requested": 2,
        "received": 0,
        "skipped": 0,
        "expired": 0,
        "refused": 0,
        "dropped": 0,
        "pending": 2,
    }


def test_an_empty_selection_asks_nothing():
    p = fresh()
    p.begin_step()
    assert (
        asked(p, [])[0] == [] and p.stats()["requested"] == 0 and p.state_dict()["selections"] == {}
    )


def test_ask_refuses_an_unknown_kind():
    p = fresh()
    p.begin_step()
    with pytest.raises(ValueError, match="unknown feedback kind 'class'"):
        asked(p, [0], kind="class")
    assert len(p) == 0


@pytest.mark.parametrize("label_expiry", [0, 1, 3])
def test_a_request_expires_exactly_after_label_expiry_steps(label_expiry):
    p = fresh(label_expiry)
    p.begin_step()
    (r,) = asked(p, [0])[0]
    for _ in range(label_expiry):  # steps 2 .. 1 + label_expiry: still answerable
        assert p.begin_step() == []
        assert p.ids == [r.id]
    assert p.begin_step() == [r.id]  # step 2 + label_expiry
    assert p.ids == [] and p.stats()["expired"] == 1
    assert p.resolve([Answer(r.id, label=1)]) == ([], [])
    assert p.stats()["refused"] == 1 and p.stats()["received"] == 0


def test_an_answer_in_the_last_step_before_expiry_is_applied_late():
    p = fresh(2)
    p.begin_step()
    (r,) = asked(p, [3])[0]
    p.begin_step()
    p.begin_step()
    current, late = p.resolve([Answer(r.id, label=2)])
    assert current == [] and len(late) == 1 and late[0].late and late[0].label == 2


def test_resolve_splits_this_steps_answers_from_earlier_ones():
    p = fresh()
    p.begin_step()
    old, old_sel, _, o1 = asked(p, [2, 5], seed=1)
    p.begin_step()
    new, new_sel, _, _ = asked(p, [0, 3], seed=2)
    current, late = p.resolve(
        [
            Answer(new[1].id, label=1),
            Answer(old[1].id, correct=True),
            Answer(old[0].id, correct=False),
            Answer(new[0].id, skip=True),
        ]
    )
    assert [(a.request.id, a.label, a.not_label, a.position, a.late) for a in current] == [
        (new[1].id, 1, None, 1, False)
    ]
    assert current[0].selection is new_sel
    pred = [int(o1[5].argmax()), int(o1[2].argmax())]
    assert [(a.request.id, a.label, a.not_label, a.position, a.late) for a in late] == [
        (old[1].id, pred[0], None, 1, True),
        (old[0].id, None, pred[1], 0, True),
    ]
    assert all(a.selection is old_sel for a in late)
    assert p.stats() == {
        "requested": 4,
        "received": 3,
        "skipped": 1,
        "expired": 0,
        "refused": 0,
        "dropped": 0,
        "pending": 0,
    }
    assert p.state_dict()["selections"] == {}  # no request of either step left


def test_a_steps_selection_is_kept_while_one_of_its_requests_waits():
    p = fresh()
    p.begin_step()
    rs, _, _, _ = asked(p, [1, 2])
    p.resolve([Answer(rs[0].id, label=0)])
    assert list(p.state_dict()["selections"]) == [1]
    p.resolve([Answer(rs[1].id, label=0)])
    assert p.state_dict()["selections"] == {}


def test_unknown_repeated_and_out_of_range_answers_are_refused_and_change_nothing_else():
    p = fresh()
    p.begin_step()
    (r,) = asked(p, [0])[0]
    current, late = p.resolve([Answer("nope", label=0), Answer(r.id, label=C)])
    assert current == late == []
    assert p.ids == [r.id]  # an out-of-range class does not close the request
    assert p.stats()["refused"] == 2 and p.stats()["received"] == 0
    current, _ = p.resolve([Answer(r.id, label=C - 1), Answer(r.id, label=0)])
    assert [a.label for a in current] == [C - 1]
    assert p.stats()["refused"] == 3 and p.stats()["received"] == 1


def test_reset_drops_everything_and_starts_a_new_epoch_of_ids():
    p = fresh()
    p.begin_step()
    rs, _, _, _ = asked(p, [0, 1])
    p.resolve([Answer(rs[0].id, label=0)])
    p.reset()
    assert p.dropped_ids == [rs[1].id] and p.ids == [] and p.step == 0 and p.epoch == 1
    assert p.stats() == {
        "requested": 2,
        "received": 1,
        "skipped": 0,
        "expired": 0,
        "refused": 0,
        "dropped": 1,
        "pending": 0,
    }  # lifetime counters stay
    assert p.resolve([Answer(rs[1].id, label=0)]) == ([], []) and p.stats()["refused"] == 1
    p.begin_step()
    (again,) = asked(p, [0])[0]
    assert again.id == "n0-1-1-0" and again.id not in rs[0].id + rs[1].id


def test_restore_brings_back_the_snapshot_and_a_retry_asks_under_new_ids():
    p = fresh(1)
    p.begin_step()
    (r,) = asked(p, [0])[0]
    token = p.snapshot()
    before = copy.deepcopy(p.state_dict())
    p.begin_step()
    retry_ids = [x.id for x in asked(p, [1, 2])[0]]
    p.resolve([Answer(r.id, label=1)])
    p.begin_step()  # expires what is left
    p.restore(token)
    after = p.state_dict()
    assert after.pop("retries") == before.pop("retries") + 1
    assert nested_equal(after, before)
    p.begin_step()
    again = [x.id for x in asked(p, [1, 2])[0]]
    assert again == ["n0-0-2r1-0", "n0-0-2r1-1"]
    assert not set(again) & set(retry_ids)


def test_state_round_trip_through_a_checkpoint_continues_identically():
    p = fresh(3)
    for step in range(3):
        p.begin_step()
        rs, _, _, _ = asked(p, [step, step + 1], seed=step)
        p.resolve([Answer(rs[0].id, label=step % C)])
    p.restore(p.snapshot())  # a retry counter to carry
    state = bytes_round_trip(p.state_dict())
    q = PendingLabels(99)
    q.load_state_dict(state)
    assert nested_equal(q.state_dict(), p.state_dict())
    assert q.label_expiry == 3 and q.nonce == "n0" and q.retries == 1
    for other in (p, q):
        other.begin_step()
    assert q.ids == p.ids
    # the loaded requests answer as the originals
    late_p = p.resolve([Answer(i, correct=False) for i in p.ids])[1]
    late_q = q.resolve([Answer(i, correct=False) for i in q.ids])[1]
    assert [
        (a.request.id, a.not_label, a.position, a.selection.indices.tolist()) for a in late_q
    ] == [(a.request.id, a.not_label, a.position, a.selection.indices.tolist()) for a in late_p]


def test_a_state_without_retries_loads_as_zero():
    p = fresh()
    p.restore(p.snapshot())
    state = p.state_dict()
    del state["retries"]
    p.load_state_dict(state)
    assert p.retries == 0


def test_to_moves_the_kept_samples():
    p = fresh()
    p.begin_step()
    asked(p, [0, 1])
    p.to("meta")
    reqs = p.state_dict()["requests"]
    assert all(
        r["sample"].device.type == "meta" and r["logits"].device.type == "meta" for r in reqs
    )
    assert [r["id"] for r in reqs] == ["n0-0-1-0", "n0-0-1-1"]


def test_ids_of_two_runs_differ():
    assert PendingLabels().nonce != PendingLabels().nonce


# -- Asking and commit_late --------------------------------------------------------------------


class Recorder(QueuedAnnotator):
    def __init__(self):
        super().__init__("label")
        self.cancelled: list[list[str]] = []

    def on_cancel(self, ids):
        self.cancelled.append(list(ids))


def test_expired_requests_are_cancelled_at_the_annotator_after_the_step_commits():
    rec = Recorder()
    asking = Asking(rec, "eatta", binary=False, label_expiry=0)
    asking.begin()
    x, o = batch()
    sel = Selection(torch.tensor([1]), [0])
    (r,) = asking.pending.ask(sel, x, o, "label")
    rec.submit([r])
    asking.committed()
    asking.begin()
    assert rec.cancelled == []  # not before the step commits
    asking.committed()
    assert rec.cancelled == [[r.id]]
    asking.committed()
    assert rec.cancelled == [[r.id]]  # once


def test_a_rolled_back_step_cancels_what_it_sent_and_not_its_expiries():
    rec = Recorder()
    asking = Asking(rec, "eatta", binary=False, label_expiry=0)
    asking.begin()
    x, o = batch()
    reqs = asking.pending.ask(Selection(torch.tensor([0]), [0]), x, o, "label")
    rec.submit(reqs)
    asking.committed()
    asking.begin()
    asking._sent = ["sent-now"]
    asking.rolled_back()
    assert rec.cancelled == [["sent-now"]]
    asking.rolled_back()
    assert rec.cancelled == [["sent-now"]]


def test_current_answers_align_labels_and_collect_the_noes():
    p = fresh()
    p.begin_step()
    rs, _, _, o = asked(p, [4, 0, 2])
    current, _ = p.resolve(
        [Answer(rs[2].id, label=3), Answer(rs[0].id, correct=False), Answer(rs[1].id, skip=True)]
    )
    labels, negatives, not_labels = current_answers(torch.tensor([4, 0, 2]), current)
    assert labels.tolist() == [-1, -1, 3]
    assert negatives.tolist() == [4] and not_labels.tolist() == [int(o[4].argmax())]
    assert negatives.dtype == not_labels.dtype == torch.long


class History:
    def __init__(self):
        self.commits = []

    def commit(self, selection, answered, labels=None):
        self.commits.append((selection.indices.tolist(), answered, labels))


class Selector:
    def __init__(self):
        self.commits = []

    def commit(self, ctx, selection, labels):
        self.commits.append(
            (ctx, selection.indices.tolist(), list(selection.classes), labels.tolist())
        )


def test_commit_late_gives_each_label_its_own_steps_selection_and_the_selector_all_of_them():
    p = fresh()
    p.begin_step()
    rs, _, _, _ = asked(p, [5, 3, 1])
    p.begin_step()
    _, late = p.resolve(
        [Answer(rs[2].id, label=2), Answer(rs[1].id, correct=False), Answer(rs[0].id, label=0)]
    )
    balance, selector, ctx = History(), Selector(), object()
    commit_late(balance, selector, late, ctx)
    assert balance.commits == [
        ([5, 3, 1], [False, False, True], [-1, -1, 2]),
        ([5, 3, 1], [True, False, False], [0, -1, -1]),
    ]
    assert selector.commits == [(ctx, [0, 1], [2, 0], [2, 0])]
    history2, selector2 = History(), Selector()
    commit_late(history2, selector2, late, None)  # no context: the selector is not told
    assert len(history2.commits) == 2 and selector2.commits == []
    commit_late(history2, selector2, [a for a in late if a.label is None], ctx)
    assert len(history2.commits) == 2 and selector2.commits == []


def test_a_simulated_annotator_and_pending_labels_agree_on_late_arrivals():
    ann = SimulatedAnnotator(delay=2)
    asking = Asking(ann, "eatta", binary=False, label_expiry=5)
    lates = []
    for t in range(6):
        asking.begin()
        x, o = batch(seed=t)
        ann.set_labels(torch.arange(6) % C)
        reqs = asking.pending.ask(Selection(torch.tensor([t % 6]), [0]), x, o, "label")
        ann.submit(reqs)
        current, late = asking.collect()
        asking.committed()
        assert current == []
        lates.append([(a.request.step, a.label) for a in late])
    assert lates == [[], [], [(1, 0)], [(2, 1)], [(3, 2)], [(4, 3)]]
