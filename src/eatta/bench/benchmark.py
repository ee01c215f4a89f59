"""A dataset ready to benchmark: its domains in stream order, its source model, its annotator.

:class:`BenchmarkData` is what :mod:`eatta.bench.suites` builds for each dataset and what the
runner streams; :func:`prepare_domains` applies an image limit and keeps BatchNorm-safe batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, Subset

from eatta.annotate.oracle import Oracle
from eatta.data.stream import Domain

__all__ = ["BenchmarkData", "OnDevice", "prepare_domains"]


@dataclass
class BenchmarkData:
    """A dataset ready to run.

    Args:
        name: the dataset's name in the grid (``"digits-c"``, ``"pacs:P-A-C-S"``).
        defaults_key: which per-dataset defaults of the method registry apply (``"pacs"``).
        domains: ``(name, dataset)`` pairs in adaptation order; items are ``(x, y)``.
        model_fn: returns a fresh source model (called once per cell, after seeding).
        fisher_data: clean source batches for EATA's Fisher regularizer, if available.
        oracle_fn: builds the annotator for a device; None means the ground truth.
        config: what else determines the results (paths, backbone, ...), for the fingerprint.
        provenance: digests of the data and model, recorded in every result;
            ``expected_provenance`` those of the reference build (a mismatch is reported).
    """

    name: str
    defaults_key: str
    domains: Sequence[Domain | tuple[str, Dataset[Any]]]
    model_fn: Callable[[], nn.Module]
    fisher_data: Callable[[torch.device], Iterable[Any]] | None = None
    oracle_fn: Callable[[torch.device], Oracle] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    expected_provenance: dict[str, Any] | None = None

    def provenance_mismatch(self) -> list[str]:
        """Keys of ``provenance`` that differ from ``expected_provenance`` (none if unset)."""
        if not self.expected_provenance:
            return []
        return [k for k, v in self.expected_provenance.items() if self.provenance.get(k, v) != v]


def prepare_domains(
    domains: Sequence[Domain | tuple[str, Dataset[Any]]],
    batch_size: int,
    limit: int | None = None,
    seed: int = 0,
) -> tuple[list[Domain], list[str]]:
    """Apply ``limit`` (a seeded random subset of each domain, in dataset order) and drop the last
    image of a domain of ``m·B + 1`` (BatchNorm cannot adapt on a batch of one); returns the
    domains and notes on what changed."""
    out: list[Domain] = []
    notes: list[str] = []
    for k, (name, ds) in enumerate(domains):
        n = len(ds)  # type: ignore[arg-type]
        idx: list[int] | None = None
        if limit is not None and n > limit:
            g = torch.Generator().manual_seed(seed * 1000003 + k)
            idx = sorted(torch.randperm(n, generator=g)[:limit].tolist())
            n = limit
        if n % batch_size == 1 and n > 1:
            idx = (idx if idx is not None else list(range(n)))[:-1]
            notes.append(f"{name}: dropped 1 image so that no batch holds a single image")
        out.append(Domain(name, ds if idx is None else Subset(ds, idx)))
    return out, notes


class OnDevice:
    """Re-iterable view of ``batches`` with every tensor moved to ``device``."""

    def __init__(self, batches: Iterable[Any], device: torch.device) -> None:
        self.batches = batches
        self.device = device

    def __iter__(self) -> Any:
        for b in self.batches:
            if isinstance(b, Tensor):
                yield b.to(self.device)
            else:
                yield tuple(t.to(self.device) if isinstance(t, Tensor) else t for t in b)
