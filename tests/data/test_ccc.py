"""The CCC-style stream: seeded walk, continuous mix and severity, blending, cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import eatta.data.ccc as ccc
from eatta.data import TestStream, digits_test
from eatta.data.ccc import CCC_SPEEDS, ccc_images, ccc_walk, digits_ccc
from eatta.data.digits import DIGITS_C_CORRUPTIONS

TINY = {"speed": 4, "transitions": 3, "limit": 10}


def arrays(stream: ccc.CCCStream) -> tuple[torch.Tensor, torch.Tensor]:
    xs = torch.cat([d.dataset.tensors[0] for d in stream.domains])  # type: ignore[attr-defined]
    ys = torch.cat([d.dataset.tensors[1] for d in stream.domains])  # type: ignore[attr-defined]
    return xs, ys


def test_tiny_stream_has_one_named_domain_per_transition(tmp_path: Path) -> None:
    s = digits_ccc(**TINY, cache_dir=tmp_path)
    w = s.walk
    assert len(w) == 12 and w.num_transitions == 3 and len(w.corruptions) == 4
    assert [d.name for d in s.domains] == [
        f"{a}>{b}" for a, b in zip(w.corruptions[:-1], w.corruptions[1:], strict=True)
    ]
    assert all(len(d.dataset) == 4 for d in s.domains)  # type: ignore[arg-type]
    xs, ys = arrays(s)
    assert xs.shape == (12, 3, 32, 32) and xs.dtype == torch.float32
    assert 0.0 <= float(xs.min()) and float(xs.max()) <= 1.0
    assert torch.equal(ys, digits_test(limit=10).tensors[1][torch.from_numpy(w.source)])
    # the existing stream runs over it unchanged
    batches = list(TestStream(s.domains, batch_size=3, shuffle=False))
    assert [name for _, _, name in batches] == [d.name for d in s.domains for _ in range(2)]


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    a = digits_ccc(**TINY, use_cache=False)
    b = digits_ccc(**TINY, use_cache=False)
    c = digits_ccc(**TINY, seed=1, use_cache=False)
    assert all(torch.equal(p, q) for p, q in zip(arrays(a), arrays(b), strict=True))
    assert a.walk.corruptions == b.walk.corruptions
    assert np.array_equal(a.walk.severity, b.walk.severity)
    assert a.walk.corruptions != c.walk.corruptions or not np.array_equal(
        a.walk.severity, c.walk.severity
    )
    assert not torch.equal(arrays(a)[0], arrays(c)[0])


def test_second_build_reads_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = digits_ccc(**TINY, cache_dir=tmp_path)
    other = digits_ccc(**{**TINY, "speed": 5}, cache_dir=tmp_path)  # another entry, kept apart
    files = list(tmp_path.rglob("*.npz"))
    assert len(files) == 2 and all("ccc-v1" in str(f) for f in files)

    def fail(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("rebuilt instead of read from the cache")

    monkeypatch.setattr(ccc, "ccc_images", fail)
    for built, kw in ((first, TINY), (other, {**TINY, "speed": 5})):
        again = digits_ccc(**kw, cache_dir=tmp_path)
        assert all(torch.equal(p, q) for p, q in zip(arrays(built), arrays(again), strict=True))
        assert np.array_equal(built.walk.severity, again.walk.severity)
    with pytest.raises(AssertionError, match="rebuilt"):  # a new seed is not in the cache
        digits_ccc(**TINY, seed=5, cache_dir=tmp_path)


def test_mix_and_severity_change_continuously() -> None:
    w = ccc_walk(898, "fast", seed=3)
    assert len(w) == 14 * 64 and w.speed == 64
    assert sorted(w.corruptions) == sorted(DIGITS_C_CORRUPTIONS)  # one walk through all 15
    for s in range(w.num_transitions):
        mix = w.mix[w.segment == s]
        assert np.array_equal(mix, np.arange(64) / 64)  # b's weight rises linearly from 0
    # severity: piecewise linear between boundary values, no jump anywhere (also across
    # transitions), varying over the full range and mostly non-integer
    steps = np.abs(np.diff(w.severity))
    assert steps.max() <= 4.0 / 64 + 1e-12
    assert 1.0 <= w.severity.min() and w.severity.max() <= 5.0
    assert w.severity.max() - w.severity.min() > 2.0
    assert np.mean(w.severity != np.round(w.severity)) > 0.99
    seg0 = w.severity[:64]
    assert np.allclose(np.diff(seg0), seg0[1] - seg0[0])  # linear within a transition
    # each image's clean source: seeded passes over the clean set, each a permutation
    assert len(set(w.source.tolist())) == 896 and w.source.max() < 898
    slow = ccc_walk(898, "slow", seed=3)
    for p in range(3):
        assert sorted(slow.source[p * 898 : (p + 1) * 898].tolist()) == list(range(898))


def test_speeds_differ_in_length_and_bad_speed_is_rejected() -> None:
    lengths = {name: len(ccc_walk(898, name)) for name in CCC_SPEEDS}
    assert lengths == {"fast": 896, "medium": 1792, "slow": 3584}
    assert len(ccc_walk(898, 10, transitions=30)) == 300
    with pytest.raises(ValueError, match=r"'warp'.*fast \(64\), medium \(128\), slow \(256\)"):
        ccc_walk(898, "warp")
    with pytest.raises(ValueError, match="unknown CCC speed"):
        digits_ccc("Fast", limit=4)
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="speed"):
            ccc_walk(10, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="severity"):
        ccc_walk(10, severity=(0.5, 5.0))
    with pytest.raises(ValueError, match="two corruptions"):
        ccc_walk(10, corruptions=["fog", "fog"])


def test_long_walks_continue_without_repeating_a_corruption_twice_in_a_row() -> None:
    w = ccc_walk(50, 2, transitions=40, seed=1)
    assert all(a != b for a, b in zip(w.corruptions[:-1], w.corruptions[1:], strict=True))
    names = w.segment_names
    assert len(set(names)) == len(names) == 40  # repeated pairs are numbered


def test_blend_is_the_mix_of_the_interpolated_severities() -> None:
    """With a fake corruption ``c(x, n) = base_c + 20 n``, image t is
    ``(1 - w) base_a + w base_b + 20 s``: linear in the mix and in the continuous severity."""
    base = {c: 7 * i for i, c in enumerate(DIGITS_C_CORRUPTIONS)}
    calls: list[tuple[str, int, list[int]]] = []

    def fake(images: np.ndarray, ids: np.ndarray, corruption: str, sev: int) -> np.ndarray:
        assert 1 <= sev <= 5 and images.dtype == np.uint8
        calls.append((corruption, sev, ids.tolist()))
        return np.full(images.shape, base[corruption] + 20 * sev, dtype=np.uint8)

    w = ccc_walk(6, 5, transitions=4, seed=2)
    out = ccc_images(np.zeros((6, 2, 2, 3), dtype=np.uint8), w, fake)
    a = np.array([base[w.corruptions[s]] for s in w.segment])
    b = np.array([base[w.corruptions[s + 1]] for s in w.segment])
    want = (1 - w.mix) * a + w.mix * b + 20 * w.severity
    assert np.all(np.abs(out[:, 0, 0, 0] - want) <= 0.5 + 1e-9)
    assert all(np.array_equal(img, np.full_like(img, img[0, 0, 0])) for img in out)
    # the first image of a transition is the pure first corruption (b's weight 0 is skipped)
    first = [c for c, _, ids in calls if 0 in ids]
    assert set(first) == {w.corruptions[0]}


def test_identity_corruption_returns_the_walks_clean_images() -> None:
    clean = np.random.default_rng(0).integers(0, 256, (7, 4, 4, 3), dtype=np.uint8)
    w = ccc_walk(7, 3, transitions=5, seed=4)
    out = ccc_images(clean, w, lambda x, ids, c, s: x)
    assert np.array_equal(out, clean[w.source])
    with pytest.raises(ValueError, match="clean image"):
        ccc_images(clean[:2], w, lambda x, ids, c, s: x)
