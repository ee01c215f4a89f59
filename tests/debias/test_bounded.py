"""The bounded (one-sided) gradient-norm debiaser of the ``eatta-stable`` variant."""

from __future__ import annotations

import math

import pytest
import torch

from eatta.debias import GradNormDebiaser
from eatta.debias.bounded import BoundedGradNormDebiaser

TRUE, FALSE = torch.tensor(True), torch.tensor(False)


def w(deb, gs: float, gu: float, has: torch.Tensor = TRUE) -> tuple[float, float]:
    out = deb.weights(torch.tensor(gs), torch.tensor(gu), has)
    return float(out.sup), float(out.unsup)


def test_large_labelled_gradient_gives_unit_weights():
    # g_s = 3, g_u = 1: faithful 2·1/4 = 0.5 and 2·3/4 = 1.5; bounded: labelled floored at 1,
    # entropy capped at 1
    assert w(GradNormDebiaser(ema=False), 3.0, 1.0) == pytest.approx((0.5, 1.5))
    assert w(BoundedGradNormDebiaser(ema=False), 3.0, 1.0) == pytest.approx((1.0, 1.0))


def test_small_labelled_gradient_keeps_the_faithful_weights():
    # g_s = 1, g_u = 3: faithful 1.5, 0.5, within the bounds, so unchanged
    assert w(BoundedGradNormDebiaser(ema=False), 1.0, 3.0) == pytest.approx((1.5, 0.5))


def test_custom_bounds_clamp_each_side():
    deb = BoundedGradNormDebiaser(ema=False, sup_floor=0.8, unsup_cap=1.1)
    assert w(deb, 3.0, 1.0) == pytest.approx((0.8, 1.1))  # 0.5 -> 0.8, 1.5 -> 1.1
    assert w(deb, 1.0, 4.0) == pytest.approx((1.6, 0.4))
    assert w(BoundedGradNormDebiaser(ema=False, sup_floor=0, unsup_cap=2), 3.0, 1.0) == (
        pytest.approx((0.5, 1.5))
    )


def test_ema_state_evolves_as_the_faithful_one_and_clamps_only_applied_weights():
    faithful, bounded = GradNormDebiaser(), BoundedGradNormDebiaser()
    for gs, gu in [(1.0, 3.0), (9.0, 1.0), (2.0, 1.0), (1.0, 1.0)]:
        fs, fu = w(faithful, gs, gu)
        bs, bu = w(bounded, gs, gu)
        assert (bs, bu) == pytest.approx((max(fs, 1.0), min(fu, 1.0)))
        assert torch.equal(faithful._state, bounded._state)
    # by hand: raws (1.5, .5), (.2, 1.8), (2/3, 4/3), (1, 1) through the 0.8 EMA
    s = 1.5
    for raw in (0.2, 2 / 3, 1.0):
        s = 0.8 * s + 0.2 * raw
    sup, unsup = bounded.current
    assert math.isclose(float(sup), max(s, 1.0), rel_tol=1e-6)
    assert math.isclose(float(unsup), min(2 - s, 1.0), rel_tol=1e-6)


def test_degenerate_step_is_weighted_as_faithful():
    deb = BoundedGradNormDebiaser()
    assert w(deb, 2.0, 0.0, FALSE) == (1.0, 0.0)  # no confident sample
    assert w(deb, 0.0, 0.0, TRUE) == (1.0, 1.0)  # both norms zero
    assert deb.current is None


def test_raw_values_stay_the_unclamped_eq_4_5():
    out = BoundedGradNormDebiaser().weights(torch.tensor(3.0), torch.tensor(1.0), TRUE)
    assert float(out.sup_raw) == pytest.approx(0.5) and float(out.unsup_raw) == pytest.approx(1.5)


def test_state_dict_reset_round_trip():
    deb = BoundedGradNormDebiaser(sup_floor=0.9)
    w(deb, 1.0, 3.0)
    w(deb, 4.0, 1.0)
    state = deb.state_dict()
    other = BoundedGradNormDebiaser(sup_floor=0.9)
    other.load_state_dict(state)
    assert w(other, 2.0, 1.0) == w(deb, 2.0, 1.0)
    deb.reset()
    assert deb.current is None and deb.state_dict()["state"] is None
    with pytest.raises(ValueError, match="sup_floor"):
        BoundedGradNormDebiaser().load_state_dict(state)


@pytest.mark.parametrize(
    ("kw", "err"),
    [
        ({"sup_floor": -0.1}, ValueError),
        ({"unsup_cap": 2.5}, ValueError),
        ({"sup_floor": "1"}, TypeError),
        ({"unsup_cap": True}, TypeError),
        ({"alpha": 1.5}, ValueError),
    ],
)
def test_bad_bounds_are_rejected(kw, err):
    with pytest.raises(err):
        BoundedGradNormDebiaser(**kw)
