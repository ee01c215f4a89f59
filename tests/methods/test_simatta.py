"""SimATTA: incremental-clustering anchors, source-like pseudo-labels, bounded buffers."""

from __future__ import annotations

import pytest
import torch
from _active_method_checks import (
    Answers,
    stream,
)

import eatta
from conftest import confident_cnn
from eatta.balance import NoClassBalance
from eatta.configure import batch_statistics_of
from eatta.methods.registry import create
from eatta.methods.simatta import SimATTA
from eatta.selection.base import SelectionContext

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


def make(oracle, budget=1, lr=0.02, params="norm", **kw):
    model = confident_cnn()
    chosen = eatta.configure(model, params)
    kw.setdefault("steps", 2)
    kw.setdefault("train_batch_size", 8)
    kw.setdefault("high_entropy_bound", 0.0)  # every sample is a clustering candidate
    kw.setdefault("low_entropy_bound", 1.0)
    opt = torch.optim.SGD(chosen, lr=lr, momentum=0.9)
    return SimATTA(model, opt, oracle=oracle, budget=budget, **kw)


def test_anchors_and_buffers_stay_bounded():
    xs, ys = stream(12)
    oracle = Answers()
    m = make(oracle, budget=3, max_anchors=4, buffer_size=10, steps=1)
    counts = []
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        m(x)
        counts.append(m.selector.num_anchors)
        assert len(m.labelled) <= 10 and len(m.source_buffer) <= 10
    assert max(counts) == 4 and counts[0] == 3
    assert m.labels_used == 36
    # the anchors are the last four labelled samples, oldest first
    last = torch.cat([m.last_step.labels])
    assert torch.equal(m.selector.labels[-len(last) :], last)


def test_new_anchors_are_the_samples_nearest_the_new_centroids():
    xs, ys = stream(2)
    oracle = Answers()
    m = make(oracle, budget=3)
    oracle.y = ys[0]
    m(xs[0])
    x = xs[1]
    backbone, head = m.split
    with torch.no_grad():
        z = backbone(x)
        o = head(z)
    ctx = SelectionContext(inputs=x, features=z, logits=o, head=head, backbone=backbone)
    anchors = m.selector.features.clone()
    expected = m.selector.select(ctx, 3, NoClassBalance())
    clustering = m.selector.cluster(ctx, 3)
    oracle.y = ys[1]
    m(x)
    assert m.last_step.selected.tolist() == expected.indices.tolist()
    assert sorted(expected.indices.tolist()) == sorted(clustering.representatives.tolist())
    centres = torch.cat([anchors, clustering.centroids])
    dist = torch.cdist(z, centres)
    for j, c in enumerate(clustering.centroids):
        members = (dist.argmin(1) == len(anchors) + j).nonzero().flatten()
        if len(members):  # the centroid is its members' mean, its representative the nearest
            assert torch.allclose(c, z[members].mean(0), atol=1e-5)
            nearest = members[dist[members, len(anchors) + j].argmin()]
            assert int(nearest) in clustering.representatives.tolist()


def test_source_like_samples_are_the_teachers_confident_predictions():
    xs, ys = stream(2)
    oracle = Answers()
    m = make(oracle, budget=1, source_per_batch=5, low_entropy_bound=0.5)
    teacher_before = [p.clone() for p in m.teacher.parameters()]
    taken = 0
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        with torch.no_grad(), batch_statistics_of(m.teacher):  # read as SimATTA reads it
            t = m.teacher(x)
        m(x)
        p = t.softmax(1)
        h = -(p * p.log()).sum(1)
        chosen = m.last_step.source_like
        taken += len(chosen)
        assert len(chosen) <= 5 and bool((h[chosen] < 0.5).all())
        rest = torch.ones(len(x), dtype=torch.bool)
        rest[chosen] = False
        if len(chosen) < 5:  # every sample under the bound was taken
            assert not bool((h[rest] < 0.5).any())
        if len(chosen) and bool(rest.any()):
            assert float(h[chosen].max()) <= float(h[rest].min())
    assert taken > 0
    pairs = zip(teacher_before, m.teacher.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert m.teacher is not None and "_teacher" not in dict(m.named_modules())
    assert not any(k.startswith("_teacher") for k in m.state_dict())


def test_mixing_weight_is_the_labelled_share():
    xs, ys = stream(1)
    oracle = Answers()
    oracle.y = ys[0]
    m = make(oracle, budget=2, low_entropy_bound=10.0, source_per_batch=6)
    m(xs[0])
    assert len(m.labelled) == 2 and len(m.source_buffer) == 6
    assert m.last_step.alpha == pytest.approx(2 / 8)
    assert len(m.last_step.losses) == 2


def test_registry_defaults():
    m = create("simatta", confident_cnn(), oracle=Answers(), budget=3)
    assert isinstance(m, SimATTA) and m.budget.per_batch == 3
    assert m.selector.max_anchors == 50 and m.labelled.capacity == 300 and m.steps == 10
    assert m.optimizer.param_groups[0]["lr"] == 2.5e-4
    # SimATTA fine-tunes every parameter
    assert len(m.params) == len(list(m.model.parameters()))
    pacs = create("simatta", confident_cnn(), dataset="pacs", oracle=Answers())
    assert isinstance(pacs.optimizer, torch.optim.Adam) and pacs.steps == 30
