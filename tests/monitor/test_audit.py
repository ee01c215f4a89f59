"""The audit sampler: a uniform Bernoulli share, its own generator, its state."""

from __future__ import annotations

import pytest
import torch

from eatta.monitor.audit import AuditSampler, check_share


def test_share_zero_and_one():
    assert len(AuditSampler(0.0).draw(64)) == 0
    assert AuditSampler(1.0).draw(64).tolist() == list(range(64))


def test_every_position_is_audited_with_the_share():
    s = AuditSampler(0.1, seed=3)
    hits = torch.zeros(64)
    for _ in range(2000):
        hits[s.draw(64)] += 1
    rate = hits / 2000
    assert abs(rate.mean().item() - 0.1) < 0.005  # the share
    assert (rate - 0.1).abs().max().item() < 0.035  # no position favoured


def test_the_sampler_leaves_the_global_generator_alone_and_resumes_exactly():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    s = AuditSampler(0.3, seed=1)
    s.draw(32)
    assert torch.equal(torch.get_rng_state(), before)
    state = s.state_dict()
    want = [s.draw(32).tolist() for _ in range(3)]
    t = AuditSampler(0.9, seed=7)
    t.load_state_dict(state)
    assert [t.draw(32).tolist() for _ in range(3)] == want
    s.reset()
    assert s.draw(32).tolist() == AuditSampler(0.3, seed=1).draw(32).tolist()


@pytest.mark.parametrize("bad", [-0.01, 1.01, float("nan")])
def test_shares_outside_the_unit_interval_are_refused(bad):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        check_share(bad)
    with pytest.raises(ValueError):
        AuditSampler(bad)


@pytest.mark.parametrize("bad", [True, "0.1", None])
def test_shares_that_are_not_numbers_are_refused(bad):
    with pytest.raises(TypeError):
        check_share(bad)
