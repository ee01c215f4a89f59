"""``eatta-bench sweep`` against a real single-node Slurm started by the test.

The fixture starts ``munged``, ``slurmctld`` and ``slurmd`` on this machine as root, from a
``slurm.conf`` it writes into a temporary folder (``proctrack/linuxproc``, ``task/none``, no
cgroup.conf, accounting disabled, one node ``localhost`` with this machine's CPUs and memory as
``slurmd -C`` reports them, a ``debug`` partition, free ports), points the Slurm commands at it
through ``SLURM_CONF`` and stops every daemon afterwards, also when the test fails.

Needs Debian's ``slurm-wlm`` and ``munge`` and root (``.ci/run`` installs them): without them the
test fails under ``CI=true`` and is skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from bench_fixtures import one_thread  # noqa: F401  (autouse fixture)

import eatta.bench.cli as cli

pytest.importorskip("submitit")

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "srun", "sinfo", "squeue", "scancel")
#: a small real digits-C grid: 2 cells x 2 seeds = 4 runs, a few seconds
SMALL = ["--rounds", "1", "--methods", "source,tent", "--limit", "16", "--batch-size", "8"]
SMALL += ["--seeds", "0,1", "--no-plot", "--no-progress"]
#: what a result's numbers are (no timings, no memory)
EXACT = ("key", "seed", "grid_index", "fingerprint", "domain_errors", "average_error")
EXACT += ("overall_error", "online", "round_errors", "model_digest", "hparams")


def _slurm_or_skip() -> None:
    missing = [c for c in (*DAEMONS, *COMMANDS) if shutil.which(c) is None]
    why = ""
    if missing:
        why = f"the Slurm test needs {', '.join(missing)} (apt-get install slurm-wlm munge)"
    elif os.geteuid() != 0:
        why = "the Slurm test starts slurmd, which runs jobs as their user: it needs root"
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)
        pytest.skip(why)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait_for(condition: Callable[[], object], timeout: float, what: str, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    tails = "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
        for p in sorted(logs.glob("*.log"))
    )
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tails}")


def _config(root: Path) -> str:
    """slurm.conf for one node ``localhost`` with this machine's hardware (``slurmd -C``)."""
    ctld_port, node_port = _free_ports(2)
    hardware = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True)
    node = hardware.stdout.splitlines()[0].split()
    assert node[0].startswith("NodeName="), hardware.stdout
    host = socket.gethostname().split(".")[0]
    lines = [
        "ClusterName=eattatest",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={node_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "MpiDefault=none",
        "ReturnToService=2",
        "KillWait=2",
        "MinJobAge=300",
        " ".join(["NodeName=localhost", "NodeAddr=127.0.0.1", *node[1:], "State=UNKNOWN"]),
        "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running single-node Slurm; yields its folder (``SLURM_CONF`` points at it)."""
    _slurm_or_skip()
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(_config(root))
    logs = root / "log"
    procs: list[subprocess.Popen[bytes]] = []
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", str(conf))
    for k in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        mp.delenv(k)  # a test run inside a Slurm job must not talk to that cluster
    mp.delenv("EATTA_SHARD", raising=False)

    def start(name: str, *args: str) -> None:
        out = (logs / f"{name}.out.log").open("wb")
        procs.append(subprocess.Popen([name, *args], stdout=out, stderr=subprocess.STDOUT))

    try:
        munge = root / "munge"
        start(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={munge}/munge.socket",
            f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed",
            f"--log-file={logs}/munged.log",
        )
        _wait_for((munge / "munge.socket").exists, 15, "munged's socket", logs)
        start("slurmctld", "-D", "-f", str(conf))
        start("slurmd", "-D", "-N", "localhost", "-f", str(conf))

        def idle() -> bool:
            states = subprocess.run(
                ["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True, timeout=10
            )
            return states.stdout.strip() == "idle"

        _wait_for(idle, 60, "the node to be idle (sinfo)", logs)
        yield root
    finally:
        try:
            subprocess.run(["scancel", "--partition=debug"], capture_output=True, timeout=10)
            _wait_for(
                lambda: (
                    not subprocess.run(
                        ["squeue", "--noheader"], capture_output=True, text=True, timeout=10
                    ).stdout.strip()
                ),
                30,
                "the queue to empty",
                logs,
            )
        except (OSError, subprocess.SubprocessError, AssertionError):
            pass  # the daemons are stopped below either way
        for proc in reversed(procs):  # slurmd, slurmctld, munged
            _stop(proc)
        mp.undo()


def numbers(folder: Path) -> list[dict[str, Any]]:
    doc = json.loads((folder / "results.json").read_text())
    return [{k: r[k] for k in EXACT} for r in doc["results"]]


def test_a_sweep_on_real_slurm_resubmits_a_cancelled_task_and_merges_to_the_serial_run(
    slurm: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    own = ["--shards", "2", "--partition", "debug", "--cpus", "1", "--time", "10"]
    # --dry-run: what the user checks first on their own cluster; submits nothing
    assert cli.main(["sweep", "--dry-run", *own, "--out", str(out), *SMALL]) == 0
    assert "in 2 shards (slurm)" in capfd.readouterr().out and not out.exists()

    # the sweep, one array task at a time; task 1 is cancelled while it waits for task 0
    argv = ["sweep", *own, "--array-parallelism", "1", "--wait", "--out", str(out), *SMALL]
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(cli.main(argv)))
    thread.start()

    def job_ids() -> dict[str, str]:
        state = out / "sweep.json"
        return json.loads(state.read_text())["submissions"][0]["job_ids"] if state.exists() else {}

    _wait_for(lambda: "1" in job_ids(), 30, "the submission", slurm / "log")
    task = job_ids()["1"]
    subprocess.run(["scancel", task], check=True, timeout=10)
    # meanwhile (task 0 runs on Slurm): the serial run in this process, the reference
    serial = tmp_path / "serial"
    assert cli.main(["run", *SMALL, "--out", str(serial)]) == 0
    assert len(numbers(serial)) == 4
    thread.join(120)
    assert not thread.is_alive() and status == [1]
    first = capfd.readouterr()
    array = task.split("_")[0]
    assert f"submitted 2 shard(s) of 2 as Slurm job {array}" in first.out
    assert f"shard 0 (job {array}_0): finished" in first.err
    # a cancelled pending task leaves the queue at once (squeue shows no CANCELLED state for it)
    failed = f"shard 1 (job {task}): FAILED: ended without a result ("
    assert failed in first.err and "cancelled" in first.err.split(failed)[1].lower()
    assert "shard(s) failed: [1]; resubmit them with" in first.out
    assert (out / "shard-0" / "results.json").is_file()
    assert not (out / "shard-1" / "results.json").exists()
    assert not (out / "results.json").exists()  # nothing merged yet

    # --resubmit: only shard 1, then the merge
    assert cli.main(["sweep", "--resubmit", "--wait", "--out", str(out)]) == 0
    second = capfd.readouterr()
    assert "submitted 1 shard(s) of 2 as Slurm job" in second.out
    state = json.loads((out / "sweep.json").read_text())
    assert [list(s["job_ids"]) for s in state["submissions"]] == [["0", "1"], ["1"]]
    # submitit asks sacct, which fails without accounting: the sweep never lets it
    assert "sacct" not in first.err + second.err

    # the merged grid is the serial run's, number for number
    assert numbers(out) == numbers(serial)
