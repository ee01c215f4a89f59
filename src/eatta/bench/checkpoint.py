"""Checkpoint plumbing: seeding, saving and restoring the global generators (for a bit-identical
resume), and atomic writes (an interrupted write never leaves a broken file)."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

__all__ = ["atomic_write", "rng_state", "seed_all", "set_rng_state"]


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - methods may draw from numpy's global RNG
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    """The global generators' states (CUDA's too on a GPU), for a checkpoint."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Restore the states :func:`rng_state` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """``write(file)`` into a temporary file renamed to ``path``: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
