"""The benchmark grid: cells (method x dataset x setting x budget x buffer), seeds, shards."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from eatta.methods import registry

__all__ = [
    "GIVEN",
    "SETTINGS",
    "CellSpec",
    "is_static",
    "make_grid",
    "make_jobs",
    "parse_shard",
    "resolve_shard",
    "shard",
]

#: ``"ctta"``: continual, never reset; ``"ftta"``: ``method.reset()`` at every domain change.
SETTINGS = ("ctta", "ftta")
#: The method that serves the model as given: every table's reference row.
GIVEN = "source"


def is_static(method: str) -> bool:
    """Whether ``method``'s predictions depend on nothing of the stream (it does not adapt: no
    setting, reset, window or parts apply)."""
    return not registry.get_spec(method).adapts


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
        per = "batch" if self.every == 1 else f"{self.every} batches"
        parts = [f"{self.labels}/{per}"] if self.labels else []
        parts += [] if self.buffer is None else [f"BFS={self.buffer}"]
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
    """All cells in canonical order (dataset, setting, method, budget, buffer); budgets and
    buffers only for active methods, one cell per dataset for ``source`` (setting ``"-"``)."""
    for s in settings:
        if s not in SETTINGS:
            raise ValueError(f"unknown setting {s!r}; choose from {SETTINGS}")
    cells: list[CellSpec] = []
    for ds in datasets:
        for setting in settings:
            for method in methods:
                spec = registry.get_spec(method)
                name = spec.name.lower()
                if is_static(name):
                    cells.append(CellSpec(ds, name, "-"))
                elif not spec.active:
                    cells.append(CellSpec(ds, name, setting))
                else:
                    cells += [
                        CellSpec(ds, name, setting, k, n, b) for k, n in budgets for b in buffers
                    ]
    return list(dict.fromkeys(cells))  # each cell once, where it first appears


def parse_shard(text: str, environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``"i/n"`` (0 <= i < n) -> ``(i, n)``; ``"auto"``: :func:`resolve_shard` of ``environ``."""
    if text.strip().lower() == "auto":
        return resolve_shard(os.environ if environ is None else environ)
    try:
        i_text, n_text = text.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        raise ValueError(f"shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard i/n needs 0 <= i < n, got {text!r}")
    return i, n


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    if not (text := environ.get(name, "").strip()):
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--shard auto: {name}={text!r} is not an integer") from None


def resolve_shard(environ: Mapping[str, str]) -> tuple[int, int]:
    """This process's shard ``(i, n)`` for ``--shard auto``: ``EATTA_SHARD=i/n``, else a Slurm
    job array numbered 0 to n-1 (any other numbering is an error, not a wrong split)."""
    if own := environ.get("EATTA_SHARD", "").strip():
        if own.lower() == "auto":
            raise ValueError("EATTA_SHARD must be i/n (e.g. 0/4), not 'auto'")
        try:
            return parse_shard(own)
        except ValueError as err:
            raise ValueError(f"EATTA_SHARD: {err}") from None
    if (task := _env_int(environ, "SLURM_ARRAY_TASK_ID")) is None:
        where = "a Slurm job but not an array" if environ.get("SLURM_JOB_ID") else "neither is set"
        raise ValueError(
            "--shard auto takes the shard from a Slurm job array (sbatch --array=0-<n-1>: "
            f"SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT) or from EATTA_SHARD=i/n; {where}"
        )
    count, low, high, step = (
        _env_int(environ, f"SLURM_ARRAY_TASK_{k}") for k in ("COUNT", "MIN", "MAX", "STEP")
    )
    if count is None and low == 0 and high is not None:  # no task count set: from the id range
        count = high + 1
    if count is None or not (
        low in (None, 0) and step in (None, 1) and high in (None, count - 1) and 0 <= task < count
    ):
        raise ValueError(
            f"--shard auto needs an array numbered 0 to n-1 (sbatch --array=0-<n-1>); this one "
            f"has task {task} of ids {low}-{high} step {step}, {count} tasks: set "
            "EATTA_SHARD=$SLURM_ARRAY_TASK_ID/<n> for a partial or renumbered array"
        )
    return task, count


_J = TypeVar("_J")


def shard(cells: Sequence[_J], index: int, count: int) -> list[tuple[int, _J]]:
    """Shard ``index`` of ``count``: the ``(j, cell)`` pairs with ``j mod count == index`` (round
    robin, so expensive methods spread over the shards)."""
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
