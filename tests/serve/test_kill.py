"""``kill -9`` of a real server while it serves and a person answers, then a restart with the
same --state: every acknowledged answer is in the queue, the method resumes from its checkpoint,
the label requests it will never apply are expired, and the stream goes on."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from _serve_helpers import ServeProcess
from test_app import _metrics

from _threaded import wait_until
from eatta.annotate import LabelQueue

http = pytest.importorskip("tritonclient.http")


def _stream(url: str, n: int, seed: int, errors: list[str] | None = None) -> int:
    """``n`` requests of 1-8 digits-sized images; the number answered (200)."""
    rng = np.random.default_rng(seed)
    client = http.InferenceServerClient(url, connection_timeout=5, network_timeout=5)
    done = 0
    for i in range(n):
        x = rng.random((int(rng.integers(1, 9)), 3, 32, 32), dtype=np.float32)
        tensor = http.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        try:
            client.infer("model", [tensor], request_id=f"s{seed}-{i}")
        except Exception as err:
            if errors is None:
                return done  # the server is gone
            errors.append(f"s{seed}-{i}: {err}")
            continue
        done += 1
    return done


def _adapter_pid(output: list[str]) -> int:
    line = next(x for x in output if "the method steps in process" in x)
    return int(line.rsplit(" ", 1)[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (dead, not yet reaped) counts as dead
        return f.read().split(") ", 1)[1][0] != "Z"


def _answer_all(url: str, acknowledged: dict[str, int]) -> None:
    for item in httpx.get(f"http://{url}/api/pending", timeout=5).json():
        label = (item["row"] + len(acknowledged)) % 10
        r = httpx.post(
            f"http://{url}/api/answers", json={"id": item["id"], "label": label}, timeout=5
        )
        if r.status_code == 200:  # acknowledged: committed
            acknowledged[item["id"]] = label


def test_kill_9_then_restart_keeps_every_acknowledged_answer_and_goes_on(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ("--window", "16", "--checkpoint-s", "0.2", "--max-wait-ms", "1")
    first = ServeProcess(state, *args)
    acknowledged: dict[str, int] = {}
    try:
        url = first.wait_url()
        for seed in range(300):  # until a person has answered three label requests
            assert _stream(url, 4, seed=seed, errors=[]) == 4
            _answer_all(url, acknowledged)
            if len(acknowledged) >= 3:
                break
        stop = threading.Event()

        def person() -> None:  # answers as requests come, until the server dies
            while not stop.is_set():
                try:
                    _answer_all(url, acknowledged)
                except httpx.HTTPError:
                    return
                time.sleep(0.01)

        answering = threading.Thread(target=person)
        streaming = threading.Thread(target=_stream, args=(url, 10_000, 1))
        answering.start()
        streaming.start()
        time.sleep(1.0)
        os.kill(first.proc.pid, signal.SIGKILL)  # in the middle of everything
        first.proc.wait(10)
        child = _adapter_pid(first.output)
        wait_until(lambda: not _alive(child), what="the adapter process killed with the server")
        stop.set()
        answering.join(10)
        streaming.join(10)
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert len(acknowledged) >= 3
    second = ServeProcess(state, *args)
    try:
        url = second.wait_url()
        assert any("resumed from its checkpoint" in line for line in second.output), second.output
        logged = {a["id"]: a.get("label") for a in LabelQueue(state / "labels.db").answers()}
        assert {k: logged.get(k) for k in acknowledged} == acknowledged  # every one, as given
        m = _metrics(url)
        # the requests the restored method does not wait for were expired: none is left pending
        assert m["eatta_queue_pending"] <= m["eatta_labels_pending"]
        before, steps = len(acknowledged), m["eatta_steps_total"]
        for seed in range(1000, 1300):  # the stream goes on until the method steps again
            errors: list[str] = []
            assert _stream(url, 4, seed=seed, errors=errors) == 4, errors
            if _metrics(url)["eatta_steps_total"] > steps:
                break
        wait_until(lambda: _metrics(url)["eatta_stepping"] == 0, what="no step running")
        _answer_all(url, acknowledged)
        assert len(acknowledged) > before  # the step after the restart asked; a person answered
        wait_until(lambda: _metrics(url)["eatta_stepping"] == 0, what="no step running")
        steps = _metrics(url)["eatta_steps_total"]
    finally:
        second.proc.send_signal(signal.SIGTERM)  # uvicorn stops cleanly, then exits by it
        assert second.proc.wait(30) in (0, -signal.SIGTERM)
    saved = torch.load(state / "checkpoint.pt", weights_only=False)
    assert saved["steps"] == steps  # a last checkpoint at the stop
