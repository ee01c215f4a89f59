"""What one cell measured (:class:`CellResult`), its row label, and how it is stored on disk."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eatta.bench.checkpoint import atomic_write
from eatta.bench.grid import CellSpec
from eatta.methods import registry

__all__ = ["RESULT_VERSION", "CellResult", "atomic_write_text", "domain_means", "row_label"]

#: Version of the stored result format (``format_version`` in every result file).
RESULT_VERSION = 1


@dataclass
class CellResult:
    """Everything measured for one cell (one seed). Errors are percentages; ``online`` lists per
    batch ``[images, errors, labels]``. ``domains`` and the ``domain_*`` lists have one entry per
    domain *visit* (``rounds`` × the domain sequence); ``round_errors[r]`` is the average error
    over round ``r``'s domains, and ``average_error`` their mean."""

    spec: CellSpec
    grid_index: int
    fingerprint: str
    domains: list[str]
    domain_images: list[int]
    domain_errors: list[float]
    domain_labels: list[int]
    average_error: float
    overall_error: float
    labels_used: int
    images: int
    wall_time_s: float
    images_per_s: float
    peak_mem_mb: float | None
    max_rss_mb: float | None
    device: str
    online: list[list[int]]
    domain_first_batch: list[int]
    model_digest: str
    hparams: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    sessions: int = 1
    seed: int = 0
    rounds: int = 1
    round_errors: list[float] = field(default_factory=list)
    #: stream protocol: ``{"rounds": R, "dirichlet": δ or None, "gradual": bool}``
    protocol: dict[str, Any] = field(default_factory=dict)
    #: digests of the data and source model the cell ran on (see ``BenchmarkData.provenance``)
    provenance: dict[str, Any] = field(default_factory=dict)
    #: CPU seconds of the run's thread (wall time grows with the machine's load, this does not)
    cpu_time_s: float | None = None
    #: what the annotator did (active methods): requested, received, expired, pending, skipped,
    #: dropped, wrong, seconds, feedback (see :func:`eatta.bench.annotation.annotation_summary`)
    annotation: dict[str, Any] | None = None
    #: audits and guard (``--audit``): per-round estimates with intervals, resets, audit counts
    #: (see :func:`eatta.bench.monitoring.monitor_summary`)
    monitor: dict[str, Any] | None = None
    #: the source-model fallback's switches, resets and per-round gain estimates, if the method
    #: had one (see :func:`eatta.bench.monitoring.fallback_summary`)
    fallback: dict[str, Any] | None = None
    #: online protocol: ``cost`` r, batches ``adapted``, ``skipped``; its errors under ``online``
    realtime: dict[str, Any] | None = None
    #: True when this result was read back from an earlier finished run (not stored).
    reused: bool = field(default=False, compare=False)

    @property
    def label(self) -> str:
        """Row label: the cell's, naming a method preset and the labels a batch really gets
        (e.g. ``eatta reference (2/batch)``: the reference preset labels once per step)."""
        return row_label(self.spec, self.hparams)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("reused")
        return d | {"key": self.spec.key, "label": self.label, "format_version": RESULT_VERSION}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CellResult:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["spec"] = CellSpec(**d["spec"])
        if not kw.get("round_errors"):  # results written before rounds existed: one round
            kw["round_errors"] = [float(d["average_error"])]
        return cls(**kw)

    def save(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CellResult:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def domain_means(results: Sequence[CellResult]) -> dict[str, float]:
    """Each domain's error (%) over all its visits in ``results`` (every round, every run),
    weighted by the images of each visit."""
    wrong: dict[str, float] = {}
    seen: dict[str, int] = {}
    for r in results:
        for name, n, e in zip(r.domains, r.domain_images, r.domain_errors, strict=True):
            wrong[name] = wrong.get(name, 0.0) + n * e
            seen[name] = seen.get(name, 0) + n
    return {k: wrong[k] / seen[k] for k in wrong if seen[k]}


def row_label(spec: CellSpec, hparams: Mapping[str, Any]) -> str:
    """:attr:`CellSpec.label`, adjusted for hyperparameters that change what a row is: a
    ``preset`` is named, and EATTA's ``steps`` (each labelling) multiply the labels per batch."""
    preset = hparams.get("preset")
    steps = hparams.get("steps", 2 if preset == "reference" else 1)
    each_step = registry.get_spec(spec.method).labels_each_step
    if not each_step or not isinstance(steps, int) or isinstance(steps, bool):
        steps = 1  # EATTA re-selects (and labels) at every step; other methods label once
    label = dataclasses.replace(spec, labels=spec.labels * max(steps, 1)).label
    return label.replace(spec.method, f"{spec.method} {preset}", 1) if preset else label


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so readers never see half a file."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
