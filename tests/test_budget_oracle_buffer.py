"""Budgets, oracles, the label buffer and noise sources."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import eatta
from conftest import confident_cnn
from eatta import Budget, GroundTruthOracle
from eatta.annotate.oracle import ModelOracle, OracleError, validate_labels
from eatta.buffer import LabelBuffer
from eatta.selection.perturbation import GaussianNoise, RecordedNoise

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.integers(1, 5), st.none() | st.integers(0, 20), st.integers(1, 40))
def test_budget_never_exceeded(per_batch, every, total, batches):
    b = Budget(per_batch, every=every, total=total)
    for t in range(batches):
        k = b.allowance()
        assert k <= per_batch and (t % every == 0 or k == 0)
        b.commit(k)
    expected = per_batch * len(range(0, batches, every))
    assert b.labels_used == (expected if total is None else min(total, expected))
    with pytest.raises(RuntimeError):
        Budget(1).commit(2)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6))
def test_eatta_never_exceeds_its_budget(per_batch, every, batches):
    model = confident_cnn()
    oracle = GroundTruthOracle()
    m = eatta.EATTA(
        model,
        torch.optim.SGD(eatta.configure(model), lr=0.01),
        oracle=oracle,
        budget=Budget(per_batch, every=every),
    )
    g = torch.Generator().manual_seed(per_batch * 7 + every)
    for t in range(batches):
        oracle.set_labels(torch.randint(0, 5, (12,), generator=g))
        used = m.labels_used
        m(torch.randn(12, 3, 8, 8, generator=g))
        assert m.labels_used - used <= (per_batch if t % every == 0 else 0)
    assert oracle.revealed == m.labels_used


@pytest.mark.parametrize("bad", [None, -1, 1.5, True])
def test_budget_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="per_batch"):
        Budget(bad)


@pytest.mark.parametrize("bad", [-1, 2.5, "3", True])
def test_budget_rejects_bad_totals(bad):
    with pytest.raises(ValueError, match="total"):
        Budget(1, total=bad)


def test_default_budget_is_one_label_per_batch_without_cap():
    b = Budget()
    assert (b.per_batch, b.every, b.total, b.allowance()) == (1, 1, None, 1)
    assert Budget(1, total=0).allowance() == 0  # a zero total is allowed: no labels at all


def test_abstain_is_minus_one_as_documented():
    """Oracles written without importing eatta answer -1 to abstain (the documented value)."""
    assert eatta.ABSTAIN == -1
    labels = validate_labels(torch.tensor([-1, 2]), count=2, num_classes=3)
    assert labels.tolist() == [-1, 2]


def test_ground_truth_oracle_reveals_only_selected():
    o = GroundTruthOracle()
    with pytest.raises(RuntimeError, match="set_labels"):
        o(torch.zeros(1), torch.tensor([0]))
    with o.labels(torch.tensor([4, 5, 6])):
        assert o(torch.zeros(2), torch.tensor([2, 0])).tolist() == [6, 4]
    assert o.revealed == 2 and o._labels is None
    with pytest.raises(RuntimeError, match="set_labels"):  # the context's batch is over
        o(torch.zeros(1), torch.tensor([0]))
    o.set_labels(torch.tensor([7, 8]))
    with pytest.raises(IndexError, match="beyond 2 labels"):
        o(torch.zeros(1), torch.tensor([2]))
    assert o(torch.zeros(1), torch.tensor([1])).tolist() == [8] and o.revealed == 3
    o.end_batch()
    with pytest.raises(RuntimeError, match="set_labels"):
        o(torch.zeros(1), torch.tensor([0]))
    with pytest.raises(ValueError, match="1-d"):
        o.set_labels(torch.zeros(2, 2, dtype=torch.long))


def test_budget_snapshot_restores_the_counters():
    b = Budget(2, every=2)
    b.commit(2)
    token = b.snapshot()
    b.commit(0)
    b.commit(1)
    assert (b.labels_used, b.batches_seen, b.lifetime_used) == (3, 3, 3)
    b.restore(token)
    assert (b.labels_used, b.batches_seen, b.lifetime_used, b.allowance()) == (2, 1, 2, 0)


def test_budget_total_binds_lifetime_use_across_resets():
    b = Budget(1, total=3)
    for _ in range(3):
        b.commit(b.allowance())
    assert (b.labels_used, b.lifetime_used, b.allowance()) == (3, 3, 0)
    b.reset()  # what a method's reset() (a guard's or the user's) does to its parts
    assert (b.labels_used, b.batches_seen, b.lifetime_used) == (0, 0, 3)
    assert b.allowance() == 0  # the cap is spent: a reset does not lift it
    b.commit(0)
    b.reset(lifetime=True)  # the user's explicit choice: a new total
    assert (b.lifetime_used, b.allowance()) == (0, 1)
    with pytest.raises(TypeError, match="lifetime"):
        b.reset(lifetime=1)  # type: ignore[arg-type]


def test_budget_partial_total_left_after_a_reset():
    b = Budget(2, every=2, total=5)
    used = []
    for t in range(6):
        if t == 3:
            b.reset()  # restarts the every-2 schedule: this batch may ask again
        k = b.allowance()
        b.commit(k)
        used.append(k)
    assert used == [2, 0, 2, 1, 0, 0]  # 2 + 2 before the reset, 1 left of the total after it
    assert (b.labels_used, b.lifetime_used) == (1, 5)


def test_budget_state_round_trip_keeps_the_lifetime_count():
    b = Budget(1, total=4)
    for _ in range(3):
        b.commit(1)
    b.reset()
    b.commit(1)
    state = b.state_dict()
    assert state == {
        "labels_used": 1,
        "batches_seen": 1,
        "lifetime_used": 4,
        "asked": 1,  # since the reset, as labels_used (a plain commit: asked, answered = used)
        "answered": 1,
    }
    c = Budget(1, total=4)
    c.load_state_dict(state)
    assert (c.labels_used, c.batches_seen, c.lifetime_used, c.allowance()) == (1, 1, 4, 0)
    old = Budget(1, total=4)  # a state saved before the lifetime count existed
    old.load_state_dict({"labels_used": 2, "batches_seen": 5})
    assert (old.lifetime_used, old.allowance()) == (2, 1)


def test_a_methods_reset_does_not_lift_the_total_cap():
    model = confident_cnn()
    oracle = GroundTruthOracle()
    budget = Budget(1, total=3)
    m = eatta.EATTA(
        model, torch.optim.SGD(eatta.configure(model), lr=0.01), oracle=oracle, budget=budget
    )
    g = torch.Generator().manual_seed(3)
    for t in range(6):
        if t == 3:
            m.reset()
        oracle.set_labels(torch.randint(0, 5, (12,), generator=g))
        m(torch.randn(12, 3, 8, 8, generator=g))
    assert oracle.revealed == 3 == budget.lifetime_used  # 3 before the reset, none after it
    assert m.labels_used == 0


def test_model_oracle_labels_by_argmax():
    net = torch.nn.Linear(3, 4)
    x = torch.randn(5, 3)
    assert torch.equal(ModelOracle(net)(x, torch.arange(5)), net(x).argmax(1))


def test_validate_labels():
    assert validate_labels(None, 2, 5) is None
    assert validate_labels([1, -1], 2, 5).tolist() == [1, -1]
    for bad, msg in (
        ([1.0, 2.0], "integers"),
        ([1], "shape"),
        ([1, 5], r"\[0, 5\)"),
        ("x", "not labels"),
    ):
        with pytest.raises(OracleError, match=msg):
            validate_labels(bad, 2, 5)


def test_buffer_is_fifo_and_restore_undoes_everything_since_the_snapshot():
    buf = LabelBuffer(capacity=3, batch_size=2)
    for i in range(4):
        buf.add(torch.full((1, 2), float(i)), torch.tensor([i]))
    x, y = buf.contents()
    assert y.tolist() == [1, 2, 3] and x[:, 0].tolist() == [1.0, 2.0, 3.0]
    state = buf.state_dict()
    token = buf.snapshot()
    buf.add(torch.full((2, 2), 9.0), torch.tensor([8, 9]))
    buf.sample()  # advances the generator
    buf.add(torch.full((1, 2), 7.0), torch.tensor([7]))
    assert buf.contents()[1].tolist() == [8, 9, 7]
    buf.restore(token)
    assert buf.contents()[1].tolist() == [1, 2, 3] and buf.contents()[0][:, 0].tolist() == [1, 2, 3]
    after = buf.state_dict()
    assert all(torch.equal(after[k], state[k]) for k in ("x", "y", "rng"))
    empty = LabelBuffer(capacity=2)
    token = empty.snapshot()
    empty.add(torch.ones(1, 2), torch.tensor([1]))
    empty.restore(token)
    assert len(empty) == 0 and empty._store is None
    with pytest.raises(ValueError, match="empty"):
        empty.sample()
    _bx, by = buf.sample()
    assert len(by) == 2 and len(set(by.tolist())) == 2 and set(by.tolist()) <= {1, 2, 3}
    other = LabelBuffer(capacity=3, batch_size=2)
    other.load_state_dict(buf.state_dict())
    assert torch.equal(other.sample()[1], buf.sample()[1])
    with pytest.raises(ValueError, match="shape"):
        buf.add(torch.zeros(1, 3), torch.tensor([0]))


def test_buffer_sample_draws_distinct_samples_from_its_generator():
    buf = LabelBuffer(capacity=5, batch_size=3, seed=4)
    for i in range(7):  # wraps around: holds 2..6
        buf.add(torch.full((1, 1), float(i)), torch.tensor([i]))
    g = torch.Generator().manual_seed(4)
    pick = torch.randperm(5, generator=g)[:3]
    bx, by = buf.sample()
    assert by.tolist() == (pick + 2).tolist() and bx[:, 0].tolist() == (pick + 2).float().tolist()
    small = LabelBuffer(capacity=5, batch_size=8)
    small.add(torch.zeros(2, 1), torch.tensor([0, 1]))
    assert sorted(small.sample()[1].tolist()) == [0, 1]  # min(batch_size, len)


def test_buffer_defaults_are_the_papers_and_bad_sizes_are_rejected():
    buf = LabelBuffer()
    assert (buf.capacity, buf.batch_size) == (300, 32)  # BFS = 300
    seeded = LabelBuffer(seed=0)
    for b in (buf, seeded):
        b.add(torch.arange(40.0).unsqueeze(1), torch.arange(40))
    assert torch.equal(buf.sample()[1], seeded.sample()[1])  # seed 0 by default
    for bad in ({"capacity": 0}, {"batch_size": 0}):
        with pytest.raises(ValueError, match="capacity and batch_size"):
            LabelBuffer(**bad)
    one = LabelBuffer(capacity=1, batch_size=1)  # the smallest buffer keeps the newest sample
    one.add(torch.zeros(2, 1), torch.tensor([3, 4]))
    assert one.contents()[1].tolist() == [4]


def test_buffer_to_moves_the_samples():
    buf = LabelBuffer(capacity=2)
    assert buf.to("meta") is buf  # nothing stored yet: nothing to move
    buf.add(torch.ones(1, 2), torch.tensor([1]))
    buf.to("meta")
    assert all(t.device.type == "meta" for t in buf._store)
    assert buf.generator.device.type == "cpu"


def test_noise_sources_replay_and_restore():
    g = GaussianNoise(std=0.01, seed=5)
    state = g.state_dict()
    a = g(torch.Size([4, 3]), torch.device("cpu"), torch.float32)
    g.load_state_dict(state)
    assert torch.equal(a, g(torch.Size([4, 3]), torch.device("cpu"), torch.float32))
    assert 0.001 < float(a.std()) < 0.05
    r = RecordedNoise([a])
    assert torch.equal(r(a.shape, a.device, a.dtype), a)
    with pytest.raises(IndexError, match="exhausted"):
        r(a.shape, a.device, a.dtype)
    with pytest.raises(ValueError, match="shape"):
        RecordedNoise([a])(torch.Size([2, 3]), a.device, a.dtype)
