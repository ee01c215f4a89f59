"""The benchmark runner: settings, budgets, oracles, checkpoint/resume, grids, shards, outputs."""

from __future__ import annotations

import csv
import json
from typing import Any

import pytest
import torch
from bench_fixtures import (
    assert_png,
    one_thread,  # noqa: F401  (autouse fixture)
    tiny_benchmark,
    tiny_net,
)
from torch import Tensor

from eatta.annotate.oracle import ModelOracle
from eatta.bench.grid import CellSpec, make_grid, shard
from eatta.bench.report import csv_text, load_results, markdown_table, write_outputs
from eatta.bench.results import CellResult
from eatta.bench.runner import RunOptions, run_cell, run_grid
from eatta.methods import registry
from eatta.methods.base import AdaptiveMethod

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

EVENTS: list[tuple[str, int]] = []


class _Spy(AdaptiveMethod):
    """Records resets and batch sizes; predicts with the model (no adaptation)."""

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        EVENTS.append(("batch", x.shape[0]))
        with torch.no_grad():
            return self.model(x)

    def reset_method_state(self) -> None:
        EVENTS.append(("reset", 0))


@pytest.fixture
def spy(monkeypatch):
    """A method named ``spy-reset`` in the registry for one test (removed afterwards)."""
    registry.available()  # load the built-in methods first
    spec = registry.MethodSpec("spy-reset", lambda model, hp, oracle, budget: _Spy(model))
    monkeypatch.setitem(registry._REGISTRY, "spy-reset", spec)
    EVENTS.clear()
    return EVENTS


def opts(**kw: Any) -> RunOptions:
    base = {"batch_size": 8, "progress": False, "checkpoint_every": 2}
    base.update(kw)
    return RunOptions(**base)


def same_result(a: CellResult, b: CellResult) -> None:
    assert a.online == b.online
    assert a.domain_errors == b.domain_errors
    assert a.domain_labels == b.domain_labels
    assert a.model_digest == b.model_digest and a.model_digest


class Stop(Exception):
    pass


def stop_at(batch: int):
    def callback(t: int, info: dict[str, Any]) -> None:
        if t == batch:
            raise Stop

    return callback


# ----------------------------------------------------------------------------- resume


@pytest.mark.parametrize(
    ("method", "setting", "labels", "stop"),
    [("eatta", "ctta", 1, 5), ("baseline", "ftta", 1, 4), ("tent", "ftta", 0, 7)],
)
def test_interrupted_run_resumes_to_the_identical_result(tmp_path, method, setting, labels, stop):
    data = tiny_benchmark()  # 3 domains x 20 images, batches of 8: 3 batches per domain
    spec = CellSpec("toy", method, setting, labels, 1)
    full = run_cell(spec, data, opts(), tmp_path / "full")
    with pytest.raises(Stop):
        run_cell(spec, data, opts(), tmp_path / "cut", callback=stop_at(stop))
    ckpts = list((tmp_path / "cut" / "checkpoints").glob("*.pt"))
    assert len(ckpts) == 1
    saved = torch.load(ckpts[0], weights_only=False)
    # saved after batch t when (t + 1) is a multiple of checkpoint_every, before the callback
    assert saved["position"] == ((stop + 1) // 2) * 2
    assert len(saved["online"]) == saved["position"]
    resumed = run_cell(spec, data, opts(), tmp_path / "cut")
    same_result(resumed, full)
    assert resumed.sessions == 2 and full.sessions == 1
    assert not list((tmp_path / "cut" / "checkpoints").glob("*.pt"))  # removed when finished
    assert resumed.labels_used == full.labels_used


def test_resume_at_a_domain_boundary_resets_in_ftta(tmp_path):
    data = tiny_benchmark()
    spec = CellSpec("toy", "eatta", "ftta", 1, 1)
    full = run_cell(spec, data, opts(checkpoint_every=3), tmp_path / "full")
    with pytest.raises(Stop):  # checkpoint after batch 2 = end of the first domain
        run_cell(spec, data, opts(checkpoint_every=3), tmp_path / "cut", callback=stop_at(4))
    same_result(run_cell(spec, data, opts(checkpoint_every=3), tmp_path / "cut"), full)


def test_finished_cell_is_loaded_not_rerun(tmp_path):
    data = tiny_benchmark()
    spec = CellSpec("toy", "tent", "ctta")
    first = run_cell(spec, data, opts(), tmp_path)
    calls = []
    again = run_cell(spec, data, opts(), tmp_path, callback=lambda t, i: calls.append(t))
    assert calls == [] and again.to_dict() == first.to_dict()
    assert again.reused and not first.reused
    fresh = run_cell(spec, data, opts(reuse=False), tmp_path, callback=lambda t, i: calls.append(t))
    assert calls == list(range(9)) and not fresh.reused
    assert fresh.online == first.online


def test_changed_arguments_start_fresh(tmp_path):
    data = tiny_benchmark()
    spec = CellSpec("toy", "eatta", "ctta", 1, 1)
    with pytest.raises(Stop):
        run_cell(spec, data, opts(seed=0), tmp_path, callback=stop_at(5))
    other = run_cell(spec, data, opts(seed=1), tmp_path)
    assert other.sessions == 1
    assert other.fingerprint != run_cell(spec, data, opts(seed=0), tmp_path).fingerprint


# ----------------------------------------------------------------------------- settings, budgets


def test_ftta_resets_at_every_domain_change_and_ctta_never(tmp_path, spy):
    data = tiny_benchmark()
    run_cell(CellSpec("toy", "spy-reset", "ftta"), data, opts(), tmp_path / "f")
    kinds = [e[0] for e in EVENTS]
    assert kinds == ["batch"] * 3 + ["reset"] + ["batch"] * 3 + ["reset"] + ["batch"] * 3
    assert [e[1] for e in EVENTS if e[0] == "batch"] == [8, 8, 4] * 3
    EVENTS.clear()
    run_cell(CellSpec("toy", "spy-reset", "ctta"), data, opts(), tmp_path / "c")
    assert [e[0] for e in EVENTS] == ["batch"] * 9


@pytest.mark.parametrize(
    ("setting", "per_batch"),
    [("ctta", [1, 0, 1, 0, 1, 0, 1, 0, 1]), ("ftta", [1, 0, 1, 1, 0, 1, 1, 0, 1])],
)
def test_labels_every_n_batches_counted_across_resets(tmp_path, setting, per_batch):
    data = tiny_benchmark()
    r = run_cell(CellSpec("toy", "eatta", setting, 1, 2), data, opts(), tmp_path)
    assert [b[2] for b in r.online] == per_batch  # FTTA's reset restarts the budget's count
    assert r.domain_labels == [sum(per_batch[3 * k : 3 * k + 3]) for k in range(3)]
    assert r.labels_used == sum(per_batch)


def test_labels_counted_when_a_reset_happens_inside_the_step(tmp_path, monkeypatch):
    """A guard resets the method inside its forward, after the step's labels were committed:
    every answer still counts (the Labels column once showed 650 of 2,250)."""
    import eatta.bench.runner as runner

    made: list[AdaptiveMethod] = []
    create = runner.registry.create

    def create_resetting(*args: Any, **kwargs: Any) -> AdaptiveMethod:
        method = create(*args, **kwargs)
        step = method.forward
        calls = [0]

        def forward_then_reset(x: Tensor) -> Tensor:
            out = step(x)
            calls[0] += 1
            if calls[0] % 4 == 0:  # as AccuracyMonitor._check_guard does after the step
                method.reset(keep_monitor=True)
            return out

        method.forward = forward_then_reset  # type: ignore[method-assign]
        made.append(method)
        return method

    monkeypatch.setattr(runner.registry, "create", create_resetting)
    r = run_cell(CellSpec("toy", "eatta", "ctta", 1, 1), tiny_benchmark(), opts(), tmp_path)
    assert [b[2] for b in r.online] == [1] * 9 and r.labels_used == 9
    assert made[0].labels_used == 1 and made[0].budget.lifetime_used == 9  # 2 resets


def test_k_labels_per_batch_and_buffer(tmp_path):
    r = run_cell(CellSpec("toy", "baseline", "ctta", 3, 1, 5), tiny_benchmark(), opts(), tmp_path)
    assert r.labels_used == 27 and r.spec.label == "baseline (3/batch, BFS=5)"
    assert r.hparams["buffer"] == 5
    # EATTA's class balancing may take fewer than k per batch, never more
    e = run_cell(CellSpec("toy", "eatta", "ctta", 3, 1), tiny_benchmark(), opts(), tmp_path)
    assert 9 < e.labels_used <= 27 and max(b[2] for b in e.online) == 3


def test_model_oracle_annotates_instead_of_the_ground_truth(tmp_path):
    annotator = tiny_net(seed=7)
    data = tiny_benchmark(oracle_fn=lambda device: ModelOracle(annotator))
    spec = CellSpec("toy", "eatta", "ctta", 1, 1)
    by_model = run_cell(spec, data, opts(), tmp_path / "m")
    by_truth = run_cell(spec, tiny_benchmark(), opts(), tmp_path / "t")
    assert by_model.labels_used == by_truth.labels_used == 9
    assert by_model.model_digest != by_truth.model_digest
    assert by_model.fingerprint != by_truth.fingerprint


def test_source_never_changes_the_model_and_metrics_are_consistent(tmp_path):
    data = tiny_benchmark()
    r = run_cell(CellSpec("toy", "source", "-"), data, opts(), tmp_path)
    assert r.images == 60 and r.domain_images == [20, 20, 20] and r.labels_used == 0
    wrong = [sum(b[1] for b in r.online[3 * k : 3 * k + 3]) for k in range(3)]
    assert r.domain_errors == pytest.approx([100 * w / 20 for w in wrong])
    assert r.average_error == pytest.approx(sum(r.domain_errors) / 3)
    assert r.wall_time_s > 0 and r.images_per_s > 0
    assert r.peak_mem_mb is None or r.peak_mem_mb >= 0
    # the source model's predictions, recomputed by hand, give the same error
    model = data.model_fn()
    total = sum(
        int((model(ds.tensors[0]).argmax(1) != ds.tensors[1]).sum()) for _, ds in data.domains
    )
    assert sum(b[1] for b in r.online) == total


def test_eata_gets_fisher_data_or_fails_clearly(tmp_path):
    data = tiny_benchmark()
    r = run_cell(CellSpec("toy", "eata", "ctta"), data, opts(), tmp_path / "ok")
    assert r.images == 60
    data.fisher_data = None
    with pytest.raises(ValueError, match="Fisher"):
        run_cell(CellSpec("toy", "eata", "ctta"), data, opts(), tmp_path / "bad")


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="batch size must be an int >= 1, got 0"):
        RunOptions(batch_size=0)
    with pytest.raises(ValueError, match="got 1"):
        RunOptions(window=1)
    with pytest.raises(ValueError, match="limit"):
        RunOptions(limit=1)
    with pytest.raises(ValueError, match="setting"):
        CellSpec("toy", "tent", "sometimes")
    with pytest.raises(ValueError):
        CellSpec("toy", "eatta", "ctta", 1, 0)


def test_merged_shards_equal_the_full_run(tmp_path):
    data = {"toy": tiny_benchmark()}
    grid = make_grid(["toy"], ["source", "tent", "eatta"], ["ctta", "ftta"])
    full = run_grid(shard(grid, 0, 1), data, opts(), tmp_path / "full")
    for i in range(2):
        run_grid(shard(grid, i, 2), data, opts(), tmp_path / f"part{i}")
    merged = load_results([tmp_path / "part0", tmp_path / "part1"])
    assert [r.spec for r in merged] == [r.spec for r in full] == grid
    for a, b in zip(merged, full, strict=True):
        same_result(a, b)

    def strip(text: str) -> list[list[str]]:  # drop the timing and memory columns
        return [line.split("|")[:-5] for line in text.splitlines()]

    assert strip(markdown_table(merged)) == strip(markdown_table(full))


# ----------------------------------------------------------------------------- outputs


def test_outputs_json_csv_markdown_and_png(tmp_path):
    data = {"toy": tiny_benchmark()}
    grid = make_grid(["toy"], ["source", "eatta"], ["ctta"])
    results = run_grid(shard(grid, 0, 1), data, opts(), tmp_path)
    paths = write_outputs(results, tmp_path, {"note": "test"})
    doc = json.loads(paths["json"].read_text())
    assert doc["meta"] == {"note": "test"} and len(doc["results"]) == 2
    row = doc["results"][1]
    for key in (
        "domain_errors",
        "average_error",
        "labels_used",
        "images_per_s",
        "wall_time_s",
        "peak_mem_mb",
        "online",
        "domains",
        "key",
        "label",
        "fingerprint",
    ):
        assert key in row
    assert row["key"] == "toy/eatta/ctta/k1-n1" and len(row["online"]) == 9
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["method"] for r in rows] == ["source", "eatta"]
    assert rows[1]["labels_used"] == "9"
    assert float(rows[1]["err:b"]) == pytest.approx(results[1].domain_errors[1], abs=1e-4)
    table = paths["markdown"].read_text()
    assert table == markdown_table(results)
    header = next(line for line in table.splitlines() if line.startswith("| Method"))
    for col in ("a", "b", "c", "Avg. Err.", "Labels", "img/s", "Wall s", "Peak MB"):
        assert f" {col} " in header
    assert csv_text(results).splitlines()[0].startswith("dataset,method,setting")
    assert_png(paths["plot"])


# ----------------------------------------------------------------------------- long-term streams


@pytest.mark.parametrize(("method", "stop"), [("eatta", 9), ("tent", 13)])
def test_resume_in_the_middle_of_a_round_reaches_the_identical_result(tmp_path, method, stop):
    data = tiny_benchmark()  # 9 batches a round
    spec = CellSpec("toy", method, "ctta", 1 if method == "eatta" else 0, 1)
    o = opts(rounds=3, dirichlet=0.2)
    full = run_cell(spec, data, o, tmp_path / "full")
    with pytest.raises(Stop):
        run_cell(spec, data, o, tmp_path / "cut", callback=stop_at(stop))
    resumed = run_cell(spec, data, o, tmp_path / "cut")
    same_result(resumed, full)
    assert resumed.sessions == 2 and len(full.online) == 27
    assert len(full.round_errors) == 3 and len(full.domains) == 9
    assert full.round_errors[1] == pytest.approx(sum(full.domain_errors[3:6]) / 3)
    assert full.protocol == {
        "rounds": 3,
        "dirichlet": 0.2,
        "gradual": False,
        "mixed": False,
        "ccc": None,
    }
    one = run_cell(spec, data, opts(), tmp_path / "one")
    assert one.fingerprint != full.fingerprint and one.rounds == 1


def test_ftta_resets_at_every_domain_of_every_round(tmp_path, spy):
    run_cell(CellSpec("toy", "spy-reset", "ftta"), tiny_benchmark(), opts(rounds=2), tmp_path)
    assert [e for e, _ in spy].count("reset") == 5  # 6 visits, a reset at each change


def test_batch_logs_get_a_line_per_domain_or_round_not_a_bar(tmp_path, capsys):
    lines: list[str] = []
    spec = CellSpec("toy", "tent", "ctta")
    run_cell(spec, tiny_benchmark(), opts(progress=True), tmp_path / "a", log=lines.append)
    assert len(lines) == 3 and "domain 1/3 a" in lines[0] and "batch 9/9" in lines[2]
    lines.clear()
    run_cell(
        spec, tiny_benchmark(), opts(progress=True, rounds=2), tmp_path / "b", log=lines.append
    )
    assert len(lines) == 2 and "round 1/2" in lines[0] and "round 2/2" in lines[1]
    assert "it/s" not in capsys.readouterr().err  # stderr is no terminal here: no tqdm bar


def test_collapse_is_stated_and_seeds_are_aggregated(tmp_path):
    from eatta.bench.report import collapse_notes, summary

    data = tiny_benchmark()
    results = [
        run_cell(CellSpec("toy", "tent", "ctta"), data, opts(rounds=2, seed=s), tmp_path)
        for s in (0, 1)
    ]
    fake = []
    for r, (first, last) in zip(results, ((40.0, 80.0), (42.0, 76.0)), strict=True):
        d = r.to_dict()
        d["round_errors"] = [first, last]
        fake.append(CellResult.from_dict(d))
    notes = collapse_notes(fake)
    assert notes == [
        "toy: tent collapses: its error grows from 41.0% in round 1 to 78.0% in round 2 "
        "(errors accumulate over the long stream)."
    ]
    assert notes[0] in markdown_table(fake)
    s = summary(fake)[0]
    assert s["seeds"] == [0, 1] and s["last_round_error"]["mean"] == pytest.approx(78.0)
    assert s["last_round_error"]["std"] == pytest.approx(2.8284271, rel=1e-6)
    steady = [CellResult.from_dict({**f.to_dict(), "round_errors": [40.0, 45.0]}) for f in fake]
    assert collapse_notes(steady) == []


@pytest.mark.parametrize("backbone", ["digits-cnn", "digits-vit"])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_eatta_safe_serves_small_requests_through_the_auto_window(tmp_path, batch_size, backbone):
    """``--window auto`` composes with the source-model fallback: eatta-safe serves requests of
    1 and 8 samples, one step (and one label) per 64 samples, on the BatchNorm CNN and on the
    LayerNorm ViT alike."""
    import eatta.bench

    done = eatta.bench.run(
        "digits-c",
        ["eatta-safe"],
        backbone=backbone,
        rounds=1,
        limit=16,
        batch_size=batch_size,
        every=64 // batch_size,
        window="auto",
        out=tmp_path,
        progress=False,
        plot=False,
    )
    (r,) = done.results
    images = sum(r.domain_images)
    assert len(r.online) == images // batch_size
    assert r.labels_used == images // 64  # one label per window step of 64 samples
    assert r.fallback is not None and r.fallback["stats"]["steps"] == images // 64


def test_weight_anchor_reaches_every_adapting_method_and_the_fingerprint(tmp_path):
    """``--weight-anchor A`` attaches the anchor to each adapting method (the source model
    takes none), changes the results and the cells' fingerprints; a bad value is refused."""
    import eatta.bench

    def run(anchor: float | None, out: str) -> dict[str, CellResult]:
        done = eatta.bench.run(
            "digits-c",
            ["source", "tent"],
            rounds=1,
            limit=16,
            weight_anchor=anchor,
            out=tmp_path / out,
            progress=False,
            plot=False,
        )
        return {r.spec.method: r for r in done.results}

    plain, pulled = run(None, "plain"), run(0.5, "pulled")
    assert pulled["source"].model_digest == plain["source"].model_digest
    assert pulled["tent"].model_digest != plain["tent"].model_digest  # the final weights
    assert pulled["tent"].fingerprint != plain["tent"].fingerprint
    with pytest.raises(ValueError, match="weight_anchor"):
        RunOptions(weight_anchor=0.0)
    with pytest.raises(ValueError, match="weight_anchor pulls an adapting method"):
        eatta.bench.run(
            "digits-c", ["source"], limit=16, weight_anchor=0.5, out=tmp_path / "u", progress=False
        )


def test_the_auto_window_applies_below_its_size_on_every_model():
    from eatta.bench.options import AUTO_WINDOW, RunOptions

    assert RunOptions(window="auto", batch_size=8).method_window() == AUTO_WINDOW
    assert RunOptions(window="auto", batch_size=64).method_window() is None
    assert RunOptions(window="off", batch_size=8).method_window() is False
    assert RunOptions(window=None, batch_size=8).method_window() is None
    assert RunOptions(window=32, batch_size=8).method_window() == 32
