"""``eatta-bench run --protocol online|both --speeds measure|FILE``: the online protocol on a tiny
stream, checked against offline runs and a hand-made schedule."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from bench_fixtures import (
    assert_cli_fails_before_any_work,
    fake_digits_c,
    one_thread,  # noqa: F401  (autouse fixture)
    tiny_benchmark,
)

import eatta
import eatta.bench
from eatta.bench import api, cli
from eatta.bench.fingerprint import model_digest
from eatta.bench.report import load_results
from eatta.data.stream import TestStream


def _speeds(tmp_path, **costs: float) -> str:
    path = tmp_path / "speeds.json"
    path.write_text(json.dumps({"costs": costs}))
    return str(path)


def _run(tmp_path, name: str, methods, **kw):
    data = {"toy": tiny_benchmark(n=24)}
    kw = {"batch_size": 8, "window": "off", "plot": False, "progress": False, **kw}
    return eatta.bench.run(data, methods, out=tmp_path / name, jobs=1, **kw)


def test_source_and_a_method_of_cost_at_most_1_equal_their_offline_runs(tmp_path):
    speeds = _speeds(tmp_path, tent=0.9, baseline=1.0)
    offline = _run(tmp_path, "off", ["source", "tent", "baseline"]).results
    online = _run(
        tmp_path, "on", ["source", "tent", "baseline"], realtime="online", speeds=speeds
    ).results
    for a, b in zip(offline, online, strict=True):
        assert (a.online, a.domain_errors, a.model_digest) == (
            b.online,
            b.domain_errors,
            b.model_digest,
        )
        assert b.realtime is not None and b.realtime["skipped"] == 0 and a.realtime is None
    assert online[0].realtime["cost"] == 1.0  # the source model's, by definition


def test_a_slow_method_adapts_on_one_batch_in_ceil_r_and_serves_the_others_unadapted(tmp_path):
    done = _run(tmp_path, "on", ["tent"], realtime="online", speeds=_speeds(tmp_path, tent=2.5))
    [r] = done.results
    data = tiny_benchmark(n=24)  # the same run by hand: step on batches 0, 3, 6, ...
    torch.manual_seed(0)
    method = eatta.create("tent", data.model_fn(), dataset="default", window=False)
    stream = TestStream(data.domains, 8, seed=0, rounds=1)
    wrong = []
    for t, (x, y) in enumerate(stream.loader(0)):
        if t % 3 == 0:
            logits = method(x)
        else:
            with torch.no_grad():
                logits = method.model(x)
        wrong.append(int((logits.argmax(1) != torch.as_tensor(y)).sum()))
    assert [row[1] for row in r.online] == wrong
    assert r.realtime == {"cost": 2.5, "adapted": 3, "skipped": 6}
    assert r.model_digest == model_digest(method.model)  # three steps, not nine
    assert r.protocol["online"] is True and "online protocol" in done.table
    assert "| r | Skipped |" in done.table


def test_skipped_batches_ask_for_no_label_and_the_labels_count_adapted_batches(tmp_path):
    done = _run(
        tmp_path, "on", ["baseline"], realtime="online", speeds=_speeds(tmp_path, baseline=2)
    )
    [r] = done.results
    assert [row[2] for row in r.online] == [1, 0] * 4 + [1]
    assert r.labels_used == 5 == r.realtime["adapted"]
    stored = json.loads(done.paths["json"].read_text())
    assert stored["results"][0]["realtime"] == {"cost": 2.0, "adapted": 5, "skipped": 4}
    assert stored["meta"]["costs"] == {"baseline": 2.0} and stored["meta"]["protocol"] == "online"


def test_a_late_annotators_answers_arrive_by_the_streams_clock(tmp_path):
    speeds = _speeds(tmp_path, baseline=2)
    late = eatta.bench.AnnotatorOptions(delay=2)
    done = _run(tmp_path, "on", ["baseline"], realtime="online", speeds=speeds, annotator=late)
    [r] = done.results
    # asked at batches 0, 2, 4, 6, 8; each answer due 2 batches later, at the next step: all
    # but the last arrive (counting steps, they would arrive two steps later: only 3)
    assert r.annotation["received"] == 4


def test_the_window_and_small_requests_keep_working(tmp_path):
    speeds = _speeds(tmp_path, tent=1.0)
    off = _run(tmp_path, "off", ["tent"], batch_size=2, window=8).results[0]
    on = _run(tmp_path, "on", ["tent"], batch_size=2, window=8, realtime="online", speeds=speeds)
    assert on.results[0].online == off.online
    slow = _run(
        tmp_path, "slow", ["tent"], batch_size=2, window=8, realtime="online",
        speeds=_speeds(tmp_path, tent=3),
    ).results[0]  # fmt: skip
    assert slow.realtime == {"cost": 3.0, "adapted": 12, "skipped": 24}


def test_both_protocols_put_the_online_error_beside_the_offline_one(tmp_path):
    speeds = _speeds(tmp_path, tent=2.5)
    both = _run(tmp_path, "both", ["source", "tent"], realtime="both", speeds=speeds)
    online = _run(tmp_path, "on", ["source", "tent"], realtime="online", speeds=speeds)
    offline = _run(tmp_path, "off", ["source", "tent"])
    for b, on, off in zip(both.results, online.results, offline.results, strict=True):
        assert (b.online, b.average_error) == (off.online, off.average_error)
        assert b.realtime["online"]["average_error"] == on.average_error
        assert b.realtime["skipped"] == on.realtime["skipped"]
    assert "| Avg. Err. | Online | r | Skipped |" in both.table
    merged = load_results([tmp_path / "both"])  # what eatta-bench merge reads: the online record
    assert [r.realtime for r in merged] == [r.realtime for r in both.results]


def test_measured_speeds_are_recorded_and_read_back_give_the_same_run(tmp_path):
    measured = _run(
        tmp_path, "m", ["source", "tent", "baseline"], realtime="online", speeds="measure"
    )
    path = tmp_path / "m" / "speeds.json"
    doc = json.loads(path.read_text())
    assert doc["costs"]["source"] == 1.0 and doc["costs"]["tent"] > 0
    assert doc["measured"]["batch_size"] == 8 and doc["measured"]["threads"] == 1
    meta = json.loads(measured.paths["json"].read_text())["meta"]
    assert meta["costs"] == doc["costs"] and meta["speeds"] == "measure"
    again = _run(tmp_path, "f", ["source", "tent", "baseline"], realtime="online", speeds=str(path))
    assert [r.online for r in again.results] == [r.online for r in measured.results]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--protocol", "online"], "give --speeds measure|FILE with --protocol online"),
        (["--speeds", "measure"], "--protocol offline"),
        (["--protocol", "online", "--speeds", "measure", "--audit", "0.1"], "--audit, --guard"),
        (["--protocol", "both", "--speeds", "measure", "--guard"], "--audit, --guard"),
        (["--protocol", "online", "--speeds", "SPEEDS", "--methods", "tent,eta"],
         "has no cost for eta"),
        (["--protocol", "online", "--speeds", "BAD", "--methods", "tent"],
         "tent (--speeds"),
        (["--protocol", "online", "--speeds", "NOPE", "--methods", "tent"], "--speeds"),
        (["--protocol", "realtime"], "--protocol"),
    ],
)  # fmt: skip
def test_bad_online_options_are_refused_naming_the_flag_before_anything_runs(
    tmp_path, monkeypatch, capsys, argv, message
):
    loaded = fake_digits_c(monkeypatch)
    files = {"SPEEDS": _speeds(tmp_path, tent=2.0), "NOPE": str(tmp_path / "missing.json")}
    bad = tmp_path / "bad.json"
    bad.write_text('{"costs": {"tent": -1}}')
    files["BAD"] = str(bad)
    argv = [files.get(a, a) for a in argv]
    assert_cli_fails_before_any_work(argv, message, tmp_path / "out", capsys, loaded)


def test_the_main_job_runs_both_protocols_at_the_committed_costs(monkeypatch):
    seen = {}

    def fake_run(*args, **kw):
        seen.update(kw)
        raise KeyboardInterrupt("stop")

    monkeypatch.setattr(api, "run", fake_run)
    assert cli.main([]) == 130
    assert seen["realtime"] == "both" and seen["speeds"] == str(api.MAIN_JOB_SPEEDS)
    costs = json.loads(api.MAIN_JOB_SPEEDS.read_text())["costs"]
    assert set(costs) == set(eatta.available())
    seen.clear()
    assert cli.main(["--rounds", "1"]) == 130
    assert seen["realtime"] is None  # any other run: offline unless asked
    assert copy.deepcopy(costs)["source"] == 1.0
