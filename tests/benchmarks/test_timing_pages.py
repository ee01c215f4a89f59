"""The timing benchmarks' pages render from their committed JSON, byte for byte: each results
folder's ``summary.md`` (``_summary``, the step and loader benchmarks), the loader's note, and
docs/small-batches.md's latency section (``small_batch_latency``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from repo_scripts import REPO, benchmark_script

RESULTS = REPO / "benchmarks" / "results"


def _json(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("folder", [".", "late_labels", "async"])
def test_each_summary_page_renders_from_its_folder(folder: str) -> None:
    with benchmark_script("_summary") as summary:
        page = summary.page(RESULTS / folder)
    assert page == (RESULTS / folder / "summary.md").read_text(encoding="utf-8")


def test_the_loader_note_renders_from_the_loader_json() -> None:
    result = _json("loader_benchmark.json")
    with benchmark_script("loader_benchmark") as loader:
        assert [loader.note(result)] == result["notes"]


def test_the_small_batch_latency_section_renders_from_its_json() -> None:
    with benchmark_script("small_batch_latency") as latency:
        text = latency.report(_json("small_batch_latency.json"))
        begin, end = latency.MARKERS
        doc = latency.DOC.read_text(encoding="utf-8")
    assert doc.split(begin, 1)[1].split(end, 1)[0] == f"\n{text}\n"
