"""``eatta-bench``: default run, datasets, shards + merge, resume, errors (miniature data)."""

from __future__ import annotations

import csv
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from bench_fixtures import (
    assert_cli_fails_before_any_work,
    assert_png,
    cli_run_interrupted,
    fake_digits_c,
    make_imagenet_c,
    make_pacs,
    make_wnid_folders,
    one_thread,  # noqa: F401  (autouse fixture)
)

import eatta.bench.api as api
import eatta.bench.cli as cli
from eatta.bench import suites
from eatta.data.imagenet import imagenet_r_wnids, imagenet_wnids

QUIET = ["--no-progress", "--rounds", "1"]


@pytest.fixture
def toy_digits(monkeypatch):
    """digits-C replaced by a tiny stand-in (see :func:`bench_fixtures.fake_digits_c`)."""
    return fake_digits_c(monkeypatch)


@pytest.fixture(scope="module")
def mini_imagenet_c(tmp_path_factory):
    return make_imagenet_c(tmp_path_factory.mktemp("inc"), imagenet_wnids()[:3], per_class=2)


def table_rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| Method")
    ]


def test_list_shows_methods_and_datasets(capsys):
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("source", "tent", "baseline", "eatta", "digits-c", "imagenet-c", "pacs"):
        assert name in out
    assert "<root>/<corruption>/<severity>/<wnid>/*.JPEG" in out
    everything = api.method_names("all")
    assert everything[0] == "source" and {"tent", "eatta", "baseline"} <= set(everything)


def test_help_names_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "{run,merge,list,sweep}" in text and "merge the output folders" in text
    with pytest.raises(SystemExit):
        cli.main(["merge", "--help"])
    assert "usage: eatta-bench merge" in capsys.readouterr().out


def test_list_subcommand_is_the_list_option(capsys):
    assert cli.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert cli.main(["--list"]) == 0
    assert capsys.readouterr().out == listed and "eatta" in listed and "pacs" in listed


def test_no_arguments_or_options_alone_mean_run(tmp_path, capsys, toy_digits, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main([]) == 0  # the README's command: the long-term digits-C table
    plain = capsys.readouterr().out
    doc = json.loads((tmp_path / "runs" / "digits-c" / "results.json").read_text())
    assert doc["meta"]["argv"] == [] and doc["meta"]["rounds"] == 10
    assert [r["spec"]["method"] for r in doc["results"]] == list(api.DEFAULT_METHODS)
    assert cli.main(["run"]) == 0  # the same run, read back from the same folder
    assert capsys.readouterr().out == plain
    argv = ["--methods", "tent,eatta", "--rounds", "2", "--batch-size", "8", "--no-plot"]
    assert cli.main([*argv, "--no-progress", "--out", "options"]) == 0
    assert cli.main(["run", *argv, "--no-progress", "--out", "command"]) == 0
    a = json.loads((tmp_path / "options" / "results.json").read_text())["results"]
    b = json.loads((tmp_path / "command" / "results.json").read_text())["results"]
    assert [(r["key"], r["online"]) for r in a] == [(r["key"], r["online"]) for r in b]
    assert len(a) == 2


def test_default_run_is_long_term_digits_c_with_eight_methods(
    tmp_path, capsys, toy_digits, monkeypatch
):
    out = tmp_path / "run"
    threads = []
    real_set = torch.set_num_threads
    real_set(2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (threads.append(n), real_set(n)))
    before = torch.get_num_threads()
    argv = ["--out", str(out), "--batch-size", "8", "--window", "off", "--no-progress"]
    assert cli.main(argv) == 0
    assert toy_digits == [None]
    text = capsys.readouterr().out
    rows = table_rows(text)
    names = ["source", "tent", "eta", "rdumb"]
    names += [
        "baseline (1/batch)",
        "eatta (1/batch)",
        "eatta-stable (1/batch)",
        "eatta-safe (1/batch)",
    ]
    assert [r[0] for r in rows] == names
    assert [r[1] for r in rows] == ["-", "C", "C", "C", "C", "C", "C", "C"]
    assert "**digits-c**" in text and "10 rounds (recurring" in text
    header = next(line for line in text.splitlines() if line.startswith("| Method"))
    assert "| R1 | R2 |" in header and "| R10 | Avg. Err. |" in header
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["batch_size"] == 8 and doc["meta"]["grid_size"] == 8
    assert doc["meta"]["rounds"] == 10 and doc["meta"]["jobs"] == min(8, os.cpu_count() or 1)
    assert [r["labels_used"] for r in doc["results"]] == [0, 0, 0, 0, 90, 90, 90, 90]  # 9 x 10
    for r, row in zip(doc["results"], rows, strict=True):
        assert len(r["round_errors"]) == 10 and len(r["online"]) == 90
        assert [f"{e:.1f}" for e in r["round_errors"]] == row[2:12]
        assert r["average_error"] == pytest.approx(sum(r["round_errors"]) / 10)
    source = doc["results"][0]["round_errors"]
    assert max(source) - min(source) < 1e-9  # a static model: every round alike
    assert (out / "results.md").read_text() == text
    assert_png(out / "online_error.png")
    assert threads == [1, before]  # digits-C runs single-threaded, then the count is restored


def test_protocols_and_seeds_end_to_end(tmp_path, capsys, toy_digits):
    out = tmp_path / "run"
    argv = ["--methods", "source,tent,eatta", "--rounds", "3", "--dirichlet", "0.1"]
    argv += ["--seeds", "0-2", "--batch-size", "8", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "3 rounds" in text and "Dirichlet(δ=0.1)" in text and "seeds 0-2" in text
    rows = table_rows(text)
    assert [r[0] for r in rows] == ["source", "tent", "eatta (1/batch)"]
    doc = json.loads((out / "results.json").read_text())
    assert len(doc["results"]) == 9 and doc["meta"]["seeds"] == [0, 1, 2]
    tent = [r for r in doc["results"] if r["spec"]["method"] == "tent"]
    assert sorted(r["seed"] for r in tent) == [0, 1, 2]
    assert len({tuple(tuple(b) for b in r["online"]) for r in tent}) == 3  # seeds differ
    firsts = [r["round_errors"][0] for r in tent]
    mean, std = np.mean(firsts), np.std(firsts, ddof=1)
    assert rows[1][2] == f"{mean:.1f} ± {std:.1f}"  # R1: mean ± sample std over seeds
    assert rows[1][-6] == "3"  # the Seeds column
    summary = next(s for s in doc["summary"] if s["key"] == tent[0]["key"])
    assert summary["seeds"] == [0, 1, 2]
    assert summary["first_round_error"]["mean"] == pytest.approx(mean)
    proto = {"rounds": 3, "dirichlet": 0.1, "gradual": False, "mixed": False, "ccc": None}
    assert all(r["protocol"] == {**proto, "severity": 5} for r in tent)
    table = list(csv.DictReader((out / "results.csv").open()))
    assert len(table) == 9 and {"err_round:1", "err_round:3", "seed"} <= set(table[0])
    assert_png(out / "online_error.png")
    # the same run again reads every cell back; other seeds are other cells
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0] == text.splitlines()[0]
    again = json.loads((out / "results.json").read_text())["results"]
    assert [r["online"] for r in again] == [r["online"] for r in doc["results"]]


def test_provenance_mismatch_is_warned_and_recorded(tmp_path, capsys, toy_digits, monkeypatch):
    real = suites.digits_c_benchmark

    def drifted(*args, **kwargs):
        b = real(*args, **kwargs)
        b.provenance = {"data_sha256": "other", "model_sha256": "m1"}
        return b

    monkeypatch.setattr(suites, "digits_c_benchmark", drifted)
    out = tmp_path / "run"
    argv = ["--methods", "source", "--batch-size", "8", "--out", str(out), *QUIET]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "warning: digits-c: data_sha256 is other, not the reference d1" in err
    assert "model_sha256" not in err
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["provenance"]["digits-c"]["found"]["data_sha256"] == "other"
    assert doc["results"][0]["provenance"]["data_sha256"] == "other"
    # what computed the numbers: in every result and in the run's description
    kernels = torch.backends.cpu.get_cpu_capability()
    assert doc["results"][0]["provenance"]["cpu_capability"] == kernels
    assert doc["meta"]["cpu_capability"] == kernels and doc["meta"]["machine"]


def test_methods_settings_budgets_and_hparams(tmp_path, capsys, toy_digits):
    out = tmp_path / "run"
    argv = [
        "--methods",
        "tent,eatta",
        "--setting",
        "ctta,ftta",
        "--labels",
        "1,2",
        "--every",
        "1",
        "--buffer",
        "4",
        "--hp",
        "eatta.lr=0.01",
        "--hp",
        "momentum=0.5",
        "--batch-size",
        "8",
        "--out",
        str(out),
        "--no-plot",
        *QUIET,
    ]
    assert cli.main(argv) == 0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["method"], r["setting"], r["labels_per_batch"], r["buffer"]) for r in rows] == [
        ("tent", "ctta", "0", ""),
        ("eatta", "ctta", "1", "4"),
        ("eatta", "ctta", "2", "4"),
        ("tent", "ftta", "0", ""),
        ("eatta", "ftta", "1", "4"),
        ("eatta", "ftta", "2", "4"),
    ]
    doc = json.loads((out / "results.json").read_text())
    assert doc["results"][1]["hparams"]["lr"] == 0.01
    assert doc["results"][0]["hparams"]["lr"] != 0.01
    assert {r["hparams"]["momentum"] for r in doc["results"]} == {0.5}
    assert not (out / "online_error.png").exists()


def test_shards_merge_into_the_full_table(tmp_path, capsys, toy_digits):
    common = [
        "--methods",
        "source,tent,baseline,eatta,sar",
        "--setting",
        "ctta,ftta",
        "--batch-size",
        "8",
        "--no-plot",
        *QUIET,
    ]
    assert cli.main([*common, "--out", str(tmp_path / "full")]) == 0
    full = capsys.readouterr().out
    sizes = []
    for i in range(3):
        assert cli.main([*common, "--shard", f"{i}/3", "--out", str(tmp_path / f"s{i}")]) == 0
        sizes.append(len(table_rows(capsys.readouterr().out)))
    assert sizes == [3, 3, 3] and len(table_rows(full)) == 9
    dirs = [str(tmp_path / f"s{i}") for i in range(3)]
    assert cli.main(["merge", *dirs, "--out", str(tmp_path / "merged")]) == 0
    merged = capsys.readouterr().out
    strip = lambda rows: [r[:-4] for r in rows]  # noqa: E731 - drop img/s, wall, CPU s, memory
    assert strip(table_rows(merged)) == strip(table_rows(full))
    a = json.loads((tmp_path / "full" / "results.json").read_text())["results"]
    b = json.loads((tmp_path / "merged" / "results.json").read_text())["results"]
    assert [(x["key"], x["online"], x["model_digest"]) for x in a] == [
        (x["key"], x["online"], x["model_digest"]) for x in b
    ]
    assert_png(tmp_path / "merged" / "online_error.png")


def test_interrupted_cli_run_resumes_to_the_same_result(tmp_path, capsys, toy_digits, monkeypatch):
    argv = [
        "--methods",
        "eatta,tent",
        "--batch-size",
        "8",
        "--checkpoint-every",
        "2",
        "--no-plot",
        "--jobs",
        "1",  # one process: the interruption below is injected into run_grid
        *QUIET,
    ]
    assert cli.main([*argv, "--out", str(tmp_path / "full")]) == 0
    cli_run_interrupted(argv, tmp_path / "cut", monkeypatch, stop_after=6)
    a = json.loads((tmp_path / "full" / "results.json").read_text())["results"]
    b = json.loads((tmp_path / "cut" / "results.json").read_text())["results"]
    assert [(x["online"], x["model_digest"]) for x in a] == [
        (x["online"], x["model_digest"]) for x in b
    ]
    assert [x["sessions"] for x in b] == [2, 1]


def test_imagenet_c_folder_with_a_random_init_backbone(tmp_path, capsys, mini_imagenet_c):
    out = tmp_path / "inc"
    argv = [
        "--dataset",
        "imagenet-c",
        "--root",
        str(mini_imagenet_c),
        "--backbone",
        "resnet18",
        "--random-init",
        "--methods",
        "source,eatta",
        "--limit",
        "4",
        "--batch-size",
        "4",
        "--window",
        "off",
        "--device",
        "cpu",
        "--out",
        str(out),
        *QUIET,
    ]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("| Method"))
    assert "| Gauss. | Shot |" in header and "| JPEG |" in header
    rows = table_rows(text)
    assert [r[0] for r in rows] == ["source", "eatta (1/batch)"]
    doc = json.loads((out / "results.json").read_text())
    eatta_row = doc["results"][1]
    assert eatta_row["images"] == 60 and eatta_row["labels_used"] == 15
    assert eatta_row["domains"][0] == "gaussian_noise" and len(eatta_row["domains"]) == 15
    assert_png(out / "online_error.png")


def test_model_annotator_from_a_checkpoint(tmp_path, capsys, mini_imagenet_c):
    from eatta.models.backbones import resnet18

    torch.manual_seed(3)
    ckpt = tmp_path / "annotator.pt"
    torch.save(resnet18(num_classes=1000, pretrained=False).state_dict(), ckpt)
    common = [
        "--dataset",
        "imagenet-c",
        "--root",
        str(mini_imagenet_c),
        "--backbone",
        "resnet18",
        "--random-init",
        "--methods",
        "eatta",
        "--limit",
        "4",
        "--batch-size",
        "4",
        "--window",
        "off",
        "--device",
        "cpu",
        "--no-plot",
        *QUIET,
    ]
    assert cli.main([*common, "--out", str(tmp_path / "gt")]) == 0
    argv = [
        *common,
        "--oracle",
        "model",
        "--oracle-backbone",
        "resnet18",
        "--oracle-checkpoint",
        str(ckpt),
        "--out",
        str(tmp_path / "model"),
    ]
    assert cli.main(argv) == 0
    gt = json.loads((tmp_path / "gt" / "results.json").read_text())["results"][0]
    by_model = json.loads((tmp_path / "model" / "results.json").read_text())["results"][0]
    assert by_model["labels_used"] == gt["labels_used"] == 15
    assert by_model["fingerprint"] != gt["fingerprint"]
    assert by_model["model_digest"] != gt["model_digest"]


def test_imagenet_r_scores_the_200_classes(tmp_path, capsys):
    root = make_wnid_folders(tmp_path / "inr", imagenet_r_wnids()[:3])
    bench = suites.imagenet_benchmark(
        "imagenet-r", root, backbone="resnet18", pretrained=False, image_size=32
    )
    model = bench.model_fn()
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 200)
    argv = [
        "--dataset",
        "imagenet-r",
        "--root",
        str(root),
        "--backbone",
        "resnet18",
        "--random-init",
        "--image-size",
        "32",
        "--methods",
        "tent,eatta",
        "--batch-size",
        "3",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "out"),
        "--no-plot",
        *QUIET,
    ]
    assert cli.main(argv) == 0
    rows = table_rows(capsys.readouterr().out)
    assert [r[0] for r in rows] == ["tent", "eatta (1/batch)"]


def test_pacs_sequences(tmp_path, capsys):
    root = make_pacs(tmp_path / "pacs")
    argv = [
        "--dataset",
        "pacs",
        "--root",
        str(root),
        "--sequence",
        "P-A-C-S,S-C-P-A",
        "--random-init",
        "--image-size",
        "32",
        "--methods",
        "source,baseline",
        "--batch-size",
        "7",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "out"),
        "--no-plot",
        *QUIET,
    ]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "**pacs:P-A-C-S**" in text and "**pacs:S-C-P-A**" in text
    headers = [line for line in text.splitlines() if line.startswith("| Method")]
    assert "| A | C | S |" in headers[0] and "| C | P | A |" in headers[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "nope"], "unknown method"),
        (["--dataset", "imagenet-c"], "needs a root folder"),
        (["--dataset", "svhn"], "unknown dataset"),
        (["--shard", "3/3"], "shard"),
        (["--setting", "sometimes"], "unknown setting"),
        (["--hp", "lr"], "KEY=VALUE"),
        (["--oracle", "model"], "--oracle-backbone"),
        (["--rounds", "0"], "--rounds"),
        (["--dirichlet", "0"], "--dirichlet"),
        (["--seed", "1", "--seeds", "0-2"], "--seeds"),
        (["--gradual", "--severity", "3"], "--severity"),
    ],
)
def test_bad_arguments_exit_with_a_message(argv, message, capsys, toy_digits, tmp_path):
    assert cli.main([*argv, "--no-progress", "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_layout_is_reported(tmp_path, capsys):
    argv = ["--dataset", "imagenet-c", "--root", str(tmp_path), "--random-init", *QUIET]
    assert cli.main(argv) == 2
    assert "gaussian_noise" in capsys.readouterr().err


@pytest.mark.slow
def test_real_digits_c_default_smoke(tmp_path, capsys, monkeypatch):
    """The embedded benchmark for real (builds digits-C and trains the model in a fresh cache)."""
    monkeypatch.setenv("EATTA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    argv = ["--limit", "64", "--rounds", "2", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    rows = table_rows(captured.out)
    names = ["source", "tent", "eta", "rdumb"]
    names += [
        "baseline (1/batch)",
        "eatta (1/batch)",
        "eatta-stable (1/batch)",
        "eatta-safe (1/batch)",
    ]
    assert [r[0] for r in rows] == names
    doc = json.loads((out / "results.json").read_text())
    source, tent = doc["results"][0], doc["results"][1]
    assert source["images"] == 2 * 15 * 64
    assert tent["average_error"] < source["average_error"]
    assert (Path(os.environ["EATTA_CACHE"]) / "digits-c").is_dir()
    # packaged weights and the pinned corruption stack reproduce the reference digests
    assert "packaged weights" in captured.err and "warning" not in captured.err
    found = doc["meta"]["provenance"]["digits-c"]
    inputs = ("data_sha256", "model_sha256")  # the same on every CPU
    assert {k: found["found"][k] for k in inputs} == {k: found["expected"][k] for k in inputs}
    # other torch kernels than the reference table's: one line of information, no warning
    other_kernels = found["found"]["cpu_capability"] != found["expected"]["cpu_capability"]
    assert ("note: digits-c: same data and model" in captured.err) == other_kernels


def test_gradual_imagenet_c_long_term_on_a_miniature_tree(tmp_path, capsys):
    root = tmp_path / "inc"
    for severity in range(1, 6):
        make_imagenet_c(root, imagenet_wnids()[:2], per_class=1, size=8, severity=severity)
    out = tmp_path / "run"
    argv = ["--dataset", "imagenet-c", "--root", str(root), "--backbone", "resnet18"]
    argv += ["--random-init", "--methods", "source,tent", "--gradual", "--rounds", "2"]
    argv += ["--batch-size", "2", "--image-size", "8", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "gradual severities 1→5→1" in text and "2 rounds" in text
    header = next(line for line in text.splitlines() if line.startswith("| Method"))
    assert "| R1 | R2 | Avg. Err. |" in header
    doc = json.loads((out / "results.json").read_text())
    tent = doc["results"][1]
    one_round = [f"{c}@{s}" for c in suites_corruptions() for s in (1, 2, 3, 4, 5, 4, 3, 2, 1)]
    assert tent["domains"] == one_round * 2 and len(tent["online"]) == 270
    assert tent["protocol"] == {
        "rounds": 2,
        "dirichlet": None,
        "gradual": True,
        "mixed": False,
        "ccc": None,
    }
    assert doc["results"][0]["round_errors"][0] == doc["results"][0]["round_errors"][1]
    # one round: one column per corruption, its nine severities pooled
    argv[argv.index("--rounds") + 1] = "1"
    argv[argv.index("--out") + 1] = str(tmp_path / "one")
    argv[argv.index("--methods") + 1] = "source"
    assert cli.main(argv) == 0
    header = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| Method"))
    assert "| Gauss. | Shot |" in header and header.count("|") == 15 + 9


def suites_corruptions() -> tuple[str, ...]:
    from eatta.data.imagenet import CORRUPTIONS

    return CORRUPTIONS


def test_seeded_long_term_shards_merge_into_the_full_table(tmp_path, capsys, toy_digits):
    common = ["--methods", "tent,eatta", "--rounds", "2", "--seeds", "0,1", "--batch-size", "8"]
    common += ["--no-plot", "--no-progress"]
    assert cli.main([*common, "--out", str(tmp_path / "full")]) == 0
    full = capsys.readouterr().out
    for i in range(3):
        assert cli.main([*common, "--shard", f"{i}/3", "--out", str(tmp_path / f"s{i}")]) == 0
    capsys.readouterr()
    dirs = [str(tmp_path / f"s{i}") for i in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["merge", *dirs, "--out", str(tmp_path / "merged"), "--no-plot"]) == 0
    assert not [w for w in caught if "different arguments" in str(w.message)]  # seeds differ
    captured = capsys.readouterr()
    strip = lambda rows: [r[:-4] for r in rows]  # noqa: E731 - drop img/s, wall, CPU s, memory
    assert strip(table_rows(captured.out)) == strip(table_rows(full))
    assert "± " in table_rows(full)[0][2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--severity", "7"], "severity is an integer from 1 to 5, got '7'"),
        (["--severity", "0"], "from 1 to 5, got '0'"),
        (["--severity", "high"], "got 'high'"),
        (["--dataset", "pacs", "--root", "/nowhere", "--severity", "2"], "pacs, which has no"),
        (["--dataset", "digits-c,imagenet-r", "--severity", "2"], "imagenet-r, which has no"),
        (["--ccc", "slow", "--severity", "2"], "--ccc walks its own severities"),
        (["--gradual", "--severity", "5"], "--gradual walks its own severities"),
    ],
)
def test_bad_severities_fail_before_any_work(argv, message, capsys, toy_digits, tmp_path):
    assert_cli_fails_before_any_work([*QUIET, *argv], message, tmp_path / "run", capsys, toy_digits)


def test_severity_reaches_the_digits_c_data_results_and_title(capsys, toy_digits, tmp_path):
    argv = [*QUIET, "--methods", "source,tent", "--out", str(tmp_path)]
    assert cli.main([*argv, "--severity", "2"]) == 0
    mild = capsys.readouterr().out
    assert "severity 2" in mild.splitlines()[0]
    assert cli.main(argv) == 0  # the default: severity 5, not the results of severity 2
    default = capsys.readouterr().out
    assert "severity 5" in default.splitlines()[0]
    cells = sorted((tmp_path / "cells").glob("*.json"))
    assert len(cells) == 4  # two cells at each severity: none was read back
    found = sorted(json.loads(c.read_text())["protocol"]["severity"] for c in cells)
    assert found == [2, 2, 5, 5]
