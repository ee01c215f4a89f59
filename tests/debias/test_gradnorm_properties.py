"""Property tests of gradient-norm debiasing (paper Eq. 4-6)."""

from __future__ import annotations

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eatta.debias import GradNormDebiaser

norms = st.floats(1e-4, 1e4, allow_nan=False)
TRUE = torch.tensor(True)


def raw(gs: float, gu: float):
    w = GradNormDebiaser(ema=False).weights(torch.tensor(gs), torch.tensor(gu), TRUE)
    return float(w.sup), float(w.unsup)


@settings(max_examples=200, deadline=None)
@given(norms, norms)
def test_weights_sum_to_two_and_lie_in_0_2(gs, gu):
    s, u = raw(gs, gu)
    assert math.isclose(s + u, 2.0, rel_tol=1e-5)
    assert 0.0 <= s <= 2.0 and 0.0 <= u <= 2.0


@settings(max_examples=200, deadline=None)
@given(norms, norms, st.floats(1e-3, 1e3))
def test_invariant_to_scaling_both_norms(gs, gu, c):
    s1, u1 = raw(gs, gu)
    s2, u2 = raw(gs * c, gu * c)
    assert math.isclose(s1, s2, rel_tol=1e-4, abs_tol=1e-6)
    assert math.isclose(u1, u2, rel_tol=1e-4, abs_tol=1e-6)


@settings(max_examples=200, deadline=None)
@given(norms, norms)
def test_swapping_norms_swaps_weights(gs, gu):
    s1, u1 = raw(gs, gu)
    s2, u2 = raw(gu, gs)
    assert math.isclose(s1, u2, rel_tol=1e-5, abs_tol=1e-6)
    assert math.isclose(u1, s2, rel_tol=1e-5, abs_tol=1e-6)


@settings(max_examples=200, deadline=None)
@given(norms, norms)
def test_larger_gradient_gets_smaller_weight(gs, gu):
    assume(not math.isclose(gs, gu, rel_tol=1e-3))
    s, u = raw(gs, gu)
    assert (s < u) == (gs > gu)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(norms, norms), min_size=1, max_size=30), st.floats(0.0, 1.0))
def test_ema_stays_bounded(seq, alpha):
    d = GradNormDebiaser(alpha=alpha)
    for gs, gu in seq:
        w = d.weights(torch.tensor(gs), torch.tensor(gu), TRUE)
        assert -1e-5 <= float(w.sup) <= 2 + 1e-5 and -1e-5 <= float(w.unsup) <= 2 + 1e-5
        assert math.isclose(float(w.sup + w.unsup), 2.0, rel_tol=1e-4)


@settings(max_examples=100, deadline=None)
@given(norms, norms, norms, norms)
def test_ema_converges_on_a_constant_input(a, b, gs, gu):
    d = GradNormDebiaser(alpha=0.8)
    d.weights(torch.tensor(a), torch.tensor(b), TRUE)  # start somewhere else
    target = raw(gs, gu)
    for _ in range(120):
        w = d.weights(torch.tensor(gs), torch.tensor(gu), TRUE)
    assert math.isclose(float(w.sup), target[0], rel_tol=1e-4, abs_tol=1e-5)


def test_degenerate_steps_do_not_touch_the_ema():
    d = GradNormDebiaser()
    w = d.weights(torch.tensor(1.0), torch.tensor(0.0), torch.tensor(False))
    assert (float(w.sup), float(w.unsup)) == (1.0, 0.0) and d.current is None
    d.weights(torch.tensor(1.0), torch.tensor(3.0), TRUE)
    before = [float(t) for t in d.current]
    w = d.weights(torch.tensor(0.0), torch.tensor(0.0), TRUE)  # both norms zero
    assert [float(t) for t in d.current] == before
    assert all(math.isfinite(float(t)) for t in w)


def test_no_gnd_and_no_ema_switches():
    gs, gu = torch.tensor(3.0), torch.tensor(1.0)
    w = GradNormDebiaser(normalize=False).weights(gs, gu, TRUE)
    assert (float(w.sup), float(w.unsup)) == (1.0, 1.0)
    d = GradNormDebiaser(ema=False)
    d.weights(torch.tensor(1.0), torch.tensor(1.0), TRUE)
    w = d.weights(gs, gu, TRUE)
    assert math.isclose(float(w.sup), 0.5) and math.isclose(float(w.unsup), 1.5)


def test_weights_have_the_documented_direction_exactly():
    w = GradNormDebiaser(ema=False).weights(torch.tensor(3.0), torch.tensor(1.0), TRUE)
    # γ_sup = 2 g_u / (g_s + g_u): the larger supervised gradient gets the smaller weight
    assert (float(w.sup), float(w.unsup)) == (0.5, 1.5)
    assert (float(w.sup_raw), float(w.unsup_raw)) == (0.5, 1.5)


@settings(max_examples=50, deadline=None)
@given(st.floats(0.05, 0.95), st.lists(st.tuples(norms, norms), min_size=2, max_size=8))
def test_ema_is_the_exact_recursion(alpha, seq):
    d = GradNormDebiaser(alpha=alpha)
    ema = None
    for gs, gu in seq:
        w = d.weights(
            torch.tensor(gs, dtype=torch.float64), torch.tensor(gu, dtype=torch.float64), TRUE
        )
        raw = (2 * gu / (gs + gu), 2 * gs / (gs + gu))
        ema = (
            raw
            if ema is None
            else tuple(alpha * e + (1 - alpha) * r for e, r in zip(ema, raw, strict=True))
        )
        assert math.isclose(float(w.sup), ema[0], rel_tol=1e-9)
        assert math.isclose(float(w.unsup), ema[1], rel_tol=1e-9)
        assert math.isclose(float(w.sup_raw), raw[0], rel_tol=1e-9)
        assert [float(t) for t in d.current] == [float(w.sup), float(w.unsup)]


def test_alpha_bounds_and_the_ema_is_kept_across_devices():
    for bad in (-0.1, 1.1):
        try:
            GradNormDebiaser(alpha=bad)
        except ValueError as err:
            assert "alpha" in str(err)
        else:
            raise AssertionError(f"alpha {bad} accepted")
    GradNormDebiaser(alpha=0.0), GradNormDebiaser(alpha=1.0)  # the bounds are allowed
    d = GradNormDebiaser(alpha=0.5)
    d.weights(torch.tensor(1.0), torch.tensor(3.0), TRUE)
    d.to("meta")
    assert d._state.device.type == "meta"  # moved, not dropped
    w = d.weights(
        torch.tensor(1.0, device="meta"), torch.tensor(3.0, device="meta"), TRUE.to("meta")
    )
    assert w.sup.device.type == "meta" and d._state.device.type == "meta"
    d.reset()
    assert d.current is None and d.state_dict() == {"state": None}


def test_snapshot_restore_and_state_round_trip():
    d = GradNormDebiaser()
    d.weights(torch.tensor(1.0), torch.tensor(3.0), TRUE)
    token = d.snapshot()
    saved = d.state_dict()
    d.weights(torch.tensor(5.0), torch.tensor(1.0), TRUE)
    d.restore(token)
    assert torch.equal(d.state_dict()["state"], saved["state"])
    e = GradNormDebiaser()
    e.load_state_dict(saved)
    assert torch.equal(e._state, d._state) and e._state is not saved["state"]
