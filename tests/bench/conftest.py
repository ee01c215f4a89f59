"""Fixtures shared by the harness tests (the helpers themselves live in bench_fixtures)."""

from __future__ import annotations

import pytest
from bench_fixtures import tiny_benchmark

from eatta.bench import suites


@pytest.fixture
def toy_digits(monkeypatch):
    """Replace the digits-C benchmark by a tiny stand-in (the real one: test_digits_model)."""
    calls = []

    def fake(cache_dir=None, *, log=None, gradual=False):
        calls.append(cache_dir)
        b = tiny_benchmark(name="digits-c")
        b.defaults_key = "digits-c"
        b.provenance = {"data_sha256": "d1", "model_sha256": "m1"}
        b.expected_provenance = dict(b.provenance)
        return b

    monkeypatch.setattr(suites, "digits_c_benchmark", fake)
    return calls
