"""README's speed line holds the ratios of the committed H100 run it names
(``benchmarks/results/gpu_check.json``), as printed: ``eatta``, the approximate step and
``eatta-safe`` on ResNet-50 then ViT-B/16 (fp32 time over TENT's), then the largest peak-memory
ratio of any adapting variant, model and precision."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "benchmarks" / "results" / "gpu_check.json"


def speed_line() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("**Speed**")
    return text[start : text.index("\n\n", start)]


def test_the_readme_speed_line_is_the_committed_h100_run() -> None:
    line = speed_line()
    assert "H100" in line and "gpu_check.json" in line
    printed = [float(v) for v in re.findall(r"(\d+\.\d+)×", line)]
    result = json.loads(RUN.read_text())
    assert "H100" in result["machine"]["gpu"]
    models = result["models"]
    expected = [
        round(models[m]["precisions"]["fp32"]["ratios_to_tent"][v]["time"], 2)
        for v in ("eatta", "eatta-approx", "eatta-safe")
        for m in ("resnet50", "vit_b_16")
    ]
    memory = max(
        r["memory"]
        for model in models.values()
        for res in model["precisions"].values()
        for name, r in res["ratios_to_tent"].items()
        if name != "inference"
    )
    assert printed == [*expected, round(memory, 2)]
