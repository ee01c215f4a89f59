"""A deployed stream: mostly clean held-out digits, with occasional corrupted stretches.

A model in deployment is mostly good: most of what it serves looks like what it was trained on,
with a shift now and then. This stream, built from the digits-C test split
(:func:`eatta.data.digits.digits_split`, the 898 held-out digits, split seed 0), is one where the
digits source CNN (:func:`eatta.models.digits_cnn.packaged_digits_source`) errs under 15 %
overall, while its corrupted parts stay a real shift.

* **Segments.** The stream is ``(clean_run + 1) · len(corruptions) + clean_run`` segments of
  ``segment`` images each: ``clean_run`` clean segments, one corrupted segment (a stretch) of the
  first corruption, ``clean_run`` clean segments, a stretch of the next corruption, and so on,
  ending with ``clean_run`` clean segments (recovery after the last stretch). Every segment is a
  :class:`~eatta.data.stream.Domain` named ``"clean"`` or after its corruption, so a stream reads
  each segment in turn, the report pools the visits of one name into one column, and the
  ``Worse`` column compares every segment with the source model's.
* **Images.** Seeded passes over the test split (``numpy.random.default_rng(seed)``, a fresh
  permutation per pass) give the stream's sequence of test images; segment ``i`` shows the next
  ``segment`` of them, clean or under its corruption. A corrupted image is digits-C's
  (:func:`eatta.data.digits.digits_c`: same per-image seed, CPU-independent, data version 2,
  cached), so the stream is the same on every CPU.
* **Defaults** (:data:`DEPLOYED_CORRUPTIONS` at severity :data:`DEPLOYED_SEVERITY`, segments of
  :data:`DEPLOYED_SEGMENT`, :data:`DEPLOYED_CLEAN_RUN` clean segments between stretches):
  19 segments of 256 images, 4,864 images (76 batches of 64). Four stretches of four batches
  (at batch 64) after every twelve clean batches: 4 / 19 = 21 % of the images are corrupted.
  The source model errs on 2.3 % of the clean test split and, at severity 2, on 17.9 %
  (gaussian_noise), 33.4 % (defocus_blur), 42.2 % (glass_blur) and 46.8 % (impulse_noise) of the
  corrupted one: a real shift, not a collapse to chance (fog, contrast and motion blur are at
  86-90 % already at severity 1). On the stream of seed 0 (``eatta-bench``'s; a run's seed only
  shuffles within segments, or the whole round when mixed) it errs on 8.7 % overall: 2.3 % of
  the clean segments and 16.8, 32.4, 39.5 and 42.6 % of the four stretches (seeds 1 and 2 of
  the construction: 8.9 %).
  "clean" is the only domain where the source model errs under 10 % (the issue-36 "easy domain").
* **In order and mixed within batches.** Read in order (the default stream protocol), a batch
  never mixes segments: a stretch is consecutive corrupted batches. With the mixed protocol
  (``TestStream(..., mixed=True)``, ``eatta-bench --mixed``), each round pools and shuffles all
  segments, so every batch is otherwise clean with 21 % corrupted samples on average (four
  corruptions); per-sample domain counts keep the per-domain errors.

All segments hold the same number of images, so the mean of the per-segment errors (the
benchmark's average error) is the stream's overall error, in both readings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from torch.utils.data import TensorDataset

from eatta.data.digits import DIGITS_C_CORRUPTIONS, DIGITS_C_VERSION, digits_c, digits_test
from eatta.data.stream import Domain

__all__ = [
    "CLEAN",
    "DEPLOYED_CLEAN_RUN",
    "DEPLOYED_CORRUPTIONS",
    "DEPLOYED_SEGMENT",
    "DEPLOYED_SEVERITY",
    "DEPLOYED_VERSION",
    "deployed_domains",
    "deployed_plan",
]

#: Name of the clean segments (the domain where the source model is good).
CLEAN = "clean"
#: The corruptions of the stretches, in stream order (noise, blur, blur, noise).
DEPLOYED_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "defocus_blur",
    "glass_blur",
    "impulse_noise",
)
#: Severity of the corrupted stretches.
DEPLOYED_SEVERITY = 2
#: Images per segment (four batches of 64).
DEPLOYED_SEGMENT = 256
#: Clean segments before every stretch, and after the last.
DEPLOYED_CLEAN_RUN = 3
#: Bump when the construction changes (with digits-C's data version it names the data).
DEPLOYED_VERSION = f"1-digits-c-v{DIGITS_C_VERSION}"


def _positive_int(value: object, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what} must be an int >= {least}, got {value!r}")
    return value


def deployed_plan(
    n_images: int,
    corruptions: Sequence[str] = DEPLOYED_CORRUPTIONS,
    *,
    segment: int = DEPLOYED_SEGMENT,
    clean_run: int = DEPLOYED_CLEAN_RUN,
    seed: int = 0,
) -> list[tuple[str, np.ndarray]]:
    """The stream's segments as ``(name, positions)``: ``name`` is ``"clean"`` or a corruption,
    ``positions`` (int64, ``segment`` of them) index the ``n_images`` test images. Seeded passes
    over the images, each a fresh permutation, are cut into segments in stream order (see the
    module docstring); no image is touched."""
    n_images = _positive_int(n_images, "n_images", 1)
    segment = _positive_int(segment, "segment", 2)
    clean_run = _positive_int(clean_run, "clean_run", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    names = list(corruptions) if not isinstance(corruptions, str) else [corruptions]
    unknown = [c for c in names if c not in DIGITS_C_CORRUPTIONS]
    if unknown or not names:
        raise ValueError(
            f"corruptions must be one or more of {DIGITS_C_CORRUPTIONS}, got {corruptions!r}"
        )
    layout: list[str] = []
    for c in names:
        layout += [CLEAN] * clean_run + [c]
    layout += [CLEAN] * clean_run
    total = len(layout) * segment
    rng = np.random.default_rng(seed)
    passes = -(-total // n_images)
    order = np.concatenate([rng.permutation(n_images) for _ in range(passes)])[:total]
    return [
        (name, order[i * segment : (i + 1) * segment].astype(np.int64))
        for i, name in enumerate(layout)
    ]


def deployed_domains(
    corruptions: Sequence[str] = DEPLOYED_CORRUPTIONS,
    severity: int = DEPLOYED_SEVERITY,
    *,
    segment: int = DEPLOYED_SEGMENT,
    clean_run: int = DEPLOYED_CLEAN_RUN,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[Domain]:
    """The deployed stream's segments in order, ready for :class:`~eatta.data.stream.TestStream`
    (in order, or with ``mixed=True``): ``[segment, 3, 32, 32]`` floats in ``[0, 1]`` and int64
    labels each. Corrupted images come from :func:`~eatta.data.digits.digits_c` at ``severity``
    (cached in ``cache_dir``); ``seed`` orders the passes over the test split."""
    if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
    clean = digits_test()
    plan = deployed_plan(len(clean), corruptions, segment=segment, clean_run=clean_run, seed=seed)
    sources = {CLEAN: clean}
    for name, _ in plan:
        if name not in sources:
            sources[name] = digits_c(name, severity, cache_dir=cache_dir)
    out = []
    for name, positions in plan:
        x, y = sources[name].tensors
        out.append(Domain(name, TensorDataset(x[positions].clone(), y[positions].clone())))
    return out
