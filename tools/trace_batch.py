"""How far one batch travels through the library: the modules it enters and the moves between.

Builds each method with ``eatta.create`` around a small ``features`` / ``classifier`` CNN, serves
it two batches of 32 samples at 16 px, then records every Python call made inside ``src/eatta``
while it serves the third, by module, consecutive calls in one module counted once::

    python tools/trace_batch.py tent eatta eatta-safe        # modules, moves
    python tools/trace_batch.py --path eatta                  # and the path itself

``modules`` is how many library modules the batch entered, ``moves`` how many times it went from
one to another. ``tests/test_structure.py`` holds the bounds of issue 60 with :func:`trace`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import Tensor, nn

import eatta
from eatta.methods.registry import get_spec

SRC = str(Path(eatta.__file__).resolve().parent) + "/"


class FeaturesClassifier(nn.Module):
    """A ``features`` / ``classifier`` CNN, as published models are written."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1, stride=2),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(16, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def trace(name: str) -> list[str]:
    """The library modules the third batch through ``name`` calls into, in order, each run of
    calls into one module once (paths relative to the package)."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(32, 3, 16, 16, generator=g) for _ in range(3)]
    ys = [torch.randint(0, 10, (32,), generator=g) for _ in range(3)]
    active = get_spec(name).active
    kw: dict[str, Any] = {"oracle": eatta.GroundTruthOracle()} if active else {}
    if name == "eata":
        kw["fisher_data"] = [xs[0]]
    method = eatta.create(name, FeaturesClassifier(), **kw)
    for x, y in zip(xs[:2], ys[:2], strict=True):
        method(x, labels=y) if active else method(x)
    seq: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(SRC):
                module = path[len(SRC) :]
                if not seq or seq[-1] != module:
                    seq.append(module)

    sys.setprofile(profile)
    try:
        method(xs[2], labels=ys[2]) if active else method(xs[2])
    finally:
        sys.setprofile(None)
    return seq


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("methods", nargs="+", help="registered method names")
    parser.add_argument("--path", action="store_true", help="print the path too")
    args = parser.parse_args(argv)
    for name in args.methods:
        path = trace(name)
        print(f"{name}: {len(set(path))} modules, {len(path) - 1} moves")
        if args.path:
            print("  " + " -> ".join(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
