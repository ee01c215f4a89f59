"""The benchmark grid: cells (method x dataset x setting x budget x buffer), seeds, shards.

:func:`make_grid` lists the cells in a canonical order, :func:`make_jobs` repeats them per seed,
and :func:`shard` splits the jobs round robin so that several machines share one grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from eatta.methods import registry

__all__ = [
    "SETTINGS",
    "STATIC_METHODS",
    "CellSpec",
    "make_grid",
    "make_jobs",
    "parse_shard",
    "shard",
]

#: ``"ctta"``: continual, never reset; ``"ftta"``: ``method.reset()`` at every domain change.
SETTINGS = ("ctta", "ftta")
_J = TypeVar("_J")
#: Methods whose predictions do not depend on the setting (nothing to reset).
STATIC_METHODS = frozenset({"source"})


@dataclass(frozen=True)
class CellSpec:
    """One grid cell: ``method`` on ``dataset`` in ``setting`` with a labelling budget."""

    dataset: str
    method: str
    setting: str = "ctta"
    labels: int = 0
    every: int = 1
    buffer: int | None = None

    def __post_init__(self) -> None:
        if self.setting not in (*SETTINGS, "-"):
            raise ValueError(f"setting must be one of {SETTINGS}, got {self.setting!r}")
        if self.labels < 0 or self.every < 1:
            raise ValueError(f"need labels >= 0 and every >= 1, got {self.labels}, {self.every}")
        if self.buffer is not None and self.buffer < 0:
            raise ValueError(f"buffer must be >= 0 or None, got {self.buffer}")

    @property
    def key(self) -> str:
        """Stable identifier, e.g. ``digits-c/eatta/ctta/k1-n1``."""
        key = f"{self.dataset}/{self.method}/{self.setting}/k{self.labels}-n{self.every}"
        return key if self.buffer is None else f"{key}-bfs{self.buffer}"

    @property
    def label(self) -> str:
        """Row label for tables and plots, e.g. ``eatta (1/batch, BFS=300)``."""
        parts = []
        if self.labels:
            per = "batch" if self.every == 1 else f"{self.every} batches"
            parts.append(f"{self.labels}/{per}")
        if self.buffer is not None:
            parts.append(f"BFS={self.buffer}")
        return f"{self.method} ({', '.join(parts)})" if parts else self.method

    def slug(self) -> str:
        return self.key.replace("/", "_").replace(":", "-")


def make_grid(
    datasets: Sequence[str],
    methods: Sequence[str],
    settings: Sequence[str] = ("ctta",),
    budgets: Sequence[tuple[int, int]] = ((1, 1),),
    buffers: Sequence[int | None] = (None,),
) -> list[CellSpec]:
    """All cells in canonical order (dataset, setting, method, budget, buffer).

    Budgets and buffers apply to active methods only; a non-active method gets one cell per
    setting, and ``source`` one cell per dataset (setting ``"-"``): their results do not depend
    on what they would ignore.
    """
    for s in settings:
        if s not in SETTINGS:
            raise ValueError(f"unknown setting {s!r}; choose from {SETTINGS}")
    cells: list[CellSpec] = []
    seen: set[CellSpec] = set()
    for ds in datasets:
        for setting in settings:
            for method in methods:
                spec_ = registry.get_spec(method)
                name = spec_.name.lower()
                if name in STATIC_METHODS:
                    candidates = [CellSpec(ds, name, "-")]
                elif not spec_.active:
                    candidates = [CellSpec(ds, name, setting)]
                else:
                    candidates = [
                        CellSpec(ds, name, setting, k, n, b) for k, n in budgets for b in buffers
                    ]
                for c in candidates:
                    if c not in seen:
                        seen.add(c)
                        cells.append(c)
    return cells


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (0 <= i < n) -> ``(i, n)``."""
    try:
        i_text, n_text = text.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        raise ValueError(f"shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard i/n needs 0 <= i < n, got {text!r}")
    return i, n


def shard(cells: Sequence[_J], index: int, count: int) -> list[tuple[int, _J]]:
    """The ``(grid index, cell)`` pairs of shard ``index`` of ``count``: cell ``j`` goes to shard
    ``j mod count`` (round robin, so expensive methods spread over the shards)."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"need 0 <= index < count, got {index}/{count}")
    return [(j, c) for j, c in enumerate(cells) if j % count == index]


def make_jobs(cells: Sequence[CellSpec], seeds: Sequence[int] = (0,)) -> list[tuple[CellSpec, int]]:
    """Every cell once per seed (cell-major), the list that :func:`shard` splits."""
    if not seeds:
        raise ValueError("need at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    return [(c, s) for c in cells for s in seeds]
