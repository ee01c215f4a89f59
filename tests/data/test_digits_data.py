"""digits-C: split, corruption determinism, caching and tensor format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from eatta.data import (
    CORRUPTIONS,
    DIGITS_C_CORRUPTIONS,
    digits_c,
    digits_c_cache_dir,
    digits_c_domains,
    digits_source,
    digits_split,
    digits_test,
)
from eatta.data import digits as dc


def test_split_is_disjoint_complete_stratified_and_seeded() -> None:
    source, test = digits_split()
    assert len(source) + len(test) == 1797
    assert not set(source.tolist()) & set(test.tolist())
    labels = dc._load()[1]
    for c in range(10):
        n_c = int((labels == c).sum())
        assert abs(int((labels[test] == c).sum()) - n_c / 2) <= 0.5
    again = digits_split()
    assert np.array_equal(source, again[0]) and np.array_equal(test, again[1])
    assert not np.array_equal(test, digits_split(seed=1)[1])
    assert len(digits_split(test_fraction=0.2)[1]) in range(355, 364)
    with pytest.raises(ValueError, match="test_fraction"):
        digits_split(test_fraction=1.0)


def test_clean_splits_format() -> None:
    src = digits_source(limit=30)
    x, y = src.tensors
    assert x.shape == (30, 3, 32, 32) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and set(y.tolist()) <= set(range(10))
    assert float(x.min()) == 0.0 and 0.9 < float(x.max()) <= 1.0
    assert torch.equal(x[:, 0], x[:, 2])  # grayscale replicated to RGB
    assert len(digits_test()) == len(digits_split()[1])


def test_order_is_the_imagenet_c_order() -> None:
    assert DIGITS_C_CORRUPTIONS == CORRUPTIONS
    assert DIGITS_C_CORRUPTIONS[:3] == ("gaussian_noise", "shot_noise", "impulse_noise")


def test_all_corruptions_deterministic_in_range_and_not_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EATTA_CACHE", str(tmp_path))
    clean = digits_test(limit=6).tensors[0]
    state = np.random.get_state()  # noqa: NPY002 - checks that the global RNG is left untouched
    for c in DIGITS_C_CORRUPTIONS:
        a = digits_c(c, limit=6, use_cache=False)
        b = digits_c(c, limit=6, use_cache=False)
        x = a.tensors[0]
        assert x.shape == (6, 3, 32, 32) and x.dtype == torch.float32, c
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0, c
        assert torch.equal(x, b.tensors[0]), f"{c} is not deterministic"
        assert not torch.equal(x, clean), f"{c} left the images unchanged"
        assert torch.equal(a.tensors[1], digits_test(limit=6).tensors[1])
    after = np.random.get_state()  # noqa: NPY002
    assert np.array_equal(state[1], after[1]) and state[2:] == after[2:]
    assert not list(tmp_path.iterdir())  # use_cache=False writes nothing


def test_an_image_is_corrupted_the_same_way_in_any_subset() -> None:
    test_idx = digits_split()[1][:5]
    images = dc._upscale(dc._load()[0][test_idx])
    whole = dc.corrupt_images(images, test_idx, "impulse_noise")
    part = dc.corrupt_images(images[3:], test_idx[3:], "impulse_noise")
    assert np.array_equal(whole[3:], part)
    other_seed = dc.corrupt_images(images, test_idx, "impulse_noise", seed=1)
    assert not np.array_equal(whole, other_seed)


def test_second_call_reads_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = digits_c("glass_blur", limit=10, cache_dir=tmp_path)
    files = list(tmp_path.rglob("*.npz"))
    assert len(files) == 1 and files[0].name == "glass_blur.npz"
    assert f"v{dc.DIGITS_C_VERSION}-" in files[0].parent.name

    def boom(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("recomputed despite the cache")

    monkeypatch.setattr(dc, "corrupt_images", boom)
    second = digits_c("glass_blur", limit=10, cache_dir=tmp_path)
    assert torch.equal(first.tensors[0], second.tensors[0])
    assert torch.equal(first.tensors[1], second.tensors[1])
    with pytest.raises(AssertionError, match="recomputed"):
        digits_c("glass_blur", limit=11, cache_dir=tmp_path)  # other size: not a cache hit


def test_damaged_cache_file_is_recomputed(tmp_path: Path) -> None:
    ref = digits_c("fog", limit=4, cache_dir=tmp_path)
    (path,) = tmp_path.rglob("fog.npz")
    path.write_bytes(b"not an npz")
    again = digits_c("fog", limit=4, cache_dir=tmp_path)
    assert torch.equal(ref.tensors[0], again.tensors[0])
    assert np.load(path)["images"].shape == (4, 32, 32, 3)


def test_cache_location_argument_env_and_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EATTA_CACHE", str(tmp_path / "env"))
    assert digits_c_cache_dir() == tmp_path / "env" / "digits-c"
    assert digits_c_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    digits_c("contrast", limit=3)
    assert list((tmp_path / "env" / "digits-c").rglob("contrast.npz"))
    monkeypatch.delenv("EATTA_CACHE")
    assert digits_c_cache_dir() == Path.home() / ".cache" / "eatta" / "digits-c"


def test_domains_and_bad_arguments(tmp_path: Path) -> None:
    doms = digits_c_domains(("snow", "frost"), limit=3, cache_dir=tmp_path)
    assert [d.name for d in doms] == ["snow", "frost"]
    assert all(len(d.dataset) == 3 for d in doms)
    with pytest.raises(ValueError, match="unknown corruption 'speckle'"):
        digits_c("speckle", use_cache=False)
    with pytest.raises(ValueError, match="limit"):
        digits_c("fog", limit=0, use_cache=False)
    with pytest.raises(ValueError, match="uint8"):
        dc.corrupt_images(np.zeros((1, 8, 8, 3)), [0], "fog")
