"""``eatta.realtime``: the online protocol's schedule, costs, serving a skipped batch, the
annotator's clock, and the speeds file."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

import eatta
from eatta.annotate.requests import LabelRequest
from eatta.annotate.simulated import SimulatedAnnotator
from eatta.realtime import (
    adapts_on,
    batch_counts,
    check_cost,
    read_costs,
    relative_cost,
    relative_costs,
    serve_without_adapting,
    skipped_after,
    tick_annotator,
    write_costs,
)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3),
    ).eval()  # fmt: skip


@pytest.mark.parametrize(
    ("cost", "skips", "adapted"),
    [(0.0, 0, "AAAAAA"), (0.4, 0, "AAAAAA"), (1.0, 0, "AAAAAA"), (1.01, 1, "A.A.A."),
     (2.0, 1, "A.A.A."), (2.5, 2, "A..A.."), (5.0, 4, "A....A")],
)  # fmt: skip
def test_a_step_of_cost_r_skips_the_next_ceil_r_minus_one_batches(cost, skips, adapted):
    assert skipped_after(cost) == skips
    assert "".join("A" if adapts_on(t, cost) else "." for t in range(6)) == adapted
    assert batch_counts(6, cost) == {"adapted": adapted.count("A"), "skipped": adapted.count(".")}


@pytest.mark.parametrize("bad", [-0.5, math.inf, math.nan, True, "2"])
def test_a_negative_non_finite_or_non_numeric_cost_is_refused(bad):
    with pytest.raises(ValueError, match="tent"):
        check_cost("tent", bad)


def test_serving_without_adapting_is_the_current_model_with_its_batch_statistics_untouched():
    model = _net()
    method = eatta.create("tent", model)
    x = torch.randn(8, 3, 6, 6)
    method(x)  # one step: TENT's model now normalizes with the batch's statistics
    before = copy.deepcopy(method.state_dict())
    out = serve_without_adapting(method, x + 1)
    with torch.no_grad():
        expected = method.model(x + 1)  # train-mode BatchNorm: this batch's statistics
    assert torch.equal(out, expected)
    after = method.state_dict()
    assert before.keys() == after.keys()
    assert all(
        torch.equal(before[k], after[k]) for k in before if isinstance(before[k], torch.Tensor)
    )


def test_serving_without_adapting_restores_running_statistics_a_forward_would_move():
    model = _net().train()  # BatchNorm tracking running statistics in train mode
    method = eatta.create("source", model)
    mean = model[1].running_mean.clone()
    serve_without_adapting(method, torch.randn(8, 3, 6, 6) + 3)
    assert torch.equal(model[1].running_mean, mean)


def test_cotta_serves_its_teacher():
    method = eatta.create("cotta", _net())
    with torch.no_grad():
        method.teacher[-1].weight.add_(1.0)  # teacher and student now differ
    x = torch.randn(8, 3, 6, 6)
    with torch.no_grad():
        assert torch.equal(serve_without_adapting(method, x), method.teacher(x))


def test_an_asynchronous_annotators_clock_runs_over_skipped_batches():
    def asked_at_step_0(annotator: SimulatedAnnotator) -> SimulatedAnnotator:
        annotator.set_labels(torch.tensor([2]))
        req = LabelRequest("r0", torch.zeros(3), torch.zeros(3), "label", 0, 0)
        annotator.submit([req])
        assert annotator.collect() == []  # step 0
        return annotator

    ticked, waited = (
        asked_at_step_0(SimulatedAnnotator(delay=3)),
        asked_at_step_0(SimulatedAnnotator(delay=3)),
    )
    tick_annotator(ticked)  # two skipped batches: the annotator works on
    tick_annotator(ticked)
    assert [a.label for a in ticked.collect()] == [2]  # the method's next step: due at 3
    assert waited.collect() == []  # without the skipped batches it would still wait
    tick_annotator(eatta.GroundTruthOracle())  # a synchronous oracle has no clock: nothing


def test_relative_cost_times_a_method_against_the_source_models_prediction():
    model, x, y = _net(), torch.randn(16, 3, 6, 6), torch.randint(0, 3, (16,))
    tent = eatta.create("tent", copy.deepcopy(model), window=False)
    r = relative_cost(tent, model, x, repeats=3, warmup=1)
    assert math.isfinite(r) and r > 0
    active = eatta.create(
        "baseline", copy.deepcopy(model), oracle=eatta.GroundTruthOracle(), window=False
    )
    costs = relative_costs({"tent": tent, "baseline": active}, model, x, labels=y, repeats=2)
    assert set(costs) == {"tent", "baseline"} and active.labels_used > 0  # asked, with labels
    with pytest.raises(ValueError, match="repeats"):
        relative_costs({"tent": tent}, model, x, repeats=0)


def test_a_speeds_file_round_trips_and_is_checked(tmp_path):
    path = write_costs(tmp_path / "speeds.json", {"source": 1.0, "tent": 2.5}, 64, "cpu")
    doc = json.loads(path.read_text())
    assert doc["measured"]["batch_size"] == 64 and "processor" in doc["measured"]
    assert read_costs(path, ["source", "tent"], "--speeds") == {"source": 1.0, "tent": 2.5}
    assert read_costs(path, ["source"]) == {"source": 1.0}
    with pytest.raises(ValueError, match=r"--speeds .* has no cost for eta"):
        read_costs(path, ["tent", "eta"], "--speeds")
    for bad in (-1.0, float("nan"), float("inf")):
        path.write_text(json.dumps({"costs": {"tent": bad}}))
        with pytest.raises(ValueError, match=r"tent \(--speeds"):
            read_costs(path, ["tent"], "--speeds")
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match='no "costs" table'):
        read_costs(path, ["tent"], "--speeds")
    with pytest.raises(ValueError, match="cannot read"):
        read_costs(tmp_path / "missing.json", ["tent"], "--speeds")
