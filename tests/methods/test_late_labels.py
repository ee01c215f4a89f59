"""Late labels weighed by staleness or typicality, and the ETA-style fallback
(eatta.methods.late_labels)."""

from __future__ import annotations

import math

import pytest
import torch

from eatta.methods.late_labels import LateLabels, typicality


def test_age_weight_halves_every_half_life() -> None:
    late = LateLabels("age", half_life=2.0)
    w = late.weights([9, 8, 6, 2], now=10)
    assert torch.allclose(w, torch.tensor([2**-0.5, 0.5, 0.25, 2.0**-4]))


def test_full_weight_is_one_whatever_the_age() -> None:
    assert torch.equal(LateLabels("full").weights([0, 5], now=100), torch.ones(2))


def _feature(direction: list[float], n: int = 4) -> torch.Tensor:
    return torch.tensor(direction).repeat(n, 1)


def test_drift_weight_is_one_while_the_stream_stays_put_and_falls_after_a_shift() -> None:
    late = LateLabels("drift", drift_scale=1.0)
    a, b = [1.0, 0.0, 0.0], [1.0, 0.1, 0.0]  # two batches that differ a little
    for step in range(1, 7):  # the same domain, batch-to-batch moves of 1 - cos(a, b)
        late.observe(step, _feature(a if step % 2 else b))
    move = 1 - float(torch.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=0))
    assert late._move == pytest.approx(move)
    late.observe(7, _feature([0.0, 1.0, 0.0]))  # a new domain
    w = late.weights([5, 6], now=7)
    # r = (1 - cos(then, now)) / move, weight exp(-(r - 1)): both far below one
    r5 = 1 - float(torch.cosine_similarity(torch.tensor(a), torch.tensor([0.0, 1.0, 0.0]), 0))
    assert w[0] == pytest.approx(math.exp(-(r5 / late._move - 1)), rel=1e-5)
    assert float(w.max()) < 0.01
    late.observe(8, _feature([0.0, 1.0, 0.0]))
    assert late.weights([7], now=8)[0] == 1.0  # asked in the same domain: full weight
    assert late.weights([0], now=8)[0] == 0.0  # nothing recorded for that step


def test_drift_keeps_at_most_label_expiry_steps() -> None:
    late = LateLabels("drift", label_expiry=3)
    for step in range(10):
        late.observe(step, torch.randn(2, 5))
    assert list(late._means) == [6, 7, 8, 9]


def _clusters(n_per: int = 8, seed: int = 0) -> torch.Tensor:
    """A batch of three tight clusters (three classes) in 6 dimensions."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.eye(6)[:3] * 4.0
    return torch.cat([c + 0.3 * torch.randn(n_per, 6, generator=g) for c in centres])


def test_similarity_weight_is_the_rank_among_the_batchs_own_samples() -> None:
    batch = _clusters()
    n = batch.shape[0]
    copy = batch[[0, 9, 20]]  # identical to batch samples: as typical as can be
    outlier = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 5.0]])  # in no cluster
    w = typicality(torch.cat([copy, outlier]), batch)
    assert torch.equal(w[:3], torch.ones(3))
    assert float(w[3]) == 0.0  # farther than every batch sample: p = 1/25, rejected at 0.05
    assert float(typicality(outlier, batch, level=0.0)[0]) == pytest.approx(2 / (n + 1))
    # by hand: d_j, the batch's nearest-neighbour distances, and d* of a new sample
    g = torch.Generator().manual_seed(5)
    new = torch.eye(6)[:1] * 4.0 + 0.3 * torch.randn(1, 6, generator=g)  # a new one of a cluster
    d = torch.tensor(
        [min(float((batch[j] - batch[k]).norm()) for k in range(n) if k != j) for j in range(n)]
    )
    d_new = float((batch - new).norm(dim=1).min())
    p = (1 + int((d >= d_new).sum())) / (n + 1)
    assert 2 / (n + 1) < min(1.0, 2 * p) < 1.0
    assert float(typicality(new, batch)[0]) == pytest.approx(min(1.0, 2 * p))


def test_similarity_weight_is_zero_where_the_conformal_test_rejects() -> None:
    """Weight 0 at p <= level, ``min(1, 2p)`` above; a batch too small to reject (n + 1 <=
    1 / level) keeps the least typical sample at 2 / (n + 1)."""
    line = torch.arange(40.0).unsqueeze(1)  # d_j = 1 for every sample of the batch
    for gap, p in ((1.5, 1 / 41), (0.5, 41 / 41)):
        w = float(typicality(torch.tensor([[39.0 + gap]]), line)[0])
        assert w == (0.0 if p <= 0.05 else min(1.0, 2 * p))
    # ranks just either side of the level: d* between the batch's distances
    batch = torch.cat([torch.arange(20.0), 100.0 + 3.0 * torch.arange(20.0)]).unsqueeze(1)
    near = torch.tensor([[-2.5]])  # d* = 2.5: only the 20 spaced by 3 are no closer: p = 21/41
    assert float(typicality(near, batch)[0]) == 1.0
    far = torch.tensor([[-3.5]])  # d* = 3.5: no batch sample is as far: p = 1/41 <= 0.05
    assert float(typicality(far, batch)[0]) == 0.0
    assert float(typicality(far, batch, level=0.02)[0]) == pytest.approx(2 / 41)
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="level"):
            typicality(far, batch, level=bad)
    with pytest.raises(TypeError, match="level"):
        typicality(far, batch, level=True)  # type: ignore[arg-type]
    small = torch.arange(16.0).unsqueeze(1)  # n = 16: p >= 1/17 > 0.05, never rejected
    assert float(typicality(torch.tensor([[100.0]]), small)[0]) == pytest.approx(2 / 17)


def test_similarity_weight_is_scale_free() -> None:
    batch, late = _clusters(), _clusters(3, seed=1)[[0, 4, 8]] + torch.tensor([0, 0, 0, 1.0, 0, 0])
    w = typicality(late, batch)
    assert len(set(w.tolist())) > 1  # not all the same: the check below could fail
    for c in (1e-3, 8.0, 1e4):  # rescaled
        assert torch.equal(typicality(c * late, c * batch), w)
    for c in (-3.0, 8.0):  # shifted
        assert torch.equal(typicality(late + c, batch + c), w)


def test_similarity_weight_of_labels_like_the_batch_is_mostly_full() -> None:
    g = torch.Generator().manual_seed(0)
    centres = 3.0 * torch.randn(4, 16, generator=g)
    draw = lambda k: centres[torch.arange(k) % 4] + torch.randn(k, 16, generator=g)  # noqa: E731
    w = torch.cat([typicality(draw(64), draw(64)) for _ in range(20)])
    # exchangeable: p about uniform, min(1, 2p) about 3/4 on average, half of them at 1
    assert 0.65 < float(w.mean()) < 0.9
    assert float((w == 1).float().mean()) > 0.4


def test_similarity_weight_on_a_batch_of_two() -> None:
    batch = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    late = torch.tensor([[0.5, 0.0], [1.0, 0.0], [5.0, 0.0]])
    # d_1 = d_2 = 2: a sample nearer one of them than 2 counts fully, one farther 2/3
    assert torch.allclose(typicality(late, batch), torch.tensor([1.0, 1.0, 2 / 3]))
    assert torch.equal(typicality(torch.randn(2, 5), torch.randn(1, 5)), torch.ones(2))


def test_similarity_weighting_keeps_no_state_and_needs_the_features() -> None:
    late = LateLabels("similarity")
    late.observe(3, torch.randn(4, 6))
    assert late.state_dict() == {"means": {}, "move": None, "probs": None}
    batch = _clusters()
    w = late.weights([0, 2], 3, features=batch[[1, 2]], batch=batch)
    assert torch.equal(w, torch.ones(2))  # however old: its age does not count
    with pytest.raises(ValueError, match="needs the features"):
        late.weights([2], 3)


def test_fallback_is_etas_filtered_weighted_entropy() -> None:
    late = LateLabels("drift", entropy_filter="eta", d_margin=0.5, anchor=0.5)
    assert late.filters(0.2) and not late.filters(0.5)
    assert not LateLabels(entropy_filter="none").filters(0.0)
    h = torch.tensor([0.1, 0.2, 0.3, 2.0])
    probs = torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.8, 0.2], [0.5, 0.5]])
    mask = h < 1.0
    loss, n = late.entropy(h, probs, mask, 1.0)  # no average yet: every reliable sample kept
    w = torch.exp(1.0 - h[:3])
    assert int(n) == 3 and float(loss) == pytest.approx(float((h[:3] * w).sum() / 3))
    avg = probs[:3].mean(0)
    assert torch.allclose(late._probs, avg)  # type: ignore[arg-type]
    # now a sample whose softmax is close to the average is redundant and dropped
    cos = torch.cosine_similarity(avg.unsqueeze(0), probs, dim=1)
    _, n2 = late.entropy(h, probs, mask, 1.0)
    kept = mask & (cos.abs() < 0.5)
    assert int(n2) == int(kept.sum()) < 3


def test_state_round_trip_and_reset() -> None:
    a = LateLabels("drift", entropy_filter="eta")
    for step in range(4):
        a.observe(step, torch.randn(3, 4))
    a.entropy(
        torch.tensor([0.1, 0.2]),
        torch.tensor([[0.7, 0.3], [0.2, 0.8]]),
        torch.ones(2, dtype=torch.bool),
        1.0,
    )
    b = LateLabels("drift", entropy_filter="eta")
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.weights([1, 2], 3), b.weights([1, 2], 3))
    token = a.snapshot()
    a.observe(4, torch.randn(3, 4))
    a.restore(token)
    assert list(a._means) == [0, 1, 2, 3]
    a.reset()
    assert a.state_dict() == {"means": {}, "move": None, "probs": None}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weighting": "recent"}, "unknown late-label weighting 'recent'"),
        ({"weighting": "similar"}, "unknown late-label weighting 'similar'"),
        ({"entropy_filter": "reset"}, "unknown entropy filter 'reset'"),
        ({"half_life": 0}, "half_life"),
        ({"drift_scale": -1.0}, "drift_scale"),
        ({"label_expiry": -1}, "label_expiry"),
    ],
)
def test_bad_options_are_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LateLabels(**kwargs)  # type: ignore[arg-type]  # bad values on purpose
