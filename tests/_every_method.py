"""Running every registered method the same way in a test: what each needs to be built, a
labelled stream, and one call that gives the labels to the methods that ask for them."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import eatta
from eatta.methods.registry import get_spec


def method_kwargs(name: str, side: int = 8) -> dict[str, Any]:
    """What ``eatta.create(name, ...)`` needs beside the model: an oracle for a method that asks,
    clean batches of ``side`` px for one that needs Fisher data (EATA)."""
    spec = get_spec(name)
    kw: dict[str, Any] = {"oracle": eatta.GroundTruthOracle()} if spec.active else {}
    if "fisher_data" in spec.needs:
        g = torch.Generator().manual_seed(1)
        kw["fisher_data"] = [torch.rand(8, 3, side, side, generator=g)]
    return kw


def labelled_batches(
    n: int, size: int = 16, *, side: int = 8, classes: int = 5, seed: int = 0
) -> list[tuple[Tensor, Tensor]]:
    """``n`` batches of ``size`` images in [0, 1] (``side`` px) with labels."""
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.rand(size, 3, side, side, generator=g),
            torch.randint(0, classes, (size,), generator=g),
        )
        for _ in range(n)
    ]


def call(method: eatta.AdaptiveMethod, name: str, x: Tensor, y: Tensor) -> Tensor:
    """``method(x)``, with the labels for a method that asks (its oracle reveals what it asks)."""
    return method(x, labels=y) if get_spec(name).active else method(x)
