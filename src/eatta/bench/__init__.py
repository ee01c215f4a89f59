"""Benchmark harness (``eatta-bench``).

- :mod:`eatta.bench.models`: the paper's backbones with their input normalization, local weights.
- :mod:`eatta.bench.digits_model`: the digits-C source CNN, trained and cached on first use.
- :mod:`eatta.bench.suites`: datasets and streams per benchmark (digits-C, ImageNet-C/R/K/A, PACS).
- :mod:`eatta.bench.runner`: one method on one stream (CTTA/FTTA, budgets, checkpoints, grids).
- :mod:`eatta.bench.report`: tables, CSV/JSON, the online-error plot, shard merging.
- :mod:`eatta.bench.reproduce`: the paper-table reproduction scripts' shared code.
- :mod:`eatta.bench.cli`: the ``eatta-bench`` command.
"""
