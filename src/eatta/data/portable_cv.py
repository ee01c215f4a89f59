"""The OpenCV operations digits-C needs, computed bit-identically on every CPU.

``corrupt_tta`` blurs and warps with OpenCV, whose ``filter2D``, ``GaussianBlur`` and
``warpAffine`` take different code paths (and so round differently in the last bits) with the
CPU's vector units: SSE, AVX2, AVX-512, NEON. After rounding to uint8 whole domains then differ
(``motion_blur`` on AVX-512 against the AVX2 reference; ``defocus_blur`` and
``elastic_transform`` with OpenCV's dispatch lowered to its baseline). NumPy's and OpenCV's
dispatch switches do not restore them, and the DFT that ``filter2D`` uses for large kernels is
not covered by those switches at all.

Here the same operations use only IEEE-754 element-wise NumPy operations (one multiply and one
add per kernel tap or interpolation weight, in a fixed order; kernel sums with :func:`math.fsum`).
Each such operation is correctly rounded on any IEEE-754 machine, whatever its vector width, so
the output depends on neither the CPU nor OpenCV's build. The results agree with OpenCV's to
about 1e-6 (their last bits are what vary between CPUs); the digits-C data
version records the switch.

:class:`PortableCV` stands in for the ``cv2`` module inside ``corrupt_tta`` (see
:func:`eatta.data.digits.corrupt_images`): these three functions are replaced, every other
attribute is OpenCV's own (colour conversions, resizing and affine solves were checked to agree
across dispatch levels by ``tests/data/test_digits_cpu_independence.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["PortableCV", "correlate", "gaussian_blur", "warp_affine"]

_SUBPIXEL = 32  # OpenCV's INTER_TAB_SIZE: bilinear weights on a 1/32-pixel grid
_AB_SCALE = 1024  # OpenCV's AB_SCALE: warpAffine's coordinates in 1/1024 pixel
_AB_SHIFT = 5  # AB_BITS - INTER_BITS: from 1/1024 to 1/32 pixel
_BORDER_CONSTANT = 0
_BORDER_REFLECT_101 = 4
_INTER_LINEAR = 1
_WARP_INVERSE_MAP = 16


def _reflect101(index: np.ndarray, size: int) -> np.ndarray:
    """OpenCV's ``BORDER_REFLECT_101`` for integer coordinates (``dcb|abcd|cba``)."""
    if size == 1:
        return np.zeros_like(index)
    period = 2 * size - 2
    i = np.mod(index, period)
    return np.where(i < size, i, period - i)


def _fixed(v: np.ndarray) -> np.ndarray:
    """``saturate_cast<int>(v * AB_SCALE)``: round half to even, as OpenCV's cvRound."""
    return np.rint(v * _AB_SCALE).astype(np.int64)


def correlate(img: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``cv2.filter2D(img, -1, kernel)``: correlation with a centred kernel, ``BORDER_REFLECT_101``.

    ``img`` is ``[H, W]`` or ``[H, W, C]`` (``[H, W, 1]`` gives ``[H, W]``, as OpenCV does); the
    result has ``img``'s dtype, accumulated in float64.
    """
    x = np.asarray(img)
    if x.ndim == 3 and x.shape[2] == 1:
        x = x[..., 0]
    if x.ndim not in (2, 3):
        raise ValueError(f"img must be [H, W] or [H, W, C], got shape {x.shape}")
    k = np.asarray(kernel, dtype=np.float64)
    if k.ndim != 2 or k.shape[0] % 2 == 0 or k.shape[1] % 2 == 0:
        raise ValueError(f"kernel must be 2-D with odd sides, got shape {k.shape}")
    h, w = x.shape[:2]
    ry, rx = k.shape[0] // 2, k.shape[1] // 2
    rows = _reflect101(np.arange(-ry, h + ry), h)
    cols = _reflect101(np.arange(-rx, w + rx), w)
    padded = x.astype(np.float64)[rows][:, cols]
    acc = np.zeros(x.shape, dtype=np.float64)
    for i, j in zip(*np.nonzero(k), strict=True):  # row-major: a fixed order of adds
        acc = acc + k[i, j] * padded[i : i + h, j : j + w]
    return acc.astype(x.dtype, copy=False)


def _gaussian_taps(n: int, sigma: float) -> np.ndarray:
    """``cv2.getGaussianKernel(n, sigma)`` in float64 (odd ``n``, ``sigma > 0``)."""
    centre = (n - 1) / 2
    taps = [math.exp(-((i - centre) ** 2) / (2.0 * sigma * sigma)) for i in range(n)]
    total = math.fsum(taps)
    return np.asarray([t / total for t in taps], dtype=np.float64)


def gaussian_blur(img: np.ndarray, ksize: tuple[int, int], sigma: float) -> np.ndarray:
    """``cv2.GaussianBlur(img, ksize, sigmaX=sigma)`` with an explicit odd ``ksize`` and
    ``sigma > 0`` (sigmaY = sigmaX), ``BORDER_REFLECT_101``; separable, rows then columns."""
    kx, ky = int(ksize[0]), int(ksize[1])
    if kx < 1 or ky < 1 or kx % 2 == 0 or ky % 2 == 0:
        raise ValueError(f"ksize must be two positive odd ints, got {ksize!r}")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    x = np.asarray(img)
    rowwise = correlate(x.astype(np.float64), _gaussian_taps(kx, sigma)[None, :])
    out = correlate(rowwise, _gaussian_taps(ky, sigma)[:, None])
    return out.astype(x.dtype, copy=False)


def warp_affine(
    img: np.ndarray,
    matrix: np.ndarray,
    dsize: tuple[int, int],
    *,
    inverse: bool = False,
    border: int = _BORDER_CONSTANT,
) -> np.ndarray:
    """``cv2.warpAffine(img, M, dsize)``, bilinear; ``border`` is ``BORDER_CONSTANT`` (0) or
    ``BORDER_REFLECT_101``. As OpenCV 5: float32 images are sampled at exact coordinates, others
    on a 1/32-pixel grid in fixed point."""
    if border not in (_BORDER_CONSTANT, _BORDER_REFLECT_101):
        raise ValueError(f"border must be BORDER_CONSTANT or BORDER_REFLECT_101, got {border!r}")
    x = np.asarray(img)
    m = np.asarray(matrix, dtype=np.float64).reshape(2, 3)
    if not inverse:  # warpAffine maps output pixels back through the inverse transform
        a, b, c, d = m[0, 0], m[0, 1], m[1, 0], m[1, 1]
        det = a * d - b * c
        if det == 0.0:
            raise ValueError("the affine matrix is singular")
        ia, ib, ic, id_ = d / det, -b / det, -c / det, a / det
        m = np.array(
            [
                [ia, ib, -(ia * m[0, 2] + ib * m[1, 2])],
                [ic, id_, -(ic * m[0, 2] + id_ * m[1, 2])],
            ]
        )
    w, h = int(dsize[0]), int(dsize[1])
    src_h, src_w = x.shape[:2]
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    if x.dtype == np.float32:
        # OpenCV 5 warps float32 images at exact (unquantized) coordinates
        sx = m[0, 0] * xs + m[0, 1] * ys + m[0, 2]
        sy = m[1, 0] * xs + m[1, 1] * ys + m[1, 2]
        x0, y0 = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
        fx, fy = sx - x0, sy - y0
    else:
        # fixed point: each term rounded to 1/1024 pixel, the sum to 1/32 (half up)
        qx = _fixed(m[0, 0] * xs) + _fixed(m[0, 1] * ys + m[0, 2])
        qy = _fixed(m[1, 0] * xs) + _fixed(m[1, 1] * ys + m[1, 2])
        half = _AB_SCALE // _SUBPIXEL // 2
        qx, qy = (qx + half) >> _AB_SHIFT, (qy + half) >> _AB_SHIFT
        x0, y0 = np.floor_divide(qx, _SUBPIXEL), np.floor_divide(qy, _SUBPIXEL)
        fx = (qx - x0 * _SUBPIXEL).astype(np.float64) / _SUBPIXEL
        fy = (qy - y0 * _SUBPIXEL).astype(np.float64) / _SUBPIXEL
    src = x.astype(np.float64)
    extra = (1,) * (x.ndim - 2)
    out = np.zeros((h, w, *x.shape[2:]), dtype=np.float64)
    for oy, wy in ((0, 1.0 - fy), (1, fy)):
        for ox, wx in ((0, 1.0 - fx), (1, fx)):
            yy, xx = y0 + oy, x0 + ox
            if border == _BORDER_REFLECT_101:
                tap = src[_reflect101(yy, src_h), _reflect101(xx, src_w)]
            else:
                inside = (yy >= 0) & (yy < src_h) & (xx >= 0) & (xx < src_w)
                tap = src[np.clip(yy, 0, src_h - 1), np.clip(xx, 0, src_w - 1)]
                tap = np.where(inside.reshape(inside.shape + extra), tap, 0.0)
            out = out + (wy * wx).reshape(wy.shape + extra) * tap
    return out.astype(x.dtype, copy=False)


class PortableCV:
    """Stand-in for the ``cv2`` module: ``filter2D``, ``GaussianBlur`` and ``warpAffine`` are
    :func:`correlate`, :func:`gaussian_blur` and :func:`warp_affine`; anything else is OpenCV's.

    Only the argument forms ``corrupt_tta`` uses are accepted; any other raises ``ValueError``
    rather than silently computing something else.
    """

    def __init__(self, cv2: Any) -> None:
        self._cv2 = cv2

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cv2, name)

    @staticmethod
    def filter2D(src: np.ndarray, ddepth: int, kernel: np.ndarray, **kwargs: Any) -> np.ndarray:
        if ddepth != -1 or kwargs:
            raise ValueError(f"filter2D: only ddepth=-1 and no options, got {ddepth}, {kwargs}")
        return correlate(src, kernel)

    @staticmethod
    def GaussianBlur(
        src: np.ndarray,
        ksize: tuple[int, int],
        sigmaX: float,
        **kwargs: Any,
    ) -> np.ndarray:
        if kwargs:
            raise ValueError(f"GaussianBlur: no options beyond ksize and sigmaX, got {kwargs}")
        return gaussian_blur(src, ksize, sigmaX)

    @staticmethod
    def warpAffine(
        src: np.ndarray,
        M: np.ndarray,
        dsize: tuple[int, int],
        flags: int = _INTER_LINEAR,
        borderMode: int = _BORDER_CONSTANT,
        **kwargs: Any,
    ) -> np.ndarray:
        if kwargs or flags & ~_WARP_INVERSE_MAP != _INTER_LINEAR:
            raise ValueError(f"warpAffine: only INTER_LINEAR, got flags={flags}, {kwargs}")
        inverse = bool(flags & _WARP_INVERSE_MAP)
        return warp_affine(src, M, dsize, inverse=inverse, border=borderMode)
