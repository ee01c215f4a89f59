"""docs/realtime.md holds what ``benchmarks/realtime_study.py`` renders from the committed results
(``benchmarks/results/realtime.json``) and costs (``src/eatta/bench/speeds_digits_cpu.json``),
and the plot it draws is committed."""

from __future__ import annotations

import json

from repo_scripts import REPO, benchmark_script


def test_the_page_holds_the_rendered_costs_and_results():
    with benchmark_script("realtime_study") as study:
        doc = json.loads(study.RESULTS.read_text(encoding="utf-8"))
        speeds = json.loads(study.SPEEDS.read_text(encoding="utf-8"))
        text = study.PAGE.read_text(encoding="utf-8")
        sections = (("realtime-costs", study.costs_block(speeds)), ("realtime", study.block(doc)))
        plot = study.PLOT
    for name, body in sections:
        assert f"<!-- {name}:begin -->\n{body}\n<!-- {name}:end -->" in text
    assert plot.is_file() and plot.read_text(encoding="utf-8").lstrip().startswith("<?xml")
    assert {r["spec"]["method"] for r in doc["results"]} == set(speeds["costs"])
    assert doc["meta"]["costs"] == speeds["costs"]  # the run used the committed table


def test_the_committed_run_keeps_the_protocols_promises():
    doc = json.loads((REPO / "benchmarks" / "results" / "realtime.json").read_text())
    for r in doc["results"]:
        rt = r["realtime"]
        assert rt["adapted"] + rt["skipped"] == len(r["online"])
        if rt["cost"] <= 1:  # the source model: its online run is its offline run
            assert rt["online"]["average_error"] == r["average_error"] and rt["skipped"] == 0


def test_the_ranking_sentence_can_fail():
    with benchmark_script("realtime_study") as study:
        ranks, block = study.ranks, study.block
    assert ranks([40.04, 39.96, 41.0]) == [1, 1, 3]  # 40.0 and 40.0 as printed: a tie
    doc = {"results": [
        {"label": "a", "labels_used": 0, "average_error": 40.0,
         "realtime": {"cost": 1.0, "adapted": 2, "skipped": 0,
                      "online": {"average_error": 40.0, "labels_used": 0}}},
        {"label": "b", "labels_used": 0, "average_error": 39.0,
         "realtime": {"cost": 3.0, "adapted": 1, "skipped": 1,
                      "online": {"average_error": 45.0, "labels_used": 0}}},
    ]}  # fmt: skip
    assert block(doc).endswith("(offline rank → online rank): a (2 → 1), b (1 → 2).")
