"""``eatta-bench --audit / --guard`` on miniature data: what the results carry, that audits leave
the methods' numbers as they were, resume, and bad options refused before any work."""

from __future__ import annotations

import csv
import json

import pytest
from bench_fixtures import (
    assert_cli_fails_before_any_work,
    cli_run_interrupted,
    fake_digits_c,
    one_thread,  # noqa: F401  (autouse fixture)
)

import eatta.bench.cli as cli
from eatta.annotate import AnnotatorCost
from eatta.bench.commands import monitor_options
from eatta.bench.monitoring import MonitorOptions

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

BASE = ["--methods", "source,tent,eatta", "--rounds", "2", "--batch-size", "8"]
BASE += ["--no-progress", "--no-plot", "--jobs", "1"]


@pytest.fixture
def toy_digits(monkeypatch):
    return fake_digits_c(monkeypatch)


def _doc(out) -> dict:
    return json.loads((out / "results.json").read_text())


def _numbers(doc: dict) -> list[tuple]:
    return [(r["key"], r["online"], r["domain_errors"], r["model_digest"]) for r in doc["results"]]


def test_audits_measure_every_adapting_method_without_changing_its_numbers(
    tmp_path, capsys, toy_digits
):
    assert cli.main([*BASE, "--out", str(tmp_path / "plain")]) == 0
    assert "Audits" not in capsys.readouterr().out
    out = tmp_path / "audited"
    assert cli.main([*BASE, "--audit", "0.5", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    plain, audited = _doc(tmp_path / "plain"), _doc(out)
    assert _numbers(plain) == _numbers(audited)
    assert "audit 0.5" in text and "Audited error % per round" in text
    header = next(line for line in text.splitlines() if line.startswith("| Method"))
    assert "| Audits | Audit min | Resets | Covered |" in header
    source, *adapting = audited["results"]
    assert source["monitor"] is None  # the source model is not audited against itself
    for r in adapting:
        m = r["monitor"]
        assert len(m["rounds"]) == 2 and m["resets"] == []
        images = sum(b[0] for b in r["online"])
        n = m["stats"]["requested"]
        assert 0.3 * images < n < 0.7 * images  # about half the samples
        assert m["stats"]["received"] == n == sum(e["audits"] for e in m["rounds"])
        assert m["seconds"] == pytest.approx(AnnotatorCost().seconds_per_label * n)
        for est in m["rounds"]:
            assert est["low"] <= est["error"] <= est["high"]
            assert est["gain"] == pytest.approx(est["source_error"] - est["error"])
        assert r["protocol"]["monitor"]["audit"] == 0.5
    assert all(r["monitor"] is None for r in plain["results"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [row["resets"] for row in rows] == ["", "0", "0"]
    assert rows[1]["est_round:1"] != "" and rows[1]["est_low_round:2"] != ""


def test_a_guard_with_late_answers_resumes_to_the_same_result(tmp_path, toy_digits, monkeypatch):
    argv = [*BASE, "--audit", "1", "--guard", "--guard-block", "4", "--guard-level", "0.5"]
    argv[1] = "tent,eatta"
    argv += ["--label-delay", "2", "--checkpoint-every", "3"]
    full = tmp_path / "full"
    assert cli.main([*argv, "--out", str(full)]) == 0
    resumed = tmp_path / "resumed"
    cli_run_interrupted(argv, resumed, monkeypatch, stop_after=5)
    a, b = _doc(full), _doc(resumed)
    assert _numbers(a) == _numbers(b)
    assert [r["monitor"] for r in a["results"]] == [r["monitor"] for r in b["results"]]
    for r in a["results"]:
        for e in r["monitor"]["resets"]:
            assert e["reason"] in ("worse than source", "worse than earlier")
            assert e["high"] < max(0.0, e["reference_low"] or 0.0)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--audit", "1.5"], "[0, 1]"),
        (["--audit", "-0.1"], "[0, 1]"),
        (["--guard", "--audit", "0"], "--guard needs audits"),
        (["--guard", "sometimes"], "unknown guard policy"),
        (["--guard", "--guard-level", "1"], "(0, 1)"),
        (["--guard", "--guard-level", "0"], "(0, 1)"),
        (["--guard", "--guard-block", "1"], "block"),
        (["--audits", "0.1"], "unrecognized arguments"),
    ],
)
def test_bad_audit_and_guard_options_fail_before_any_work(
    tmp_path, capsys, toy_digits, extra, message
):
    assert_cli_fails_before_any_work([*BASE, *extra], message, tmp_path / "run", capsys, toy_digits)


def test_guard_alone_audits_the_default_share_and_the_options_check_their_types():
    from eatta.bench.monitoring import DEFAULT_AUDIT_SHARE

    args = cli.run_parser().parse_args(["--guard"])
    opts = monitor_options(args)
    assert opts.audit == DEFAULT_AUDIT_SHARE and opts.guard == "paired"
    assert not monitor_options(cli.run_parser().parse_args([])).active
    with pytest.raises(TypeError):
        MonitorOptions(audit=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs audits"):
        MonitorOptions(guard="paired")


def test_resets_at_each_domain_keep_the_audits(tmp_path, toy_digits):
    out = tmp_path / "ftta"
    argv = [*BASE, "--methods", "tent", "--setting", "ftta", "--audit", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    (r,) = _doc(out)["results"]
    images = sum(b[0] for b in r["online"])
    assert r["monitor"]["stats"]["received"] == images  # every sample, over every domain
    assert [e["audits"] for e in r["monitor"]["rounds"]] == [images // 2, images // 2]


def test_fallback_serves_by_evidence_and_counts_its_audits_as_labels(tmp_path, toy_digits):
    out = tmp_path / "fallback"
    argv = [*BASE, "--methods", "tent,baseline", "--labels", "2", "--fallback", "--out", str(out)]
    argv += ["--window", "off"]  # a step (and an audit) a batch of 8
    assert cli.main(argv) == 0
    tent, baseline = _doc(out)["results"]
    batches = len(tent["online"])
    for r in (tent, baseline):
        fb = r["fallback"]
        assert fb["stats"]["steps"] == batches and len(fb["rounds"]) == 2
        assert fb["stats"]["requested"] == batches  # one audit a batch
        assert sum(x["answers"] for x in fb["rounds"]) == fb["stats"]["answers"]
    assert tent["labels_used"] == batches  # a label-free method: its audits are its labels
    # an active method's audits come out of its budget: 2 a batch in all, never more
    assert batches < baseline["labels_used"] <= 2 * batches
    assert all(b[2] <= 2 for b in baseline["online"])


@pytest.mark.parametrize(
    "extra", [["--labels", "0"], ["--every", "2"]], ids=["no-budget", "every-2"]
)
def test_fallback_audits_beyond_an_active_methods_budget_fail_before_any_work(
    tmp_path, capsys, toy_digits, extra
):
    argv = [*BASE, "--methods", "baseline", "--fallback", *extra]
    assert_cli_fails_before_any_work(
        argv, "the split exceeds the budget", tmp_path / "run", capsys, toy_digits
    )


def test_eatta_safe_measures_with_its_own_answers_and_takes_no_audit(tmp_path, toy_digits):
    out = tmp_path / "safe"
    argv = [*BASE, "--methods", "eatta-safe", "--fallback", "--out", str(out)]
    assert cli.main(argv) == 0
    (r,) = _doc(out)["results"]
    assert r["fallback"]["stats"]["requested"] == 0  # no audit of its own
    assert r["labels_used"] == r["fallback"]["stats"]["answers"] <= len(r["online"])
