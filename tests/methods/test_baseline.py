"""The ATTA baseline: TENT + random labels + Eq. 2 with unit weights."""

from __future__ import annotations

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
from eatta.balance import NoClassBalance
from eatta.methods.baseline import baseline
from eatta.methods.eatta import EATTA
from eatta.methods.registry import create
from eatta.selection import RandomSelector

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


def make(oracle, budget=1, lr=0.05, seed=0, **kw):
    model = confident_cnn()
    params = eatta.configure(model)
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    return baseline(model, opt, oracle=oracle, budget=budget, seed=seed, **kw)


def test_components_are_random_no_balance_unit_weights():
    m = make(Answers())
    assert isinstance(m.selector, RandomSelector)
    assert isinstance(m.balance, NoClassBalance)
    assert m.debiaser.normalize is False


def test_loss_weights_are_exactly_one_and_step_matches_eq2():
    xs, ys = stream(1)
    x, y = xs[0], ys[0]
    oracle = Answers()
    oracle.y = y
    m = make(oracle, budget=2, lr=0.1)
    # the same step by hand on a copy: CE on the labelled + mean entropy of confident unlabelled
    ref = confident_cnn()
    ref_params = eatta.configure(ref)
    logits = ref(x)
    m(x)
    rec = m.last_step
    assert all(float(w) == 1.0 for w in rec.weights)
    sel = rec.selected
    log_p = logits.log_softmax(1)
    h = -(log_p.exp() * log_p).sum(1)
    mask = h.detach() < 0.4 * math.log(5)
    mask[sel] = False
    assert mask.any()
    loss = F.cross_entropy(logits[sel], y[sel]) + h[mask].mean()
    grads = torch.autograd.grad(loss, ref_params)
    with torch.no_grad():
        expected = [p - 0.1 * g for p, g in zip(ref_params, grads, strict=True)]
    got = [p for p in m.params]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected, strict=True))


def test_selection_is_uniformly_random_given_the_seed():
    xs, ys = stream(3)
    oracle = Answers()
    m = make(oracle, budget=3, seed=7)
    g = torch.Generator().manual_seed(7)
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        m(x)
        draws = torch.rand(len(x), generator=g, dtype=torch.float64)
        expected = torch.argsort(draws, descending=True, stable=True)[:3]
        assert m.last_step.selected.tolist() == expected.tolist()


def test_random_selection_frequencies_are_uniform():
    sel = RandomSelector(seed=3)
    from eatta.selection.base import SelectionContext

    logits = torch.zeros(6, 4)
    ctx = SelectionContext(inputs=logits, features=logits, logits=logits, head=torch.nn.Identity())
    counts = torch.zeros(6)
    for _ in range(3000):
        counts[sel.select(ctx, 1, NoClassBalance()).indices] += 1
    assert counts.sum() == 3000
    assert bool((counts > 400).all() and (counts < 600).all()), counts.tolist()


def test_registry_defaults_are_tents():
    m = create("baseline", confident_cnn(), oracle=Answers(), budget=2)
    assert isinstance(m, EATTA) and isinstance(m.selector, RandomSelector)  # an EATTA, so built
    assert m.budget.per_batch == 2
    group = m.optimizer.param_groups[0]
    assert isinstance(m.optimizer, torch.optim.SGD)
    assert group["lr"] == 2.5e-4 and group["momentum"] == 0.9
    for dataset in ("imagenet-r", "imagenet-a"):
        m = create("baseline", confident_cnn(), dataset=dataset, oracle=Answers())
        assert m.optimizer.param_groups[0]["lr"] == 2.5e-4
    pacs = create("baseline", confident_cnn(), dataset="pacs", oracle=Answers())
    assert isinstance(pacs.optimizer, torch.optim.Adam)
    assert pacs.optimizer.param_groups[0]["lr"] == 5e-3
    with pytest.raises(ValueError, match="active"):
        create("baseline", confident_cnn())
