"""Folder-layout checks and image loading shared by the benchmark datasets.

Every dataset here is a tree of class folders holding image files. Scanning lists names only (no
image is opened), so building a dataset over 50,000 files takes well under a second, and a wrong
layout fails at construction with a :class:`DatasetLayoutError` that shows the expected pattern and
what was actually found.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = [
    "IMAGE_EXTENSIONS",
    "DatasetLayoutError",
    "FolderDataset",
    "check_class_folders",
    "list_dir",
    "list_images",
    "load_rgb",
    "pil_to_tensor",
    "require_dir",
]

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".ppm", ".gif", ".tif", ".tiff", ".webp")
_SHOW = 5  # how many found entries an error message lists


class DatasetLayoutError(ValueError):
    """A dataset folder is missing or not laid out as expected (the message says what and where)."""


def _preview(names: Sequence[str]) -> str:
    if not names:
        return "nothing (empty folder)"
    shown = ", ".join(repr(n) for n in names[:_SHOW])
    more = f" and {len(names) - _SHOW} more" if len(names) > _SHOW else ""
    return f"{shown}{more}"


def list_dir(path: Path) -> list[str]:
    """Sorted visible entries of ``path`` (hidden files such as ``.DS_Store`` are skipped)."""
    return sorted(n for n in os.listdir(path) if not n.startswith("."))


def require_dir(path: Path, *, what: str, pattern: str) -> None:
    """Raise :class:`DatasetLayoutError` unless ``path`` is a directory.

    The message names ``what`` was looked for, the expected ``pattern`` and the entries that exist
    in the closest existing parent folder, so a typo or an extra nesting level is easy to spot.
    """
    if path.is_dir():
        return
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    found = _preview(list_dir(parent)) if parent.is_dir() else "nothing"
    state = "is not a directory" if path.exists() else "does not exist"
    raise DatasetLayoutError(
        f"{what}: {str(path)!r} {state}. Expected layout {pattern!r}; "
        f"{str(parent)!r} contains {found}."
    )


def list_images(folder: Path, *, pattern: str) -> list[str]:
    """Sorted image file names in ``folder``; :class:`DatasetLayoutError` if there are none."""
    names = list_dir(folder)
    images = [n for n in names if n.lower().endswith(IMAGE_EXTENSIONS)]
    if not images:
        raise DatasetLayoutError(
            f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in {str(folder)!r}. "
            f"Expected layout {pattern!r}; the folder contains {_preview(names)}."
        )
    return images


def check_class_folders(
    root: Path, allowed: Iterable[str], *, what: str, pattern: str, require_all: bool = False
) -> list[str]:
    """Sorted class-folder names under ``root``, all of which must be in ``allowed``.

    Loose files next to the class folders are ignored. Raises :class:`DatasetLayoutError` for an
    empty root, for folders whose names are not allowed classes and, with ``require_all``, for
    missing classes.
    """
    allowed_set = set(allowed)
    entries = list_dir(root)
    folders = [n for n in entries if (root / n).is_dir()]
    if not folders:
        raise DatasetLayoutError(
            f"{what}: no class folders in {str(root)!r}. Expected layout {pattern!r}; "
            f"the folder contains {_preview(entries)}."
        )
    unknown = [n for n in folders if n not in allowed_set]
    if unknown:
        example = sorted(allowed_set)[:3]
        raise DatasetLayoutError(
            f"{what}: {len(unknown)} folder(s) in {str(root)!r} are not valid class names: "
            f"{_preview(unknown)}. Expected layout {pattern!r} with class folders such as "
            f"{', '.join(repr(e) for e in example)}."
        )
    if require_all:
        missing = sorted(allowed_set.difference(folders))
        if missing:
            raise DatasetLayoutError(
                f"{what}: {len(missing)} class folder(s) missing in {str(root)!r}: "
                f"{_preview(missing)}. Expected layout {pattern!r}; found {_preview(folders)}."
            )
    return folders


def load_rgb(path: str | os.PathLike[str]) -> Any:
    """Open an image with PIL and convert it to RGB (decoding happens here, not at scan time)."""
    from PIL import Image

    with Image.open(path) as img:
        return img.convert("RGB")


def pil_to_tensor(img: Any) -> Tensor:
    """PIL RGB image -> float tensor ``[3, H, W]`` in ``[0, 1]`` (what ``ToTensor`` gives)."""
    if img.mode != "RGB":
        img = img.convert("RGB")
    w, h = img.size
    data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return data.view(h, w, 3).permute(2, 0, 1).float().div_(255.0)


class FolderDataset(Dataset[tuple[Tensor, int]]):
    """A list of ``(path, label)`` samples whose images are decoded lazily with PIL.

    ``transform`` maps the PIL RGB image to a tensor; the default is :func:`pil_to_tensor`.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        transform: Callable[[Any], Tensor] | None = None,
    ) -> None:
        self.samples: list[tuple[str, int]] = list(samples)
        self.transform: Callable[[Any], Tensor] = transform or pil_to_tensor

    @property
    def targets(self) -> list[int]:
        """The label of every sample, in dataset order."""
        return [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        path, label = self.samples[index]
        return self.transform(load_rgb(path)), label
