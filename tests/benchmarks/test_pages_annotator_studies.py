"""``benchmarks/late_labels_study.py`` and ``benchmarks/real_annotators.py``: the committed
results render their committed tables byte for byte (and the late-labels section of
docs/real-annotators.md)."""

from __future__ import annotations

import json

import pytest

from repo_scripts import REPO, benchmark_script

RESULTS = REPO / "benchmarks" / "results"


STUDIES = [("late_labels_study", "late_labels"), ("real_annotators", "real_annotators")]


@pytest.mark.parametrize(("script", "name"), STUDIES)
def test_the_committed_results_render_the_committed_tables(script: str, name: str) -> None:
    data = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    with benchmark_script(script) as study:
        text = study.report(data)
    assert text + "\n" == (RESULTS / f"{name}.md").read_text(encoding="utf-8")
    if script == "late_labels_study":
        page = (REPO / "docs" / "real-annotators.md").read_text(encoding="utf-8")
        assert f"<!-- late-labels:begin -->\n{text}\n<!-- late-labels:end -->" in page
