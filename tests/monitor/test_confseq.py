"""The confidence bounds: the formulas by hand, and anytime coverage by simulation."""

from __future__ import annotations

import math

import pytest
import torch

from eatta.monitor.confseq import check_level, hoeffding_radius, mixture_radius, mixture_rho


def test_mixture_radius_is_the_normal_mixture_boundary_by_hand():
    alpha, n, span = 0.05, 400, 2.0
    var = span**2 / 4
    la = 2 * math.log(1 / alpha)
    rho = var * 500 / (la + math.log(1 + la))
    v = var * n
    want = math.sqrt((v + rho) * math.log((v + rho) / (rho * alpha**2))) / n
    assert mixture_radius(n, alpha, span=span) == pytest.approx(want, rel=1e-12)
    assert mixture_rho(alpha, var, 500) == pytest.approx(rho, rel=1e-12)
    assert mixture_radius(0, alpha) == math.inf
    # wider at a stricter level, narrower with more observations, proportional to the span
    assert mixture_radius(n, 0.01) > mixture_radius(n, 0.05)
    assert mixture_radius(4 * n, alpha) < mixture_radius(n, alpha)
    assert mixture_radius(n, alpha, span=2.0) == pytest.approx(2 * mixture_radius(n, alpha))


def test_hoeffding_radius_by_hand():
    assert hoeffding_radius(100, 0.05, span=2.0) == pytest.approx(
        2.0 * math.sqrt(math.log(40.0) / 200.0), rel=1e-12
    )
    assert hoeffding_radius(0, 0.05) == math.inf


def test_the_sequence_covers_the_mean_at_every_time_at_once():
    """Bernoulli(0.3) streams of 2,000: the running 90 % sequence misses the mean at some time in
    at most 10 % of the streams (a fixed-n interval read at every time would miss far more)."""
    g = torch.Generator().manual_seed(0)
    streams, length, alpha, p = 1000, 2000, 0.1, 0.3
    x = (torch.rand(streams, length, generator=g) < p).double()
    n = torch.arange(1, length + 1, dtype=torch.float64)
    mean = x.cumsum(1) / n
    r = torch.tensor([mixture_radius(int(k), alpha) for k in range(1, length + 1)])
    ever_missed = ((mean - p).abs() > r).any(1).double().mean().item()
    assert ever_missed <= alpha
    # the fixed-sample Hoeffding radius, read at every time, is not anytime-valid here
    h = torch.tensor([hoeffding_radius(int(k), alpha) for k in range(1, length + 1)])
    assert ((mean - p).abs() > 0.5 * h).any(1).double().mean().item() > ever_missed


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, float("nan")])
def test_levels_outside_the_open_unit_interval_are_refused(bad):
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        check_level(bad)


@pytest.mark.parametrize("bad", [True, "0.05", None])
def test_levels_that_are_not_numbers_are_refused(bad):
    with pytest.raises(TypeError):
        check_level(bad)
