"""``benchmarks/vit_batch_study.py`` renders its section of ``docs/benchmarks.md`` from the
committed results, byte for byte."""

from __future__ import annotations

import json

from repo_scripts import benchmark_script


def test_the_committed_results_render_the_committed_section():
    with benchmark_script("vit_batch_study") as study:
        data = json.loads(study.JSON.read_text(encoding="utf-8"))
        page = study.DOC.read_text(encoding="utf-8")
        section = page.split(study.BEGIN, 1)[1].split(study.END, 1)[0]
        assert section == f"\n{study.render(data)}\n"


def test_the_regenerate_command_names_batch_sizes_other_than_the_default():
    with benchmark_script("vit_batch_study") as study:
        data = json.loads(study.JSON.read_text(encoding="utf-8"))
        assert "--batch-sizes" not in study.render(data)
        data["meta"]["batch_sizes"] = [64, 8]
        for cells in data["methods"].values():
            cells.pop("1", None)
        assert "--batch-sizes 64,8`" in study.render(data)
