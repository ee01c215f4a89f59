"""Property tests of selection under the class balances (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eatta.balance import LastKClasses, NoClassBalance, ReferenceBalance

batches = st.integers(1, 24).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0, 1, allow_nan=False, width=32), min_size=n, max_size=n, unique=True),
        st.lists(st.integers(0, 5), min_size=n, max_size=n),
        st.integers(1, 6),
    )
)
streams = st.lists(batches, min_size=1, max_size=6)


def as_tensors(scores, labels):
    return torch.tensor(scores, dtype=torch.float32), torch.tensor(labels)


@settings(max_examples=150, deadline=None)
@given(streams)
def test_indices_unique_in_range_and_within_k(stream):
    for balance in (NoClassBalance(), LastKClasses(2), ReferenceBalance()):
        for scores, labels, k in stream:
            s, y = as_tensors(scores, labels)
            sel = balance.plan(s, y, k)
            idx = sel.indices.tolist()
            assert len(idx) == len(set(idx)) <= min(k, len(scores))
            assert all(0 <= i < len(scores) for i in idx)
            assert len(idx) >= 1  # every rule labels something when a label is allowed
            balance.commit(sel, [True] * len(idx))


@settings(max_examples=150, deadline=None)
@given(streams)
def test_last_k_chooses_the_best_allowed_sample(stream):
    balance = LastKClasses(2)
    for scores, labels, _ in stream:
        s, y = as_tensors(scores, labels)
        recent = set(balance.classes)
        (i,) = balance.plan(s, y, 1).indices.tolist()
        allowed = [j for j in range(len(scores)) if labels[j] not in recent]
        pool = allowed or list(range(len(scores)))
        assert scores[i] == max(scores[j] for j in pool)
        balance.commit(balance.plan(s, y, 1), [True])
        assert balance.classes[-1] == labels[i] and len(balance.classes) <= 2


@settings(max_examples=150, deadline=None)
@given(streams)
def test_reference_history_invariants(stream):
    balance = ReferenceBalance()
    for scores, labels, k in stream:
        s, y = as_tensors(scores, labels)
        before = list(balance.classes)
        sel = balance.plan(s, y, k)
        assert balance.classes == before  # planning changes nothing
        order = sorted(range(len(scores)), key=lambda j: -scores[j])
        positions = [order.index(i) for i in sel.indices.tolist()]
        assert positions == sorted(positions)  # sorted-position order
        if not before:  # empty balance: the top-m
            assert positions == list(range(min(k, len(scores))))
        balance.commit(sel, [True] * len(positions))
        if before:  # a balancing step trims to the last class; a fallback leaves it as it was
            assert len(balance.classes) <= 2 or balance.classes == before
        picked = sel.indices.tolist()
        for c, d in balance.stored_diff.items():  # a class labelled now stores a diff of this batch
            if c in [labels[j] for j in picked]:
                assert any(labels[j] == c and abs(scores[j] - d) < 1e-6 for j in picked)


@settings(max_examples=100, deadline=None)
@given(batches)
def test_no_class_balance_is_top_k(batch):
    scores, labels, k = batch
    s, y = as_tensors(scores, labels)
    got = NoClassBalance().plan(s, y, k).indices.tolist()
    assert got == sorted(range(len(scores)), key=lambda j: -scores[j])[: min(k, len(scores))]


def test_reference_rule_replacement_branch():
    h = ReferenceBalance()
    y = torch.tensor([0, 1, 2, 0])
    first = h.plan(torch.tensor([0.9, 0.1, 0.2, 0.3]), y, 1)
    h.commit(first, [True])  # labels class 0 with diff 0.9
    assert h.classes == [0] and h.stored_diff == {0: torch.tensor(0.9).item()}
    # top candidate is class 0 again but with a smaller diff: replaced by the next unseen class
    second = h.plan(torch.tensor([0.5, 0.1, 0.2, 0.3]), y, 1)
    assert second.indices.tolist() == [2]
    # a larger diff than stored keeps the candidate even though its class is recent
    third = h.plan(torch.tensor([0.95, 0.1, 0.2, 0.3]), y, 1)
    assert third.indices.tolist() == [0]


def test_abstained_samples_do_not_enter_history():
    h = LastKClasses(3)
    sel = h.plan(torch.tensor([0.9, 0.5, 0.1]), torch.tensor([2, 1, 0]), 2)
    h.commit(sel, [False, True])
    assert h.classes == [1]


def test_history_state_round_trip():
    for cls in (LastKClasses, ReferenceBalance):
        h = cls()
        sel = h.plan(torch.tensor([0.9, 0.5, 0.1]), torch.tensor([2, 1, 0]), 2)
        h.commit(sel, [True, True])
        g = cls()
        g.load_state_dict(h.state_dict())
        assert g.state_dict() == h.state_dict()
        s2 = torch.tensor([0.3, 0.8, 0.7])
        assert torch.equal(
            g.plan(s2, torch.tensor([2, 1, 0]), 1).indices,
            h.plan(s2, torch.tensor([2, 1, 0]), 1).indices,
        )


def test_reference_trim_keeps_only_the_last_class():
    h = ReferenceBalance()
    y = torch.tensor([0, 1, 2, 3])
    h.commit(h.plan(torch.tensor([0.9, 0.1, 0.2, 0.3]), y, 1), [True])
    assert h.classes == [0]
    # balancing step with two labels: balance [0, 3, 2] is longer than 2 -> only [2] is kept
    sel = h.plan(torch.tensor([0.1, 0.2, 0.8, 0.9]), y, 2)
    assert sel.indices.tolist() == [3, 2]
    h.commit(sel, [True, True])
    assert h.classes == [2]
    assert h.stored_diff == {0: pytest.approx(0.9), 3: pytest.approx(0.9), 2: pytest.approx(0.8)}


def test_reference_first_selection_is_not_trimmed():
    h = ReferenceBalance()
    sel = h.plan(torch.tensor([0.9, 0.8, 0.7]), torch.tensor([0, 1, 2]), 3)
    h.commit(sel, [True, True, True])
    assert h.classes == [0, 1, 2]  # the reference trims only in its balancing branch


def test_last_k_records_the_oracle_labels_and_restores():
    h = LastKClasses(2)
    sel = h.plan(torch.tensor([0.9, 0.5, 0.1]), torch.tensor([2, 1, 0]), 2)
    token = h.snapshot()
    h.commit(sel, [True, True], labels=[4, 3])
    assert h.classes == [4, 3]
    h.commit(sel, [True, False], labels=[0, -1])
    assert h.classes == [3, 0]  # the last K = 2 annotated classes
    h.restore(token)
    assert h.classes == []
    # a candidate whose pseudo-label was annotated recently is skipped
    h.commit(sel, [True, False], labels=[1, -1])
    assert h.plan(torch.tensor([0.9, 0.5]), torch.tensor([1, 0]), 1).indices.tolist() == [1]


@pytest.mark.parametrize("balance", [LastKClasses(), NoClassBalance()], ids=["last-k", "none"])
def test_the_highest_scores_are_picked_first(balance):
    sel = balance.plan(torch.tensor([0.1, 0.9, 0.5, 0.7]), torch.tensor([0, 1, 2, 3]), 2)
    assert sel.indices.tolist() == [1, 3]


def test_last_k_defaults_to_the_last_two_classes_and_accepts_zero():
    h = LastKClasses()
    sel = h.plan(torch.tensor([0.9, 0.5, 0.1]), torch.tensor([2, 1, 0]), 3)
    h.commit(sel, [True, True, True], labels=[4, 3, 2])
    assert h.classes == [3, 2]
    none = LastKClasses(0)  # remembers nothing: plain top-k
    none.commit(sel, [True, True, True], labels=[4, 3, 2])
    assert none.classes == []
    assert none.plan(torch.tensor([0.9, 0.5]), torch.tensor([4, 3]), 1).indices.tolist() == [0]
    with pytest.raises(ValueError, match="k_recent"):
        LastKClasses(-1)


def test_reference_snapshot_restores_history_and_diffs():
    h = ReferenceBalance()
    h.commit(h.plan(torch.tensor([0.9, 0.1]), torch.tensor([0, 1]), 1), [True])
    token, state = h.snapshot(), h.state_dict()
    h.commit(h.plan(torch.tensor([0.1, 0.95]), torch.tensor([0, 1]), 1), [True])
    assert h.state_dict() != state
    h.restore(token)
    assert h.state_dict() == state


def trimmed_reference() -> ReferenceBalance:
    """History [2] after a trim, with diffs stored for classes 0, 3 and 2."""
    h = ReferenceBalance()
    y = torch.tensor([0, 1, 2, 3])
    h.commit(h.plan(torch.tensor([0.9, 0.1, 0.2, 0.3]), y, 1), [True])
    h.commit(h.plan(torch.tensor([0.1, 0.2, 0.8, 0.9]), y, 2), [True, True])
    assert h.classes == [2] and sorted(h.stored_diff) == [0, 2, 3]
    return h


def test_reference_takes_a_class_outside_the_history_whatever_its_stored_diff():
    h = trimmed_reference()
    # class 0 (stored 0.9) tops the batch with 0.5: it is no longer in the balance, so it is taken
    sel = h.plan(torch.tensor([0.5, 0.1, 0.2, 0.3]), torch.tensor([0, 1, 2, 3]), 1)
    assert sel.indices.tolist() == [0]


def test_reference_fallback_takes_the_top_m_without_extending_the_history():
    h = trimmed_reference()
    # the top candidate is class 2 (in the balance) below its stored 0.8, and every other
    # sample is class 2 too: nothing qualifies, so the top one is taken and the balance kept
    y = torch.tensor([2, 2, 2])
    sel = h.plan(torch.tensor([0.5, 0.1, 0.2]), y, 1)
    assert sel.indices.tolist() == [0] and sel.update["extend"] is False
    h.commit(sel, [True])
    assert h.classes == [2] and h.stored_diff[2] == pytest.approx(0.5)


def test_reference_restore_brings_back_a_history_unlike_its_diff_keys():
    h = trimmed_reference()
    token, state = h.snapshot(), h.state_dict()
    h.commit(h.plan(torch.tensor([0.1, 0.95, 0.2, 0.3]), torch.tensor([0, 1, 2, 3]), 1), [True])
    h.restore(token)
    assert h.state_dict() == state and h.classes == [2]


@pytest.mark.parametrize("balance", [LastKClasses(), ReferenceBalance()], ids=["last-k", "ref"])
def test_commit_rejects_answers_of_the_wrong_length(balance):
    sel = balance.plan(torch.tensor([0.9, 0.5, 0.1]), torch.tensor([2, 1, 0]), 2)
    with pytest.raises(ValueError):
        balance.commit(sel, [True], labels=[2, 1])


def test_reference_state_with_unpaired_diffs_is_rejected():
    state = trimmed_reference().state_dict()
    state["stored_diff"] = state["stored_diff"][:-1]
    with pytest.raises(ValueError):
        ReferenceBalance().load_state_dict(state)


def test_reference_keeps_a_recent_class_that_equals_its_stored_diff():
    # only a score strictly below the stored one sends the pick down the batch
    h = ReferenceBalance()
    y = torch.tensor([0, 1, 2, 0])
    h.commit(h.plan(torch.tensor([0.9, 0.1, 0.2, 0.3]), y, 1), [True])
    assert h.plan(torch.tensor([0.9, 0.1, 0.2, 0.3]), y, 1).indices.tolist() == [0]


@pytest.mark.parametrize(
    "balance",
    [LastKClasses(), NoClassBalance(), ReferenceBalance()],
    ids=["last-k", "none", "ref"],
)
def test_tied_scores_are_taken_in_batch_order(balance):
    # a stable sort: the same picks on every machine (an unstable CPU sort reorders 20+ ties)
    n = 64
    sel = balance.plan(torch.full((n,), 0.5), torch.arange(n) % 10, 3)
    assert sel.indices.tolist() == [0, 1, 2]
