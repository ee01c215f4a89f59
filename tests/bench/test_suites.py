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
    with pytest.raises(ValueError, match="choose one"):
        suites.digits_c_benchmark(gradual=True, ccc="slow")
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


@pytest.fixture
def mnist_file(tmp_path):
    """A generated mnist_5k.csv.gz: 16 bars and boxes, labels 0-3."""
    import gzip

    import numpy as np

    rng = np.random.default_rng(0)
    images = np.zeros((16, 28, 28), dtype=np.uint8)
    for i, img in enumerate(images):
        top, left = rng.integers(2, 10, size=2)
        img[top : top + 14, left : left + 2 + 3 * (i % 4)] = 255
    rows = np.concatenate([images.reshape(16, -1), (np.arange(16) % 4)[:, None]], axis=1)
    path = tmp_path / "mnist_5k.csv.gz"
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")
    return path


def test_the_mnist_benchmark_serves_the_digits_model_on_one_domain(mnist_file):
    from eatta.data.mnist import mnist_digits
    from eatta.models.digits_cnn import DIGITS_SOURCE_SHA256

    b = suites.mnist_benchmark(mnist_file)
    assert (b.name, b.defaults_key) == ("mnist", "digits-c")
    ((name, ds),) = b.domains
    assert name == "mnist" and torch.equal(ds.tensors[0], mnist_digits(mnist_file).tensors[0])
    assert b.provenance["data_sha256"] == prov.dataset_digest(ds)
    assert b.provenance["model_sha256"] == DIGITS_SOURCE_SHA256
    assert b.fisher_data is not None and "severity" not in b.config


def test_the_mnist_benchmark_serves_the_vit_under_its_own_name(mnist_file):
    from eatta.models import digits_vit as dv

    b = suites.mnist_benchmark(mnist_file, backbone="digits-vit")
    assert (b.name, b.defaults_key) == ("mnist:vit", "digits-c")
    assert isinstance(b.model_fn(), dv.DigitsViT)
    assert b.provenance["model_sha256"] == dv.DIGITS_VIT_SHA256
    with pytest.raises(ValueError, match="mnist has no backbone 'resnet50_bn'"):
        suites.mnist_benchmark(mnist_file, backbone="resnet50_bn")


def test_the_mnist_stream_runs_with_the_stream_protocols(mnist_file, tmp_path, capsys):
    import eatta.bench.cli as cli

    out = tmp_path / "run"
    argv = ["--dataset", "mnist", "--root", f"mnist={mnist_file}", "--methods", "source,tent"]
    argv += ["--rounds", "2", "--dirichlet", "1", "--batch-size", "4", "--no-progress"]
    assert cli.main([*argv, "--no-plot", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("**mnist**: error % (lower is better), 16 images in 1 domains, × 2")
    assert "| Worse |" in text and "severity" not in text.splitlines()[0]
    doc = json.loads((out / "results.json").read_text())
    tent = doc["results"][1]
    assert tent["domains"] == ["mnist", "mnist"] and len(tent["online"]) == 8
    assert tent["protocol"]["rounds"] == 2 and "severity" not in tent["protocol"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mixed"], "mixed domains need at least two domains"),
        (["--severity", "2"], "mnist, which has no severities"),
        (["--gradual"], "gradual needs severities; mnist has none"),
        (["--ccc", "slow"], "built for digits-c, not mnist"),
    ],
)
def test_the_mnist_stream_refuses_what_it_has_not(mnist_file, tmp_path, capsys, extra, message):
    import eatta.bench.cli as cli

    out = tmp_path / "run"
    argv = ["--dataset", "mnist", "--root", f"mnist={mnist_file}", "--no-progress", *extra]
    assert cli.main([*argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not (out / "cells").exists()
