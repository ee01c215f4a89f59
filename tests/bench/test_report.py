"""The sentence under a long-stream table (which methods hold, drift, collapse) and the count of
domains that end worse than the source model."""

from __future__ import annotations

import csv
import io

import pytest

from eatta.bench.grid import CellSpec
from eatta.bench.report import WORSE_NOTE, csv_text, markdown_table, stability_sentence, summary
from eatta.bench.results import CellResult


def _result(method: str, rounds: list[float], seed: int = 0, labels: int = 0) -> CellResult:
    setting = "-" if method == "source" else "ctta"
    spec = CellSpec("toy", method, setting, labels)
    return CellResult(
        spec=spec,
        grid_index=0,
        fingerprint=f"{method}{seed}",
        domains=[f"d{r}" for r in range(len(rounds))],
        domain_images=[10] * len(rounds),
        domain_errors=list(rounds),
        domain_labels=[0] * len(rounds),
        average_error=sum(rounds) / len(rounds),
        overall_error=sum(rounds) / len(rounds),
        labels_used=0,
        images=10 * len(rounds),
        wall_time_s=1.0,
        images_per_s=10.0,
        peak_mem_mb=None,
        max_rss_mb=None,
        device="cpu",
        online=[[10, 1, 0]] * len(rounds),
        domain_first_batch=list(range(len(rounds))),
        model_digest="",
        hparams={},
        seed=seed,
        rounds=len(rounds),
        round_errors=list(rounds),
        protocol={"rounds": len(rounds)},
    )


def test_the_sentence_sorts_methods_by_how_their_last_round_compares_with_the_first():
    rows = [
        _result("tent", [40.0, 60.0, 80.0]),  # ends worse than the source: collapses
        _result("source", [73.0, 73.0, 73.0]),  # listed after tent: still the reference
        _result("eatta", [40.0, 48.0, 52.0], labels=1),  # +12, far from every line: degrades
        _result("eta", [39.6, 39.0, 39.5]),  # -0.1: holds
        _result("baseline", [40.0, 37.0, 35.0], labels=1),  # improves
    ]
    text = stability_sentence(rows)
    assert text is not None
    assert "collapse, ending worse than the unadapted source model (73.0): tent (40.0 → 80.0)" in (
        text
    )
    assert "degrade: eatta (1/batch) (40.0 → 52.0)" in text
    assert "hold or improve: eta (39.6 → 39.5), baseline (1/batch) (40.0 → 35.0)" in text
    assert "source (" not in text and "on this machine" not in text
    assert "degrade: eatta (1/batch) (40.0 → 52.0)" in markdown_table(rows)


def test_a_verdict_near_its_line_is_stated_for_this_machine_only():
    near_hold = _result("eatta", [40.0, 42.5], labels=1)  # +2.5: half a point past the 2-point line
    near_source = _result("tent", [40.0, 73.5])  # half a point past the source's 73
    far = _result("eta", [40.0, 40.0])
    text = stability_sentence([_result("source", [73.0, 73.0]), near_hold, near_source, far])
    assert text is not None
    assert "eatta (1/batch) (40.0 → 42.5, on this machine)" in text
    assert "tent (40.0 → 73.5, on this machine)" in text
    assert "eta (40.0 → 40.0)" in text
    # KERNEL_SPREAD_POINTS (1) past the line is no longer near
    assert "on this machine" not in stability_sentence([_result("eatta", [40.0, 43.0])])


def test_collapse_notes_use_the_source_model_when_the_run_has_it():
    from eatta.bench.report import collapse_notes

    rows = [_result("source", [73.0, 73.0]), _result("eatta", [40.0, 55.0], labels=1)]
    assert collapse_notes(rows) == []  # +15 but far better than doing nothing
    rows.append(_result("tent", [40.0, 75.0]))
    assert collapse_notes(rows) == [
        "toy: tent collapses: its error grows from 40.0% in round 1 to 75.0% in round 2 "
        "(worse than the unadapted source model's 73.0%)."
    ]


def test_no_sentence_for_one_round_and_means_over_seeds():
    assert stability_sentence([_result("tent", [40.0])]) is None
    seeds = [_result("tent", [40.0, 46.0], seed=0), _result("tent", [40.0, 50.0], seed=1)]
    assert stability_sentence(seeds) == (
        "Over the rounds (error % in round 1 → last round), degrade: tent (40.0 → 48.0)."
    )


def _per_domain(method: str, rounds: list[list[float]], seed: int = 0) -> CellResult:
    """A result with ``len(rounds[0])`` domains per round, errors as given."""
    flat = [e for errs in rounds for e in errs]
    r = _result(method, [sum(errs) / len(errs) for errs in rounds], seed=seed)
    r.domains = [f"d{k}" for _ in rounds for k in range(len(rounds[0]))]
    r.domain_errors = flat
    r.domain_images = [10] * len(flat)
    r.domain_labels = [0] * len(flat)
    r.domain_first_batch = list(range(len(flat)))
    r.fingerprint = f"{method}{seed}"
    return r


def _column(table: str, name: str) -> dict[str, str]:
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    return {row[0]: row[head.index(name)] for row in rows}


def test_worse_than_source_counts_the_last_rounds_domains_above_the_source():
    from eatta.bench.report import worse_than_source

    source = _per_domain("source", [[50.0, 10.0, 30.0], [50.0, 10.0, 30.0]])
    # round 1 is worse everywhere and does not count; round 2: d0 above, d1 equal, d2 above
    tent = _per_domain("tent", [[90.0, 90.0, 90.0], [55.0, 10.0, 30.5]])
    assert worse_than_source(tent, source) == (2, 3)
    better = _per_domain("eta", [[90.0, 90.0, 90.0], [49.0, 9.0, 29.0]])
    assert worse_than_source(better, source) == (0, 3)
    one_round = _per_domain("tent", [[60.0, 5.0, 31.0]])
    assert worse_than_source(one_round, _per_domain("source", [[50.0, 10.0, 30.0]])) == (2, 3)
    with pytest.raises(ValueError, match="different streams"):
        worse_than_source(one_round, source)
    with pytest.raises(ValueError, match="different streams"):
        worse_than_source(_per_domain("tent", [[1.0, 1.0, 1.0]], seed=1), one_round)


def test_the_worse_column_in_the_table_csv_and_summary():
    src = [[50.0, 10.0, 30.0], [50.0, 10.0, 30.0]]
    rows = [
        _per_domain("source", src, seed=0),
        _per_domain("source", src, seed=1),
        _per_domain("tent", [[0.0, 0.0, 0.0], [55.0, 10.0, 31.0]], seed=0),  # 2 worse
        _per_domain("tent", [[0.0, 0.0, 0.0], [51.0, 9.0, 29.0]], seed=1),  # 1 worse
        _per_domain("eta", [[0.0, 0.0, 0.0], [40.0, 9.0, 20.0]], seed=0),  # none
        _per_domain("eta", [[0.0, 0.0, 0.0], [40.0, 9.0, 20.0]], seed=1),
    ]
    table = markdown_table(rows)
    assert _column(table, "Worse") == {"source": "-", "tent": "1.5/3", "eta": "0/3"}
    assert WORSE_NOTE in table
    by_seed = {(r["label"], int(r["seed"])): r for r in csv.DictReader(io.StringIO(csv_text(rows)))}
    assert [by_seed[("tent", s)]["worse_domains"] for s in (0, 1)] == ["2", "1"]
    assert by_seed[("tent", 0)]["compared_domains"] == "3"
    assert by_seed[("source", 0)]["worse_domains"] == ""
    entry = {e["label"]: e for e in summary(rows)}
    assert entry["tent"]["worse_than_source"]["per_seed"] == [2, 1]
    assert entry["tent"]["worse_than_source"]["mean"] == 1.5
    assert entry["tent"]["worse_than_source"]["std"] == pytest.approx(0.5**0.5)
    assert "worse_than_source" not in entry["source"]
    # without the source model there is nothing to compare with: no column
    alone = markdown_table(rows[2:])
    assert "Worse" not in alone and WORSE_NOTE not in alone
    assert "worse_than_source" not in summary(rows[2:])[0]


def test_each_dataset_is_compared_with_its_own_source():
    import dataclasses

    def on(dataset: str, r: CellResult) -> CellResult:
        r.spec = dataclasses.replace(r.spec, dataset=dataset)
        return r

    rows = [
        on("a", _per_domain("source", [[50.0, 10.0]])),
        on("a", _per_domain("tent", [[60.0, 20.0]])),
        on("b", _per_domain("source", [[5.0, 5.0, 5.0]])),
        on("b", _per_domain("tent", [[4.0, 4.0, 6.0]])),
    ]
    tables = markdown_table(rows).split("**b**")
    assert _column(tables[0], "Worse")["tent"] == "2/2"
    assert _column(tables[1], "Worse")["tent"] == "1/3"
    worse = [r["worse_domains"] for r in csv.DictReader(io.StringIO(csv_text(rows)))]
    assert worse == ["", "2", "", "1"]
