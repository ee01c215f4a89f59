"""PACS dataset, domain names and sequences on a miniature folder tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from eatta.data import (
    PACS,
    PACS_CLASSES,
    PACS_DOMAINS,
    PACS_SEQUENCES,
    DatasetLayoutError,
    pacs_domain,
    pacs_domains,
    parse_pacs_sequence,
)


def make_pacs(root: Path, domains: tuple[str, ...] = PACS_DOMAINS, n: int = 2) -> Path:
    for d, domain in enumerate(domains):
        for c, cls in enumerate(PACS_CLASSES):
            folder = root / domain / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                color = (30 * c, 60 * d, 100 + i)
                Image.new("RGB", (20, 17), color).save(folder / f"pic_{i:03d}.jpg", quality=95)
    return root


def test_sequences_are_the_papers() -> None:
    letters = {"photo": "P", "art_painting": "A", "cartoon": "C", "sketch": "S"}
    assert ["".join(letters[d] for d in seq) for seq in PACS_SEQUENCES] == [
        "PACS",
        "ACPS",
        "CASP",
        "SCPA",
    ]
    assert PACS_CLASSES == ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")


def test_domain_and_sequence_parsing() -> None:
    assert pacs_domain("P") == "photo" and pacs_domain("a") == "art_painting"
    assert pacs_domain("Cartoon") == "cartoon"
    expected = ("photo", "art_painting", "cartoon", "sketch")
    for text in ("PACS", "P→A→C→S", "P->A->C->S", "P-A-C-S", "p, a, c, s"):
        assert parse_pacs_sequence(text) == expected
    assert parse_pacs_sequence(["S", "cartoon"]) == ("sketch", "cartoon")
    with pytest.raises(ValueError, match="unknown PACS domain 'X'"):
        pacs_domain("X")
    with pytest.raises(ValueError, match="distinct"):
        parse_pacs_sequence("PP")


def test_pacs_labels_and_transform(tmp_path: Path) -> None:
    ds = PACS(make_pacs(tmp_path), "A")
    assert ds.domain == "art_painting"
    assert len(ds) == 14
    assert ds.targets == [c for c in range(7) for _ in range(2)]
    x, y = ds[len(ds) - 1]
    assert y == PACS_CLASSES.index("person") == 6
    assert x.shape == (3, 224, 224) and x.dtype == torch.float32
    # solid color (180, 0, 101) survives resize up to JPEG error
    assert abs(float(x[0].mean()) - 180 / 255) < 0.03


def test_official_kfold_level_is_accepted(tmp_path: Path) -> None:
    make_pacs(tmp_path / "kfold", ("sketch",), n=1)
    assert len(PACS(tmp_path, "S")) == 7


def test_pacs_layout_errors(tmp_path: Path) -> None:
    make_pacs(tmp_path, ("photo", "cartoon"))
    with pytest.raises(DatasetLayoutError, match="'art_painting'") as err:
        PACS(tmp_path, "A")
    assert "'cartoon'" in str(err.value) and "'photo'" in str(err.value)
    assert "<root>/<domain>/<class>" in str(err.value)

    shutil.rmtree(tmp_path / "photo" / "horse")
    with pytest.raises(DatasetLayoutError, match="missing") as err:
        PACS(tmp_path, "photo")
    assert "'horse'" in str(err.value)

    (tmp_path / "cartoon" / "cat").mkdir()
    with pytest.raises(DatasetLayoutError, match="not valid class names") as err:
        PACS(tmp_path, "cartoon")
    assert "'cat'" in str(err.value)

    with pytest.raises(DatasetLayoutError, match="PACS root"):
        PACS(tmp_path / "nope", "photo")
    with pytest.raises(ValueError, match="unknown PACS domain"):
        PACS(tmp_path, "painting")


def test_pacs_domains_skip_the_source(tmp_path: Path) -> None:
    make_pacs(tmp_path, n=1)
    targets = pacs_domains(tmp_path, "C→A→S→P")
    assert [d.name for d in targets] == ["art_painting", "sketch", "photo"]
    everything = pacs_domains(tmp_path, PACS_SEQUENCES[0], include_source=True)
    assert [d.name for d in everything] == list(PACS_SEQUENCES[0])
    assert all(len(d.dataset) == 7 for d in everything)
