"""The sentence under a long-stream table: which methods hold, drift, collapse."""

from __future__ import annotations

from eatta.bench.grid import CellSpec
from eatta.bench.report import markdown_table, stability_sentence
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
