"""``benchmarks/guard_study.py``: the committed results render docs/guard.md byte for byte."""

from __future__ import annotations

import json

from repo_scripts import REPO, benchmark_script


def test_the_committed_results_render_the_committed_page():
    text = (REPO / "benchmarks" / "results" / "guard_study.json").read_text(encoding="utf-8")
    data = json.loads(text)
    with benchmark_script("guard_study") as guard:
        page = guard.render(data)
    assert page == (REPO / "docs" / "guard.md").read_text(encoding="utf-8")
    assert json.dumps(data, indent=1) == text  # the figures render() adds are those committed
