"""IWMS-like replay of the labelled samples nearest the current batch."""

from __future__ import annotations

import pytest
import torch

from eatta.methods.nearest_replay import NearestReplay


def test_offers_the_k_nearest_weighted_by_similarity() -> None:
    r = NearestReplay(capacity=8, k=2)
    assert len(r) == 0 and r.nearest(torch.ones(3, 2)) is None
    feats = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    r.add(torch.arange(4.0).unsqueeze(1), torch.tensor([0, 1, 2, 3]), feats)
    batch = torch.tensor([[1.0, 0.1], [1.0, -0.1]])  # mean (1, 0)
    near = r.nearest(batch)
    assert near is not None
    x, y, w = near
    assert y.tolist() == [0, 2] and x.squeeze(1).tolist() == [0.0, 2.0]
    assert torch.allclose(w, torch.tensor([1.0, 2**-0.5]))
    r2 = NearestReplay(capacity=8, k=4)
    r2.add(torch.zeros(4, 1), torch.arange(4), feats)
    _, _, w2 = r2.nearest(batch)  # type: ignore[misc]
    assert float(w2.min()) == 0.0  # the opposite sample weighs nothing (clamped cosine)


def test_keeps_the_last_capacity_samples_and_state_round_trips() -> None:
    r = NearestReplay(capacity=3, k=1)
    for i in range(5):
        r.add(torch.full((1, 1), float(i)), torch.tensor([i]), torch.randn(1, 4))
    assert len(r) == 3 and r.state_dict()["y"].tolist() == [2, 3, 4]
    s = NearestReplay(capacity=3, k=1)
    s.load_state_dict(r.state_dict())
    f = torch.randn(2, 4)
    assert all(torch.equal(a, b) for a, b in zip(r.nearest(f), s.nearest(f), strict=True))  # type: ignore[arg-type]
    token = r.snapshot()
    r.add(torch.zeros(1, 1), torch.tensor([9]), torch.randn(1, 4))
    r.restore(token)
    assert r.state_dict()["y"].tolist() == [2, 3, 4]
    with pytest.raises(ValueError, match="capacity=5"):
        NearestReplay(capacity=5, k=1).load_state_dict(r.state_dict())
    r.reset()
    assert len(r) == 0


@pytest.mark.parametrize("kwargs", [{"capacity": 0}, {"k": 0}, {"k": 1.5}])
def test_bad_sizes_are_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be an int >= 1"):
        NearestReplay(**kwargs)  # type: ignore[arg-type]  # bad values on purpose
