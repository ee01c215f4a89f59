"""Test streams for continual test-time adaptation: domains in order, seeded, resumable, and the
long-term protocols (recurring rounds, gradual severities, Dirichlet label shift, mixed domains).

A stream is a sequence of :class:`Domain` (a name and a map-style dataset of ``(x, y)``), visited
``rounds`` times (the *recurring* protocol of PeTTA, NeurIPS 2024: round ``r`` repeats the whole
domain sequence in a fresh order). Visit ``j`` (domain ``j mod K`` of round ``j // K``, ``K``
domains) is cut into batches (a batch never mixes domains, unless ``mixed``; a visit's last batch
may be short).
Visit ``j``'s order is fixed by ``(seed, j)`` alone:

* i.i.d. (default): ``torch.randperm`` with a generator seeded by ``(seed, j)``;
* label shift (``dirichlet=δ``): :func:`dirichlet_order`, samples grouped by class following a
  Dirichlet(δ) process over time slots, as in the non-i.i.d. settings of NOTE, RoTTA and SAR
  (δ = 0.1: strongly class-correlated batches; large δ: close to i.i.d.).

So any batch's indices can be computed without touching an image: :meth:`TestStream.iter_from`
resumes at batch ``t`` (also in the middle of a round) and loads only what follows. With
``rounds=1`` and no label shift the stream is the one of earlier versions, batch for batch.

*Mixed domains* (``mixed=True``): each round pools the samples of all ``K`` domains and shuffles
them together (seeded by ``(seed, round)``, or ordered by the Dirichlet process over the pooled
labels), so every batch draws from all domains. A round is then one visit, named ``"mixed"``:
``visits_per_round`` is 1, ``locate(t)`` gives ``(round, batch within the round)``,
``batches_per_visit[r]`` is ``ceil(N / batch_size)`` for the ``N`` samples of a round, and
:meth:`TestStream.sample_domains` gives the domain of each sample of a batch (per-domain errors).
:func:`gradual_domains` builds CoTTA's *gradual* sequence (severity 1→5→1 within each corruption).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler, Subset, TensorDataset

__all__ = [
    "GRADUAL_SEVERITIES",
    "MIXED",
    "Domain",
    "TestStream",
    "base_domain_name",
    "dataset_labels",
    "dirichlet_order",
    "gradual_domains",
]

_MASK63 = (1 << 63) - 1
_MIXED_SALT = 0x6D69786564  # "mixed": mixed rounds get orders unrelated to the domains' visits

#: Visit name of every round of a ``mixed`` stream.
MIXED = "mixed"

#: Severity order of CoTTA's gradual setting within one corruption.
GRADUAL_SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5, 4, 3, 2, 1)


class Domain(NamedTuple):
    """One test domain of a stream: its name (e.g. ``"gaussian_noise"``) and its dataset."""

    name: str
    dataset: Dataset[Any]


def _domain_seed(seed: int, k: int) -> int:
    # Mix (seed, k) into one 63-bit seed; fixed arithmetic, so identical on every platform.
    return (seed * 0x9E3779B97F4A7C15 + (k + 1) * 0xBF58476D1CE4E5B9) & _MASK63


def dataset_labels(dataset: Dataset[Any]) -> Tensor:
    """All labels of ``dataset`` as an int64 tensor, read without decoding images where possible
    (``TensorDataset``, ``Subset``, ``ConcatDataset``, datasets with ``targets``); otherwise by
    reading every item."""
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1].reshape(-1).long()
    if isinstance(dataset, Subset):
        idx = torch.as_tensor(list(dataset.indices), dtype=torch.long)
        return dataset_labels(dataset.dataset)[idx]
    if isinstance(dataset, ConcatDataset):
        return torch.cat([dataset_labels(d) for d in dataset.datasets])
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return torch.as_tensor(list(targets), dtype=torch.long).reshape(-1)
    return torch.as_tensor(
        [int(dataset[i][1]) for i in range(len(dataset))],  # type: ignore[arg-type]
        dtype=torch.long,
    )


def dirichlet_order(
    labels: Sequence[int] | np.ndarray | Tensor,
    concentration: float,
    num_slots: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """A permutation of ``range(len(labels))`` ordered by a Dirichlet class process.

    Time is cut into ``num_slots`` slots; each class draws its share of every slot from
    ``Dirichlet(concentration · 1)`` and its (shuffled) samples are dealt to the slots in those
    proportions; slots are read in order, each shuffled. Small ``concentration`` puts most of a
    class in few slots (long runs of one class); large ``concentration`` spreads it evenly.
    Every sample appears exactly once.
    """
    if not concentration > 0 or not math.isfinite(concentration):
        raise ValueError(f"the Dirichlet concentration must be > 0, got {concentration!r}")
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    y = np.asarray(labels).reshape(-1)
    slots: list[list[np.ndarray]] = [[] for _ in range(num_slots)]
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        share = rng.dirichlet(np.full(num_slots, float(concentration)))
        cuts = np.rint(np.cumsum(share) * len(members)).astype(np.int64)
        cuts[-1] = len(members)
        lo = 0
        for s, hi in enumerate(cuts):
            if hi > lo:
                slots[s].append(members[lo:hi])
                lo = int(hi)
    parts = [rng.permutation(np.concatenate(s)) for s in slots if s]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def gradual_domains(
    corruptions: Sequence[str],
    make: Callable[[str, int], Dataset[Any]],
    severities: Sequence[int] = GRADUAL_SEVERITIES,
) -> list[Domain]:
    """CoTTA's gradual sequence: for each corruption, ``make(corruption, severity)`` at severities
    1, 2, 3, 4, 5, 4, 3, 2, 1; domains are named ``"<corruption>@<severity>"``. Datasets are
    built once per (corruption, severity) and shared by the visits."""
    built: dict[tuple[str, int], Dataset[Any]] = {}
    out = []
    for c in corruptions:
        for s in severities:
            if (c, s) not in built:
                built[(c, s)] = make(c, s)
            out.append(Domain(f"{c}@{s}", built[(c, s)]))
    return out


def base_domain_name(name: str) -> str:
    """``"fog@3"`` -> ``"fog"`` (the corruption of a gradual domain); other names unchanged."""
    return name.split("@", 1)[0]


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
        seed: fixes every visit's order; the same seed gives the same stream everywhere.
        shuffle: if False each domain is read in dataset order (every round alike).
        rounds: how many times the domain sequence is repeated (recurring protocol).
        dirichlet: if given, the Dirichlet concentration δ of the label-shift order.
        mixed: shuffle the samples of all domains together within each round (module docstring);
            needs at least two domains and ``shuffle=True``.
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
        rounds: int = 1,
        dirichlet: float | None = None,
        mixed: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be a positive int, got {rounds!r}")
        if dirichlet is not None:
            if isinstance(dirichlet, bool) or not isinstance(dirichlet, int | float):
                raise TypeError(f"dirichlet must be a number, got {type(dirichlet).__name__}")
            if not dirichlet > 0 or not math.isfinite(dirichlet):
                raise ValueError(f"dirichlet must be a finite number > 0, got {dirichlet!r}")
            if not shuffle:
                raise ValueError("dirichlet orders samples at random; it cannot use shuffle=False")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if not domains:
            raise ValueError("a stream needs at least one domain")
        if not isinstance(mixed, bool):
            raise TypeError(f"mixed must be a bool, got {type(mixed).__name__}")
        if mixed and len(domains) < 2:
            raise ValueError(f"mixed needs at least two domains, got {len(domains)}")
        if mixed and not shuffle:
            raise ValueError("mixed shuffles the domains together; it cannot use shuffle=False")
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
        self.rounds = rounds
        self.dirichlet = None if dirichlet is None else float(dirichlet)
        self.mixed = mixed
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self._sizes = [len(d.dataset) for d in self.domains]  # type: ignore[arg-type]
        self._offsets = [0]
        for n in self._sizes:
            self._offsets.append(self._offsets[-1] + n)
        #: Batches per domain read alone (one visit, unless ``mixed``).
        self.batches_per_domain: list[int] = [math.ceil(n / batch_size) for n in self._sizes]
        #: Batches per visit, over all rounds (visit ``j`` is domain ``j % K`` of round ``j // K``;
        #: with ``mixed``, visit ``j`` is round ``j``).
        self.batches_per_visit: list[int] = (
            [math.ceil(self._offsets[-1] / batch_size)] * rounds
            if mixed
            else self.batches_per_domain * rounds
        )
        self._first_batch = [0]
        for b in self.batches_per_visit:
            self._first_batch.append(self._first_batch[-1] + b)
        self._perms: dict[int, Tensor] = {}
        self._labels: dict[int, np.ndarray] = {}

    @property
    def domain_names(self) -> list[str]:
        """Domain names in the order of one round."""
        return [d.name for d in self.domains]

    @property
    def visits_per_round(self) -> int:
        """Visits in one round: the number of domains, or 1 with ``mixed``."""
        return 1 if self.mixed else len(self.domains)

    @property
    def visit_names(self) -> list[str]:
        """Domain name of every visit, all rounds (``domain_names`` repeated ``rounds`` times;
        ``"mixed"`` for each round with ``mixed``)."""
        return [MIXED] * self.rounds if self.mixed else self.domain_names * self.rounds

    @property
    def visit_first_batch(self) -> list[int]:
        """First global batch of every visit."""
        return self._first_batch[:-1]

    @property
    def batches_per_round(self) -> int:
        """Number of batches in one round."""
        return self._first_batch[self.visits_per_round]

    @property
    def num_samples(self) -> int:
        """Total number of test samples in the stream (all rounds)."""
        return self._offsets[-1] * self.rounds

    def __len__(self) -> int:
        """Number of batches in the stream."""
        return self._first_batch[-1]

    def permutation(self, j: int) -> Tensor:
        """The order (dataset indices of domain ``j % K``) in which visit ``j`` is read; with
        ``mixed``, the order of round ``j`` as global (concatenated-dataset) indices."""
        if not 0 <= j < len(self.batches_per_visit):
            raise IndexError(f"visit {j} out of range for {len(self.batches_per_visit)} visits")
        return self._perm(j).clone()

    def _domain_labels(self, k: int) -> np.ndarray:
        if k not in self._labels:
            self._labels[k] = dataset_labels(self.domains[k].dataset).numpy()
        return self._labels[k]

    def _perm(self, j: int) -> Tensor:
        if j not in self._perms:
            if len(self._perms) >= 4:  # visits are read in order: keep only the latest few
                self._perms.pop(next(iter(self._perms)))
            if self.mixed:
                self._perms[j] = self._mixed_perm(j)
                return self._perms[j]
            k = j % len(self.domains)
            n = self._sizes[k]
            if self.dirichlet is not None:
                rng = np.random.default_rng(_domain_seed(self.seed, j))
                order = dirichlet_order(
                    self._domain_labels(k), self.dirichlet, self.batches_per_domain[k], rng
                )
                self._perms[j] = torch.from_numpy(order.astype(np.int64))
            elif self.shuffle:
                g = torch.Generator().manual_seed(_domain_seed(self.seed, j))
                self._perms[j] = torch.randperm(n, generator=g)
            else:
                self._perms[j] = torch.arange(n)
        return self._perms[j]

    def _mixed_perm(self, r: int) -> Tensor:
        """Round ``r``'s order of all samples (global indices), seeded by ``(seed, r)``."""
        seed = _domain_seed(self.seed ^ _MIXED_SALT, r)
        if self.dirichlet is not None:
            labels = np.concatenate([self._domain_labels(k) for k in range(len(self.domains))])
            rng = np.random.default_rng(seed)
            order = dirichlet_order(labels, self.dirichlet, self.batches_per_visit[r], rng)
            return torch.from_numpy(order.astype(np.int64))
        g = torch.Generator().manual_seed(seed)
        return torch.randperm(self._offsets[-1], generator=g)

    def locate(self, t: int) -> tuple[int, int]:
        """``(visit index, batch index within that visit)`` of global batch ``t``; the visit is
        domain ``visit % K`` of round ``visit // K`` (with one round: the domain index), or,
        with ``mixed``, round ``visit``."""
        if not 0 <= t < len(self):
            raise IndexError(f"batch {t} out of range for a stream of {len(self)} batches")
        j = bisect.bisect_right(self._first_batch, t) - 1
        return j, t - self._first_batch[j]

    def round_of_batch(self, t: int) -> int:
        """Round (0-based) batch ``t`` belongs to."""
        return self.locate(t)[0] // self.visits_per_round

    def batch_indices(self, t: int) -> tuple[str, list[int]]:
        """Visit name (the domain's, or ``"mixed"``) and global (concatenated-dataset) indices
        of batch ``t``; loads no image (a Dirichlet order reads the domain's labels once)."""
        j, b = self.locate(t)
        local = self._perm(j)[b * self.batch_size : (b + 1) * self.batch_size]
        if self.mixed:
            return MIXED, local.tolist()
        k = j % len(self.domains)
        return self.domains[k].name, (local + self._offsets[k]).tolist()

    def sample_domains(self, t: int) -> list[int]:
        """Domain index (into :attr:`domains`) of each sample of batch ``t``, in batch order:
        what per-domain errors of a ``mixed`` stream are counted by. Loads no image."""
        _, idx = self.batch_indices(t)
        return [bisect.bisect_right(self._offsets, i) - 1 for i in idx]

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
        """Name of the domain batch ``t`` belongs to (``"mixed"`` with ``mixed``)."""
        if self.mixed:
            return MIXED
        return self.domains[self.locate(t)[0] % len(self.domains)].name

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, str]]:
        return self.iter_from(0)

    def __repr__(self) -> str:
        extra = "" if self.rounds == 1 else f", rounds={self.rounds}"
        if self.dirichlet is not None:
            extra += f", dirichlet={self.dirichlet:g}"
        if self.mixed:
            extra += ", mixed"
        return (
            f"TestStream({len(self.domains)} domains, {self.num_samples} samples, "
            f"{len(self)} batches of {self.batch_size}, seed={self.seed}{extra})"
        )
