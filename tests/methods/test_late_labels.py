"""Late labels weighed by staleness, and the ETA-style fallback (eatta.methods.late_labels)."""

from __future__ import annotations

import math

import pytest
import torch

from eatta.methods.late_labels import LateLabels


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
        ({"entropy_filter": "reset"}, "unknown entropy filter 'reset'"),
        ({"half_life": 0}, "half_life"),
        ({"drift_scale": -1.0}, "drift_scale"),
        ({"label_expiry": -1}, "label_expiry"),
    ],
)
def test_bad_options_are_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LateLabels(**kwargs)  # type: ignore[arg-type]  # bad values on purpose
