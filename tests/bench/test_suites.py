"""The ready-to-run benchmarks of :mod:`eatta.bench.suites`: severities, the MNIST stream."""

from __future__ import annotations

import json

import pytest
import torch
from bench_fixtures import one_thread  # noqa: F401  (autouse fixture)
from torch.utils.data import TensorDataset

from eatta.bench import provenance as prov
from eatta.bench import suites
from eatta.data.digits import DIGITS_C_CORRUPTIONS
from eatta.data.stream import Domain


@pytest.fixture
def asked(monkeypatch):
    """digits-C domains replaced by two tiny ones; returns the severities they were asked at."""
    import eatta.data.digits as digits

    severities: list[int] = []

    def fake_domains(corruptions=DIGITS_C_CORRUPTIONS, severity=5, **kw):
        severities.append(severity)
        g = torch.Generator().manual_seed(severity)
        return [
            Domain(c, TensorDataset(torch.rand(4, 3, 32, 32, generator=g), torch.arange(4)))
            for c in corruptions
        ]

    monkeypatch.setattr(digits, "digits_c_domains", fake_domains)
    return severities


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_digits_c_builds_its_domains_at_the_severity_given(asked, severity):
    b = suites.digits_c_benchmark(severity=severity)
    assert asked == [severity] and b.config["severity"] == severity
    ref = json.loads(prov._REFERENCE.read_text())["domains_sha256"]
    keys = [f"{c}@{severity}" for c in DIGITS_C_CORRUPTIONS]
    assert b.expected_provenance is not None
    assert b.expected_provenance["data_sha256"] == prov.combine([ref[k] for k in keys])


def test_severities_are_checked_before_anything_is_built(asked):
    for bad in (0, 6, 2.0, True, "3"):
        with pytest.raises(ValueError, match="from 1 to 5"):
            suites.digits_c_benchmark(severity=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="walks its own severities"):
        suites.digits_c_benchmark(severity=2, gradual=True)
    assert asked == []
    assert suites.check_severity("digits-c", None) == 5
    assert suites.check_severity("pacs", None) is None
    with pytest.raises(ValueError, match="severity 2 given for pacs, which has no severities"):
        suites.check_severity("pacs", 2)


def test_loading_checks_every_datasets_severity_before_loading_any(asked):
    from eatta.bench.api import load_benchmarks

    with pytest.raises(ValueError, match="imagenet-r, which has no severities"):
        load_benchmarks(["digits-c", "imagenet-r"], severity=2, roots={"imagenet-r": "/x"})
    assert asked == []  # digits-C, listed first, was not built
