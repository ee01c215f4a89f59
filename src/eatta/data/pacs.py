"""PACS: 7 classes in 4 domains (photo P, art painting A, cartoon C, sketch S), paper §6.

Layout ``root/<domain>/<class>/*`` (the ``kfold`` folder of the official release), labels in the
sorted class order (dog=0, elephant, giraffe, guitar, horse, house, person=6). Images (227 px in
the release) are resized to 224 x 224 (bilinear, both sides, no crop) and converted to ``[0, 1]``
tensors; normalization belongs to the model wrapper.

A sequence such as P→A→C→S trains the source model on its first domain (P) and adapts on the
others in order (A, C, S).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from eatta.data._layout import (
    FolderDataset,
    check_class_folders,
    list_images,
    pil_to_tensor,
    require_dir,
)
from eatta.data.stream import Domain

__all__ = [
    "PACS",
    "PACS_CLASSES",
    "PACS_DOMAINS",
    "PACS_LETTERS",
    "PACS_SEQUENCES",
    "ResizeTransform",
    "pacs_domain",
    "pacs_domains",
    "parse_pacs_sequence",
]

PACS_DOMAINS: tuple[str, ...] = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES: tuple[str, ...] = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
PACS_LETTERS: dict[str, str] = {"P": "photo", "A": "art_painting", "C": "cartoon", "S": "sketch"}

#: The four domain sequences of the paper: P→A→C→S, A→C→P→S, C→A→S→P, S→C→P→A.
PACS_SEQUENCES: tuple[tuple[str, ...], ...] = tuple(
    tuple(PACS_LETTERS[letter] for letter in seq) for seq in ("PACS", "ACPS", "CASP", "SCPA")
)

_PATTERN = "<root>/<domain>/<class>/*.jpg with domain in art_painting|cartoon|photo|sketch"


def pacs_domain(name: str) -> str:
    """Full PACS domain name for a full name or its letter (``"P"`` -> ``"photo"``)."""
    key = name.strip()
    if key.upper() in PACS_LETTERS and len(key) == 1:
        return PACS_LETTERS[key.upper()]
    if key.lower() in PACS_DOMAINS:
        return key.lower()
    raise ValueError(
        f"unknown PACS domain {name!r}; expected one of {PACS_DOMAINS} or a letter P, A, C, S"
    )


def parse_pacs_sequence(sequence: str | Sequence[str]) -> tuple[str, ...]:
    """Domain names of a sequence given as ``"PACS"``, ``"P→A→C→S"``, ``"P-A-C-S"`` or a list."""
    if isinstance(sequence, str):
        text = sequence
        for sep in ("→", "->", "-", ",", " ", ">"):
            text = text.replace(sep, " ")
        parts = text.split()
        if len(parts) == 1 and parts[0].upper() == parts[0] and len(parts[0]) > 1:
            parts = list(parts[0])  # "PACS"
    else:
        parts = list(sequence)
    domains = tuple(pacs_domain(p) for p in parts)
    if len(set(domains)) != len(domains) or len(domains) < 2:
        raise ValueError(f"a PACS sequence needs >= 2 distinct domains, got {sequence!r}")
    return domains


class ResizeTransform:
    """Resize a PIL image to ``size`` x ``size`` (bilinear, aspect not kept), then to a tensor."""

    def __init__(self, size: int = 224) -> None:
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        self.size = size

    def __call__(self, img: Any) -> Tensor:
        from PIL import Image

        return pil_to_tensor(img.resize((self.size, self.size), Image.Resampling.BILINEAR))

    def __repr__(self) -> str:
        return f"ResizeTransform(size={self.size})"


class PACS(FolderDataset):
    """One PACS domain, ``root/<domain>/<class>/*``; all 7 class folders must be present.

    ``domain`` is a full name or a letter (P, A, C, S). Default transform:
    :class:`ResizeTransform` (224 x 224).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        domain: str,
        transform: Callable[[Any], Tensor] | None = None,
    ) -> None:
        self.root = Path(root)
        self.domain = pacs_domain(domain)
        require_dir(self.root, what="PACS root", pattern=_PATTERN)
        folder = self.root / self.domain
        if not folder.is_dir() and (self.root / "kfold").is_dir():
            folder = self.root / "kfold" / self.domain  # the official archive's extra level
        require_dir(folder, what=f"PACS domain {self.domain!r}", pattern=_PATTERN)
        what = f"PACS domain {self.domain!r}"
        classes = check_class_folders(
            folder, PACS_CLASSES, what=what, pattern=_PATTERN, require_all=True
        )
        samples = [
            (str(folder / c / name), PACS_CLASSES.index(c))
            for c in classes
            for name in list_images(folder / c, pattern=_PATTERN)
        ]
        super().__init__(samples, transform if transform is not None else ResizeTransform())


def pacs_domains(
    root: str | os.PathLike[str],
    sequence: str | Sequence[str],
    *,
    include_source: bool = False,
    transform: Callable[[Any], Tensor] | None = None,
) -> list[Domain]:
    """The domains of a sequence, in order, without its first (source) domain by default."""
    names = parse_pacs_sequence(sequence)
    if not include_source:
        names = names[1:]
    return [Domain(n, PACS(root, n, transform=transform)) for n in names]
