"""Benchmark harness: backbones (:mod:`eatta.bench.models`) and experiment tooling for §6."""
