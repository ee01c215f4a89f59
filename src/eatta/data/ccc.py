"""A CCC-style stream: corruptions that change continuously (after Press et al., NeurIPS 2023).

*Continuously Changing Corruptions* (CCC, in "RDumb: A simple approach that questions our progress
in continual test-time adaptation") walks from one corruption to the next in small steps, so a
stream never jumps between domains and can be made as long as wanted. This module builds such a
walk from any clean images and any integer-severity corruption function:

* **Walk** (:func:`ccc_walk`): a seeded order of the corruptions (a permutation, so ``K``
  corruptions give ``K - 1`` transitions per pass; more transitions continue with further
  permutations) and, per stream image, the clean image it shows (seeded passes over the clean
  set, each reshuffled), its pair of corruptions ``(a, b)``, a mixing weight and a severity.
* **Mix**: along the ``speed`` images of a transition ``a > b`` the weight of ``b`` rises
  linearly, ``w = i / speed`` for image ``i``; the image is ``(1 - w) · a(x) + w · b(x)``
  (pixel-wise, each corrupted from the same clean ``x``). The next transition starts at pure
  ``b``, so the stream is continuous across transitions.
* **Continuous severity**: corruption libraries such as ``corrupt_tta`` only take integer
  severities 1-5, so a severity ``s = n + f`` (``0 <= f < 1``) is the interpolation
  ``(1 - f) · c(x, n) + f · c(x, n + 1)`` of the images at the two neighbouring integer
  severities. Severities are drawn uniformly in ``severity`` (default 1-5) at every transition
  boundary (seeded) and interpolated linearly between boundaries.
* **Speed** = images per transition. Digits presets (:data:`CCC_SPEEDS`): ``fast`` 64 (one batch
  per transition: the 14 transitions through all 15 corruptions take 896 images, about one pass
  over the 898-image test split), ``medium`` 128 (2x) and ``slow`` 256 (4x, about four passes).
  The paper's speeds are 1,000 / 2,000 / 5,000 ImageNet images per step of its walk.

Differences from CCC: CCC composes the two corruptions (``b`` applied on ``a``'s output, with
``a``'s severity falling as ``b``'s rises, paths chosen to hold a target source accuracy, using
its own float-severity reimplementation of ImageNet-C); here they are blended by a weight and
share one severity, which works with any integer-severity corruption function.

Output (:func:`digits_ccc`): one :class:`~eatta.data.stream.Domain` per transition, named
``"a>b"`` (a repeated pair gets ``"#2"``, ``"#3"``...), so :class:`~eatta.data.stream.TestStream`
and per-domain reporting work unchanged (use ``shuffle=False`` to keep the walk's order inside a
transition). The digits stream is built on first use (seconds: see :func:`digits_ccc`) and cached
as ``.npz`` next to digits-C (:func:`eatta.data.digits.digits_c_cache_dir`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from eatta.data.digits import (
    DIGITS_C_CORRUPTIONS,
    DIGITS_C_VERSION,
    _load,
    _read_cache,
    _take,
    _to_dataset,
    _upscale,
    _write_cache,
    corrupt_images,
    digits_c_cache_dir,
    digits_split,
)
from eatta.data.stream import Domain

__all__ = [
    "CCC_SPEEDS",
    "CCC_VERSION",
    "CCCStream",
    "CCCWalk",
    "CorruptFn",
    "ccc_images",
    "ccc_walk",
    "digits_ccc",
]

#: Images per transition of the digits CCC stream, by name.
CCC_SPEEDS: dict[str, int] = {"fast": 64, "medium": 128, "slow": 256}
#: Bump when the walk or the blending changes; old cache entries are then ignored.
CCC_VERSION = "1"

#: ``corrupt(images, ids, corruption, severity)``: uint8 ``[n, H, W, C]`` images corrupted at an
#: integer severity 1-5; ``ids`` (int64 ``[n]``) identify the stream positions, for seeding.
CorruptFn = Callable[[np.ndarray, np.ndarray, str, int], np.ndarray]

_TAG = 0xCCC  # separates the walk's random draws from other uses of the same seed


@dataclass(frozen=True)
class CCCWalk:
    """The recorded schedule of a CCC stream, one entry per stream image.

    ``segment[t]`` is the transition image ``t`` belongs to (``corruptions[s] > corruptions[s+1]``),
    ``mix[t]`` the weight of its second corruption, ``severity[t]`` its continuous severity and
    ``source[t]`` the index of its clean image.
    """

    corruptions: tuple[str, ...]
    speed: int
    source: np.ndarray
    severity: np.ndarray
    mix: np.ndarray
    segment: np.ndarray

    def __len__(self) -> int:
        return len(self.source)

    @property
    def num_transitions(self) -> int:
        """Number of transitions (segments) of the walk."""
        return len(self.corruptions) - 1

    @property
    def segment_names(self) -> list[str]:
        """``"a>b"`` per transition; a repeated pair gets ``"#2"``, ``"#3"``..."""
        names: list[str] = []
        seen: dict[str, int] = {}
        for a, b in zip(self.corruptions[:-1], self.corruptions[1:], strict=True):
            base = f"{a}>{b}"
            seen[base] = seen.get(base, 0) + 1
            names.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
        return names


class CCCStream(NamedTuple):
    """A built CCC stream: its domains (one per transition) and the schedule that made them."""

    domains: list[Domain]
    walk: CCCWalk


def _speed(speed: str | int) -> int:
    if isinstance(speed, str) and speed in CCC_SPEEDS:
        return CCC_SPEEDS[speed]
    if isinstance(speed, int) and not isinstance(speed, bool) and speed >= 1:
        return speed
    known = ", ".join(f"{k} ({v})" for k, v in CCC_SPEEDS.items())
    raise ValueError(
        f"unknown CCC speed {speed!r}; use one of {known} or a positive int (images/transition)"
    )


def _check_severity(severity: tuple[float, float]) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in severity)
    except (TypeError, ValueError):
        raise ValueError(f"severity must be a (low, high) pair, got {severity!r}") from None
    if not 1.0 <= lo <= hi <= 5.0:
        raise ValueError(f"severity must satisfy 1 <= low <= high <= 5, got {severity!r}")
    return lo, hi


def _corruption_order(
    corruptions: Sequence[str], length: int, rng: np.random.Generator
) -> tuple[str, ...]:
    """``length`` corruptions: seeded permutations one after the other, never one twice in a
    row."""
    order: list[str] = []
    while len(order) < length:
        perm = [corruptions[i] for i in rng.permutation(len(corruptions))]
        if order and perm[0] == order[-1]:
            perm = perm[1:] + perm[:1]
        order.extend(perm)
    return tuple(order[:length])


def ccc_walk(
    num_images: int,
    speed: str | int = "medium",
    *,
    seed: int = 0,
    corruptions: Sequence[str] = DIGITS_C_CORRUPTIONS,
    transitions: int | None = None,
    severity: tuple[float, float] = (1.0, 5.0),
) -> CCCWalk:
    """The seeded schedule of a CCC stream over ``num_images`` clean images (module docstring).

    ``speed``: a name of :data:`CCC_SPEEDS` or images per transition; ``transitions``: how many
    (default ``len(corruptions) - 1``: one walk through all of them); ``severity``: the range the
    boundary severities are drawn from. Touches no image.
    """
    step = _speed(speed)
    lo, hi = _check_severity(severity)
    if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 1:
        raise ValueError(f"num_images must be a positive int, got {num_images!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    names = list(dict.fromkeys(corruptions))
    if len(names) < 2:
        raise ValueError(f"a CCC walk needs at least two corruptions, got {list(corruptions)}")
    count = len(names) - 1 if transitions is None else transitions
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"transitions must be a positive int or None, got {transitions!r}")
    rng = np.random.default_rng([seed, _TAG])
    order = _corruption_order(names, count + 1, rng)
    knots = rng.uniform(lo, hi, size=count + 1)
    total = count * step
    passes = math.ceil(total / num_images)
    source = np.concatenate([rng.permutation(num_images) for _ in range(passes)])[:total]
    within = np.tile(np.arange(step, dtype=np.float64) / step, count)
    segment = np.repeat(np.arange(count, dtype=np.int64), step)
    sev = knots[segment] + (knots[segment + 1] - knots[segment]) * within
    return CCCWalk(
        corruptions=order,
        speed=step,
        source=source.astype(np.int64),
        severity=np.clip(sev, lo, hi),
        mix=within,
        segment=segment,
    )


def ccc_images(clean: np.ndarray, walk: CCCWalk, corrupt: CorruptFn) -> np.ndarray:
    """The stream's images: ``clean[walk.source]`` blended and interpolated per the walk.

    ``clean``: uint8 ``[M, H, W, C]``; ``corrupt``: see :data:`CorruptFn` (called once per
    corruption, integer severity and transition, on the images that need it, with their stream
    positions as ids). Returns uint8 ``[len(walk), H, W, C]`` (rounded, clipped).
    """
    clean = np.asarray(clean)
    if clean.ndim != 4 or clean.dtype != np.uint8:
        raise ValueError(f"clean must be uint8 [N, H, W, C], got {clean.dtype} {clean.shape}")
    if len(walk) and int(walk.source.max()) >= len(clean):
        raise ValueError(f"the walk uses clean image {int(walk.source.max())} of {len(clean)}")
    out = np.empty((len(walk), *clean.shape[1:]), dtype=np.uint8)
    level = np.floor(walk.severity).astype(np.int64)
    frac = walk.severity - level
    for s in range(walk.num_transitions):
        rows = np.flatnonzero(walk.segment == s)
        acc = np.zeros((len(rows), *clean.shape[1:]), dtype=np.float64)
        pair = walk.corruptions[s], walk.corruptions[s + 1]
        for corruption, w_c in zip(pair, (1.0 - walk.mix[rows], walk.mix[rows]), strict=True):
            for up, w_l in ((0, 1.0 - frac[rows]), (1, frac[rows])):
                weight = w_c * w_l
                for sev in np.unique(level[rows] + up):
                    pick = np.flatnonzero((level[rows] + up == sev) & (weight > 0))
                    if len(pick) == 0:
                        continue
                    ids = rows[pick]
                    res = corrupt(clean[walk.source[ids]], ids, corruption, int(sev))
                    acc[pick] += weight[pick, None, None, None] * np.asarray(res, np.float64)
        out[rows] = np.clip(np.rint(acc), 0, 255).astype(np.uint8)
    return out


def digits_ccc(
    speed: str | int = "medium",
    *,
    seed: int = 0,
    transitions: int | None = None,
    severity: tuple[float, float] = (1.0, 5.0),
    test_fraction: float = 0.5,
    limit: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    use_cache: bool = True,
) -> CCCStream:
    """The CCC stream over the digits-C test split, one domain per transition (module docstring).

    The 15 digits-C corruptions (``corrupt_tta``, the same per-image seeding as digits-C, keyed
    by stream position) are walked in a seeded order; ``limit`` keeps the first ``limit`` clean
    test images (quick tests). Built on first use (measured on the 2-core development machine:
    4 / 8 / 15 s of CPU time for ``fast`` / ``medium`` / ``slow``, digits-C itself takes about
    as long as ``slow``; a cached read 0.6 s) and cached under
    :func:`~eatta.data.digits.digits_c_cache_dir`;
    ``use_cache=False`` always recomputes and writes nothing. The schedule is recomputed from
    the seed (no image needed) and returned as ``walk``.
    """
    images, labels = _load()
    idx = _take(digits_split(seed, test_fraction)[1], limit)
    walk = ccc_walk(
        len(idx),
        speed,
        seed=seed,
        corruptions=DIGITS_C_CORRUPTIONS,
        transitions=transitions,
        severity=severity,
    )
    lo, hi = _check_severity(severity)
    key = f"ccc-v{CCC_VERSION}-data{DIGITS_C_VERSION}-seed{seed}-test{test_fraction:g}-n{len(idx)}"
    file = f"speed{walk.speed}-t{walk.num_transitions}-sev{lo:g}-{hi:g}.npz"
    path = digits_c_cache_dir(cache_dir) / key / file
    stream_idx = idx[walk.source]  # load_digits index of every stream image
    cached = _read_cache(path, stream_idx) if use_cache else None
    if cached is not None:
        stream_images, stream_labels = cached
    else:
        noise_seed = int(np.random.SeedSequence([seed, _TAG]).generate_state(1)[0])

        def corrupt(batch: np.ndarray, ids: np.ndarray, corruption: str, sev: int) -> np.ndarray:
            return corrupt_images(batch, ids, corruption, sev, noise_seed)

        stream_images = ccc_images(_upscale(images[idx]), walk, corrupt)
        stream_labels = labels[stream_idx]
        if use_cache:
            _write_cache(path, stream_images, stream_labels, stream_idx)
    step = walk.speed
    domains = [
        Domain(
            name,
            _to_dataset(
                stream_images[s * step : (s + 1) * step], stream_labels[s * step : (s + 1) * step]
            ),
        )
        for s, name in enumerate(walk.segment_names)
    ]
    return CCCStream(domains, walk)
