"""``benchmarks/safety_study.py``'s plumbing, without running a stream: a study on another source
model (``--backbone``) reaches every run of every stream, keeps its own section of the page,
merged folders keep (or refuse to mix) the settings they were run with, and the committed results
render the committed tables and page sections byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repo_scripts import REPO, benchmark_script

RESULTS = REPO / "benchmarks" / "results"


@pytest.fixture(scope="module")
def safety() -> Iterator[Any]:
    with benchmark_script("safety_study") as module:
        yield module


def test_the_backbone_reaches_every_run_and_the_study(safety, tmp_path, monkeypatch):
    seen: list[dict[str, Any]] = []

    def run_part(out, part, protocol, methods, **kw):
        seen.append({"part": part, "methods": list(methods), **kw})
        return []

    monkeypatch.setattr(safety, "run_part", run_part)
    plan = [("references", "mixed"), ("annotators", "mnist"), ("references", "deployed")]
    data = safety.study(tmp_path, [0], plan, ["instant"], [64], backbone="digits-vit")
    parts = ["references", "given-64", "ann-instant", "ann-instant-blend", "references"]
    assert [s["part"] for s in seen] == parts  # the default's rule and the lean rule beside it
    datasets = ["digits-c", "mnist", "mnist", "mnist", "digits-deployed"]
    assert [s["dataset"] for s in seen] == datasets
    assert seen[3]["hparams"]["eatta-safe"] == {"fallback_start": "blend"}
    assert all(s["backbone"] == "digits-vit" for s in seen)
    assert data["backbone"] == "digits-vit"
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["backbone"] == "digits-vit"
    no_runs = {**data, "streams": {}}  # the fake parts ran nothing to report
    assert "(the packaged `digits-vit` on digits-C," in safety.report(no_runs)


def test_the_running_excess_is_read_batch_by_batch_against_the_given_model(safety):
    served = [[64, 10, 1], [64, 2, 1], [32, 9, 1]]
    given = [[64, 8, 0], [64, 8, 0], [32, 4, 0]]
    worst, last = safety.running_excess(served, given)
    assert worst == pytest.approx(100 * 2 / 64)  # +2 after the first batch, then -4, then +1
    assert last == pytest.approx(100 * 1 / 160)
    with pytest.raises(ValueError, match="differ"):
        safety.running_excess(served, [[64, 8, 0], [32, 8, 0], [64, 4, 0]])


def _study(folder: Path, **settings: Any) -> None:
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"seeds": [0], "streams": {}, **settings}))


def test_report_only_writes_the_backbones_own_section(safety, tmp_path):
    _study(tmp_path / "vit", backbone="digits-vit")
    page = tmp_path / "page.md"
    main = "<!-- safety:begin -->\nkept\n<!-- safety:end -->"
    vit = "<!-- safety-digits-vit:begin -->\nold\n<!-- safety-digits-vit:end -->"
    page.write_text(f"{main}\n{vit}\n")
    argv = ["--report-only", "--out", str(tmp_path / "vit"), "--backbone", "digits-vit"]
    assert safety.main([*argv, "--tables", str(tmp_path / "t.md"), "--doc", str(page)]) == 0
    text = page.read_text()
    assert main in text and "old" not in text
    assert "<!-- safety-digits-vit:begin -->\nError % averaged" in text
    assert "the packaged `digits-vit` on digits-C" in text


def test_a_backbones_study_writes_its_own_tables_unless_told(safety, tmp_path, monkeypatch):
    written: list[str] = []
    monkeypatch.setattr(safety, "publish", lambda text, data, tables, *a: written.append(tables))
    _study(tmp_path / "vit", backbone="digits-vit")
    argv = ["--report-only", "--out", str(tmp_path / "vit"), "--doc", str(tmp_path / "none.md")]
    assert safety.main([*argv, "--backbone", "digits-vit"]) == 0
    assert safety.main([*argv, "--backbone", "digits-vit", "--tables", "t.md"]) == 0
    assert written == ["benchmarks/results/safety_study_vit.md", "t.md"]
    assert safety.default_tables(None) == "benchmarks/results/safety_study.md"


def test_merged_folders_keep_their_settings_and_refuse_to_mix_them(safety, tmp_path):
    from _study import merged

    _study(tmp_path / "a", safe={"explore": 0.5})
    _study(tmp_path / "b", safe={"explore": 0.5})
    _study(tmp_path / "c")
    both = merged(f"{tmp_path / 'a'},{tmp_path / 'b'}", safety.STREAM_NAMES)
    assert both["safe"] == {"explore": 0.5}
    assert safety.report(both).startswith("Variant: `eatta-safe` with `explore=0.5`.")
    with pytest.raises(SystemExit, match="was run with"):
        merged(f"{tmp_path / 'a'},{tmp_path / 'c'}", safety.STREAM_NAMES)


def test_no_answers_keep_a_share_of_a_gain_only_where_there_is_one(safety):
    ann = {"none": {safety.SAFE: [{"error": 50.0}, {"error": 52.0}]}}
    (kept,) = safety._gains({}, ann, 73.0, 41.0)  # keeps (73 - 51) / (73 - 41) of the gain
    assert "keeps 69 % of the best label-free method's gain" in kept
    (vacuous,) = safety._gains({}, ann, 58.1, 58.0)
    assert "gains 0.1 points" in vacuous and "no bar" in vacuous
    assert safety._gains({}, ann, 30.0, 20.0) == []  # not a heavy shift: no line


def test_an_unknown_backbone_is_refused_before_anything_runs(safety, tmp_path):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit, match="--backbone: digits-c has no backbone 'resnet18'"):
        safety.main(["--backbone", "resnet18", "--plan", "references:mixed", "--out", str(out)])
    assert not out.exists()


def test_unknown_request_sizes_are_refused(safety, tmp_path):
    with pytest.raises(SystemExit, match="--sizes must be among 64, 8, 1, got 3"):
        safety.main(["--sizes", "64,3", "--plan", "references:mixed", "--out", str(tmp_path)])


@pytest.mark.parametrize("variant", ["", "_anchor", "_approx", "_source", "_vit"])
def test_the_committed_results_render_their_committed_tables(safety, variant):
    data = json.loads((RESULTS / f"safety_study{variant}.json").read_text(encoding="utf-8"))
    tables = (RESULTS / f"safety_study{variant}.md").read_text(encoding="utf-8")
    assert safety.report(data) + "\n" == tables


@pytest.mark.parametrize(("variant", "marker"), [("", "safety"), ("_vit", "safety-digits-vit")])
def test_the_committed_results_render_the_pages_sections(safety, variant, marker):
    data = json.loads((RESULTS / f"safety_study{variant}.json").read_text(encoding="utf-8"))
    page = (REPO / "docs" / "safety.md").read_text(encoding="utf-8")
    section = page.split(f"<!-- {marker}:begin -->\n")[1].split(f"\n<!-- {marker}:end -->")[0]
    assert safety.report(data) == section


def test_report_only_without_a_study_renders_the_committed_results(safety, tmp_path):
    """No study.json under --out: the results beside --tables are rendered (and kept as they
    were)."""
    committed = (RESULTS / "safety_study_anchor.json").read_text(encoding="utf-8")
    (tmp_path / "t.json").write_text(committed, encoding="utf-8")
    argv = ["--report-only", "--out", str(tmp_path / "none"), "--doc", str(tmp_path / "none.md")]
    assert safety.main([*argv, "--tables", str(tmp_path / "t.md")]) == 0
    tables = (RESULTS / "safety_study_anchor.md").read_text(encoding="utf-8")
    assert (tmp_path / "t.md").read_text(encoding="utf-8") == tables
    assert (tmp_path / "t.json").read_text(encoding="utf-8") == committed
