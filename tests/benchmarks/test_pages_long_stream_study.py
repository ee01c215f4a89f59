"""``benchmarks/long_stream_study.py``'s report from stored runs (its runs are not committed, so
the tables are checked on made-up runs): a longer run stands in for a shorter one, an aliased
Table-3 row reads its named configuration's runs, and the tables say what the runs hold."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repo_scripts import benchmark_script


@pytest.fixture(scope="module")
def study() -> Iterator[Any]:
    with benchmark_script("long_stream_study") as module:
        yield module


def _store(study: Any, out: Path, stream: str, config: str, seed: int, errors: list[float]):
    rounds = [
        {
            "error": e,
            **dict.fromkeys(study.STEP_KEYS, 1.0),
            "labels_per_class": [r + 1] * 10,
            "drift": float(r),
        }
        for r, e in enumerate(errors)
    ]
    run = {"per_round": rounds, "gamma_trace": [0.5, 2.0], "ratio_trace": [4.0, float("nan")]}
    path = out / "runs" / f"{stream}__{config}__s{seed}__r{len(errors)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run))


def test_tables_from_stored_runs(study, tmp_path):
    _store(study, tmp_path, "embedded", "baseline", 0, [40.0, 30.0, 20.0])  # 3 rounds, read as 2
    _store(study, tmp_path, "embedded", "baseline", 1, [42.0, 32.0])
    _store(study, tmp_path, "embedded", "eatta", 0, [41.0, 45.0])
    errors = study.error_table(tmp_path, "embedded", ["none", "eatta", "PD"], [0, 1], 2)
    assert errors.splitlines() == [
        "| configuration | r1 | r2 | mean |",
        "|---|---|---|---|",
        "| none | 41.0 ± 1.4 | 31.0 ± 1.4 | 36.0 ± 1.4 |",  # Table 3's "none" is the Baseline
        "| eatta | 41.0 | 45.0 | 43.0 |",
        "",
        "(runs found for 2 of the seeds 0, 1)",
    ]
    diagnosis = study.diagnosis_table(tmp_path, "embedded", ["eatta"], 0, 2)
    assert "| eatta | 41.0 → 45.0 | 1.00 → 1.00 |" in diagnosis
    assert diagnosis.endswith("| 0.0 → 1.0 | 2–2 |")
    _store(study, tmp_path, "embedded", "eatta-stable", 0, [40.0, 40.0])
    clamp = study.clamp_table(tmp_path, [0], 2)
    assert clamp.splitlines()[-1] == "| embedded | 4.0 | 4.0 | 50.0% |"


def test_the_report_lists_every_part_of_the_plan(study, tmp_path, monkeypatch):
    monkeypatch.setattr(study, "plots", lambda *args: [])
    text = study.report(tmp_path)
    parts = [line for line in text.splitlines() if line.startswith("## ")]
    assert parts[0] == "## diagnose: embedded, 10 rounds, seeds [0] (diagnosis)"
    assert parts[-1] == "## Where the variant differs from `gnd=False`"
    assert len(parts) == 1 + sum(len(streams) for _, streams, *_ in study.PLAN)
