"""``benchmarks/real_annotators.py``: the committed results render their committed tables byte
for byte."""

from __future__ import annotations

import json

from repo_scripts import REPO, benchmark_script

RESULTS = REPO / "benchmarks" / "results"


def test_the_committed_results_render_the_committed_tables():
    data = json.loads((RESULTS / "real_annotators.json").read_text(encoding="utf-8"))
    with benchmark_script("real_annotators") as study:
        tables = study.report(data)
    assert tables + "\n" == (RESULTS / "real_annotators.md").read_text(encoding="utf-8")
