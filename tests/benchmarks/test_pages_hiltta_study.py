"""``benchmarks/hiltta_study.py``: the committed results render the section of docs/hiltta.md
byte for byte."""

from __future__ import annotations

import json

from repo_scripts import REPO, benchmark_script


def test_the_committed_results_render_the_pages_section():
    data = json.loads((REPO / "benchmarks" / "results" / "hiltta_study.json").read_text("utf-8"))
    with benchmark_script("hiltta_study") as study:
        text = study.report(data)
    page = (REPO / "docs" / "hiltta.md").read_text(encoding="utf-8")
    assert f"<!-- hiltta:begin -->\n\n{text}\n\n<!-- hiltta:end -->" in page
