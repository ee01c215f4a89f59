"""The perturbation-difference selector (paper Eq. 3) inside EATTA."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import eatta
from conftest import confident_cnn
from eatta.selection.base import SelectionContext
from eatta.selection.perturbation import PerturbationSelector, RecordedNoise
from eatta.split import split_model

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["none", "last-k"]), st.integers(1, 3))
def test_eatta_labels_the_max_diff_sample_the_class_rule_allows(seed, rule, k):
    model = confident_cnn(seed=seed % 7)
    oracle = eatta.GroundTruthOracle()
    m = eatta.EATTA(
        model,
        torch.optim.SGD(eatta.configure(model), lr=0.01),
        oracle=oracle,
        budget=k,
        balance=rule,
        selector=PerturbationSelector(seed=seed),
    )
    g = torch.Generator().manual_seed(seed)
    for _ in range(3):
        recent = set(m.balance.classes)
        oracle.set_labels(torch.randint(0, 5, (10,), generator=g))
        m(torch.randn(10, 3, 8, 8, generator=g))
        rec = m.last_step
        scores, pl, picked = rec.scores, rec.pseudo_labels, rec.selected.tolist()
        first = picked[0]
        allowed = [i for i in range(10) if int(pl[i]) not in recent] if rule == "last-k" else []
        pool = allowed or list(range(10))
        assert scores[first] == scores[pool].max()
        if rule == "none":
            assert picked == torch.argsort(scores, descending=True, stable=True)[:k].tolist()


def test_diff_is_the_change_of_the_pseudo_label_probability():
    model = confident_cnn()
    eatta.configure(model)
    backbone, head = split_model(model)
    x = torch.randn(6, 3, 8, 8)
    z = backbone(x)
    eps = torch.randn(6, 16) * 0.01
    sel = PerturbationSelector(noise=RecordedNoise([eps]))
    ctx = SelectionContext(inputs=x, features=z, logits=head(z), head=head)
    with torch.no_grad():
        p, q = head(z).softmax(1), head(z + eps).softmax(1)
        yhat = p.argmax(1)
        want = (p[torch.arange(6), yhat] - q[torch.arange(6), yhat]).abs()
    torch.testing.assert_close(sel.score(ctx), want)
    assert sel.noise.position == 1  # one draw per scoring
    other = PerturbationSelector(noise=RecordedNoise([-eps]))
    assert not torch.equal(other.score(ctx), want)  # the noise matters


def test_snapshot_restores_the_noise_generator():
    model = confident_cnn()
    backbone, head = split_model(model)
    x = torch.randn(6, 3, 8, 8)
    z = backbone(x)
    ctx = SelectionContext(inputs=x, features=z, logits=head(z), head=head)
    sel = PerturbationSelector(seed=3)
    token = sel.snapshot()
    first = sel.score(ctx)
    assert not torch.equal(sel.score(ctx), first)  # the generator moved on
    sel.restore(token)
    assert torch.equal(sel.score(ctx), first)
    sel.reset()
    assert torch.equal(sel.score(ctx), first)  # seed 3 from the start again


def test_only_the_head_runs_twice():
    model = confident_cnn()
    calls = {"backbone": 0, "head": 0}
    model[0].register_forward_hook(lambda *a: calls.__setitem__("backbone", calls["backbone"] + 1))
    model[-1].register_forward_hook(lambda *a: calls.__setitem__("head", calls["head"] + 1))
    m = eatta.EATTA(
        model, torch.optim.SGD(eatta.configure(model), lr=0.01), oracle=lambda x, i: None
    )
    m(torch.randn(8, 3, 8, 8))
    assert calls == {"backbone": 1, "head": 2}


def test_defaults_are_the_papers_sigma_and_seed_zero():
    sel = PerturbationSelector()
    assert sel.noise.std == 0.01
    want = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)) * 0.01
    assert torch.equal(sel.noise(torch.Size([4, 3]), torch.device("cpu"), torch.float32), want)
