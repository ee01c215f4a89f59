"""Benchmark harness (``eatta-bench``).

:func:`run` is the benchmark as a Python call; :mod:`eatta.bench.commands` and
:mod:`eatta.bench.cli` are the command built on it (``run``, ``merge``, ``list``) and
:mod:`eatta.bench.sweep` runs a grid's shards on a cluster. From the data to the table:
:mod:`~eatta.bench.suites` (the datasets), :mod:`~eatta.bench.grid` (cells, seeds, shards),
:mod:`~eatta.bench.runner` (one cell on one stream, resumable) and :mod:`~eatta.bench.report`
(tables, files, merging); each module's docstring says what it holds.
"""

from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.api import BenchmarkRun, load_benchmarks, run
from eatta.bench.protocol import StreamProtocol

__all__ = ["AnnotatorOptions", "BenchmarkRun", "StreamProtocol", "load_benchmarks", "run"]
