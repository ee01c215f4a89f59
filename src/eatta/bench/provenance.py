"""What benchmark numbers depend on beyond the code: digests of the data and the source model,
recorded in every result and compared with ``digits_reference.json``, so a difference shows.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Sequence
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

__all__ = [
    "COMPUTED_WITH",
    "CORRUPTION_STACK",
    "combine",
    "corruption_stack_versions",
    "dataset_digest",
    "digits_reference",
    "machine_provenance",
]

#: Keys saying how, not on what, numbers were computed: a difference is information, not a warning.
COMPUTED_WITH = ("cpu_capability", "machine")

#: Distributions whose versions can change the digits-C arrays.
CORRUPTION_STACK = tuple(
    "corrupt-tta numpy scipy scikit-image scikit-learn opencv-python opencv-python-headless "
    "pillow wand".split()
)

_REFERENCE = Path(__file__).with_name("digits_reference.json")


def machine_provenance() -> dict[str, str]:
    """Torch's CPU kernel level and the architecture: vector widths round differently."""
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


def corruption_stack_versions() -> dict[str, str | None]:
    """Installed version of each :data:`CORRUPTION_STACK` distribution (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in CORRUPTION_STACK:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def dataset_digest(dataset: Dataset[Any]) -> str | None:
    """SHA-256 of an in-memory ``TensorDataset`` (images as uint8, and labels); else None."""
    if not isinstance(dataset, TensorDataset) or len(dataset.tensors) < 2:
        return None
    x, y = dataset.tensors[0], dataset.tensors[1]
    h = hashlib.sha256()
    h.update(f"{list(x.shape)}".encode())
    q = x.detach().cpu().mul(255.0).round_().clamp_(0, 255).to(torch.uint8).contiguous()
    h.update(q.numpy().tobytes())
    h.update(y.detach().cpu().to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def combine(digests: Sequence[str | None]) -> str | None:
    """One digest for an ordered list of digests (None if any is unknown)."""
    if not digests or any(d is None for d in digests):
        return None
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()  # type: ignore[arg-type]


@lru_cache(maxsize=1)
def _reference() -> dict[str, Any] | None:
    try:
        return json.loads(_REFERENCE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def digits_reference(domain_names: Sequence[str]) -> dict[str, Any] | None:
    """Reference digests for a digits-C run over ``domain_names`` (``"fog"``: severity 5, else
    ``"fog@3"``) and what computed the README's table; None without a reference."""
    if (ref := _reference()) is None:
        return None
    table = ref.get("domains_sha256", {})
    keys = [n if "@" in n else f"{n}@5" for n in domain_names]
    out = {
        "model_sha256": ref.get("model_sha256"),
        "data_sha256": combine([table.get(k) for k in keys]),
    }
    out.update({k: ref[k] for k in COMPUTED_WITH if ref.get(k) is not None})
    return out
