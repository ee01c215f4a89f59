"""``--batch-size`` and ``--every`` reach the stream and the budget under every protocol."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from bench_fixtures import (
    assert_cli_fails_before_any_work,
    fake_digits_c,
    one_thread,  # noqa: F401  (autouse fixture)
    tensor_domains,
)

import eatta.bench
from eatta.bench import StreamProtocol
from eatta.bench.benchmark import BenchmarkData
from eatta.models.digits_vit import DigitsViT

N, DOMAINS = 10, 3  # images per domain, domains


def vit_benchmark(**config: object) -> BenchmarkData:
    """Three tiny domains and a tiny LayerNorm ViT (no BatchNorm: batches of one adapt)."""
    torch.manual_seed(0)
    base = DigitsViT(num_classes=4, dim=8, depth=1, heads=2, patch=4, image_size=8).eval()
    return BenchmarkData(
        name="toy",
        defaults_key="digits-c",
        domains=tensor_domains(n=N),
        model_fn=lambda: copy.deepcopy(base),
        config=dict(config),
    )


PROTOCOLS = {
    "recurring": (StreamProtocol(rounds=2), {}),
    "gradual": (StreamProtocol(gradual=False), {"gradual": True}),  # its domains are the data's
    "mixed": (StreamProtocol(rounds=2, mixed=True), {}),
    "ccc": (StreamProtocol(), {"ccc": "fast"}),  # the walk's order, not shuffled
    "dirichlet": (StreamProtocol(rounds=2, dirichlet=0.1), {}),
}


@pytest.mark.small_batches  # the ViT adapts on batches of 1 and 4 as given, on purpose
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize(("batch", "every"), [(1, 4), (4, 2)])
def test_every_protocol_streams_the_batch_size_and_labels_every_nth(
    tmp_path, protocol, batch, every
):
    proto, config = PROTOCOLS[protocol]
    done = eatta.bench.run(
        {"toy": vit_benchmark(**config)},
        ["baseline"],
        protocol=proto,
        batch_size=batch,
        every=every,
        window=None,  # each batch adapted on as given (auto: a window of 64 on any model)
        out=tmp_path,
        progress=False,
        plot=False,
        device="cpu",
    )
    (r,) = done.results
    rounds = proto.rounds or 1
    sizes = [row[0] for row in r.online]
    assert sum(sizes) == N * DOMAINS * rounds
    if proto.mixed:  # one visit a round: batches cut from the pooled round
        assert len(sizes) == rounds * math.ceil(N * DOMAINS / batch)
    else:  # a batch never spans two domains
        assert len(sizes) == rounds * DOMAINS * math.ceil(N / batch)
    assert max(sizes) == batch
    # one label on every every-th batch of the stream (the first included), none elsewhere
    assert [row[2] for row in r.online] == [int(t % every == 0) for t in range(len(sizes))]
    assert r.labels_used == math.ceil(len(sizes) / every)


@pytest.mark.small_batches  # batches of 2, as given, on purpose
def test_ftta_restarts_the_every_count_at_each_domain(tmp_path):
    done = eatta.bench.run(
        {"toy": vit_benchmark()},
        ["baseline"],
        settings="ftta",
        rounds=1,
        batch_size=2,
        window=None,
        every=3,
        out=tmp_path,
        progress=False,
        plot=False,
        device="cpu",
    )
    (r,) = done.results
    per_domain = [int(b % 3 == 0) for b in range(N // 2)]  # batches 0 and 3 of each domain
    assert [row[2] for row in r.online] == per_domain * DOMAINS


@pytest.fixture
def toy_digits(monkeypatch):
    return fake_digits_c(monkeypatch)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--batch-size", "-3"], "--batch-size must be >= 1, got -3"),
        (["--every", "0"], "--every must be >= 1 (label every N-th batch), got 0"),
        (["--every", "4,-1"], "--every must be >= 1 (label every N-th batch), got -1"),
        (["--labels", "-2"], "--labels must be >= 0, got -2"),
        (["--backbone", "resnet50_bn"], "digits-c has no backbone 'resnet50_bn'"),
    ],
)
def test_bad_batch_size_every_or_backbone_fail_before_any_work(
    tmp_path, capsys, toy_digits, argv, message
):
    if argv[0] == "--backbone":  # checked when loading, before any cell runs or file is written
        import eatta.bench.cli as cli

        assert cli.main([*argv, "--methods", "source", "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "o").exists()
        return
    assert_cli_fails_before_any_work(argv, message, tmp_path / "o", capsys, toy_digits)


def test_sweep_plan_names_the_vit_grid_and_checks_the_same_values():
    from eatta.bench.sweep import plan

    p = plan(["--backbone", "digits-vit", "--methods", "tent", "--rounds", "1"])
    assert {spec.dataset for spec, _ in p.jobs} == {"digits-c:vit"}
    assert p.stream["digits-c:vit"][0] == 898 * 15
    assert plan(["--batch-size", "1", "--methods", "tent"]).jobs
    with pytest.raises(ValueError, match="--batch-size must be >= 1, got 0"):
        plan(["--batch-size", "0"])
    with pytest.raises(ValueError, match=r"--every must be >= 1 \(label every N-th batch\), got 0"):
        plan(["--every", "0"])
    with pytest.raises(ValueError, match="no backbone 'vit_b_16'"):
        plan(["--backbone", "vit_b_16"])
