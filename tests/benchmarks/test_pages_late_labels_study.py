"""``benchmarks/late_labels_study.py``: the committed results render their committed tables and
the section of docs/real-annotators.md byte for byte."""

from __future__ import annotations

import json

from repo_scripts import REPO, benchmark_script

RESULTS = REPO / "benchmarks" / "results"


def test_the_committed_results_render_the_committed_tables_and_section():
    data = json.loads((RESULTS / "late_labels.json").read_text(encoding="utf-8"))
    with benchmark_script("late_labels_study") as study:
        text = study.report(data)
    assert text + "\n" == (RESULTS / "late_labels.md").read_text(encoding="utf-8")
    page = (REPO / "docs" / "real-annotators.md").read_text(encoding="utf-8")
    assert f"<!-- late-labels:begin -->\n{text}\n<!-- late-labels:end -->" in page
