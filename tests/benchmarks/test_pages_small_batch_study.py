"""``benchmarks/small_batch_study.py`` renders its section of ``docs/small-batches.md`` from the
committed runs, byte for byte (the page was made with ``--rounds 3`` and the default seeds and
EMA rate)."""

from __future__ import annotations

import json

import eatta.window
from repo_scripts import benchmark_script


def test_the_committed_runs_render_the_committed_section():
    with benchmark_script("small_batch_study") as study:
        data = json.loads(study.JSON.read_text(encoding="utf-8"))
        page = study.DOC.read_text(encoding="utf-8")
        begin, end = "<!-- small-batches:begin -->", "<!-- small-batches:end -->"
        section = page.split(begin, 1)[1].split(end, 1)[0]
        text = study.report(data, 3, [0, 1, 2], eatta.window.WINDOW_MOMENTUM)
        assert section == f"\n{text}\n"


def test_a_window_run_is_named_by_its_settings_and_the_plain_run_at_batch_64():
    with benchmark_script("small_batch_study") as study:
        run = study.Run("eatta-stable+w", "recurring", 8, 0, 3, 1.0, refresh=16)
        assert run.key == "recurring/r3/eatta-stable+w/B8/s0/m1.0r16"
        at_64 = study.Run("eatta-stable+w", "recurring", 64, 0, 3, 1.0, refresh=16)
        assert at_64.key == "recurring/r3/eatta-stable/B64/s0/plain"


def test_report_only_reads_the_rounds_of_the_stored_runs(tmp_path, monkeypatch):
    """``--report-only`` without ``--rounds`` renders the stored recurring runs (3 rounds), not
    a page of "not run" cells for the default 10."""
    with benchmark_script("small_batch_study") as study:
        doc = tmp_path / "small-batches.md"
        begin, end = "<!-- small-batches:begin -->", "<!-- small-batches:end -->"
        doc.write_text(f"{begin}\n{end}\n", encoding="utf-8")
        monkeypatch.setattr(study, "DOC", doc)
        assert study.main(["--report-only"]) == 0
        written = doc.read_text(encoding="utf-8")
        committed = (study.JSON.parents[2] / "docs" / "small-batches.md").read_text("utf-8")
        section = committed.split(begin, 1)[1].split(end, 1)[0]
        assert written == f"{begin}{section}{end}\n"
