"""Test streams for continual test-time adaptation: domains in order, shuffled per domain by a seed.

A stream is a sequence of :class:`Domain` (a name and a map-style dataset of ``(x, y)``). It is
cut into batches domain by domain (a batch never mixes domains; a domain's last batch may be
short). Domain ``k``'s order is ``torch.randperm(len(domain), generator=g)`` with ``g`` seeded by
``(seed, k)``, so the whole stream is fixed by ``seed`` alone, and any batch's indices can be
computed without touching an image: :meth:`TestStream.iter_from` resumes at batch ``t`` and loads
only what follows.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler

__all__ = ["Domain", "TestStream"]

_MASK63 = (1 << 63) - 1


class Domain(NamedTuple):
    """One test domain of a stream: its name (e.g. ``"gaussian_noise"``) and its dataset."""

    name: str
    dataset: Dataset[Any]


def _domain_seed(seed: int, k: int) -> int:
    # Mix (seed, k) into one 63-bit seed; fixed arithmetic, so identical on every platform.
    return (seed * 0x9E3779B97F4A7C15 + (k + 1) * 0xBF58476D1CE4E5B9) & _MASK63


class _PlanSampler(Sampler[list[int]]):
    """Yields the stream's batches (global ConcatDataset indices) from batch ``start`` on."""

    def __init__(self, stream: TestStream, start: int) -> None:
        self.stream = stream
        self.start = start

    def __len__(self) -> int:
        return len(self.stream) - self.start

    def __iter__(self) -> Iterator[list[int]]:
        s = self.stream
        for t in range(self.start, len(s)):
            yield s.batch_indices(t)[1]


class TestStream:
    """A seeded, resumable CTTA stream yielding ``(x, y, domain_name)`` batches.

    Args:
        domains: ``Domain``/``(name, dataset)`` pairs in adaptation order.
        batch_size: images per batch (64 in the paper).
        seed: fixes the within-domain shuffle; the same seed gives the same stream everywhere.
        shuffle: if False each domain is read in dataset order.
        num_workers, pin_memory, persistent_workers, prefetch_factor: passed to the
            :class:`~torch.utils.data.DataLoader` that :meth:`loader` builds.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self,
        domains: Sequence[Domain | tuple[str, Dataset[Any]]],
        batch_size: int = 64,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if not domains:
            raise ValueError("a stream needs at least one domain")
        self.domains: list[Domain] = []
        for i, item in enumerate(domains):
            try:
                name, dataset = item
            except (TypeError, ValueError):
                msg = f"domain {i} must be a (name, dataset) pair, got {item!r}"
                raise TypeError(msg) from None
            if not isinstance(name, str):
                raise TypeError(f"domain {i}: name must be a str, got {type(name).__name__}")
            size = len(dataset)  # type: ignore[arg-type]
            if size == 0:
                raise ValueError(f"domain {i} ({name!r}) is empty")
            self.domains.append(Domain(name, dataset))
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self._sizes = [len(d.dataset) for d in self.domains]  # type: ignore[arg-type]
        self._offsets = [0]
        for n in self._sizes:
            self._offsets.append(self._offsets[-1] + n)
        self.batches_per_domain: list[int] = [math.ceil(n / batch_size) for n in self._sizes]
        self._first_batch = [0]
        for b in self.batches_per_domain:
            self._first_batch.append(self._first_batch[-1] + b)
        self._perms: dict[int, Tensor] = {}

    @property
    def domain_names(self) -> list[str]:
        """Domain names in stream order."""
        return [d.name for d in self.domains]

    @property
    def num_samples(self) -> int:
        """Total number of test samples in the stream."""
        return self._offsets[-1]

    def __len__(self) -> int:
        """Number of batches in the stream."""
        return self._first_batch[-1]

    def permutation(self, k: int) -> Tensor:
        """The order (dataset indices) in which domain ``k`` is read."""
        return self._perm(k).clone()

    def _perm(self, k: int) -> Tensor:
        if k not in self._perms:
            n = self._sizes[k]
            if self.shuffle:
                g = torch.Generator().manual_seed(_domain_seed(self.seed, k))
                self._perms[k] = torch.randperm(n, generator=g)
            else:
                self._perms[k] = torch.arange(n)
        return self._perms[k]

    def locate(self, t: int) -> tuple[int, int]:
        """``(domain index, batch index within that domain)`` of global batch ``t``."""
        if not 0 <= t < len(self):
            raise IndexError(f"batch {t} out of range for a stream of {len(self)} batches")
        k = bisect.bisect_right(self._first_batch, t) - 1
        return k, t - self._first_batch[k]

    def batch_indices(self, t: int) -> tuple[str, list[int]]:
        """Domain name and global (concatenated-dataset) indices of batch ``t``; loads nothing."""
        k, b = self.locate(t)
        local = self._perm(k)[b * self.batch_size : (b + 1) * self.batch_size]
        return self.domains[k].name, (local + self._offsets[k]).tolist()

    def loader(self, start: int = 0) -> DataLoader[Any]:
        """A DataLoader yielding the ``(x, y)`` batches from batch ``start`` on, in stream order."""
        if not 0 <= start <= len(self):
            raise IndexError(f"start must be in [0, {len(self)}], got {start}")
        kwargs: dict[str, Any] = {}
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = self.prefetch_factor
        return DataLoader(
            ConcatDataset([d.dataset for d in self.domains]),
            batch_sampler=_PlanSampler(self, start),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            **kwargs,
        )

    def iter_from(self, start: int = 0) -> Iterator[tuple[Tensor, Tensor, str]]:
        """Batches ``(x, y, domain_name)`` from batch ``start`` on; skipped images stay unread."""
        loader = self.loader(start)
        for t, (x, y) in enumerate(loader, start):
            yield x, y, self.domain_of_batch(t)

    def domain_of_batch(self, t: int) -> str:
        """Name of the domain batch ``t`` belongs to."""
        return self.domains[self.locate(t)[0]].name

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, str]]:
        return self.iter_from(0)

    def __repr__(self) -> str:
        return (
            f"TestStream({len(self.domains)} domains, {self.num_samples} samples, "
            f"{len(self)} batches of {self.batch_size}, seed={self.seed})"
        )
