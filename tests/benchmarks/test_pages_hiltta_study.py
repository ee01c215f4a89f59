"""``benchmarks/hiltta_study.py``: the committed results render the section of docs/hiltta.md
byte for byte."""

from __future__ import annotations

import json

import pytest

from repo_scripts import REPO, benchmark_script


def test_the_committed_results_render_the_pages_section():
    data = json.loads((REPO / "benchmarks" / "results" / "hiltta_study.json").read_text("utf-8"))
    with benchmark_script("hiltta_study") as study:
        text = study.report(data)
    page = (REPO / "docs" / "hiltta.md").read_text(encoding="utf-8")
    assert f"<!-- hiltta:begin -->\n\n{text}\n\n<!-- hiltta:end -->" in page


def test_the_sar_rows_are_on_the_page():
    data = json.loads((REPO / "benchmarks" / "results" / "hiltta_study.json").read_text("utf-8"))
    with benchmark_script("hiltta_study") as study:
        text = study.report(data)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "±" in line]
    for stream in data["sar"]:
        assert any(row.startswith(f"| {stream} |") and row.count("±") == 3 for row in rows)


def test_parts_are_checked_and_a_partial_run_keeps_the_saved_protocol(tmp_path):
    with benchmark_script("hiltta_study") as study:
        with pytest.raises(SystemExit, match="--parts must be among main, select, sar"):
            study.main(["--parts", "sar,select-all", "--out", str(tmp_path)])
        with pytest.raises(SystemExit, match="same --rounds, --limit and --seeds"):
            study.main(["--parts", "sar", "--rounds", "1", "--limit", "64", "--out", str(tmp_path)])
        assert not any(tmp_path.iterdir())  # refused before running anything
