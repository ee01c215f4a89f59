"""digits-C is bit-identical whatever SIMD code NumPy, OpenCV and torch dispatch to.

Each case builds the 15 severity-5 domains in a fresh interpreter with some vector paths switched
off through the libraries' documented environment variables, and compares every domain's digest
with the packaged reference (``digits_reference.json``). The switches are derived from what the
running machine's libraries report, so the test means the same on AVX2, AVX-512 and arm64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from eatta.bench import provenance as prov
from eatta.data.portable_cv import PortableCV, correlate, gaussian_blur, warp_affine

_BUILD = """
import json, sys
from eatta.bench.provenance import dataset_digest
from eatta.data.digits import DIGITS_C_CORRUPTIONS, digits_c
import numpy, torch
out = {f"{c}@5": dataset_digest(digits_c(c, 5, use_cache=False)) for c in DIGITS_C_CORRUPTIONS}
out["_torch_capability"] = torch.backends.cpu.get_cpu_capability()
json.dump(out, sys.stdout)
"""


def _numpy_dispatched() -> list[str]:
    """NumPy's dispatch targets this machine supports (e.g. X86_V3, X86_V4; ASIMDHP on arm64)."""
    from numpy._core import _multiarray_umath as um

    features = getattr(um, "__cpu_features__", {})
    return [t for t in getattr(um, "__cpu_dispatch__", []) if features.get(t, True)]


def _opencv_dispatched() -> list[str]:
    """OpenCV's dispatched (starred) features in its CPU line, e.g. ``*AVX2 *AVX512-SKX``."""
    import cv2

    return [f[1:] for f in cv2.getCPUFeaturesLine().split() if f.startswith("*")]


def _settings() -> dict[str, dict[str, str]]:
    # the default dispatch is checked against the reference by every embedded run (data_sha256)
    return {
        "numpy-baseline+torch-default": {
            "NPY_DISABLE_CPU_FEATURES": " ".join(_numpy_dispatched()),
            "ATEN_CPU_CAPABILITY": "default",
        },
        "opencv-baseline+no-ipp": {
            "OPENCV_CPU_DISABLE": ",".join(_opencv_dispatched()),
            "OPENCV_IPP": "disabled",
        },
    }


@pytest.mark.parametrize("setting", sorted(_settings()))
def test_digits_c_domains_match_the_reference_under_forced_dispatch(setting: str) -> None:
    env = {**os.environ, **_settings()[setting], "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, "-c", _BUILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    capability = got.pop("_torch_capability")
    if "ATEN_CPU_CAPABILITY" in _settings()[setting]:
        assert capability == "DEFAULT"  # the switch took effect
    ref = prov._reference()
    assert ref is not None
    wrong = {k: v for k, v in got.items() if v != ref["domains_sha256"][k]}
    assert not wrong, f"{setting}: domains differ from the reference: {sorted(wrong)}"


def test_correlate_is_a_reflect101_correlation() -> None:
    rng = np.random.default_rng(0)
    img = rng.random((12, 12, 3))
    kernel = np.zeros((5, 5))
    kernel[2, :] = 0.2  # horizontal, 5 taps of 1/5
    padded = np.pad(img, [(0, 0), (2, 2), (0, 0)], mode="reflect")  # numpy's reflect = 101
    expected = sum(padded[:, j : j + 12] for j in range(5)) / 5
    np.testing.assert_allclose(correlate(img, kernel), expected, atol=1e-15)
    assert correlate(img[..., :1], kernel).shape == (12, 12)  # as cv2.filter2D
    assert correlate(img.astype(np.float32), kernel).dtype == np.float32
    with pytest.raises(ValueError, match="odd"):
        correlate(img, np.ones((4, 4)))


def test_gaussian_blur_uses_normalized_gaussian_taps() -> None:
    img = np.zeros((9, 9), dtype=np.float32)
    img[4, 4] = 1.0  # an impulse: the blur is the outer product of the 1-D taps
    out = gaussian_blur(img, (3, 3), 0.5)
    g = np.exp(-np.array([1.0, 0.0, 1.0]) / (2 * 0.25))
    g /= g.sum()
    np.testing.assert_allclose(out[3:6, 3:6], np.outer(g, g), rtol=1e-6)
    assert out.dtype == np.float32 and out.sum() == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_blur(img, (3, 3), 0.0)


def test_warp_affine_translates_and_rotates() -> None:
    img = np.arange(36, dtype=np.float64).reshape(6, 6)
    shift = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])  # output x samples input x - 1
    out = warp_affine(img, shift, (6, 6))
    np.testing.assert_array_equal(out[:, 1:], img[:, :-1])
    np.testing.assert_array_equal(out[:, 0], 0.0)  # constant border
    out101 = warp_affine(img, shift, (6, 6), border=4)
    np.testing.assert_array_equal(out101[:, 0], img[:, 1])  # reflect-101: x = -1 reads x = 1
    kernel = np.zeros((7, 7))
    kernel[3, :] = 1.0
    quarter = np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, 6.0]])  # a quarter turn about (3, 3)
    np.testing.assert_allclose(warp_affine(kernel, quarter, (7, 7)), kernel.T, atol=1e-15)
    with pytest.raises(ValueError, match="singular"):
        warp_affine(img, np.zeros((2, 3)), (6, 6))


def test_portable_cv_agrees_with_opencv_to_rounding() -> None:
    import cv2

    rng = np.random.default_rng(1)
    img = rng.random((32, 32, 3))
    kernel = rng.random((21, 21))
    np.testing.assert_allclose(correlate(img, kernel), cv2.filter2D(img, -1, kernel), atol=1e-9)
    m = cv2.getRotationMatrix2D((10.0, 10.0), 23.0, 1.0)
    line = np.zeros((21, 21))
    line[10, :] = 1.0
    np.testing.assert_allclose(
        warp_affine(line, m, (21, 21)), cv2.warpAffine(line, m, (21, 21)), atol=1e-9
    )
    f32 = img.astype(np.float32)
    np.testing.assert_allclose(
        warp_affine(f32, m, (32, 32), border=4),
        cv2.warpAffine(f32, m, (32, 32), borderMode=4),
        atol=1e-5,
    )
    disk = (rng.random((17, 17)) > 0.5).astype(np.float32)
    np.testing.assert_allclose(
        gaussian_blur(disk, (3, 3), 0.5),
        cv2.GaussianBlur(disk, ksize=(3, 3), sigmaX=0.5),
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="ddepth"):
        PortableCV(cv2).filter2D(img, cv2.CV_32F, kernel)


def test_corrupt_images_restores_corrupt_tta_opencv() -> None:
    from corrupt_tta import corruptions

    from eatta.data.digits import corrupt_images

    before = corruptions.cv2
    images = np.zeros((1, 32, 32, 3), dtype=np.uint8)
    corrupt_images(images, [0], "motion_blur")
    assert corruptions.cv2 is before
