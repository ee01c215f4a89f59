"""ImageNet-C/R/A/Sketch datasets on miniature folder trees written to tmp_path."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from eatta.data import (
    CORRUPTIONS,
    DatasetLayoutError,
    EvalTransform,
    ImageNetA,
    ImageNetC,
    ImageNetR,
    ImageNetSketch,
    SubsetLogits,
    class_indices,
    imagenet_a_wnids,
    imagenet_c_domains,
    imagenet_r_wnids,
    imagenet_wnids,
    select_logits,
    select_subset,
)

WNIDS = imagenet_wnids()
# three classes spread over the list: first, one in the middle, last
MINI = (WNIDS[0], WNIDS[500], WNIDS[999])


def write_image(path: Path, size: tuple[int, int] = (8, 8), seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    img = Image.new("RGB", size)
    img.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(size[0] * size[1])])
    img.save(path, quality=95)


def make_c(root: Path, corruption: str = "gaussian_noise", severity: int = 5, n: int = 4) -> Path:
    for k, wnid in enumerate(MINI):
        for i in range(n):
            write_image(root / corruption / str(severity) / wnid / f"img_{k}_{i:03d}.JPEG", seed=i)
    return root


# ----------------------------------------------------------------------------- wnid lists


def test_shipped_wnid_lists_are_complete_and_sorted() -> None:
    assert len(WNIDS) == 1000 == len(set(WNIDS))
    assert list(WNIDS) == sorted(WNIDS)
    assert WNIDS[0] == "n01440764" and WNIDS[-1] == "n15075141"
    for sub in (imagenet_r_wnids(), imagenet_a_wnids()):
        assert len(sub) == 200 == len(set(sub))
        assert list(sub) == sorted(sub)
        assert set(sub) <= set(WNIDS)


def test_class_indices_match_published_masks() -> None:
    # First entries of the index lists in the official ImageNet-R / ImageNet-A eval code.
    assert class_indices(imagenet_r_wnids())[:8] == [1, 2, 4, 6, 8, 9, 11, 13]
    assert class_indices(imagenet_r_wnids())[-3:] == [981, 983, 988]
    assert class_indices(imagenet_a_wnids())[:6] == [6, 11, 13, 15, 17, 22]
    assert class_indices(imagenet_a_wnids())[-3:] == [986, 987, 988]
    with pytest.raises(ValueError, match="not ImageNet-1k wnids"):
        class_indices(["n00000000"])


def test_select_logits_and_subset_wrapper_pick_the_200_columns() -> None:
    idx = class_indices(imagenet_r_wnids())
    logits = torch.randn(5, 1000)
    sub = select_logits(logits, idx)
    assert sub.shape == (5, 200)
    assert torch.equal(sub, logits[:, idx])

    model = nn.Linear(4, 1000)
    wrapped = SubsetLogits(model, idx)
    x = torch.randn(3, 4)
    assert torch.equal(wrapped(x), model(x)[:, idx])
    assert wrapped.model is model
    with pytest.raises(ValueError, match="indices must lie in"):
        select_logits(torch.randn(2, 10), [3, 10])
    with pytest.raises(ValueError, match=r"\[N, C\]"):
        select_logits(torch.randn(10), [1])


# ----------------------------------------------------------------------------- ImageNet-C


def test_imagenet_c_labels_are_positions_in_the_1000_list(tmp_path: Path) -> None:
    ds = ImageNetC(make_c(tmp_path), "gaussian_noise", severity=5)
    assert len(ds) == 12
    assert Counter(ds.targets) == {0: 4, 500: 4, 999: 4}
    x, y = ds[len(ds) - 1]
    assert y == 999
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert float(x.max()) > 0.2  # decoded, not blank


def test_imagenet_c_missing_corruption_folder_names_pattern_and_found(tmp_path: Path) -> None:
    make_c(tmp_path, "shot_noise")
    with pytest.raises(DatasetLayoutError) as err:
        ImageNetC(tmp_path, "gaussian_noise")
    msg = str(err.value)
    assert "gaussian_noise" in msg and "does not exist" in msg
    assert "<root>/<corruption>/<severity>/<wnid>/*.JPEG" in msg
    assert "'shot_noise'" in msg  # what was found instead


def test_imagenet_c_missing_root_and_severity(tmp_path: Path) -> None:
    with pytest.raises(DatasetLayoutError, match="ImageNet-C root"):
        ImageNetC(tmp_path / "nowhere", "gaussian_noise")
    make_c(tmp_path, "gaussian_noise", severity=3)
    with pytest.raises(DatasetLayoutError, match="severity folder") as err:
        ImageNetC(tmp_path, "gaussian_noise", severity=5)
    assert "'3'" in str(err.value)


def test_imagenet_c_rejects_non_wnid_and_empty_folders(tmp_path: Path) -> None:
    make_c(tmp_path)
    bad = tmp_path / "gaussian_noise" / "5" / "dogs"
    write_image(bad / "a.JPEG")
    with pytest.raises(DatasetLayoutError, match="not valid class names") as err:
        ImageNetC(tmp_path, "gaussian_noise")
    assert "'dogs'" in str(err.value) and "n01440764" in str(err.value)
    (bad / "a.JPEG").unlink()
    bad.rmdir()

    empty = tmp_path / "gaussian_noise" / "5" / WNIDS[1]
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(DatasetLayoutError, match="no image files") as err:
        ImageNetC(tmp_path, "gaussian_noise")
    assert "notes.txt" in str(err.value)

    only_files = tmp_path / "other"
    (only_files / "gaussian_noise" / "5").mkdir(parents=True)
    (only_files / "gaussian_noise" / "5" / "x.JPEG").write_bytes(b"")
    with pytest.raises(DatasetLayoutError, match="no class folders"):
        ImageNetC(only_files, "gaussian_noise")


def test_imagenet_c_bad_arguments(tmp_path: Path) -> None:
    make_c(tmp_path)
    with pytest.raises(ValueError, match="unknown corruption 'gauss'"):
        ImageNetC(tmp_path, "gauss")
    with pytest.raises(ValueError, match="severity"):
        ImageNetC(tmp_path, "gaussian_noise", severity=6)
    with pytest.raises(ValueError, match="subset size"):
        ImageNetC(tmp_path, "gaussian_noise", subset=13)
    with pytest.raises(FileNotFoundError, match="neither an image count"):
        ImageNetC(tmp_path, "gaussian_noise", subset="five")


def test_subset_is_deterministic_stratified_and_same_across_corruptions(tmp_path: Path) -> None:
    make_c(tmp_path, "gaussian_noise", n=6)
    make_c(tmp_path, "fog", n=6)
    a = ImageNetC(tmp_path, "gaussian_noise", subset=6)
    b = ImageNetC(tmp_path, "gaussian_noise", subset="6")
    c = ImageNetC(tmp_path, "fog", subset=6)
    assert a.samples == b.samples
    assert Counter(a.targets) == {0: 2, 500: 2, 999: 2}
    assert [Path(p).name for p, _ in a.samples] == [Path(p).name for p, _ in c.samples]
    other = ImageNetC(tmp_path, "gaussian_noise", subset=6, subset_seed=1)
    assert other.samples != a.samples
    odd = ImageNetC(tmp_path, "gaussian_noise", subset=7)
    assert sorted(Counter(odd.targets).values()) == [2, 2, 3]


def test_select_subset_5000_of_imagenet_c_is_5_per_class_and_pinned() -> None:
    names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 51)]
    files = {w: names for w in WNIDS}
    first = select_subset(files, 5000)
    assert first == select_subset(files, 5000)
    assert len(first) == 1000 and all(len(v) == 5 for v in first.values())
    # Pinned: the choice must never change between versions or machines.
    assert select_subset({"n01440764": names}, 2) == {
        "n01440764": ["ILSVRC2012_val_00000038.JPEG", "ILSVRC2012_val_00000042.JPEG"]
    }


def test_subset_from_file_list(tmp_path: Path) -> None:
    make_c(tmp_path)
    listing = tmp_path / "ids.txt"
    listing.write_text(f"{MINI[1]}/img_1_002.JPEG 500\n\n{MINI[0]}/img_0_000.JPEG\n")
    ds = ImageNetC(tmp_path, "gaussian_noise", subset=listing)
    assert [(Path(p).name, y) for p, y in ds.samples] == [
        ("img_0_000.JPEG", 0),
        ("img_1_002.JPEG", 500),
    ]
    listing.write_text(f"{MINI[0]}/missing.JPEG\n")
    with pytest.raises(DatasetLayoutError, match=r"missing\.JPEG"):
        ImageNetC(tmp_path, "gaussian_noise", subset=listing)


def test_imagenet_c_domains_follow_ctta_order(tmp_path: Path) -> None:
    assert CORRUPTIONS[0] == "gaussian_noise" and CORRUPTIONS[-1] == "jpeg_compression"
    assert len(CORRUPTIONS) == 15 == len(set(CORRUPTIONS))
    for c in CORRUPTIONS:
        make_c(tmp_path, c, n=1)
    domains = imagenet_c_domains(tmp_path, subset=None)
    assert [d.name for d in domains] == list(CORRUPTIONS)
    assert all(len(d.dataset) == 3 for d in domains)
    assert all(d.dataset.corruption == d.name for d in domains)


# ----------------------------------------------------------------------------- R / A / Sketch


def test_imagenet_r_labels_follow_the_200_list(tmp_path: Path) -> None:
    r = imagenet_r_wnids()
    for wnid in (r[0], r[199]):
        write_image(tmp_path / wnid / "a.jpg", size=(300, 260))
    (tmp_path / "README.txt").write_text("loose files are ignored")
    ds = ImageNetR(tmp_path)
    assert ds.targets == [0, 199]
    x, _ = ds[0]
    assert x.shape == (3, 224, 224)


def test_imagenet_r_rejects_a_wnid_outside_its_200(tmp_path: Path) -> None:
    assert WNIDS[0] not in imagenet_r_wnids()
    write_image(tmp_path / WNIDS[0] / "a.jpg")
    with pytest.raises(DatasetLayoutError, match="ImageNet-R") as err:
        ImageNetR(tmp_path)
    assert WNIDS[0] in str(err.value)


def test_imagenet_a_and_sketch_labels(tmp_path: Path) -> None:
    a = imagenet_a_wnids()
    write_image(tmp_path / "a" / a[5] / "x.jpg", size=(230, 240))
    assert ImageNetA(tmp_path / "a").targets == [5]
    write_image(tmp_path / "k" / WNIDS[42] / "x.JPEG", size=(240, 230))
    sketch = ImageNetSketch(tmp_path / "k")
    assert sketch.targets == [42]
    assert sketch[0][0].shape == (3, 224, 224)
    with pytest.raises(DatasetLayoutError, match="ImageNet-Sketch"):
        ImageNetSketch(tmp_path / "missing")


@pytest.mark.parametrize("size", [(300, 257), (257, 300), (256, 256), (500, 333)])
def test_eval_transform_matches_torchvision(size: tuple[int, int]) -> None:
    from eatta._compat import import_torchvision

    tv = import_torchvision()
    t = tv.transforms
    reference = t.Compose([t.Resize(256), t.CenterCrop(224), t.ToTensor()])
    g = torch.Generator().manual_seed(0)
    arr = torch.randint(0, 256, (size[1], size[0], 3), dtype=torch.uint8, generator=g)
    img = Image.fromarray(arr.numpy())
    ours = EvalTransform()(img)
    assert ours.shape == (3, 224, 224)
    assert torch.equal(ours, reference(img))
