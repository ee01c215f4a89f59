"""CEMA with oracle labels: dynamic entropy band, entropy + CE loss, replay buffer."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from _active_method_checks import (
    Answers,
    stream,
)

import eatta
from conftest import confident_cnn
from eatta.methods.cema import CEMA
from eatta.methods.registry import create
from eatta.selection import DynamicMarginSelector

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

LN5 = math.log(5)


def make(oracle, budget=1, lr=0.02, high=0.95, low=0.0, factor=1.0, **kw):
    """A wide band (almost every sample of the tiny model is inside it) unless told otherwise."""
    model = confident_cnn()
    params = eatta.configure(model)
    selector = DynamicMarginSelector(high, low, factor, strict=True)
    kw.setdefault("buffer", 8)
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    return CEMA(model, opt, oracle=oracle, budget=budget, selector=selector, **kw)


def entropies(logits):
    p = logits.softmax(1)
    return -(p * p.log()).sum(1)


@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_thresholds_follow_the_running_mean_entropy(factor):
    xs, ys = stream(5)
    oracle = Answers()
    m = make(oracle, budget=2, high=0.4, low=0.02, factor=factor)
    seen = []
    for t, (x, y) in enumerate(zip(xs, ys, strict=True)):
        oracle.y = y
        logits = m(x)
        seen.append(entropies(logits).double())
        h_all = torch.cat(seen)
        warm = float(seen[0].mean())
        high = 0.4 * LN5 * (float(h_all.mean()) / warm) * factor
        got_high, got_low = m.last_step.thresholds
        assert got_high == pytest.approx(high, rel=1e-6) and got_low == pytest.approx(0.02 * LN5)
        assert m.thresholds(5) == m.last_step.thresholds
        band = (seen[-1] > got_low) & (seen[-1] < got_high)
        assert torch.equal(m.last_step.band.cpu(), band)
        if t == 0:
            assert got_high == pytest.approx(0.4 * LN5 * factor)


def test_threshold_decreases_as_the_stream_gets_confident():
    sel = DynamicMarginSelector(0.4, 0.02, 1.0)
    from eatta.balance import NoClassBalance
    from eatta.selection.base import SelectionContext

    highs = []
    for scale in (1.0, 2.0, 4.0, 8.0):
        logits = scale * torch.linspace(-1, 1, 5).repeat(6, 1)
        ctx = SelectionContext(
            inputs=logits, features=logits, logits=logits, head=torch.nn.Identity()
        )
        sel.select(ctx, 1, NoClassBalance())
        highs.append(sel.thresholds(5)[0])
    assert all(a > b for a, b in itertools.pairwise(highs))


def test_labels_only_inside_the_band_most_uncertain_first():
    xs, ys = stream(3)
    oracle = Answers()
    m = make(oracle, budget=3, high=0.5, low=0.1)
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        logits = m(x)
        h = entropies(logits)
        band = m.last_step.band
        chosen = m.last_step.selected
        assert len(chosen) == min(3, int(band.sum()))
        assert bool(band[chosen].all())
        inside = h[band].sort(descending=True).values[: len(chosen)]
        assert torch.allclose(h[chosen], inside)


def test_loss_is_weighted_entropy_of_uploaded_plus_ce_of_labelled():
    xs, ys = stream(1)
    x, y = xs[0], ys[0]
    oracle = Answers()
    oracle.y = y
    m = make(oracle, budget=2, lr=0.1, buffer=None, alpha=3.0, beta=3.0, gamma=1.0)
    ref = confident_cnn()
    params = eatta.configure(ref)
    m(x)
    rec = m.last_step
    band, sel = rec.band, rec.selected
    logits = ref(x[band])
    h = entropies(logits)
    ent = (h * torch.exp(0.4 * LN5 - h.detach())).mean()
    pos = torch.cumsum(band.long(), 0) - 1
    ce = F.cross_entropy(logits[pos[sel]], y[sel])
    loss = 3.0 * ent + 4.0 * ce
    assert torch.allclose(rec.loss, loss.detach(), atol=1e-6)
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        expected = [p - 0.1 * g for p, g in zip(params, grads, strict=True)]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(m.params, expected, strict=True))


def test_replay_buffer_is_bounded_and_replayed():
    xs, ys = stream(6)
    oracle = Answers()
    m = make(oracle, budget=3, buffer=5)
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        m(x)
        assert len(m.buffer) <= 5
    assert len(m.buffer) == 5 and m.last_step.replayed == 5


def test_empty_band_means_no_labels_and_no_update():
    xs, ys = stream(1)
    oracle = Answers()
    m = make(oracle, budget=3, high=0.001, low=0.0, buffer=None)
    before = [p.clone() for p in m.params]
    oracle.y = ys[0]
    m(xs[0])
    assert m.labels_used == 0 and oracle.calls == [] and not bool(m.last_step.band.any())
    assert all(torch.equal(a, b) for a, b in zip(before, m.params, strict=True))


def test_registry_defaults():
    m = create("cema", confident_cnn(), oracle=Answers(), budget=2)
    assert isinstance(m, CEMA) and m.budget.per_batch == 2
    assert m.buffer is not None and m.buffer.capacity == 300
    s = m.selector
    assert (s.high_factor, s.low_factor, s.decreasing_factor, s.strict) == (0.4, 0.02, 1.0, True)
    assert m.optimizer.param_groups[0]["lr"] == 2.5e-4
    assert (m.alpha, m.beta, m.gamma) == (3.0, 3.0, 1.0)
