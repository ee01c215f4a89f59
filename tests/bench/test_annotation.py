"""``eatta-bench`` with simulated annotators and the new stream protocols (miniature data)."""

from __future__ import annotations

import csv
import json
import math

import pytest
from bench_fixtures import (
    assert_cli_fails_before_any_work,
    cli_run_interrupted,
    fake_digits_c,
    one_thread,  # noqa: F401  (autouse fixture)
    tiny_benchmark,
)

import eatta.bench
import eatta.bench.cli as cli
from eatta.annotate import AnnotatorCost, SimulatedAnnotator
from eatta.bench import AnnotatorOptions, StreamProtocol

BASE = ["--methods", "baseline,eatta", "--rounds", "2", "--batch-size", "8", "--no-progress"]
BASE += ["--no-plot", "--jobs", "1", "--window", "off"]


@pytest.fixture
def toy_digits(monkeypatch):
    return fake_digits_c(monkeypatch)


def _doc(out) -> dict:
    return json.loads((out / "results.json").read_text())


def _numbers(doc: dict) -> list[tuple]:
    return [(r["key"], r["online"], r["domain_errors"], r["model_digest"]) for r in doc["results"]]


def test_label_delay_zero_gives_the_numbers_of_a_run_without_it(tmp_path, toy_digits):
    assert cli.main([*BASE, "--out", str(tmp_path / "plain")]) == 0
    assert cli.main([*BASE, "--label-delay", "0", "--out", str(tmp_path / "zero")]) == 0
    plain, zero = _doc(tmp_path / "plain"), _doc(tmp_path / "zero")
    assert _numbers(plain) == _numbers(zero)
    # ... while it did run the asynchronous path, which counts its requests
    for r in zero["results"]:
        assert r["annotation"]["requested"] == r["labels_used"] == r["annotation"]["received"]
        assert r["protocol"]["annotator"] == {"delay": 0, "noise": 0.0, "feedback": "label"}
    assert all("annotator" not in r["protocol"] for r in plain["results"])


def test_late_noisy_labels_are_counted_in_the_table_csv_and_json(tmp_path, capsys, toy_digits):
    out = tmp_path / "run"
    argv = [*BASE, "--label-delay", "3", "--label-noise", "0.5", "--out", str(out)]
    argv += ["--seconds-per-label", "10"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "labels 3 batches late" in text and "50% wrong" in text
    header = next(line for line in text.splitlines() if line.startswith("| Method"))
    assert "| Asked | Got | Expired | Pending | Wrong | Annot. min |" in header
    doc = _doc(out)
    for r in doc["results"]:
        a = r["annotation"]
        batches = len(r["online"])
        assert a["requested"] == r["labels_used"] == batches  # one request per batch
        assert a["pending"] == 3  # the last three batches' answers are still on their way
        assert a["received"] + a["pending"] + a["expired"] + a["skipped"] == a["requested"]
        assert a["expired"] == 0 and 0 < a["wrong"] < a["requested"]
        assert a["seconds"] == pytest.approx(10 * a["requested"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [int(row["pending"]) for row in rows] == [3, 3]
    assert {row["label_delay"] for row in rows} == {"3"} and {row["feedback"] for row in rows} == {
        "label"
    }
    assert doc["meta"]["annotator"]["cost"]["seconds_per_label"] == 10


def test_yes_no_feedback_costs_binary_seconds_and_never_expires_when_delay_never(
    tmp_path, toy_digits
):
    out = tmp_path / "binary"
    argv = [*BASE, "--feedback", "binary", "--labels", "3", "--out", str(out)]
    assert cli.main(argv) == 0
    for r in _doc(out)["results"]:
        a = r["annotation"]
        asked = sum(b[2] for b in r["online"])
        assert a["feedback"] == "binary" and a["requested"] == r["labels_used"] == asked
        assert len(r["online"]) < asked <= 3 * len(r["online"])  # up to 3 a batch
        assert a["seconds"] == pytest.approx(AnnotatorCost().seconds_per_binary * a["requested"])
    out = tmp_path / "never"
    assert cli.main([*BASE, "--label-delay", "never", "--out", str(out)]) == 0
    for r in _doc(out)["results"]:
        a = r["annotation"]
        assert a["received"] == 0 and a["pending"] == a["requested"]  # stream shorter than 256


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--label-delay", "-1"], "label delay"),
        (["--label-delay", "soon"], "label delay"),
        (["--label-noise", "1.5"], "label noise"),
        (["--label-noise", "nan"], "label noise"),
        (["--feedback", "maybe"], "--feedback"),
        (["--ccc", "warp"], "--ccc"),
        (["--seconds-per-label", "-1"], "seconds_per_label"),
    ],
)
def test_bad_annotator_and_protocol_options_fail_before_any_work(
    tmp_path, capsys, toy_digits, extra, message
):
    assert_cli_fails_before_any_work([*BASE, *extra], message, tmp_path / "run", capsys, toy_digits)


def test_typed_options_check_their_values():
    with pytest.raises(ValueError, match="label delay"):
        AnnotatorOptions(delay=-2)
    with pytest.raises(TypeError, match="label noise"):
        AnnotatorOptions(noise=True)
    with pytest.raises(ValueError, match="feedback"):
        AnnotatorOptions(feedback="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="CCC speed"):
        StreamProtocol(ccc="warp")
    with pytest.raises(ValueError, match="rounds"):
        StreamProtocol(rounds=0)
    with pytest.raises(ValueError, match="gradual"):
        StreamProtocol(ccc="fast", gradual=True)
    assert AnnotatorOptions().simulated is False and AnnotatorOptions(delay=0).simulated


def test_protocol_and_shorthands_do_not_mix(tmp_path):
    data = {"toy": tiny_benchmark()}
    with pytest.raises(TypeError, match="not both"):
        eatta.bench.run(data, ["tent"], rounds=2, protocol=StreamProtocol(), out=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_mixed_needs_two_domains_before_any_file_is_written(tmp_path):
    one = tiny_benchmark()
    one.domains = one.domains[:1]
    out = tmp_path / "x"
    with pytest.raises(ValueError, match="at least two domains"):
        eatta.bench.run({"toy": one}, ["tent"], protocol=StreamProtocol(mixed=True), out=out)
    assert not out.exists()


def test_mixed_reports_every_domain_and_counts_every_sample(tmp_path):
    data = {"toy": tiny_benchmark(n=20)}
    done = eatta.bench.run(
        data,
        ["source", "tent"],
        protocol=StreamProtocol(rounds=2, mixed=True),
        batch_size=8,
        out=tmp_path / "mixed",
        progress=False,
        plot=False,
    )
    for r in done.results:
        k = len(data["toy"].domains)
        assert len(r.domains) == 2 * k and r.domain_images == [20] * (2 * k)
        assert sum(r.domain_images) == r.images == sum(b[0] for b in r.online)
        wrong = sum(b[1] for b in r.online)
        assert sum(n * e / 100 for n, e in zip(r.domain_images, r.domain_errors, strict=True)) == (
            pytest.approx(wrong)
        )
        assert r.round_errors[0] == pytest.approx(sum(r.domain_errors[:k]) / k)
        assert r.protocol["mixed"] is True
    source = done.results[0]
    assert source.round_errors[0] == pytest.approx(source.round_errors[1])  # static model


def test_parallel_jobs_give_the_serial_numbers(tmp_path, toy_digits):
    argv = [*BASE[:-2], "--methods", "source,tent,baseline,eatta"]
    assert cli.main([*argv, "--jobs", "1", "--out", str(tmp_path / "serial")]) == 0
    assert cli.main([*argv, "--jobs", "2", "--out", str(tmp_path / "parallel")]) == 0
    serial, parallel = _doc(tmp_path / "serial"), _doc(tmp_path / "parallel")
    assert _numbers(serial) == _numbers(parallel)
    assert parallel["meta"]["jobs"] == 2 and serial["meta"]["jobs"] == 1


def test_results_json_names_the_code(tmp_path, toy_digits):
    assert cli.main([*BASE, "--out", str(tmp_path / "run")]) == 0
    meta = _doc(tmp_path / "run")["meta"]
    assert meta["code_digest"] == eatta.bench.fingerprint.code_digest()
    commit = meta["git_commit"]
    assert commit is None or (len(commit.split("+")[0]) == 40 and commit[:1].isalnum())


def test_a_delayed_run_resumes_to_the_identical_result(tmp_path, toy_digits, monkeypatch):
    argv = [*BASE, "--label-delay", "2", "--label-noise", "0.3", "--checkpoint-every", "2"]
    assert cli.main([*argv, "--out", str(tmp_path / "full")]) == 0
    cli_run_interrupted(argv, tmp_path / "part", monkeypatch, stop_after=5)
    full, part = _doc(tmp_path / "full"), _doc(tmp_path / "part")
    assert _numbers(full) == _numbers(part)
    assert [r["annotation"] for r in full["results"]] == [r["annotation"] for r in part["results"]]
    assert part["results"][0]["sessions"] == 2


def test_minutes_in_the_table_come_from_the_seconds():
    cell = [
        type(
            "R",
            (),
            {
                "annotation": {
                    "requested": 6,
                    "received": 5,
                    "expired": 0,
                    "pending": 1,
                    "wrong": 2,
                    "seconds": 90.0,
                }
            },
        )()
    ]
    from eatta.bench.report import _annotation_cells

    assert _annotation_cells(cell) == ["6", "5", "0", "1", "2", "1.5"]  # type: ignore[arg-type]
    assert math.isclose(90.0 / 60, 1.5)


def test_a_paced_annotator_from_the_options() -> None:
    opts = AnnotatorOptions(stream_rate=4, order="oldest", patience=8)
    assert opts.simulated and opts.paced
    ann = opts.build(0)
    assert isinstance(ann, SimulatedAnnotator) and ann.pace is not None
    assert ann.pace.capacity == pytest.approx(1 / (11.7 * 4)) and ann.pace.order == "oldest"
    assert opts.describe()["seconds_per_answer"] == 11.7
    binary = AnnotatorOptions(stream_rate=1, feedback="binary").build(0)
    assert binary.pace is not None and binary.pace.capacity == pytest.approx(1 / 1.6)  # type: ignore[union-attr]
    # fingerprints of cells without a pace are unchanged
    assert AnnotatorOptions(delay=4).describe() == {"delay": 4, "noise": 0.0, "feedback": "label"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pace": 0}, "capacity .* > 0, got 0"),
        ({"pace": 1, "stream_rate": 2}, "not both"),
        ({"stream_rate": -1}, "stream_rate .* got -1"),
        ({"pace": 1, "order": "random"}, "unknown queue order 'random'"),
        ({"pace": 1, "delay": 4}, "follows from its load"),
        ({"order": "newest"}, "apply to a paced annotator"),
    ],
)
def test_bad_pace_options_are_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AnnotatorOptions(**kwargs)  # type: ignore[arg-type]  # bad values on purpose
