"""Benchmark harness (``eatta-bench``).

- :mod:`eatta.bench.provenance`: digests of data and source model, compared with the reference.
- :mod:`eatta.bench.suites`: datasets and streams per benchmark (digits-C, ImageNet-C/R/K/A, PACS).
- :mod:`eatta.bench.benchmark`: :class:`BenchmarkData`, a dataset ready to run.
- :mod:`eatta.bench.protocol`: :class:`StreamProtocol`, how the domains are streamed.
- :mod:`eatta.bench.annotation`: :class:`AnnotatorOptions`, who answers the active methods.
- :mod:`eatta.bench.monitoring`: ``MonitorOptions``: audits, the guard, the given-model fallback.
- :mod:`eatta.bench.options`: :class:`RunOptions`, how cells are run.
- :mod:`eatta.bench.grid`: grid cells (method, dataset, setting, budget, buffer), seeds, shards.
- :mod:`eatta.bench.runner`: the run loop: one cell on one stream (CTTA/FTTA, rounds, label shift),
  resumable from checkpoints.
- :mod:`eatta.bench.checkpoint`: seeding, random-generator capture, atomic checkpoint files.
- :mod:`eatta.bench.fingerprint`: what determines a cell's result, hashed (the code included).
- :mod:`eatta.bench.results`: :class:`CellResult`, row labels, result files.
- :mod:`eatta.bench.report`: tables, CSV/JSON, the online-error plot, shard merging.
- :mod:`eatta.bench.reproduce`: the paper-table reproduction scripts' shared code.
- :mod:`eatta.bench.api`: :func:`eatta.bench.run`, the benchmark as a Python call.
- :mod:`eatta.bench.flags`: command-line flags declared once, on the option dataclasses.
- :mod:`eatta.bench.commands`, :mod:`eatta.bench.cli`: the ``eatta-bench`` command (``run``,
  ``merge``, ``list``), built on :func:`run`.
- :mod:`eatta.bench.sweep`: ``eatta-bench sweep``, a grid's shards as a Slurm job array or local
  processes.
"""

from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.api import BenchmarkRun, load_benchmarks, run
from eatta.bench.protocol import StreamProtocol

__all__ = ["AnnotatorOptions", "BenchmarkRun", "StreamProtocol", "load_benchmarks", "run"]
