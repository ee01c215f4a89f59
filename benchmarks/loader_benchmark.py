#!/usr/bin/env python
"""Can the ImageNet-C loader feed the adaptation step? Loader images/s against step images/s.

Writes a miniature ImageNet-C tree of generated 224 px JPEGs (quality 85) into a temporary
folder and reads it through the benchmark's pipeline (:class:`eatta.data.imagenet.ImageNetC`,
:class:`eatta.data.stream.TestStream`) with 0, 1 and 2 persistent workers (pinned memory on a
GPU), timing a first epoch (start-up included) and a steady second one; a variant whose workers
return uint8 tensors shows what moving floats between processes costs. The step side: images/s
of inference, TENT and EATTA (budget 1) on ResNet-50 at 224 px (``--quick``: ResNet-18, batch 16).

    python benchmarks/loader_benchmark.py [--device cpu|cuda] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import _common
import _summary
import _timing
import torch
from torch import Tensor

import eatta
from eatta._compat import import_torchvision
from eatta.data.imagenet import ImageNetC, imagenet_wnids
from eatta.data.stream import TestStream
from eatta.methods.tent import Tent


def make_tree(root: Path, images: int, classes: int = 10, size: int = 224, seed: int = 0) -> float:
    """Write ``images`` JPEGs in ImageNet-C's layout; returns the mean file size in KB."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    total = 0
    for i in range(images):
        wnid = imagenet_wnids()[i % classes]
        folder = root / "gaussian_noise" / "5" / wnid
        folder.mkdir(parents=True, exist_ok=True)
        coarse = torch.rand(1, 3, 7, 7, generator=g)
        smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic")[0]
        noisy = (smooth + 0.15 * torch.randn(3, size, size, generator=g)).clamp(0, 1)
        pixels = (noisy * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
        path = folder / f"ILSVRC2012_val_{i + 1:08d}.JPEG"
        Image.fromarray(pixels).save(path, quality=85)
        total += path.stat().st_size
    return total / images / 1024


def pil_to_uint8(img: Any) -> Tensor:
    """PIL RGB image -> uint8 tensor ``[3, H, W]`` (a quarter of the float bytes to transfer)."""
    if img.mode != "RGB":
        img = img.convert("RGB")
    w, h = img.size
    data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return data.view(h, w, 3).permute(2, 0, 1)


def time_loader(
    root: Path, *, workers: int, batch: int, device: torch.device, uint8: bool
) -> dict[str, Any]:
    """images/s of a first and a second epoch of one loader, batches moved to ``device``."""
    dataset = ImageNetC(root, "gaussian_noise", 5, transform=pil_to_uint8 if uint8 else None)
    stream = TestStream(
        [("gaussian_noise", dataset)],
        batch,
        seed=0,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
    )
    loader = stream.loader()
    sync = _timing.synchronizer(device)
    epochs = []
    for _ in range(2):
        n = 0
        t0 = time.perf_counter()
        for x, _ in loader:
            x = x.to(device, non_blocking=True)
            if uint8:
                x = x.float().div_(255.0)
            n += len(x)
        sync()
        epochs.append(n / (time.perf_counter() - t0))
    del loader
    name = f"{workers} worker{'s' if workers != 1 else ''}"
    name += ", persistent" if workers else ", main process"
    name += ", pinned" if device.type == "cuda" else ""
    name += ", uint8 transfer" if uint8 else ", float transfer (pil_to_tensor)"
    speeds = {"first_epoch_images_per_s": epochs[0], "images_per_s": epochs[1]}
    return {"name": name, "workers": workers, "uint8": uint8, **speeds}


def time_steps(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """images/s of inference, TENT and EATTA on the ImageNet-C model at 224 px."""
    tv = import_torchvision()
    arch = "resnet18" if args.quick else "resnet50"
    batch = 16 if args.quick else args.batch
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, 224, 224, generator=g).to(device)
    y = torch.randint(0, 1000, (batch,), generator=g)

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = getattr(tv.models, arch)(num_classes=1000).to(device)
        return model, torch.optim.SGD(eatta.configure(model), lr=2.5e-4, momentum=0.9)

    tent = Tent(*build())
    method = eatta.EATTA(*build(), oracle=eatta.GroundTruthOracle())
    fns = {
        "inference": _timing.inference(build()[0], x),
        "tent": partial(tent, x),
        "eatta": partial(method, x, labels=y),
    }
    repeats = 2 if args.quick else 3
    samples = _timing.time_interleaved(fns, repeats=repeats, warmup=1, device=device)
    rows = []
    for name, s in samples.items():
        ms = _timing.stats_ms(s)["median_ms"]
        label = f"{name} ({arch}, 224 px, batch {batch})"
        rows.append({"name": label, "median_ms": ms, "images_per_s": batch / (ms / 1e3)})
    return rows


def note(result: dict[str, Any]) -> str:
    """The page's note: the best loader's images/s against the EATTA step's."""
    best = max(result["loaders"], key=lambda r: r["images_per_s"])
    step = next(r for r in result["steps"] if r["name"].startswith("eatta"))
    ratio = f"{best['images_per_s'] / step['images_per_s']:.1f}"
    cores = result["meta"]["cpu_count"]
    return _summary.PAGE("loader-note", best=best["name"], ratio=ratio, cores=cores)


def main(argv: list[str] | None = None) -> int:
    p = _timing.timing_parser(__doc__)
    p.add_argument("--images", type=int, help="JPEGs to generate (default 320, quick 96)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, nargs="+", help="(default 0 1 2, quick 0 2)")
    args = p.parse_args(argv)
    _timing.fill_defaults(args, args.quick, images=(320, 96))
    args.workers = args.workers or ([0, 2] if args.quick else [0, 1, 2])
    if (device := _timing.timing_device(args)) is None:
        return 2
    started = time.perf_counter()
    meta = _common.machine(device)
    result: dict[str, Any] = {"meta": meta, "batch": args.batch, "image_size": 224}
    with tempfile.TemporaryDirectory(prefix="mini-imagenet-c-") as tmp:
        root = Path(tmp)
        result["mean_file_kb"] = make_tree(root, args.images)
        result["images"] = args.images
        loaders = []
        for w in args.workers:
            for uint8 in (False, True):
                row = time_loader(root, workers=w, batch=args.batch, device=device, uint8=uint8)
                print(f"  {row['name']}: {row['images_per_s']:.0f} images/s", flush=True)
                loaders.append(row)
        result["loaders"] = loaders
    result["steps"] = time_steps(args, device)
    for row in result["steps"]:
        print(f"  {row['name']}: {row['images_per_s']:.1f} images/s", flush=True)
    result["notes"] = [note(result)]
    _timing.write_results(args.out / "loader_benchmark.json", result, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
