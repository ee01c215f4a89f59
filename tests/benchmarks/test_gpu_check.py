"""``benchmarks/gpu_check.py``'s CPU dry run (``--device cpu --tiny``): the same code path as the
GPU measurement, so the one prepared GPU call is known to run and to write a complete JSON."""

from __future__ import annotations

import json
import math
import statistics
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from repo_scripts import benchmark_script

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

VARIANTS = [
    "inference",
    "tent",
    "eatta",
    "eatta-stable",
    "eatta-approx",
    "eatta-safe",
    "floor-two-pass",
    "floor-one-pass",
]
TIME_TARGETS = {"eatta": 1.65, "eatta-stable": 1.65, "eatta-approx": 1.10, "eatta-safe": 1.20}
SYNC_TARGETS = {"tent": 1, "eatta": 2, "eatta-stable": 2, "eatta-approx": 2, "eatta-safe": 3}


@pytest.fixture(scope="module")
def gpu_check() -> Iterator[Any]:
    with benchmark_script("gpu_check") as module:
        yield module


@pytest.fixture(scope="module")
def dry_run(gpu_check, tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpu_check") / "dry.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["--device", "cpu", "--tiny", "--skip-tests", "--out", str(out)]
        assert gpu_check.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.read_text())


def _numbers(node: Any, path: str = "") -> list[tuple[str, float]]:
    """Every number in a JSON tree (booleans are not numbers here), with its path."""
    if isinstance(node, bool):
        return []
    if isinstance(node, int | float):
        return [(path, float(node))]
    if isinstance(node, dict):
        return [n for k, v in node.items() for n in _numbers(v, f"{path}/{k}")]
    if isinstance(node, list):
        return [n for i, v in enumerate(node) for n in _numbers(v, f"{path}[{i}]")]
    return []


def test_the_dry_run_measures_every_variant_of_both_models(dry_run):
    assert set(dry_run) >= {"machine", "settings", "targets", "models", "gpu_tests", "wall_s"}
    facts = dry_run["machine"]
    assert facts["torch"] == torch.__version__ and facts["device"] == "cpu"
    assert facts["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    for key in ("cpu", "git_commit", "python", "cuda_runtime", "date_utc"):
        assert key in facts
    assert dry_run["targets"] == {
        "time_ratio_to_tent": TIME_TARGETS,
        "memory_ratio_to_tent": 1.05,
        "host_syncs_per_step": SYNC_TARGETS,
    }
    assert dry_run["gpu_tests"] == {"skipped": "--skip-tests"}
    assert dry_run["complete"] is True and dry_run["failed_jobs"] == 0
    assert set(dry_run["models"]) == {"resnet-tiny", "vit-tiny"}
    for model in dry_run["models"].values():
        assert (model["image_size"], model["batch"]) == (32, 8)
        assert set(model["precisions"]) == {"fp32", "bf16"}
        for precision, res in model["precisions"].items():
            if "skipped" in res:  # bf16 where this CPU cannot: said, not silently missing
                assert precision == "bf16" and not dry_run["settings"]["bf16_supported"]
                continue
            assert list(res["variants"]) == VARIANTS
            assert res["rounds_done"] == 2 and not res["stopped_by_budget"]
            for name, row in res["variants"].items():
                assert row["n"] == 2 and len(row["samples_ms"]) == 2
                # the CPU has no host syncs to count: null, with the reason
                assert row["host_syncs_per_step"] is None
                assert "CUDA only" in row["host_syncs"]["reason"]
                via = row["bf16_via"]
                if precision == "fp32":
                    assert via == "none"
                elif name == "inference" or name.startswith("floor-"):  # no method: no option
                    assert via == "torch.autocast around the call"
                else:
                    assert via == "autocast=True"


def test_every_number_is_finite_and_positive(dry_run):
    numbers = _numbers(dry_run["models"])
    assert len(numbers) > 200
    bad = [(p, v) for p, v in numbers if not (math.isfinite(v) and v > 0)]
    assert not bad


def assert_ratios_follow(result: dict[str, Any]) -> None:
    """Every ratio is recomputed from the recorded samples and peaks, every verdict from its
    ratio and target; host syncs are ``None`` where they cannot be counted (the CPU). The
    variants and targets are the run's own (earlier runs had fewer, and one sync target)."""
    time_targets = result["targets"]["time_ratio_to_tent"]
    sync_targets = result["targets"]["host_syncs_per_step"]
    for model in result["models"].values():
        for res in model["precisions"].values():
            if "skipped" in res:
                continue
            rows, ratios, targets = res["variants"], res["ratios_to_tent"], res["targets"]
            variants = list(rows)
            assert set(ratios) == set(variants) - {"tent"}
            tent = rows["tent"]
            for name, r in ratios.items():
                row = rows[name]
                # the medians themselves, from the recorded samples
                for v in (row, tent):
                    assert v["median_ms"] == statistics.median(v["samples_ms"])
                expected = statistics.median(row["samples_ms"]) / statistics.median(
                    tent["samples_ms"]
                )
                assert r["time"] == pytest.approx(expected, rel=1e-12)
                paired = [a / b for a, b in zip(row["samples_ms"], tent["samples_ms"], strict=True)]
                assert r["time_paired"] == pytest.approx(statistics.median(paired), rel=1e-12)
                assert r["memory"] == row["peak_bytes"] / tent["peak_bytes"]
            assert set(targets) == set(variants) - {"inference"}
            for name, limit in time_targets.items():
                for kind, value, bound in (
                    ("time", ratios[name]["time"], limit),
                    ("memory", ratios[name]["memory"], 1.05),
                ):
                    verdict = targets[name][kind]
                    assert (verdict["value"], verdict["target"]) == (value, bound)
                    assert verdict["status"] == ("met" if value <= bound else "missed")
            for name in targets:
                bound = sync_targets if isinstance(sync_targets, int) else sync_targets.get(name)
                if bound is None:  # no target for this variant: none recorded
                    assert "host_syncs_per_step" not in targets[name]
                    continue
                syncs = targets[name]["host_syncs_per_step"]
                value = rows[name]["host_syncs_per_step"]
                status = None if value is None else ("met" if value <= bound else "missed")
                assert syncs == {"value": value, "target": bound, "status": status}


def test_ratios_and_verdicts_follow_from_the_measurements(dry_run):
    assert_ratios_follow(dry_run)
    for model in dry_run["models"].values():
        for res in model["precisions"].values():
            for row in res.get("variants", {}).values():
                assert row["host_syncs_per_step"] is None  # not counted on the CPU


#: the committed H100 runs (docs/guide/reproduce.md): the last is gpu_check.json
H100_RUNS = ["gpu_check_run1.json", "gpu_check_run2.json", "gpu_check.json"]


@pytest.mark.parametrize("name", H100_RUNS)
def test_the_committed_h100_runs_are_complete_and_consistent(name: str) -> None:
    result = json.loads((RESULTS / name).read_text())
    assert result["complete"] is True and result["failed_jobs"] == 0
    assert "H100" in result["machine"]["gpu"]
    assert set(result["models"]) == {"resnet50", "vit_b_16"}
    for model in result["models"].values():
        assert (model["image_size"], model["batch"]) == (224, 64)
        assert all(res["rounds_done"] == 30 for res in model["precisions"].values())
    assert_ratios_follow(result)


def test_the_last_h100_run_passed_the_gpu_tests() -> None:
    tests = json.loads((RESULTS / "gpu_check.json").read_text())["gpu_tests"]
    assert tests["returncode"] == 0 and tests["failed"] == 0 and tests["passed"] >= 24


def test_a_spent_budget_stops_adding_rounds_and_says_so(gpu_check, tmp_path):
    out = tmp_path / "budget.json"
    argv = ["--device", "cpu", "--tiny", "--skip-tests", "--models", "resnet50"]
    argv += ["--precisions", "fp32", "--rounds", "50", "--budget-s", "0.001", "--out", str(out)]
    assert gpu_check.main(argv) == 0
    res = json.loads(out.read_text())["models"]["resnet-tiny"]["precisions"]
    assert set(res) == {"fp32"}
    assert res["fp32"]["stopped_by_budget"] and res["fp32"]["rounds_done"] == 1
    assert res["fp32"]["rounds_asked"] == 50


def test_the_compiled_rows_run_on_a_compiled_model(gpu_check, tmp_path):
    """``--compile`` (aot_eager here: inductor's kernels are the GPU run's business) adds
    TENT, eatta and eatta-approx on ``torch.compile(model)``, measured as the others."""
    out = tmp_path / "compiled.json"
    argv = ["--device", "cpu", "--tiny", "--skip-tests", "--models", "resnet50"]
    argv += ["--precisions", "fp32", "--compile", "--compile-backend", "aot_eager"]
    assert gpu_check.main([*argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    res = data["models"]["resnet-tiny"]["precisions"]["fp32"]
    compiled = ["tent-compiled", "eatta-compiled", "eatta-approx-compiled"]
    assert list(res["variants"]) == VARIANTS + compiled
    assert data["settings"]["compile"] and data["settings"]["compile_backend"] == "aot_eager"
    assert_ratios_follow(data)


def test_a_failing_job_is_recorded_and_the_exit_status_says_so(gpu_check, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("step failed on this device")

    monkeypatch.setattr(gpu_check, "time_job", broken)
    out = tmp_path / "failed.json"
    argv = ["--device", "cpu", "--tiny", "--skip-tests", "--models", "vit_b_16", "--out", str(out)]
    assert gpu_check.main(argv) == 1
    data = json.loads(out.read_text())
    assert data["complete"] and data["failed_jobs"] == 2
    for res in data["models"]["vit-tiny"]["precisions"].values():
        assert "step failed on this device" in res["error"] and "RuntimeError" in res["traceback"]


def test_sync_warnings_are_counted_by_site_and_the_mode_restored(gpu_check, monkeypatch):
    # torch's CUDA sync debug mode, stood in for on the CPU: what it would do is warn
    modes: list[str] = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def step() -> None:
        assert modes == ["warn"]
        for _ in range(2):
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
        raise RuntimeError("the step fails")

    with pytest.raises(RuntimeError, match="the step fails"):
        gpu_check.count_syncs_debug(step, torch.device("cpu"))
    assert modes == ["warn", "default"]  # restored even though the step failed

    def quiet_step() -> None:
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    line = quiet_step.__code__.co_firstlineno + 2
    got = gpu_check.count_syncs_debug(quiet_step, torch.device("cpu"))
    assert got == {"count": 3, "sites": {f"benchmarks/test_gpu_check.py:{line}": 3}}


def test_a_sync_site_does_not_depend_on_the_checkouts_folder_name(gpu_check, monkeypatch, tmp_path):
    import eatta.methods.base as inside

    clone = tmp_path / "eatta"  # what `git clone` names the folder
    monkeypatch.setattr(gpu_check, "ROOT", clone)
    short = gpu_check._short
    assert short(str(clone / "tests" / "benchmarks" / "test_gpu_check.py")) == (
        "benchmarks/test_gpu_check.py"
    )
    assert short(str(clone / "benchmarks" / "gpu_check.py")) == "benchmarks/gpu_check.py"
    assert short(inside.__file__) == "eatta/methods/base.py"


def test_the_gpu_marked_tests_run_in_a_subprocess(gpu_check):
    files = gpu_check.gpu_test_files()
    assert "tests/methods/test_eatta.py" in files
    got = gpu_check.run_gpu_tests(timeout=120)
    assert got["returncode"] == 0 and got["summary_found"], got["output_tail"]
    assert got["failed"] == 0 and got["deselected"] > 0
    assert got["passed"] + got["skipped"] >= 1  # skipped here without CUDA, run on a GPU


def test_pytest_summary_counts(gpu_check):
    text = "....\nan earlier 3 passed\n1 passed, 2 skipped, 3 errors, 900 deselected in 4s\n"
    assert gpu_check.pytest_counts(text) == {
        "passed": 1,
        "skipped": 2,
        "error": 3,
        "deselected": 900,
    }
    assert gpu_check.pytest_counts("no tests ran in 0.01s\n") == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_without_a_device_is_refused(gpu_check, tmp_path, capsys):
    out = tmp_path / "x.json"
    assert gpu_check.main(["--device", "cuda", "--skip-tests", "--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()


def test_an_explicit_commit_is_recorded_over_gits(gpu_check):
    """A tree copied to a GPU machine may carry an older .git than its files: --commit wins."""
    facts = gpu_check.machine(torch.device("cpu"), "0123abc")
    assert (facts["git_commit"], facts["git_commit_from"]) == ("0123abc", "--commit")
    facts = gpu_check.machine(torch.device("cpu"))
    assert facts["git_commit_from"] in ("git", None) and facts["git_commit"] != "0123abc"
