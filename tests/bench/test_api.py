"""``eatta.bench.run``: the benchmark as a Python call, the same as ``eatta-bench run``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from bench_fixtures import (
    fake_digits_c,
    one_thread,  # noqa: F401  (autouse fixture)
    tiny_benchmark,
)
from torch import nn

import eatta.bench
from eatta.bench import cli


@pytest.fixture
def toy_digits(monkeypatch):
    """digits-C replaced by a tiny stand-in (see :func:`bench_fixtures.fake_digits_c`)."""
    return fake_digits_c(monkeypatch)


def _numbers(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (r["key"], r["seed"], r["online"], r["domain_errors"], r["model_digest"], r["fingerprint"])
        for r in doc["results"]
    ]


def test_run_gives_the_numbers_and_table_of_the_command(tmp_path, capsys, toy_digits):
    argv = ["--methods", "source,tent,eatta", "--rounds", "2", "--seeds", "0,1"]
    argv += ["--batch-size", "8", "--labels", "1,2", "--hp", "tent.lr=0.01", "--no-plot"]
    assert cli.main(["run", *argv, "--no-progress", "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    done = eatta.bench.run(
        "digits-c",
        ["source", "tent", "eatta"],
        rounds=2,
        seeds=[0, 1],
        batch_size=8,
        labels=[1, 2],
        hparams={"tent": {"lr": 0.01}},
        plot=False,
        progress=False,
        out=tmp_path / "api",
    )
    by_cli = json.loads((tmp_path / "cli" / "results.json").read_text())
    by_api = json.loads(done.paths["json"].read_text())
    assert len(done.results) == 8  # source, tent, eatta x 2 budgets = 4 cells, x 2 seeds
    assert _numbers(by_api) == _numbers(by_cli)
    errors = [r["average_error"] for r in by_cli["results"]]
    assert [r.average_error for r in done.results] == errors
    assert done.table == (tmp_path / "api" / "results.md").read_text()

    def strip(text: str) -> list[list[str]]:  # drop the timing and memory columns
        return [line.split("|")[:-5] for line in text.splitlines()]

    assert strip(done.table) == strip(printed)
    assert by_api["meta"]["rounds"] == 2 and by_cli["meta"]["argv"][0] == "--methods"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"methods": "tent,nope"}, ValueError, "unknown method"),
        ({"settings": "sometimes"}, ValueError, "unknown setting"),
        ({"labels": -1}, ValueError, "labels"),
        ({"every": [1, 0]}, ValueError, "every"),
        ({"labels": 1.5}, TypeError, "labels"),
        ({"buffers": -2}, ValueError, "buffers"),
        ({"seeds": [1, 1]}, ValueError, "seeds"),
        ({"rounds": 0}, ValueError, "rounds"),
        ({"dirichlet": 0.0}, ValueError, "dirichlet"),
        ({"batch_size": 0}, ValueError, "batch size must be an int >= 1, got 0"),
        ({"window": 1}, ValueError, "got 1"),
        ({"hparams": {"tent": {"lrr": 0.1}}}, TypeError, "lrr"),
        ({"hparams": {"eta": {"lr": 0.1}}}, ValueError, "eta"),
        ({"shard": "3/3"}, ValueError, "shard"),
        ({"shard": 3}, TypeError, "shard"),
        ({"threads": 0}, ValueError, "threads"),
        ({"device": "abacus"}, ValueError, "abacus"),
        ({"bogus": 1}, TypeError, "bogus"),
        ({"gradual": "yes"}, TypeError, "gradual"),
        ({"reuse": 0}, TypeError, "reuse"),
    ],
)
def test_bad_options_raise_before_data_is_loaded_or_anything_written(
    tmp_path, options, error, message
):
    def never(names: list[str]) -> Any:
        raise AssertionError("data was loaded")

    kw: dict[str, Any] = {"methods": "tent", "out": tmp_path / "out", "progress": False}
    kw.update(options)
    if "bogus" not in options:
        kw["load"] = never
    with pytest.raises(error, match=message):
        eatta.bench.run("digits-c", **kw)
    assert not (tmp_path / "out").exists()


def test_single_requests_without_a_window_are_refused_only_for_batchnorm_models(tmp_path):
    """Batch size 1 with the window off: a BatchNorm model cannot normalize a batch of 1 (refused
    before anything is written); a LayerNorm model steps on each request."""
    single = {"batch_size": 1, "window": "off", "progress": False, "plot": False}
    with pytest.raises(ValueError, match="toy's model normalizes with BatchNorm"):
        eatta.bench.run({"toy": tiny_benchmark()}, "tent", out=tmp_path / "bn", **single)
    assert not (tmp_path / "bn").exists()
    torch.manual_seed(0)
    ln = nn.Sequential(nn.Flatten(), nn.Linear(192, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 4))
    data = tiny_benchmark(n=6)
    data.model_fn = lambda: copy.deepcopy(ln)
    done = eatta.bench.run({"ln": data}, "tent", out=tmp_path / "ln", **single)
    assert done.results[0].images == 18 and len(done.results[0].online) == 18  # one per request


def test_loaded_data_and_loading_options_do_not_mix(tmp_path):
    with pytest.raises(TypeError, match="backbone"):
        eatta.bench.run({"toy": tiny_benchmark()}, "tent", backbone="resnet18", out=tmp_path)
    with pytest.raises(TypeError, match="BenchmarkData"):
        eatta.bench.run({"toy": "not data"}, "tent", out=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_out_folder_holds_the_cells_and_the_summaries_and_a_rerun_reads_them_back(tmp_path):
    data = {"toy": tiny_benchmark()}
    kw: dict[str, Any] = {"seeds": [0, 1], "batch_size": 8, "progress": False, "plot": False}
    kw["window"] = "off"  # a step a batch: the tiny stream is shorter than one window
    kw["checkpoint_every"] = 1
    lines: list[str] = []
    done = eatta.bench.run(
        data, ["source", "eatta"], out=tmp_path, log=lines.append, meta={"note": "x"}, **kw
    )
    assert done.out == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cells",
        "checkpoints",
        "results.csv",
        "results.json",
        "results.md",
    ]
    assert len(list((tmp_path / "cells").glob("*.json"))) == 4  # 2 cells x 2 seeds
    assert list((tmp_path / "checkpoints").iterdir()) == []  # finished cells keep no checkpoint
    assert set(done.paths) == {"json", "csv", "markdown"}
    meta = json.loads(done.paths["json"].read_text())["meta"]
    assert meta["note"] == "x" and meta["seeds"] == [0, 1] and meta["grid_size"] == 2
    assert [(r.spec.method, r.seed) for r in done.results] == [
        ("source", 0),
        ("source", 1),
        ("eatta", 0),
        ("eatta", 1),
    ]
    assert done.results[2].labels_used > 0 and done.results[0].labels_used == 0
    assert any(line.startswith("[4/4] toy") for line in lines)
    again = eatta.bench.run(data, ["source", "eatta"], out=tmp_path, **kw)
    assert all(r.reused for r in again.results)
    assert [r.online for r in again.results] == [r.online for r in done.results]
    assert data["toy"].name == "toy" and len(data) == 1  # the caller's mapping is not changed
