"""``benchmarks/per_sample_choice.py``: the distance it reads at the source model's last
BatchNorm layer, the rule applied to a run's records, and the table docs/safety.md quotes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from repo_scripts import REPO, benchmark_script


@pytest.fixture(scope="module")
def psc() -> Iterator[Any]:
    with benchmark_script("per_sample_choice") as module:
        yield module


def test_the_distance_is_the_samples_channel_means_in_the_last_layers_source_units(psc):
    torch.manual_seed(0)
    first, last = nn.BatchNorm2d(3), nn.BatchNorm2d(4)
    model = nn.Sequential(first, nn.Conv2d(3, 4, 1), last, nn.Flatten(), nn.LazyLinear(5)).eval()
    last.running_mean.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    last.running_var.copy_(torch.tensor([1.0, 2.0, 0.5, 4.0]))
    x = torch.randn(6, 3, 5, 5)
    pred, d = psc._near(model, x)
    with torch.no_grad():
        mu = model[1](model[0](x)).mean((2, 3))
        expected = ((mu - last.running_mean) ** 2 / last.running_var).mean(1)
        assert torch.equal(pred, model(x).argmax(1))
    torch.testing.assert_close(d, expected)
    assert not model[0]._forward_hooks and not last._forward_hooks  # the hook is removed


def _records() -> dict[str, np.ndarray]:
    """Two batches of 64: the first with 4 near samples, the second all near. The source model
    is right everywhere on domain "easy" and nowhere on "hard"; the served model the reverse."""
    y = np.zeros(128, dtype=int)
    domain = np.array(["easy", "hard"] * 64)
    source = np.where(domain == "easy", 0, 1)
    served = 1 - source
    d = np.ones(128)
    d[:4] = 0.0  # near: two easy, two hard samples of the first batch
    d[64:] = 0.0
    batch = np.repeat([0, 1], 64)
    return {"y": y, "batch": batch, "served": served, "source": source, "d": d, "domain": domain}


def test_near_samples_get_the_source_models_prediction(psc):
    r = _records()
    assert psc.evaluate(r, None, None) == (50.0, 100.0)  # as served: every easy sample wrong
    error, easy = psc.evaluate(r, 0.5, None)
    # near: samples 0-3 and the whole second batch take the source model's prediction
    wrong = np.where(np.r_[np.arange(64) < 4, np.ones(64, bool)], r["source"], r["served"]) != 0
    assert error == pytest.approx(100 * wrong.mean())
    assert easy == pytest.approx(100 * wrong[r["domain"] == "easy"].mean())


def test_the_gate_keeps_the_rule_to_batches_with_few_near_samples(psc):
    r = _records()
    error, _ = psc.evaluate(r, 0.5, 0.1)  # 4/64 near passes; the all-near batch does not
    wrong = np.where(np.arange(128) < 4, r["source"], r["served"]) != 0
    assert error == pytest.approx(100 * wrong.mean())


def test_the_gate_reads_each_batch_as_it_was_served(psc):
    """Batches of unequal size (a domain's remainder): the share is each real batch's, not of
    fixed chunks of 64 records."""
    r = _records()
    r["batch"] = np.r_[np.zeros(4, int), np.ones(124, int)]  # batch 0: samples 0-3, all near
    r["d"] = np.ones(128)
    r["d"][:4] = 0.0
    r["d"][4:6] = 0.0  # 2 near samples of 124 in batch 1
    error, _ = psc.evaluate(r, 0.5, 0.1)  # batch 0 is all near (gated out), batch 1 passes
    wrong = np.where((np.arange(128) >= 4) & (np.arange(128) < 6), r["source"], r["served"]) != 0
    assert error == pytest.approx(100 * wrong.mean())


def test_the_committed_results_render_the_table_docs_safety_quotes(psc):
    """Every line of the table of the quoted rules is in the page (its rows in another order)."""
    results = REPO / "benchmarks" / "results" / "per_sample_choice.json"
    table = psc.table(json.loads(results.read_text(encoding="utf-8")), psc.QUOTED)
    page = (REPO / "docs" / "safety.md").read_text(encoding="utf-8").splitlines()
    assert table.startswith("| stream | as served | `τ = 0.25` | `τ = 0.3` | `τ = 0.25`, gated |")
    assert len(table.splitlines()) == 8
    assert all(line in page for line in table.splitlines())
