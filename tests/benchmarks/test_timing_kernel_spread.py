"""``benchmarks/kernel_spread.py --table-only``: the table of finished runs, one column per
(kernels, seed), as docs/benchmarks.md shows it (fake runs here; nothing is run)."""

from __future__ import annotations

import json
from pathlib import Path

from repo_scripts import REPO, benchmark_script


def _fake_run(folder: Path, kernels: str | None, seed: int) -> None:
    rounds = [40.0 + seed, 30.0]
    result = {"label": "tent", "spec": {"method": "tent"}, "average_error": 35.0 + seed}
    meta = {"cpu_capability": kernels} if kernels else {}
    folder.mkdir(parents=True)
    doc = {"meta": meta, "results": [result | {"round_errors": rounds}]}
    (folder / "results.json").write_text(json.dumps(doc))


def test_the_table_has_a_column_per_run_and_is_saved(tmp_path, monkeypatch, capsys) -> None:
    runs = tmp_path / "runs"
    # native-s1: made before results recorded the kernels
    for name, kernels, seed in [
        ("native-s0", "AVX512", 0),
        ("avx2-s0", "AVX2", 0),
        ("default-s0", "DEFAULT", 0),
        ("native-s1", None, 1),
        ("native-s2", "AVX512", 2),
    ]:
        _fake_run(runs / name, kernels, seed)
    with benchmark_script("kernel_spread") as script:
        monkeypatch.setattr(script, "RESULTS", tmp_path)
        assert script.main(["--out", str(runs), "--methods", "tent", "--table-only"]) == 0
        own = script.torch.backends.cpu.get_cpu_capability()
    saved = json.loads((tmp_path / "kernel_spread.json").read_text())
    header, _, row = saved["table"].split("\n")
    columns = ["seed 0, AVX512 (own)", "seed 0, AVX2", "seed 0, DEFAULT"]
    columns += [f"seed 1, {own} (own)", "seed 2, AVX512 (own)"]
    assert header == "| " + " | ".join(["method", *columns]) + " |"
    assert row.startswith("| tent | 35.0 (40.0 → 30.0) | ") and row.endswith(
        " 37.0 (42.0 → 30.0) |"
    )
    assert [r["seed"] for r in saved["runs"]] == [0, 0, 0, 1, 2]
    assert saved["table"] in capsys.readouterr().out
    committed = json.loads((REPO / "benchmarks/results/kernel_spread.json").read_text())
    assert committed["table"].split("\n")[0].startswith("| method | seed 0, AVX512 (own) |")


def test_a_missing_run_is_named_with_table_only(tmp_path, capsys) -> None:
    with benchmark_script("kernel_spread") as script:
        assert script.main(["--out", str(tmp_path), "--table-only"]) == 1
    assert "missing" in capsys.readouterr().err
