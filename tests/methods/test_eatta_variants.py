"""The ``eatta-stable`` registry entry: EATTA with the bounded debiaser; faithful EATTA intact."""

from __future__ import annotations

import math

import pytest
import torch
from _active_method_checks import check_reset_is_exact, check_state_dict_round_trip

from conftest import confident_cnn
from eatta import EATTA, GroundTruthOracle
from eatta.debias import GradNormDebiaser
from eatta.debias.bounded import BoundedGradNormDebiaser
from eatta.methods.registry import available, create, get_spec

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


def test_registered_with_eattas_defaults():
    assert "eatta-stable" in available() and get_spec("eatta-stable").active
    for dataset in ("digits-c", "imagenet-c", "pacs"):
        hp = get_spec("eatta-stable").hparams(dataset, {})
        base = get_spec("eatta").hparams(dataset, {})
        late = {"late_weight": "similarity", "late_half_life": 2.0, "late_drift_scale": 0.25}
        late |= {"late_entropy_filter": "eta", "late_anchor": 0.1, "late_replay": 0}
        assert hp == {**base, "sup_floor": 1.0, "unsup_cap": 1.0, **late}


def test_builds_eatta_with_the_bounded_debiaser_and_the_same_optimizer():
    stable = create("eatta-stable", confident_cnn(), dataset="digits-c", oracle=GroundTruthOracle())
    faithful = create("eatta", confident_cnn(), dataset="digits-c", oracle=GroundTruthOracle())
    assert isinstance(stable, EATTA) and isinstance(stable.debiaser, BoundedGradNormDebiaser)
    assert type(faithful.debiaser) is GradNormDebiaser  # the faithful default is untouched
    assert stable.optimizer.defaults == faithful.optimizer.defaults
    custom = create(
        "eatta-stable", confident_cnn(), oracle=GroundTruthOracle(), sup_floor=0.5, ema=False
    )
    assert custom.debiaser.sup_floor == 0.5 and custom.debiaser.ema is False
    off = create("eatta-stable", confident_cnn(), oracle=GroundTruthOracle(), gnd=False)
    assert off.debiaser.needs_grad_norms is False


def test_bad_option_raises_before_the_model_is_touched():
    model = confident_cnn()
    before = [p.requires_grad for p in model.parameters()]
    with pytest.raises(ValueError, match="sup_floor"):
        create("eatta-stable", model, oracle=GroundTruthOracle(), sup_floor=3.0)
    assert [p.requires_grad for p in model.parameters()] == before


def test_step_applies_the_bounded_weights_to_the_recorded_norms(batch):
    x, y = batch
    m = create("eatta-stable", confident_cnn(), oracle=GroundTruthOracle(), lr=0.05)
    start = [p.detach().clone() for p in m.params]
    for step in range(3):
        m(x, labels=y)
        rec = m.last_step
        gs, gu = float(rec.grad_norm_sup), float(rec.grad_norm_unsup)
        assert math.isclose(float(rec.weights.sup_raw), 2 * gu / (gs + gu), rel_tol=1e-5)
        assert float(rec.weights.sup) >= 1.0 and float(rec.weights.unsup) <= 1.0
        if step == 0:  # first EMA value = raw value, then clamped
            assert math.isclose(float(rec.weights.sup), max(2 * gu / (gs + gu), 1.0), rel_tol=1e-5)
    assert any(not torch.equal(p, p0) for p, p0 in zip(m.params, start, strict=True))


def test_reset_and_state_round_trip_of_the_method(batch):
    x, y = batch
    m = create("eatta-stable", confident_cnn(), oracle=GroundTruthOracle(), lr=0.05)
    m(x, labels=y)
    saved = m.state_dict()
    twin = create("eatta-stable", confident_cnn(), oracle=GroundTruthOracle(), lr=0.05)
    twin.load_state_dict(saved)
    assert torch.equal(twin.debiaser._state, m.debiaser._state)
    assert torch.equal(twin(x, labels=y), m(x, labels=y))
    m.reset()
    assert m.debiaser.current is None


def _make(oracle, budget=1, **kw):
    return create("eatta-stable", confident_cnn(), oracle=oracle, budget=budget, lr=0.05, **kw)


def test_keeps_the_active_method_contract(tmp_path):
    check_reset_is_exact(_make)
    check_state_dict_round_trip(_make, tmp_path)
