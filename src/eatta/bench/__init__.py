"""Benchmark harness (``eatta-bench``).

- :mod:`eatta.bench.models`: the paper's backbones with their input normalization, local weights.
- :mod:`eatta.bench.digits_model`: the digits-C source CNN (weights shipped with the package).
- :mod:`eatta.bench.provenance`: digests of data and source model, compared with the reference.
- :mod:`eatta.bench.suites`: datasets and streams per benchmark (digits-C, ImageNet-C/R/K/A, PACS).
- :mod:`eatta.bench.runner`: one method on one stream (CTTA/FTTA, budgets, rounds, label shift,
  checkpoints, grids, seeds).
- :mod:`eatta.bench.report`: tables, CSV/JSON, the online-error plot, shard merging.
- :mod:`eatta.bench.reproduce`: the paper-table reproduction scripts' shared code.
- :mod:`eatta.bench.cli`: the ``eatta-bench`` command.
"""
