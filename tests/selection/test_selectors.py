"""The selection alternatives of Table 7: hand-computed scores, top-k exactness, properties."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import eatta
from conftest import confident_cnn, nested_equal
from eatta.balance import LastKClasses, NoClassBalance, ReferenceBalance
from eatta.methods.registry import create
from eatta.selection import (
    SELECTORS,
    DynamicMarginSelector,
    EntropyMarginSelector,
    IncrementalClusteringSelector,
    LeastConfidenceSelector,
    MaxEntropySelector,
    MinMarginSelector,
    PerturbationSelector,
    PLPDSelector,
    RandomSelector,
    make_selector,
)
from eatta.selection.base import SelectionContext
from eatta.selection.clustering import cluster_with_anchors
from eatta.selection.plpd import patch_shuffle

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

# Six 4-class predictions with hand-computed statistics (natural log):
#   entropy      0.1677 1.3863 1.1683 1.1935 0.9405 0.7663
#   1 - max p    0.03   0.75   0.5    0.6    0.3    0.4
#   top-2 margin 0.96   0      0.2    0      0.6    0.22
PROBS = torch.tensor(
    [
        [0.97, 0.01, 0.01, 0.01],
        [0.25, 0.25, 0.25, 0.25],
        [0.5, 0.3, 0.1, 0.1],
        [0.4, 0.4, 0.1, 0.1],
        [0.7, 0.1, 0.1, 0.1],
        [0.6, 0.38, 0.01, 0.01],
    ],
    dtype=torch.float64,
)
ENTROPY = [0.1677, 1.3863, 1.1683, 1.1935, 0.9405, 0.7663]


def ctx_from_logits(logits, features=None, inputs=None, head=None, backbone=None):
    features = logits if features is None else features
    inputs = features if inputs is None else inputs
    head = head if head is not None else nn.Identity()
    return SelectionContext(inputs, features, logits, head, backbone)


def pick(selector, ctx, k, balance=None):
    return selector.select(ctx, k, balance or NoClassBalance()).indices.tolist()


def test_hand_computed_entropies_match():
    ctx = ctx_from_logits(PROBS.log())
    assert ctx.entropy.tolist() == pytest.approx(ENTROPY, abs=1e-4)


@pytest.mark.parametrize(
    ("selector", "k", "expected"),
    [
        (MaxEntropySelector(), 4, [1, 3, 2, 4]),
        (LeastConfidenceSelector(), 4, [1, 3, 2, 5]),
        (MinMarginSelector(), 4, [1, 3, 2, 5]),  # margin ties 1, 3 keep batch order
        # margin 0.4 ln 4 = 0.5545: only sample 0 is below, the rest follow nearest-first
        (EntropyMarginSelector(), 3, [0, 5, 4]),
        # margin 1.0: 4, 5, 0 below (most uncertain first), then 2 (1.168) just above
        (EntropyMarginSelector(margin=1.0), 4, [4, 5, 0, 2]),
        # band (0.02 ln 4, 0.8 ln 4) = (0.0277, 1.109) holds 4, 5, 0; then the nearest: 2
        (DynamicMarginSelector(high_factor=0.8), 4, [4, 5, 0, 2]),
        (DynamicMarginSelector(high_factor=0.8, strict=True), 4, [4, 5, 0]),
    ],
)
def test_hand_computed_selection(selector, k, expected):
    assert pick(selector, ctx_from_logits(PROBS.log()), k) == expected


def tiny_backbone_head():
    model = confident_cnn()
    eatta.configure(model)
    return model[:-1], model[-1]


def image_ctx(seed=0, batch=12):
    backbone, head = tiny_backbone_head()
    x = torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        z = backbone(x)
        o = head(z)
    return SelectionContext(x, z, o, head, backbone)


def all_selectors():
    return {
        "perturbation": PerturbationSelector(std=0.5, seed=1),
        "max-entropy": MaxEntropySelector(),
        "least-confidence": LeastConfidenceSelector(),
        "min-margin": MinMarginSelector(),
        "random": RandomSelector(seed=2),
        "entropy-margin": EntropyMarginSelector(),
        "plpd": PLPDSelector(seed=3),
        "k-clustering": IncrementalClusteringSelector(entropy_bound=0.0),
        "dynamic-margin": DynamicMarginSelector(),
    }


@pytest.mark.parametrize("name", sorted(SELECTORS))
@pytest.mark.parametrize("k", [1, 3, 12, 20])
def test_selection_is_exactly_the_top_k_of_the_score(name, k):
    sel = all_selectors()[name]
    ctx = image_ctx()
    state = sel.state_dict()
    scores = sel.score(ctx, k) if name == "k-clustering" else sel.score(ctx)
    sel.load_state_dict(state)
    selection = sel.select(ctx, k, NoClassBalance())
    expected = torch.argsort(scores, descending=True, stable=True)[:k]
    assert selection.indices.tolist() == expected.tolist()
    assert torch.equal(selection.update["scores"], scores)
    assert len(selection.indices) == min(k, 12)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 20),
    classes=st.integers(2, 9),
    k=st.integers(0, 24),
    seed=st.integers(0, 2**16),
    name=st.sampled_from(
        [
            "max-entropy",
            "least-confidence",
            "min-margin",
            "random",
            "entropy-margin",
            "dynamic-margin",
            "k-clustering",
        ]
    ),
    spread=st.floats(0.0, 6.0),
)
def test_property_indices_unique_in_range_and_count(batch, classes, k, seed, name, spread):
    g = torch.Generator().manual_seed(seed)
    logits = spread * torch.randn(batch, classes, generator=g)
    feats = torch.randn(batch, 3, generator=g)
    ctx = ctx_from_logits(logits, features=feats)
    sel = make_selector(name, seed=seed)
    idx = sel.select(ctx, k, NoClassBalance()).indices
    assert idx.dtype == torch.long and len(idx) == min(k, batch)
    assert len(set(idx.tolist())) == len(idx)
    assert all(0 <= i < batch for i in idx.tolist())
    for balance in (ReferenceBalance(), LastKClasses()):
        balance.plan(torch.rand(batch, generator=g), logits.argmax(1), 1)  # nothing committed
        balance.commit(balance.plan(torch.rand(batch, generator=g), logits.argmax(1), 1), [True])
        idx = make_selector(name, seed=seed).select(ctx, k, balance).indices
        assert len(idx) <= k and len(set(idx.tolist())) == len(idx)
        assert all(0 <= i < batch for i in idx.tolist())


def test_random_selector_state_round_trip_and_reset():
    ctx = ctx_from_logits(torch.zeros(10, 3))
    sel = RandomSelector(seed=5)
    first = pick(sel, ctx, 3)
    state = sel.state_dict()
    second = pick(sel, ctx, 3)
    sel.load_state_dict(state)
    assert pick(sel, ctx, 3) == second
    sel.reset()
    assert pick(sel, ctx, 3) == first
    other = RandomSelector(seed=6)
    assert [pick(other, ctx, 3) for _ in range(5)] != [pick(sel, ctx, 3) for _ in range(5)]


# -- PLPD --------------------------------------------------------------------------------------
def test_patch_shuffle_permutes_whole_patches():
    x = torch.arange(2 * 1 * 8 * 8, dtype=torch.float32).reshape(2, 1, 8, 8)
    g = torch.Generator().manual_seed(0)
    out = patch_shuffle(x, 4, g)

    def patches(t):
        return {
            tuple(t[:, i : i + 2, j : j + 2].flatten().tolist())
            for i in (0, 2, 4, 6)
            for j in (0, 2, 4, 6)
        }

    for b in range(2):
        assert patches(out[b]) == patches(x[b])
    assert not torch.equal(out, x)
    assert torch.equal(patch_shuffle(x, 1, g), x)
    odd = torch.randn(2, 3, 10, 9)
    assert patch_shuffle(odd, 4, g).shape == odd.shape
    with pytest.raises(ValueError, match="images"):
        patch_shuffle(torch.randn(2, 8), 4, g)
    with pytest.raises(ValueError, match="grid"):
        patch_shuffle(torch.randn(1, 1, 3, 3), 4, g)


def test_plpd_is_the_drop_of_the_pseudo_label_probability():
    ctx = image_ctx()
    sel = PLPDSelector(grid=4, seed=9)
    scores = sel.score(ctx)
    shuffled = patch_shuffle(ctx.inputs, 4, torch.Generator().manual_seed(9))
    with torch.no_grad():
        p2 = ctx.head(ctx.backbone(shuffled)).softmax(1)
    p = ctx.logits.softmax(1)
    y = p.argmax(1)
    expected = p[torch.arange(len(y)), y] - p2[torch.arange(len(y)), y]
    assert torch.allclose(scores, expected)


def test_plpd_of_a_shuffle_invariant_model_is_zero():
    backbone = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
    head = nn.Linear(3, 4)
    x = torch.randn(5, 3, 8, 8)
    z = backbone(x)
    ctx = SelectionContext(x, z, head(z), head, backbone)
    assert torch.allclose(PLPDSelector().score(ctx), torch.zeros(5), atol=1e-6)


def test_plpd_needs_the_backbone():
    with pytest.raises(ValueError, match="backbone"):
        PLPDSelector().score(ctx_from_logits(torch.randn(4, 3, 2, 2).flatten(1)))


# -- incremental clustering -----------------------------------------------------------------------
def blobs(seed=0, per=6):
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    pts = torch.cat([c + 0.5 * torch.randn(per, 2, generator=g) for c in centres])
    return pts


def nearest_to_mean(pts, rows):
    sub = pts[rows]
    return int(rows[(sub - sub.mean(0)).norm(dim=1).argmin()])


def test_clustering_picks_the_sample_nearest_each_cluster_mean():
    pts = blobs()
    ctx = ctx_from_logits(torch.zeros(18, 3), features=pts)
    sel = IncrementalClusteringSelector(entropy_bound=0.0)
    result = sel.cluster(ctx, 3)
    groups = [torch.arange(0, 6), torch.arange(6, 12), torch.arange(12, 18)]
    means = torch.stack([pts[g].mean(0) for g in groups])
    order = torch.cdist(result.centroids, means).argmin(1)
    assert sorted(order.tolist()) == [0, 1, 2]
    assert torch.allclose(result.centroids, means[order], atol=1e-5)
    expected = {nearest_to_mean(pts, g) for g in groups}
    assert set(pick(sel, ctx, 3)) == expected == set(result.representatives.tolist())


def test_anchors_are_fixed_centres_so_only_the_new_region_is_labelled():
    pts = blobs()
    ctx = ctx_from_logits(torch.zeros(18, 3), features=pts)
    sel = IncrementalClusteringSelector(entropy_bound=0.0)
    before = copy.deepcopy(sel.state_dict())
    first = sel.select(ctx, 2, NoClassBalance())
    assert sel.num_anchors == 0 and nested_equal(sel.state_dict(), before)  # select adds none
    labels = torch.tensor([0, 1])
    sel.commit(ctx, first, labels)
    assert sel.num_anchors == 2
    covered = {int(i) // 6 for i in first.indices}
    (new,) = {0, 1, 2} - covered
    second = pick(sel, ctx, 1)
    assert second == [nearest_to_mean(pts, torch.arange(6 * new, 6 * new + 6))]


def test_anchor_cap_evicts_oldest_and_abstentions_are_not_anchors():
    sel = IncrementalClusteringSelector(max_anchors=3, entropy_bound=0.0, keep_inputs=True)
    for step in range(4):
        ctx = ctx_from_logits(torch.zeros(18, 3), features=blobs(step) + 100 * step)
        selection = sel.select(ctx, 2, NoClassBalance())
        sel.commit(ctx, selection, torch.tensor([step, -1]))
        assert sel.num_anchors == min(step + 1, 3) <= 3
    assert sel.labels.tolist() == [1, 2, 3]
    assert len(sel.inputs) == 3
    assert float(sel.features[-1].norm()) > 250  # the newest anchor comes from the last batch
    sel.refresh(nn.Flatten())
    assert sel.features.shape == (3, 2)
    sel.reset()
    assert sel.num_anchors == 0


def test_only_high_entropy_samples_are_candidates():
    logits = torch.zeros(18, 3)
    logits[:6, 0] = 20.0  # confident: entropy ~ 0
    ctx = ctx_from_logits(logits, features=blobs())
    result = IncrementalClusteringSelector().cluster(ctx, 3)
    assert set(result.candidates.tolist()) == set(range(6, 18))
    assert all(int(i) >= 6 for i in result.representatives)


def test_clustering_with_fewer_candidates_than_k():
    pts = blobs()[:2]
    result = cluster_with_anchors(pts, torch.arange(2), pts.new_empty((0, 2)), 5)
    assert len(result.centroids) == 2 and sorted(result.representatives.tolist()) == [0, 1]
    none = cluster_with_anchors(pts, torch.arange(0), pts.new_empty((0, 2)), 5)
    assert len(none.representatives) == 0


# -- dynamic margin --------------------------------------------------------------------------------
def confident_batch(scale, n=6, classes=5):
    return ctx_from_logits(scale * torch.linspace(-1, 1, classes).repeat(n, 1))


def test_dynamic_threshold_is_e0_times_factor_times_entropy_ratio():
    sel = DynamicMarginSelector(0.4, 0.02, decreasing_factor=0.7, warmup_samples=10)
    e0 = 0.4 * math.log(5)
    hs = []
    for t, scale in enumerate((1.0, 2.0, 3.0, 5.0)):
        ctx = confident_batch(scale)
        before = sel.score(ctx)
        assert torch.equal(before, sel.score(ctx))  # score is pure
        selection = sel.select(ctx, 1, NoClassBalance())
        hs.append(ctx.entropy.double())
        h_all = torch.cat(hs)
        high, low = sel.thresholds(5)
        assert low == pytest.approx(0.02 * math.log(5))
        if t == 0:  # 6 samples < warm-up of 10: still static
            assert high == pytest.approx(e0)
        else:
            warm = float(torch.cat(hs[:2]).mean())
            assert high == pytest.approx(e0 * 0.7 * float(h_all.mean()) / warm)
        assert selection.update["thresholds"] == (high, low)
        assert sel.mean_entropy == pytest.approx(float(h_all.mean()))


def test_dynamic_margin_state_round_trip():
    sel = DynamicMarginSelector()
    sel.select(confident_batch(1.0), 1, NoClassBalance())
    state = sel.state_dict()
    sel.select(confident_batch(3.0), 1, NoClassBalance())
    after = sel.thresholds(5)
    sel.load_state_dict(state)
    sel.select(confident_batch(3.0), 1, NoClassBalance())
    assert sel.thresholds(5) == after
    sel.reset()
    assert sel.mean_entropy is None and sel.thresholds(5)[0] == pytest.approx(0.4 * math.log(5))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"high_factor": 0.0},
        {"low_factor": 0.5, "high_factor": 0.4},
        {"decreasing_factor": 0.0},
        {"warmup_samples": 0},
    ],
)
def test_dynamic_margin_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        DynamicMarginSelector(**kwargs)


# -- by name ---------------------------------------------------------------------------------
def test_make_selector_by_name():
    for name, cls in SELECTORS.items():
        assert isinstance(make_selector(name, seed=4), cls)
    assert (
        make_selector("random", seed=4)
        .state_dict()["rng"]
        .equal(RandomSelector(seed=4).state_dict()["rng"])
    )
    assert make_selector("entropy-margin", margin=0.3).margin == 0.3
    with pytest.raises(ValueError, match="unknown selector"):
        make_selector("oracle-peeking")


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_eatta_runs_with_each_selector_by_name(name, batch):
    x, y = batch
    oracle = eatta.GroundTruthOracle()
    m = create("eatta", confident_cnn(), oracle=oracle, budget=2, selector=name, balance=None)
    assert isinstance(m.selector, SELECTORS[name])
    m(x, labels=y)
    m(x, labels=y)
    assert m.labels_used == 4
    assert len(m.last_step.selected) == 2


def test_eatta_restores_the_dynamic_margin_statistics_when_the_oracle_fails(batch):
    x, y = batch
    state = {"ok": True}

    def oracle(inputs, idx):
        if not state["ok"]:
            raise RuntimeError("annotator offline")
        return y[idx]

    m = create("eatta", confident_cnn(), oracle=oracle, selector="dynamic-margin")
    m(x)
    before = m.selector.state_dict()
    state["ok"] = False
    with pytest.raises(eatta.OracleError):
        m(x)
    assert m.selector.state_dict() == before
