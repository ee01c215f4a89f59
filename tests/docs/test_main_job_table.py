"""The main job's tables in README.md, docs/start/main-job.md and docs/benchmarks.md hold the
numbers of the committed results file they were copied from (``eatta-bench``'s ``results.json``
of the main job).

A table is found by its header: a markdown row whose first cell starts with ``Method`` and that has
an ``R1`` column. Its rows are matched to the file's cells by label (``baseline (1/batch)``; the
words ``label/batch`` and ``/batch`` are the same), its columns by name: ``R<n>`` is round ``n``'s
error, ``Avg.`` / ``Avg. Err.`` the average error, ``CPU s`` the CPU time, ``Labels`` the labels
used, ``Worse`` (``k/n``) the last round's domains on which the cell's error is above the source
model's, counted here from the file's per-domain errors, ``Online`` the average error under the
online protocol, ``r`` its relative cost and ``Skipped`` the batches it skipped (the cell's
``realtime`` record); other columns are not compared. Every number is compared as printed, with
the decimals the table shows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
#: the committed results file the tables are copied from
MAIN_JOB_RESULTS = REPO / "benchmarks" / "results" / "main-job" / "results.json"
#: the pages that show the main job's table
PAGES = [
    REPO / "README.md",
    REPO / "docs" / "start" / "main-job.md",
    REPO / "docs" / "benchmarks.md",
]

_FIELDS = {
    "avg.": "average_error",
    "avg. err.": "average_error",
    "avg": "average_error",
    "cpu s": "cpu_time_s",
    "labels": "labels_used",
}
#: the online protocol's columns: keys of the cell's ``realtime`` record
_ONLINE = {"online": ("online", "average_error"), "r": ("cost",), "skipped": ("skipped",)}


def _cells(line: str) -> list[str]:
    return [c.strip().strip("*").strip("`").strip() for c in line.strip().strip("|").split("|")]


def main_job_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """``(header, rows)`` of every table whose header starts with ``Method`` and has ``R1``."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        head = _cells(line)
        if not head[0].startswith("Method") or "R1" not in head:
            continue
        rows = []
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            rows.append(_cells(row))
        found.append((head, rows))
    return found


def _label(text: str) -> str:
    text = text.lower().replace(" label/batch", "/batch").replace(" labels/batch", "/batch")
    return re.sub(r"\s+", " ", text).strip()


def worse_text(cell: dict[str, Any], source: dict[str, Any]) -> str:
    """``k/n``: of the ``n`` domains of the last round, ``k`` with an error above the source's."""
    n = len(cell["domains"]) // cell["rounds"]
    pairs = zip(cell["domain_errors"][-n:], source["domain_errors"][-n:], strict=True)
    return f"{sum(mine > given for mine, given in pairs)}/{n}"


def compare(
    header: list[str], rows: list[list[str]], results: list[dict[str, Any]]
) -> tuple[list[str], int]:
    """The differences between a table and the results (seed 0), and how many numbers matched."""
    by_label = {_label(r["label"]): r for r in results if r.get("seed", 0) == 0}
    problems: list[str] = []
    matched = 0
    for row in rows:
        cell = by_label.get(_label(row[0]))
        if cell is None:
            problems.append(f"row {row[0]!r}: no such cell in the results ({sorted(by_label)})")
            continue
        for name, shown in zip(header[1:], row[1:], strict=True):
            if name == "Worse" and "source" in by_label and cell is not by_label["source"]:
                expected_worse = worse_text(cell, by_label["source"])
                if shown != expected_worse:
                    problems.append(
                        f"{row[0]} / Worse: the page shows {shown}, the file {expected_worse}"
                    )
                else:
                    matched += 1
                continue
            m = re.fullmatch(r"R(\d+)", name)
            if not re.fullmatch(r"-?\d+(\.\d+)?", shown):
                continue  # "-": not measured
            if m:
                value = cell["round_errors"][int(m[1]) - 1]
            elif name.lower() in _FIELDS:
                value = cell[_FIELDS[name.lower()]]
            elif name.lower() in _ONLINE:
                value = cell.get("realtime") or {}
                for key in _ONLINE[name.lower()]:
                    value = value.get(key, {})
                if not isinstance(value, int | float):
                    problems.append(f"{row[0]} / {name}: the file has no online record")
                    continue
            else:
                continue
            decimals = len(shown.split(".", 1)[1]) if "." in shown else 0
            expected = f"{float(value):.{decimals}f}"
            if shown != expected:
                problems.append(f"{row[0]} / {name}: the page shows {shown}, the file {expected}")
            else:
                matched += 1
    return problems, matched


def test_comparison_finds_a_changed_number_and_an_unknown_row():
    results = [
        {"label": "tent", "seed": 0, "round_errors": [40.04, 79.36], "average_error": 59.7},
        {"label": "baseline (1/batch)", "seed": 0, "round_errors": [40.2, 35.8],
         "average_error": 38.0, "cpu_time_s": 37.81},
    ]  # fmt: skip
    text = (
        "| Method (seed 0) | R1 | R2 | Avg. | CPU s | img/s |\n|---|---:|---:|---:|---:|---:|\n"
        "| tent | 40.0 | 79.4 | **59.7** | - | 3 |\n"
        "| Baseline (1 label/batch) | 40.2 | 35.8 | 38.0 | 37.8 | 9 |\n"
    )
    [(header, rows)] = main_job_tables(text)
    assert compare(header, rows, results) == ([], 7)
    changed = text.replace("79.4", "79.5")
    assert compare(*main_job_tables(changed)[0], results)[0] == [
        "tent / R2: the page shows 79.5, the file 79.4"
    ]
    unknown = text.replace("| tent |", "| eata |")
    assert "no such cell" in compare(*main_job_tables(unknown)[0], results)[0][0]


def test_the_online_columns_are_compared_with_the_cells_realtime_record():
    online = {"cost": 2.23, "skipped": 1500, "online": {"average_error": 47.26}}
    results = [{"label": "tent", "round_errors": [40.0], "average_error": 54.7, "realtime": online}]
    text = "| Method | R1 | Avg. | Online | r | Skipped |\n|---|---:|---:|---:|---:|---:|\n"
    assert compare(
        *main_job_tables(text + "| tent | 40.0 | 54.7 | 47.3 | 2.23 | 1500 |")[0], results
    ) == ([], 5)
    problems = compare(
        *main_job_tables(text + "| tent | 40.0 | 54.7 | 47.2 | 2.23 | 1499 |")[0], results
    )[0]
    assert problems == [
        "tent / Online: the page shows 47.2, the file 47.3",
        "tent / Skipped: the page shows 1499, the file 1500",
    ]
    del results[0]["realtime"]
    problems = compare(
        *main_job_tables(text + "| tent | 40.0 | 54.7 | 47.3 | 2.23 | 1500 |")[0], results
    )[0]
    assert problems[0] == "tent / Online: the file has no online record"


def test_the_worse_column_is_counted_from_the_per_domain_errors():
    results = [
        {"label": "source", "seed": 0, "rounds": 2, "domains": ["a", "b", "a", "b"],
         "domain_errors": [50.0, 10.0, 50.0, 10.0], "round_errors": [30.0, 30.0]},
        {"label": "tent", "seed": 0, "rounds": 2, "domains": ["a", "b", "a", "b"],
         "domain_errors": [90.0, 90.0, 40.0, 11.0], "round_errors": [90.0, 25.5]},
    ]  # fmt: skip
    text = (
        "| Method | R1 | R2 | Worse |\n|---|---:|---:|---:|\n"
        "| source | 30.0 | 30.0 | - |\n| tent | 90.0 | 25.5 | 1/2 |\n"
    )
    assert compare(*main_job_tables(text)[0], results) == ([], 5)
    wrong = text.replace("1/2", "2/2")
    assert compare(*main_job_tables(wrong)[0], results)[0] == [
        "tent / Worse: the page shows 2/2, the file 1/2"
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_main_job_table_matches_the_committed_results(page: Path):
    assert MAIN_JOB_RESULTS.is_file(), f"{MAIN_JOB_RESULTS.relative_to(REPO)} is not committed"
    results = json.loads(MAIN_JOB_RESULTS.read_text(encoding="utf-8"))["results"]
    tables = main_job_tables(page.read_text(encoding="utf-8"))
    assert tables, f"{page.name} shows no main-job table"
    for header, rows in tables:
        problems, matched = compare(header, rows, results)
        assert problems == []
        assert matched >= 2 * len(rows)  # at least R1 and the average of every row
