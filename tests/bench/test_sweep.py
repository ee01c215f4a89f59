"""``eatta-bench sweep`` and ``--shard auto``: local sweeps against the serial run, a killed shard
resubmitted, the Slurm job array as submitit would submit it (fake sbatch), bad input."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from bench_fixtures import fake_digits_c, one_thread  # noqa: F401  (autouse fixture)

import eatta.bench
import eatta.bench.cli as cli
from eatta.bench import grid, sweep
from eatta.bench.grid import parse_shard, resolve_shard

pytest.importorskip("submitit")

#: a small real digits-C grid: 2 cells x 2 seeds = 4 runs, a few seconds in one process
SMALL = ["--rounds", "1", "--methods", "source,tent", "--limit", "16", "--batch-size", "8"]
SMALL += ["--seeds", "0,1", "--no-plot", "--no-progress"]
#: what a result's numbers are (no timings, no memory)
EXACT = (
    "key",
    "seed",
    "grid_index",
    "fingerprint",
    "domains",
    "domain_images",
    "domain_errors",
    "domain_labels",
    "average_error",
    "overall_error",
    "labels_used",
    "online",
    "round_errors",
    "model_digest",
    "hparams",
    "protocol",
    "provenance",
)
TIMING = ("wall_time_s", "cpu_time_s", "images_per_s", "peak_mem_mb", "max_rss_mb")


def numbers(folder: Path) -> list[dict[str, Any]]:
    doc = json.loads((folder / "results.json").read_text())
    return [{k: r[k] for k in EXACT} for r in doc["results"]]


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small grid run in this process, unsharded: the reference."""
    out = tmp_path_factory.mktemp("serial")
    assert cli.main(["run", *SMALL, "--out", str(out)]) == 0
    return out


# ----------------------------------------------------------------------------- --shard auto


def test_shard_auto_reads_a_slurm_array_or_eatta_shard():
    array = {
        "SLURM_JOB_ID": "77",
        "SLURM_ARRAY_JOB_ID": "70",
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "3",
        "SLURM_ARRAY_TASK_STEP": "1",
    }
    assert resolve_shard(array) == (2, 4)
    assert parse_shard("auto", array) == (2, 4) and parse_shard(" AUTO ", array) == (2, 4)
    no_count = {k: v for k, v in array.items() if k != "SLURM_ARRAY_TASK_COUNT"}
    assert resolve_shard(no_count) == (2, 4)
    assert resolve_shard({"EATTA_SHARD": "1/3"}) == (1, 3)
    assert resolve_shard({**array, "EATTA_SHARD": "0/5"}) == (0, 5)  # explicit wins
    with pytest.raises(ValueError, match="neither is set"):
        resolve_shard({})
    with pytest.raises(ValueError, match="not an array"):
        resolve_shard({"SLURM_JOB_ID": "77"})
    irregular = [
        {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "4"},
        {"SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6", "SLURM_ARRAY_TASK_STEP": "2"},
        {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_COUNT": "2"},
    ]
    for change in irregular:
        with pytest.raises(ValueError, match="EATTA_SHARD="):
            resolve_shard({**array, **change})
    for bad, match in (("3/3", "EATTA_SHARD"), ("auto", "not 'auto'"), ("x", "EATTA_SHARD")):
        with pytest.raises(ValueError, match=match):
            resolve_shard({"EATTA_SHARD": bad})
    with pytest.raises(ValueError, match="SLURM_ARRAY_TASK_ID"):
        resolve_shard({"SLURM_ARRAY_TASK_ID": "two"})


def test_run_shard_auto_is_the_shard_slurm_names(tmp_path, capsys, monkeypatch):
    fake_digits_c(monkeypatch)  # the tiny stand-in: this test is about the shard, in-process
    for k in [k for k in os.environ if k.startswith("SLURM_") or k == "EATTA_SHARD"]:
        monkeypatch.delenv(k)
    argv = ["--methods", "source,tent,eta", "--rounds", "1", "--batch-size", "8", "--no-plot"]
    argv += ["--no-progress"]
    assert cli.main([*argv, "--shard", "auto", "--out", str(tmp_path / "none")]) == 2
    assert "neither is set" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "0")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MAX", "1")
    assert cli.main([*argv, "--shard", "auto", "--out", str(tmp_path / "auto")]) == 0
    assert cli.main([*argv, "--shard", "1/2", "--out", str(tmp_path / "hand")]) == 0
    auto, hand = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("auto", "hand"))
    assert auto["meta"]["shard"] == [1, 2] == hand["meta"]["shard"]
    assert [r["key"] for r in auto["results"]] == ["digits-c/tent/ctta/k0-n1"]
    assert [r["online"] for r in auto["results"]] == [r["online"] for r in hand["results"]]
    monkeypatch.setenv("EATTA_SHARD", "0/2")  # wins over the array
    done = eatta.bench.run(
        "digits-c",
        ["source", "tent", "eta"],
        rounds=1,
        batch_size=8,
        shard="auto",
        out=tmp_path / "api",
        plot=False,
        progress=False,
    )
    assert [r.spec.method for r in done.results] == ["source", "eta"]


# ----------------------------------------------------------------------------- dry run


def test_dry_run_lists_runs_and_shards_with_their_size(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--methods", "source,tent,eatta", "--labels", "1,2", "--seeds", "0,1", "--limit"]
    argv += ["16", "--batch-size", "5", "--rounds", "2"]
    assert cli.main(["sweep", "--dry-run", "--shards", "3", "--out", str(out), *argv]) == 0
    text = capsys.readouterr().out
    assert not out.exists()  # nothing written, nothing submitted
    # 4 cells (source, tent, eatta k1, eatta k2) x 2 seeds; 16 % 5 == 1: 15 images a domain
    assert "sweep of 8 runs (4 cells x 2 seeds) in 3 shards (slurm)" in text
    assert "digits-c 450 (15 x 15 domains x 2 rounds)" in text
    assert "images in all (images x runs): 3,600" in text
    rows = [
        ln.split("|")[1:-1] for ln in text.splitlines() if ln.startswith("| ") and "runs" not in ln
    ]
    assert [(r[0].strip(), r[1].strip(), r[2].strip()) for r in rows] == [
        ("0", "3", "1,350"),
        ("1", "3", "1,350"),
        ("2", "2", "900"),
    ]
    assert (
        "digits-c/source/-/k0-n1 s0, digits-c/tent/ctta/k0-n1 s1, digits-c/eatta/ctta/k2-n1 s0"
        in (rows[0][4])
    )
    assert f"--shard 0/3 --out {out}/shard-0" in text
    # other datasets are not loaded to count their images
    argv = ["--dataset", "imagenet-c,pacs", "--sequence", "P-A-C-S,S-C-P-A", "--methods", "tent"]
    assert cli.main(["sweep", "--dry-run", "--out", str(out), "--", *argv]) == 0
    text = capsys.readouterr().out
    assert "sweep of 3 runs (3 cells x 1 seeds) in 3 shards" in text
    assert "imagenet-c unknown (not loaded); pacs:P-A-C-S unknown" in text
    assert "images in all (images x runs): unknown" in text


# ----------------------------------------------------------------------------- bad input


def _no_slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--shards", "0", "--", *SMALL], "--shards must be between 1 and the grid's 4 runs"),
        (["--shards", "5", "--", *SMALL], "--shards must be between 1 and the grid's 4 runs"),
        (["--", *SMALL, "--shard", "0/2"], "--shard is not a sweep's run option"),
        (["--", *SMALL, "--out", "x"], "--out is not a sweep's run option"),
        (["--", *SMALL, "--rerun"], "--rerun is not a sweep's run option"),
        (["--methods", "tent,nope"], "unknown method"),
        (["--", "--bogus", "1"], "run options: unrecognized arguments: --bogus"),
        (["--", "--labels", "x"], "run options: argument --labels"),
        (["--hp", "tent.nope=1", "--methods", "tent"], "--hp"),
        (["--launcher", "slurm", *SMALL], "no Slurm here"),
        (["--launcher", "local", "--partition", "gpu", *SMALL], "are Slurm options"),
        (["--launcher", "slurm", "--jobs", "2", *SMALL], "--jobs is for --launcher local"),
        (["--launcher", "local", "--jobs", "0", *SMALL], "--jobs must be an int >= 1"),
        (["--time", "soon", *SMALL], "--time is minutes"),
        (["--resubmit"], "holds no sweep"),
        (["--sbatch", "account", *SMALL], "--sbatch expects KEY=VALUE"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    extra, message, tmp_path, capsys, monkeypatch
):
    _no_slurm(monkeypatch, tmp_path)
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_missing_submitit_and_the_python_api(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sweep"
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    for launcher in ("slurm", "local"):
        assert cli.main(["sweep", "--launcher", launcher, "--out", str(out), *SMALL]) == 2
        assert "pip install 'eatta[cluster]'" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ValueError, match="between 1 and the grid's 4 runs"):
        sweep.launch(SMALL, out, shards=9, launcher="local")
    with pytest.raises(ValueError, match="eatta\\[cluster\\]"):
        sweep.launch(SMALL, out, launcher="local")
    assert sweep.plan(SMALL, 2).shard(1) == grid.shard(sweep.plan(SMALL).jobs, 1, 2)
    assert not out.exists()


def test_a_folder_holds_one_sweep(tmp_path, capsys):
    out = tmp_path / "sweep"
    out.mkdir()
    state = {"format": 1, "argv": SMALL, "shards": 2, "launcher": "local", "submissions": []}
    (out / "sweep.json").write_text(json.dumps(state))
    other = [*SMALL, "--checkpoint-every", "7"]
    assert cli.main(["sweep", "--out", str(out), "--", *other]) == 2
    assert "holds a sweep of other options" in capsys.readouterr().err
    assert cli.main(["sweep", "--out", str(out), "--shards", "3", *SMALL]) == 2
    assert cli.main(["sweep", "--out", str(out), "--resubmit", "--dry-run"]) == 0
    assert "in 2 shards (local)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- Slurm


def _fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sinfo: str = "cpu\ngpu*") -> Path:
    """sbatch, srun and sinfo on the PATH: sbatch keeps each submission file and answers with
    job ids 4242, 4243, ..."""
    bin_ = tmp_path / "bin"
    kept = tmp_path / "submitted"
    bin_.mkdir()
    kept.mkdir()
    scripts = {
        "sbatch": f"""#!/bin/sh
n=$(ls {kept} | wc -l)
cp "$1" {kept}/$n.sh
echo "Submitted batch job $((4242 + n))"
""",
        "srun": "#!/bin/sh\nexit 1\n",
        "sinfo": f"#!/bin/sh\nprintf '{sinfo}\\n'\n",
    }
    for name, text in scripts.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return kept


def _submitted(out: Path, job_id: str) -> sweep.ShardJob:
    from submitit.core.utils import DelayedSubmission

    job = DelayedSubmission.load(out / "submitit" / job_id / f"{job_id}_submitted.pkl").function
    assert isinstance(job, sweep.ShardJob)
    return job


def test_slurm_sweep_submits_one_job_array_with_the_asked_resources(tmp_path, capsys, monkeypatch):
    kept = _fake_slurm(tmp_path, monkeypatch)
    out = tmp_path / "sweep"
    argv = ["sweep", "--out", str(out), "--shards", "3", "--partition", "gpu", "--time", "2:00:00"]
    argv += ["--gpus", "1", "--cpus", "8", "--array-parallelism", "2", "--sbatch", "account=proj"]
    assert cli.main([*argv, *SMALL]) == 0
    text = capsys.readouterr().out
    assert "submitted 3 shard(s) of 3 as Slurm job 4242" in text
    for i in range(3):
        assert f"shard {i}: job 4242_{i}" in text
    assert f"eatta-bench merge {out}/shard-* --out {out} --no-plot" in text
    assert f"eatta-bench sweep --resubmit --out {out}" in text
    sbatch = (kept / "0.sh").read_text()
    for line in (
        "#SBATCH --array=0-2%2",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=120",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --account=proj",
        "#SBATCH --job-name=eatta-sweep",
        "export OMP_NUM_THREADS=8",
    ):
        assert line in sbatch.splitlines()
    assert "srun" in sbatch and "submitit.core._submit" in sbatch
    for i in range(3):  # each array job runs eatta-bench run ARGV --shard i/3 --out DIR/shard-i
        job = _submitted(out, f"4242_{i}")
        assert job.command() == [
            "run",
            *SMALL,
            "--shard",
            f"{i}/3",
            "--out",
            str(out / f"shard-{i}"),
        ]
        assert job.threads == 8
    state = json.loads((out / "sweep.json").read_text())
    assert state["argv"] == SMALL and state["shards"] == 3 and state["launcher"] == "slurm"
    assert state["submissions"][0]["job_ids"] == {"0": "4242_0", "1": "4242_1", "2": "4242_2"}
    assert state["slurm"]["partition"] == "gpu" and state["time_min"] == 120
    # the executor itself, as configured (nothing submitted)
    options = sweep.SlurmOptions(partition="gpu", time_min=30, gpus=2, cpus=4, array_parallelism=5)
    params = sweep.slurm_executor(tmp_path / "ex", options).parameters
    assert {k: params[k] for k in ("partition", "time", "gpus_per_node", "cpus_per_task")} == {
        "partition": "gpu",
        "time": 30,
        "gpus_per_node": 2,
        "cpus_per_task": 4,
    }
    assert params["array_parallelism"] == 5
    # shard 1 finished: resubmitting (with more time) submits shards 0 and 2 only
    (out / "shard-1").mkdir()
    (out / "shard-1" / "results.json").write_text("{}")
    assert cli.main(["sweep", "--resubmit", "--out", str(out), "--time", "300"]) == 0
    text = capsys.readouterr().out
    assert "submitted 2 shard(s) of 3 as Slurm job 4243" in text
    resent = (kept / "1.sh").read_text().splitlines()
    assert "#SBATCH --array=0-1%2" in resent and "#SBATCH --time=300" in resent
    assert "#SBATCH --partition=gpu" in resent  # the recorded options are kept
    assert [_submitted(out, f"4243_{a}").index for a in (0, 1)] == [0, 2]
    state = json.loads((out / "sweep.json").read_text())
    assert state["submissions"][1]["job_ids"] == {"0": "4243_0", "2": "4243_1"}


def test_slurm_that_does_not_answer_or_lacks_the_partition(tmp_path, capsys, monkeypatch):
    _fake_slurm(tmp_path, monkeypatch)
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--out", str(out), "--partition", "big", *SMALL]) == 2
    assert "'big' is not a partition of this cluster (cpu, gpu)" in capsys.readouterr().err
    (tmp_path / "bin" / "sinfo").write_text(
        "#!/bin/sh\necho 'cannot reach slurmctld' >&2\nexit 1\n"
    )
    assert cli.main(["sweep", "--out", str(out), *SMALL]) == 2
    assert "Slurm does not answer" in capsys.readouterr().err
    assert not out.exists()


def test_the_documented_sbatch_script_runs_shard_auto_and_merges(tmp_path, monkeypatch):
    """docs/slurm_array.sbatch with sbatch and srun replaced by recorders."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "docs" / "slurm_array.sbatch"
    bin_, calls = tmp_path / "bin", tmp_path / "calls"
    bin_.mkdir()
    recorder = f"""#!/bin/sh
printf '%s\\n' "$(basename "$0")" "$@" "--" >> {calls}
env | grep -E '^(EATTA_SHARD|OUT)=' >> {calls} || true
echo "4242;cluster"
"""
    for name in ("sbatch", "srun"):
        (bin_ / name).write_text(recorder)
        (bin_ / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "OUT": "g"}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_") and k != "EATTA_SHARD"}
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True)
    submitted = calls.read_text().split("--\n")
    assert submitted[0].split("\n")[:4] == [
        "sbatch",
        "--parsable",
        "--export=ALL,OUT=g",
        str(script),
    ]
    merge = submitted[1].splitlines()
    assert "--dependency=afterok:4242" in merge and "eatta-bench merge g/shard-* --out g" in merge
    calls.unlink()
    task = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "0"}
    subprocess.run(["bash", str(script)], env={**env, **task}, check=True, capture_output=True)
    ran = calls.read_text().splitlines()
    assert ran[:3] == ["srun", "eatta-bench", "run"] and not any("EATTA" in x for x in ran)
    argv = ran[3 : ran.index("--")]
    assert argv[-5:] == ["--shard", "auto", "--out", "g/shard-1", "--no-progress"]
    assert resolve_shard(task) == (1, 8)
    assert len(sweep.plan(argv[:-5]).jobs) >= 8  # the script's grid fills its array
    calls.unlink()  # a resubmission of shards 3 and 5 of 8
    again = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "2", "SHARDS": "8"}
    subprocess.run(["bash", str(script)], env={**env, **again}, check=True, capture_output=True)
    ran = calls.read_text().splitlines()
    assert "EATTA_SHARD=5/8" in ran and "g/shard-5" in ran
    assert resolve_shard({**again, "EATTA_SHARD": "5/8"}) == (5, 8)


# ----------------------------------------------------------------------------- local


def _local(out: Path, shards: int, argv: list[str]) -> list[str]:
    return [
        "sweep",
        "--launcher",
        "local",
        "--jobs",
        "2",
        "--shards",
        str(shards),
        "--out",
        str(out),
        *argv,
    ]


def _cells(folder: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for f in sorted((folder / "cells").glob("*.json")):
        d = json.loads(f.read_text())
        found[f.name] = {k: v for k, v in d.items() if k not in TIMING}
    return found


def test_local_sweeps_merge_to_the_serial_result(tmp_path, capsys, serial):
    reference = numbers(serial)
    assert len(reference) == 4
    for shards in (2, 3):
        out = tmp_path / f"sweep{shards}"
        assert cli.main(_local(out, shards, SMALL)) == 0
        assert numbers(out) == reference  # same cells, same errors, same online records
        assert sorted(p.name for p in out.glob("shard-*")) == [f"shard-{i}" for i in range(shards)]
    # a shard run by hand writes the same cell files as the launcher's
    capsys.readouterr()
    hand = tmp_path / "hand"
    assert cli.main(["run", *SMALL, "--shard", "1/3", "--out", str(hand)]) == 0
    assert _cells(hand) == _cells(tmp_path / "sweep3" / "shard-1") != {}
    # the same command again: every shard has finished, nothing is submitted, merged again
    again = cli.main(_local(tmp_path / "sweep2", 2, SMALL))
    assert again == 0 and "all 2 shards" in capsys.readouterr().err
    state = json.loads((tmp_path / "sweep2" / "sweep.json").read_text())
    assert len(state["submissions"]) == 1


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds processes through /proc")
def test_a_killed_shard_resumes_when_resubmitted(tmp_path, capsys):
    argv = ["--rounds", "2", "--methods", "tent", "--limit", "128", "--batch-size", "16"]
    argv += ["--window", "off"]
    argv += ["--seeds", "0,1", "--checkpoint-every", "5", "--no-plot", "--no-progress"]
    out = tmp_path / "sweep"
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(cli.main(_local(out, 2, argv))))
    thread.start()
    ckpts = out / "shard-1" / "checkpoints"
    deadline = time.monotonic() + 120
    while not list(ckpts.glob("*.pt")) and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.02)
    controller = int(json.loads((out / "sweep.json").read_text())["submissions"][0]["job_ids"]["1"])
    killed = []
    for task in _children(controller):  # the shard's process, mid-run
        os.kill(task, signal.SIGKILL)
        killed.append(task)
    thread.join(120)
    assert killed and status == [1]
    assert "shard 1 (job" in capsys.readouterr().err
    assert list(ckpts.glob("*.pt")) and not list((out / "shard-1").glob("cells/*.json"))
    finished = (out / "shard-0" / "results.json").read_bytes()
    # resubmitted (launcher and options from sweep.json): only shard 1, from its checkpoint
    assert cli.main(["sweep", "--resubmit", "--out", str(out)]) == 0
    state = json.loads((out / "sweep.json").read_text())
    assert list(state["submissions"][-1]["job_ids"]) == ["1"]
    assert (out / "shard-0" / "results.json").read_bytes() == finished
    resumed = json.loads((out / "shard-1" / "results.json").read_text())["results"][0]
    assert resumed["sessions"] == 2 and not list(ckpts.glob("*.pt"))
    serial = tmp_path / "serial"
    assert cli.main(["run", *argv, "--out", str(serial)]) == 0
    assert numbers(out) == numbers(serial)
