"""ImageNet-C, ImageNet-R, ImageNet-Sketch and ImageNet-A test sets (paper §6 "Benchmarks").

Class indices always follow the standard 1000-class order (the sorted ImageNet wnids shipped in
``imagenet_wnids.txt``), so labels match the logits of any ImageNet classifier:

* ImageNet-C and ImageNet-Sketch: label = position of the folder's wnid in the 1000-wnid list.
* ImageNet-R and ImageNet-A (200 classes each): label = position of the wnid in the sorted
  200-wnid list of that set (0..199), and a 1000-class model is scored on the 200 matching logits,
  see :func:`class_indices`, :func:`select_logits` and :class:`SubsetLogits`.

Labels never depend on which class folders happen to be present, unlike ``ImageFolder``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from eatta.data._layout import (
    DatasetLayoutError,
    FolderDataset,
    check_class_folders,
    list_images,
    pil_to_tensor,
    require_dir,
)
from eatta.data.stream import Domain

__all__ = [
    "CORRUPTIONS",
    "EvalTransform",
    "ImageNetA",
    "ImageNetC",
    "ImageNetR",
    "ImageNetSketch",
    "SubsetLogits",
    "class_indices",
    "imagenet_a_wnids",
    "imagenet_c_domains",
    "imagenet_r_wnids",
    "imagenet_wnids",
    "select_logits",
    "select_subset",
]

#: The 15 ImageNet-C corruptions in the standard continual (CTTA) order.
CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)

_C_PATTERN = "<root>/<corruption>/<severity>/<wnid>/*.JPEG"


@cache
def _read_wnids(filename: str, expected: int) -> tuple[str, ...]:
    text = resources.files("eatta.data").joinpath(filename).read_text(encoding="utf-8")
    wnids = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(wnids) != expected or len(set(wnids)) != expected or list(wnids) != sorted(wnids):
        raise RuntimeError(f"packaged {filename} is corrupt: expected {expected} sorted wnids")
    return wnids


def imagenet_wnids() -> tuple[str, ...]:
    """The 1000 ImageNet-1k wnids in standard (sorted) class-index order."""
    return _read_wnids("imagenet_wnids.txt", 1000)


def imagenet_r_wnids() -> tuple[str, ...]:
    """The 200 ImageNet-R wnids, sorted; a wnid's position is its ImageNet-R label."""
    return _read_wnids("imagenet_r_wnids.txt", 200)


def imagenet_a_wnids() -> tuple[str, ...]:
    """The 200 ImageNet-A wnids, sorted; a wnid's position is its ImageNet-A label."""
    return _read_wnids("imagenet_a_wnids.txt", 200)


def class_indices(wnids: Sequence[str]) -> list[int]:
    """Positions of ``wnids`` in the 1000-class list, i.e. which logits of a 1k model they are.

    ``class_indices(imagenet_r_wnids())`` gives the 200 logits ImageNet-R is scored on.
    """
    position = {w: i for i, w in enumerate(imagenet_wnids())}
    unknown = [w for w in wnids if w not in position]
    if unknown:
        raise ValueError(f"not ImageNet-1k wnids: {unknown[:5]}")
    return [position[w] for w in wnids]


def select_logits(logits: Tensor, indices: Sequence[int] | Tensor) -> Tensor:
    """Keep the columns ``indices`` of ``[N, C]`` logits (e.g. the 200 ImageNet-R classes)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, C], got shape {tuple(logits.shape)}")
    idx = torch.as_tensor(indices, dtype=torch.long, device=logits.device)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= logits.shape[1]):
        lo, hi = int(idx.min()), int(idx.max())
        raise ValueError(f"indices must lie in [0, {logits.shape[1]}), got {lo}..{hi}")
    return logits.index_select(1, idx)


class SubsetLogits(nn.Module):
    """Wrap a 1000-class model so it outputs only the logits of a class subset.

    Used to score ImageNet-R / ImageNet-A (200 classes) with an ImageNet classifier: prediction and
    entropy are then computed over the 200 matching classes only. The wrapped model is ``.model``.
    """

    indices: Tensor

    def __init__(self, model: nn.Module, indices: Sequence[int] | Tensor) -> None:
        super().__init__()
        self.model = model
        idx = torch.as_tensor(indices, dtype=torch.long).flatten()
        if idx.numel() == 0 or int(idx.min()) < 0:
            raise ValueError("indices must be a non-empty list of non-negative class indices")
        self.register_buffer("indices", idx, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return select_logits(self.model(x), self.indices)


class EvalTransform:
    """Standard ImageNet eval preprocessing without normalization (the model wrapper normalizes).

    Resize the short side to ``resize`` (bilinear, PIL), center-crop ``crop`` x ``crop``, convert to
    a float tensor in ``[0, 1]``; identical to torchvision's ``Resize(256), CenterCrop(224),
    ToTensor()`` on PIL images.
    """

    def __init__(self, resize: int = 256, crop: int = 224) -> None:
        if not 0 < crop <= resize:
            raise ValueError(f"need 0 < crop <= resize, got crop={crop}, resize={resize}")
        self.resize = resize
        self.crop = crop

    def __call__(self, img: Any) -> Tensor:
        from PIL import Image

        w, h = img.size
        if w <= h:
            size = (self.resize, int(self.resize * h / w))
        else:
            size = (int(self.resize * w / h), self.resize)
        img = img.resize(size, Image.Resampling.BILINEAR)
        w, h = img.size
        top = round((h - self.crop) / 2.0)
        left = round((w - self.crop) / 2.0)
        img = img.crop((left, top, left + self.crop, top + self.crop))
        return pil_to_tensor(img)

    def __repr__(self) -> str:
        return f"EvalTransform(resize={self.resize}, crop={self.crop})"


def _subset_key(seed: int, wnid: str, name: str) -> str:
    return hashlib.sha256(f"{seed}/{wnid}/{name}".encode()).hexdigest()


def select_subset(
    files_by_class: Mapping[str, Sequence[str]], n: int, seed: int = 0
) -> dict[str, list[str]]:
    """Choose ``n`` files, stratified over classes, from file names alone (no randomness state).

    Each file gets the key ``sha256(f"{seed}/{wnid}/{file name}")``. Within a class, files are
    ranked by key; then all rank-0 files are taken (in key order), then rank-1 files, and so on
    until ``n`` are chosen. So 5000 of ImageNet-C's 1000 x 50 images are exactly 5 per class, the
    choice is the same on every machine and run, and since ImageNet-C keeps the validation file
    names, every corruption and severity gets the same 5000 source images.
    Returns the chosen names per class, sorted.
    """
    total = sum(len(v) for v in files_by_class.values())
    if n <= 0 or n > total:
        raise ValueError(f"subset size must be in [1, {total}] (files found), got {n}")
    ranked: list[tuple[int, str, str, str]] = []
    for wnid, names in files_by_class.items():
        keyed = sorted((_subset_key(seed, wnid, name), name) for name in names)
        ranked.extend((rank, key, wnid, name) for rank, (key, name) in enumerate(keyed))
    ranked.sort()
    chosen: dict[str, list[str]] = {wnid: [] for wnid in files_by_class}
    for _, _, wnid, name in ranked[:n]:
        chosen[wnid].append(name)
    return {wnid: sorted(names) for wnid, names in chosen.items() if names}


def _read_subset_file(path: Path) -> dict[str, set[str]]:
    wanted: dict[str, set[str]] = {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        token = line.split()[0] if line.split() else ""
        if not token:
            continue
        parts = token.replace("\\", "/").split("/")
        if len(parts) < 2:
            raise ValueError(f"{path}:{line_no}: expected '<wnid>/<file name>', got {token!r}")
        wanted.setdefault(parts[-2], set()).add(parts[-1])
    if not wanted:
        raise ValueError(f"subset file {str(path)!r} lists no files")
    return wanted


def _scan(
    root: Path,
    wnids: Sequence[str],
    *,
    what: str,
    pattern: str,
    require_all: bool = False,
) -> dict[str, list[str]]:
    require_dir(root, what=what, pattern=pattern)
    folders = check_class_folders(root, wnids, what=what, pattern=pattern, require_all=require_all)
    return {w: list_images(root / w, pattern=pattern) for w in folders}


class _WnidFolder(FolderDataset):
    """``root/<wnid>/*`` with labels = position of the wnid in a fixed wnid list."""

    _what = "ImageNet"
    _pattern = "<root>/<wnid>/*.JPEG"

    def __init__(
        self,
        root: str | os.PathLike[str],
        wnids: Sequence[str],
        transform: Callable[[Any], Tensor] | None,
    ) -> None:
        self.root = Path(root)
        self.wnids: tuple[str, ...] = tuple(wnids)
        files = _scan(self.root, self.wnids, what=self._what, pattern=self._pattern)
        label = {w: i for i, w in enumerate(self.wnids)}
        samples = [
            (str(self.root / w / name), label[w]) for w in sorted(files) for name in files[w]
        ]
        super().__init__(samples, transform if transform is not None else EvalTransform())


class ImageNetR(_WnidFolder):
    """ImageNet-R(endition): ``root/<wnid>/*``, 200 classes, labels 0..199 (sorted 200-wnid list).

    Default transform: :class:`EvalTransform` (resize 256, center crop 224, no normalization).
    Score a 1000-class model with ``SubsetLogits(model, class_indices(imagenet_r_wnids()))``.
    """

    _what = "ImageNet-R"
    _pattern = "<root>/<wnid>/*.jpg (200 ImageNet-R wnids)"

    def __init__(
        self, root: str | os.PathLike[str], transform: Callable[[Any], Tensor] | None = None
    ) -> None:
        super().__init__(root, imagenet_r_wnids(), transform)


class ImageNetA(_WnidFolder):
    """ImageNet-A: ``root/<wnid>/*``, 200 classes, labels 0..199 (sorted 200-wnid list).

    Default transform: :class:`EvalTransform`. Score a 1000-class model with
    ``SubsetLogits(model, class_indices(imagenet_a_wnids()))``.
    """

    _what = "ImageNet-A"
    _pattern = "<root>/<wnid>/*.jpg (200 ImageNet-A wnids)"

    def __init__(
        self, root: str | os.PathLike[str], transform: Callable[[Any], Tensor] | None = None
    ) -> None:
        super().__init__(root, imagenet_a_wnids(), transform)


class ImageNetSketch(_WnidFolder):
    """ImageNet-Sketch: ``root/<wnid>/*``, 1000 classes, labels in the standard 1000-class order.

    Default transform: :class:`EvalTransform`.
    """

    _what = "ImageNet-Sketch"
    _pattern = "<root>/<wnid>/*.JPEG (ImageNet-1k wnids)"

    def __init__(
        self, root: str | os.PathLike[str], transform: Callable[[Any], Tensor] | None = None
    ) -> None:
        super().__init__(root, imagenet_wnids(), transform)


def _parse_subset(subset: int | str | os.PathLike[str] | None) -> int | Path | None:
    if subset is None:
        return None
    if isinstance(subset, bool):
        raise TypeError("subset must be None, an image count, '5000' or a file list path")
    if isinstance(subset, int):
        return subset
    if isinstance(subset, str) and subset.strip().isdigit():
        return int(subset)
    if isinstance(subset, str | os.PathLike):
        path = Path(subset)
        if not path.is_file():
            raise FileNotFoundError(
                f"subset {str(subset)!r} is neither an image count (e.g. '5000') nor a file"
            )
        return path
    raise TypeError(f"subset must be None, an int, '5000' or a path, got {type(subset).__name__}")


class ImageNetC(FolderDataset):
    """One ImageNet-C domain: ``root/<corruption>/<severity>/<wnid>/*.JPEG``.

    Images are already 224 x 224, so the default transform only converts to a ``[0, 1]`` tensor
    (normalization belongs to the model wrapper). Labels follow the 1000-class order.

    ``subset``: ``None`` for all images; an int or a digit string such as ``"5000"`` for the fixed
    class-stratified subset chosen by :func:`select_subset` with ``subset_seed`` (5000 = 5 images
    per class, identical on every machine and for every corruption); or the path of a text file
    listing ``<wnid>/<file name>`` per line (first token of each line; e.g. RobustBench's list).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        corruption: str,
        severity: int = 5,
        subset: int | str | os.PathLike[str] | None = None,
        transform: Callable[[Any], Tensor] | None = None,
        subset_seed: int = 0,
    ) -> None:
        if corruption not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {corruption!r}; expected one of {CORRUPTIONS}")
        if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
            raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
        self.root = Path(root)
        self.corruption = corruption
        self.severity = severity
        what = f"ImageNet-C ({corruption}, severity {severity})"
        require_dir(self.root, what="ImageNet-C root", pattern=_C_PATTERN)
        require_dir(self.root / corruption, what=f"{what} corruption folder", pattern=_C_PATTERN)
        folder = self.root / corruption / str(severity)
        require_dir(folder, what=f"{what} severity folder", pattern=_C_PATTERN)
        files = _scan(folder, imagenet_wnids(), what=what, pattern=_C_PATTERN)

        chosen = _parse_subset(subset)
        if isinstance(chosen, int):
            files = select_subset(files, chosen, seed=subset_seed)
        elif isinstance(chosen, Path):
            wanted = _read_subset_file(chosen)
            present = {w: set(names) for w, names in files.items()}
            missing = [
                f"{w}/{n}"
                for w, names in sorted(wanted.items())
                for n in sorted(names)
                if n not in present.get(w, set())
            ]
            if missing:
                raise DatasetLayoutError(
                    f"{what}: {len(missing)} file(s) listed in {str(chosen)!r} are missing under "
                    f"{str(folder)!r}, e.g. {missing[:3]}"
                )
            files = {w: sorted(wanted[w]) for w in sorted(wanted)}
        self.subset = chosen
        label = {w: i for i, w in enumerate(imagenet_wnids())}
        samples = [(str(folder / w / name), label[w]) for w in sorted(files) for name in files[w]]
        super().__init__(samples, transform if transform is not None else pil_to_tensor)


def imagenet_c_domains(
    root: str | os.PathLike[str],
    severity: int = 5,
    subset: int | str | os.PathLike[str] | None = None,
    corruptions: Sequence[str] = CORRUPTIONS,
    transform: Callable[[Any], Tensor] | None = None,
    subset_seed: int = 0,
) -> list[Domain]:
    """ImageNet-C domains in CTTA order, ready for :class:`eatta.data.stream.TestStream`.

    ``subset=None`` (default) keeps all 50,000 images per corruption as in the paper; ``"5000"``
    gives the fixed 5,000-image subset (see :class:`ImageNetC`).

    All folders are checked up front, so a missing corruption fails before any adaptation runs.
    """
    return [
        Domain(
            c,
            ImageNetC(
                root, c, severity, subset=subset, transform=transform, subset_seed=subset_seed
            ),
        )
        for c in corruptions
    ]
