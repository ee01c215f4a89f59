"""digits-C: a CPU-sized corruption benchmark built from scikit-learn's 8x8 digits.

* Data: ``sklearn.datasets.load_digits`` (1,797 grayscale 8 x 8 images, values 0..16, 10 classes).
* Split (:func:`digits_split`): per class, a ``numpy.random.default_rng(seed)`` permutation puts
  ``round(test_fraction * n_class)`` images in the test split, the rest in the source split (used
  to train a source model). Both index lists are sorted. With the defaults: 899 source, 898 test.
* Images: value ``v`` -> ``round(v * 255 / 16)`` as uint8, upscaled to 32 x 32 with PIL bilinear,
  copied to 3 channels (RGB, white digit on black).
* Corruption (:func:`corrupt_images`): the 15 ImageNet-C corruptions of ``corrupt_tta`` at
  severity 5 (:data:`DIGITS_C_CORRUPTIONS`, the standard CTTA order) applied to the 32 x 32 test
  images, rounded and clipped to uint8. Deterministic: image ``i`` (its index in ``load_digits``)
  under corruption ``c`` uses seed ``SeedSequence([seed, severity, c, i])``, set on numpy's global
  RNG (which ``corrupt_tta`` draws from) and restored afterwards. ``impulse_noise`` calls
  scikit-image's ``random_noise`` with an explicit ``rng`` because ``corrupt_tta`` lets it draw
  fresh OS entropy. ``corrupt_tta``'s OpenCV blurs and warps (``filter2D``, ``GaussianBlur``,
  ``warpAffine``: motion blur, snow, defocus blur, elastic transform) run through
  :class:`eatta.data.portable_cv.PortableCV`, whose results do not depend on the CPU's vector
  units (data version 2; version 1 used OpenCV's and differed on AVX-512 machines). The
  ImageNet-C parameters are tuned for 224 px, so on 32 px the blurs (defocus, motion, glass),
  fog and contrast are much harsher than the noises, pixelate and JPEG (which barely change an
  upscaled 8 x 8 digit).
* Output: ``TensorDataset`` of float images ``[N, 3, 32, 32]`` in ``[0, 1]`` and int64 labels.
* Cache: corrupted arrays are stored as ``.npz`` under ``cache_dir`` (default
  ``$EATTA_CACHE/digits-c`` or ``~/.cache/eatta/digits-c``) in a folder keyed by
  :data:`DIGITS_C_VERSION`, seed, split, severity and size, so the second call only reads a file.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from eatta.data.imagenet import CORRUPTIONS
from eatta.data.portable_cv import PortableCV
from eatta.data.stream import Domain

__all__ = [
    "DIGITS_C_CORRUPTIONS",
    "DIGITS_C_VERSION",
    "IMAGE_SIZE",
    "corrupt_images",
    "digits_c",
    "digits_c_cache_dir",
    "digits_c_domains",
    "digits_source",
    "digits_split",
    "digits_test",
]

#: Corruption order of digits-C (the standard ImageNet-C continual order).
DIGITS_C_CORRUPTIONS: tuple[str, ...] = CORRUPTIONS
#: Bump when the preprocessing or corruption recipe changes; old cache entries are then ignored.
#: 2: OpenCV's filter2D, GaussianBlur and warpAffine replaced by CPU-independent ones.
DIGITS_C_VERSION = "2"
#: Side length of the (square) digits-C images.
IMAGE_SIZE = 32

_IMPULSE_AMOUNT = (0.03, 0.06, 0.09, 0.17, 0.27)  # corrupt_tta's impulse_noise, severity 1..5


def _load() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.asarray(bunch.images), np.asarray(bunch.target, dtype=np.int64)


def _check_fraction(test_fraction: float) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")


def digits_split(seed: int = 0, test_fraction: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``(source, test)`` indices into ``load_digits``: seeded and stratified by class."""
    _check_fraction(test_fraction)
    _, labels = _load()
    rng = np.random.default_rng(seed)
    source: list[np.ndarray] = []
    test: list[np.ndarray] = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        n_test = round(test_fraction * len(members))
        test.append(members[:n_test])
        source.append(members[n_test:])
    return np.sort(np.concatenate(source)), np.sort(np.concatenate(test))


def _upscale(images: np.ndarray) -> np.ndarray:
    """``[N, 8, 8]`` digits (0..16) -> ``[N, 32, 32, 3]`` uint8 RGB (bilinear upscaling)."""
    from PIL import Image

    u8 = np.clip(np.rint(images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    out = np.empty((len(u8), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, img in enumerate(u8):
        big = Image.fromarray(img).resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
        out[i] = np.asarray(big)[..., None]
    return out


def _to_dataset(images: np.ndarray, labels: np.ndarray) -> TensorDataset:
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(255.0)
    return TensorDataset(x.contiguous(), torch.from_numpy(np.asarray(labels, dtype=np.int64)))


def _take(indices: np.ndarray, limit: int | None) -> np.ndarray:
    if limit is None:
        return indices
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    return indices[:limit]


def digits_source(
    seed: int = 0, test_fraction: float = 0.5, limit: int | None = None
) -> TensorDataset:
    """The clean source split, ``[N, 3, 32, 32]`` floats in ``[0, 1]`` and int64 labels."""
    images, labels = _load()
    idx = _take(digits_split(seed, test_fraction)[0], limit)
    return _to_dataset(_upscale(images[idx]), labels[idx])


def digits_test(
    seed: int = 0, test_fraction: float = 0.5, limit: int | None = None
) -> TensorDataset:
    """The clean (uncorrupted) test split, same format as :func:`digits_source`."""
    images, labels = _load()
    idx = _take(digits_split(seed, test_fraction)[1], limit)
    return _to_dataset(_upscale(images[idx]), labels[idx])


def _image_seed(seed: int, severity: int, corruption: str, index: int) -> int:
    entropy = [seed, severity, CORRUPTIONS.index(corruption), int(index)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def _impulse_noise(img: np.ndarray, severity: int, seed: int) -> np.ndarray:
    from skimage.util import random_noise

    noisy = random_noise(img / 255.0, mode="s&p", amount=_IMPULSE_AMOUNT[severity - 1], rng=seed)
    return np.clip(noisy, 0, 1) * 255


def corrupt_images(
    images: np.ndarray,
    indices: Sequence[int] | np.ndarray,
    corruption: str,
    severity: int = 5,
    seed: int = 0,
) -> np.ndarray:
    """Apply one ``corrupt_tta`` corruption to ``[N, H, W, 3]`` uint8 images, deterministically.

    ``indices[i]`` identifies image ``i`` (its ``load_digits`` index) in its seed, so an image is
    corrupted the same way whatever batch or subset it comes in. numpy's global RNG state is
    restored on return. Returns uint8 ``[N, H, W, 3]``.
    """
    from corrupt_tta import corrupt

    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; expected one of {CORRUPTIONS}")
    if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 [N, H, W, 3], got {images.dtype} {images.shape}")
    if len(indices) != len(images):
        raise ValueError(f"got {len(indices)} indices for {len(images)} images")
    out = np.empty_like(images)
    state = np.random.get_state()  # noqa: NPY002 - corrupt_tta draws from the global RNG
    module = _corruptions_module()
    opencv = module.cv2
    module.cv2 = PortableCV(opencv)  # CPU-independent blurs and warps
    try:
        for i, (img, index) in enumerate(zip(images, indices, strict=True)):
            s = _image_seed(seed, severity, corruption, int(index))
            np.random.seed(s)  # noqa: NPY002
            if corruption == "impulse_noise":
                res = _impulse_noise(img, severity, s)
            else:
                res = corrupt(img, severity=severity, corruption_name=corruption)
            out[i] = np.clip(np.rint(np.asarray(res, dtype=np.float64)), 0, 255).astype(np.uint8)
    finally:
        module.cv2 = opencv
        np.random.set_state(state)  # noqa: NPY002
    return out


def _corruptions_module() -> Any:
    """``corrupt_tta``'s corruption module, whose global ``cv2`` its corruptions call."""
    from corrupt_tta import corruptions

    if getattr(getattr(corruptions, "cv2", None), "__name__", None) != "cv2":
        raise RuntimeError(
            "corrupt_tta.corruptions does not use OpenCV as digits-C expects: install the "
            "corrupt-tta version pinned in constraints.txt"
        )
    return corruptions


def digits_c_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where digits-C arrays are cached: ``cache_dir``, else ``$EATTA_CACHE/digits-c``, else
    ``~/.cache/eatta/digits-c``."""
    if cache_dir is not None:
        return Path(cache_dir)
    root = os.environ.get("EATTA_CACHE")
    if root:
        return Path(root) / "digits-c"
    return Path.home() / ".cache" / "eatta" / "digits-c"


def _read_cache(path: Path, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        with np.load(path) as data:
            images, labels, cached_idx = data["images"], data["labels"], data["indices"]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    expected = (len(indices), IMAGE_SIZE, IMAGE_SIZE, 3)
    if images.shape != expected or images.dtype != np.uint8:
        return None
    if not np.array_equal(cached_idx, indices):
        return None
    return images, labels


def _write_cache(path: Path, images: np.ndarray, labels: np.ndarray, indices: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, images=images, labels=labels, indices=indices)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the full new one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def digits_c(
    corruption: str,
    severity: int = 5,
    *,
    seed: int = 0,
    test_fraction: float = 0.5,
    limit: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    use_cache: bool = True,
) -> TensorDataset:
    """One digits-C domain: the test split under ``corruption``, ``[N, 3, 32, 32]`` in ``[0, 1]``.

    ``limit`` keeps the first ``limit`` test images (for quick tests). Results are cached (see
    :func:`digits_c_cache_dir`); ``use_cache=False`` always recomputes and writes nothing.
    """
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; expected one of {CORRUPTIONS}")
    images, labels = _load()
    idx = _take(digits_split(seed, test_fraction)[1], limit)
    key = f"v{DIGITS_C_VERSION}-seed{seed}-test{test_fraction:g}-sev{severity}-n{len(idx)}"
    path = digits_c_cache_dir(cache_dir) / key / f"{corruption}.npz"
    if use_cache:
        cached = _read_cache(path, idx)
        if cached is not None:
            return _to_dataset(*cached)
    corrupted = corrupt_images(_upscale(images[idx]), idx, corruption, severity, seed)
    if use_cache:
        _write_cache(path, corrupted, labels[idx], idx)
    return _to_dataset(corrupted, labels[idx])


def digits_c_domains(
    corruptions: Sequence[str] = DIGITS_C_CORRUPTIONS,
    severity: int = 5,
    *,
    seed: int = 0,
    test_fraction: float = 0.5,
    limit: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[Domain]:
    """digits-C domains in order, ready for :class:`eatta.data.stream.TestStream`."""
    return [
        Domain(
            c,
            digits_c(
                c,
                severity,
                seed=seed,
                test_fraction=test_fraction,
                limit=limit,
                cache_dir=cache_dir,
            ),
        )
        for c in corruptions
    ]
