"""``benchmarks/approx_step_study.py`` renders ``docs/approx-step.md`` and its results file from the
committed results, byte for byte."""

from __future__ import annotations

import json

from repo_scripts import benchmark_script


def test_the_committed_results_render_the_committed_page():
    with benchmark_script("approx_step_study") as study:
        committed = study.DATA.read_text(encoding="utf-8")
        data = json.loads(committed)
        assert study.render(data) == study.PAGE.read_text(encoding="utf-8")
        rewritten = {**data, "verdicts": study.verdicts(data)}
        assert json.dumps(rewritten, indent=1) + "\n" == committed
