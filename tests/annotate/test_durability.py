"""kill -9 of the adapting process and of the page's server, at random moments, loses no
acknowledged answer, applies none twice and none to the wrong sample (real processes).

The test is the poster: it answers every pending request through the HTTP API from the image it
is shown (``_adapter.expected``) and records each acknowledged (200) answer. Meanwhile it kills
the adapter (``_adapter.py``), the server (``eatta-annotate serve``) or both with SIGKILL, and
restarts them on the same queue file. ``EATTA_KILL_ROUNDS`` sets the number of kills (default 2;
each restart costs a second or two of imports).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from _adapter import expected, request  # noqa: E402
from _annotate_helpers import ServerProcess, subprocess_env  # noqa: E402

from eatta.annotate import Answer, LabelQueue  # noqa: E402
from eatta.annotate.queue import sample_digest  # noqa: E402

ADAPTER = Path(__file__).with_name("_adapter.py")
ROUNDS = int(os.environ.get("EATTA_KILL_ROUNDS", "2"))
STEPS = 24
MODES = ("same", "diverge")


def start_adapter(tmp: Path, queue: Path, mode: str) -> subprocess.Popen[Any]:
    args = [sys.executable, str(ADAPTER), "--queue", str(queue), "--prefix", mode]
    args += ["--checkpoint", str(tmp / f"{mode}.json"), "--steps", str(STEPS), "--pause", "0.12"]
    args += ["--diverge"] if mode == "diverge" else []
    with open(tmp / f"{mode}.log", "a") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=subprocess_env())


def kill9(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_sigkill_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Two adapting processes share the queue: one re-runs exactly what it ran before its
    checkpoint ("same"), the other may ask about other samples under the same ids ("diverge")."""
    rng = random.Random(20250)
    queue = tmp_path / "q.db"
    LabelQueue(queue).close()
    victims = (["adapters", "server", "all"] * ROUNDS)[:ROUNDS]
    rng.shuffle(victims)
    adapters = {mode: start_adapter(tmp_path, queue, mode) for mode in MODES}
    server = ServerProcess(queue)
    acked: list[tuple[str, dict[str, Any]]] = []
    kills = {"adapters": 0, "server": 0}
    starts = dict.fromkeys(MODES, 1)
    next_kill: float | None = None
    deadline = time.monotonic() + 150

    def running() -> bool:
        return any(p.poll() is None or p.returncode == -signal.SIGKILL for p in adapters.values())

    def kill_due() -> bool:
        """A kill is due a random 0.1-0.8 s after every adapter has (re)started its loop."""
        nonlocal next_kill
        if not victims:
            return False
        if next_kill is None:
            logs = {m: (tmp_path / f"{m}.log").read_text() for m in MODES}
            if all(logs[m].count("adapter: from step") >= starts[m] for m in MODES):
                next_kill = time.monotonic() + rng.uniform(0.1, 0.8)
            return False
        return time.monotonic() >= next_kill

    http = httpx.Client(timeout=10)
    try:
        while running():
            assert time.monotonic() < deadline, "the adapters did not finish in time"
            url = server.url
            try:
                if url is None:  # (re)starting
                    raise httpx.ConnectError("the server is starting")
                for item in http.get(f"{url}/api/pending").json():
                    png = http.get(f"{url}{item['image']}").content
                    body = {"id": item["id"], **expected(png)}
                    r = http.post(f"{url}/api/answers", json=body)
                    if r.status_code == 200:
                        acked.append((item["id"], body))
                    else:  # answered or superseded meanwhile: refused with a reason
                        assert r.status_code in (409, 410), r.text
                    if kill_due():
                        break
            except httpx.TransportError:
                pass  # the server is down (killed): nothing was acknowledged
            if kill_due():
                victim = victims.pop()
                if victim in ("adapters", "all"):
                    for mode, proc in adapters.items():
                        if proc.poll() is None:
                            kill9(proc)
                            adapters[mode] = start_adapter(tmp_path, queue, mode)
                            starts[mode] += 1
                    kills["adapters"] += 1
                if victim in ("server", "all"):
                    kill9(server.proc)
                    kills["server"] += 1
                    server = ServerProcess(queue)
                next_kill = None
            time.sleep(0.01)
    finally:
        http.close()
        for proc in (*adapters.values(), server.proc):
            if proc.poll() is None:
                kill9(proc)
    assert kills["adapters"] >= 1 and kills["server"] >= 1, kills
    for mode, proc in adapters.items():
        output = (tmp_path / f"{mode}.log").read_text()
        assert proc.returncode == 0, output
        final = json.loads((tmp_path / f"{mode}.json").read_text())
        mine = [(key, body) for key, body in acked if key.startswith(f"{mode}-")]
        superseded = check_exactly_once(queue, final, mine, mode == "diverge")
        print(
            f"{mode}: kills {kills}, {len(mine)} answers acknowledged, {superseded} requests "
            f"re-asked with another sample; log:\n{output}"
        )


def check_exactly_once(
    queue: Path, final: dict[str, Any], acked: list[tuple[str, dict[str, Any]]], diverge: bool
) -> int:
    assert final["step"] == STEPS
    applied = final["applied"]
    ids = [a["id"] for a in applied]
    assert len(ids) == len(set(ids)), "an answer was applied twice"
    assert all(a["ok"] for a in applied), "an answer was applied to another sample"
    log = {a["id"]: a for a in LabelQueue(queue).answers()}  # the queue's answer log, by key
    for key, body in acked:  # acknowledged means committed, as sent
        assert {k: log[key][k] for k in body if k != "id"} == {
            k: body[k] for k in body if k != "id"
        }
    db = sqlite3.connect(queue)
    latest: dict[str, tuple[str, str, int]] = {}  # method id -> its last submit's key and sample
    superseded = 0
    rows = "SELECT key, method_id, digest, prediction FROM requests ORDER BY rowid"
    for key, mid, digest, prediction in db.execute(rows):
        if not mid.startswith(final["prefix"]):
            continue
        if mid in latest:  # a new key only for another sample or prediction than the last one
            assert latest[mid][1:] != (digest, prediction), key
            superseded += 1
        latest[mid] = (key, digest, prediction)
    db.close()
    # every request of the surviving run was answered, and got exactly its own answer
    by_id = {a["id"]: a["answer"] for a in applied}
    assert set(by_id) == set(final["asked"])
    for mid, seed in final["asked"].items():
        key, digest, _ = latest[mid]
        assert digest == sample_digest(request(0, seed).sample)
        entry = log[key]
        sent = {k: entry[k] for k in ("label", "correct", "skip") if k in entry}
        assert by_id[mid] == {"id": mid, **sent}
    # an acknowledged answer not delivered belongs to a sample the surviving run never asked
    delivered = {latest[mid][0] for mid in final["asked"]}
    orphans = {key for key, _ in acked} - delivered
    if not diverge:
        assert not orphans and not superseded
    assert all("." in key or latest[key][0] != key for key in orphans)
    return superseded


def test_a_real_method_resumes_on_the_same_queue(tmp_path: Path) -> None:
    """eatta with a LabelQueue: a checkpoint (method + queue state), more steps and answers, then
    a fresh method and queue restored from it re-run the steps: every answer it gets is the one
    given to the sample it asked about, none twice, none refused."""
    import copy

    import torch

    import eatta
    from conftest import confident_cnn, image_batches

    path = tmp_path / "q.db"
    page = LabelQueue(path)
    batches = image_batches(7, size=16, seed=3)

    class Recording(LabelQueue):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.asked: dict[str, str] = {}
            self.got: list[Any] = []

        def submit(self, requests: Any) -> None:
            super().submit(requests)
            self.asked.update({r.id: sample_digest(r.sample) for r in requests})

        def collect(self) -> list[Any]:
            out = super().collect()
            self.got.extend(out)
            return out

    def answer_all() -> None:
        for item in page.pending():
            page.answer(Answer(item["id"], label=(item["prediction"] + 1) % 5))

    def build(queue: LabelQueue) -> Any:
        torch.manual_seed(0)
        return eatta.create("eatta", copy.deepcopy(confident_cnn()), oracle=queue, budget=1)

    first = Recording(path)
    method = build(first)
    for x in batches[:3]:
        method(x)
        answer_all()
    saved = copy.deepcopy((method.state_dict(), first.state_dict()))
    for x in batches[3:6]:
        method(x)
        answer_all()
    assert first.got and method.annotation_stats["refused"] == 0
    second = Recording(path)
    restored = build(second)
    restored.load_state_dict(saved[0])
    second.load_state_dict(saved[1])
    base = restored.annotation_stats  # lifetime counters, as at the checkpoint
    for x in batches[3:]:
        restored(x)
        answer_all()
    restored(batches[0])  # one more step collects the last answers
    ids = [a.id for a in second.got]
    assert ids and len(ids) == len(set(ids))
    stats = restored.annotation_stats
    assert stats["refused"] == 0
    assert stats["received"] + stats["skipped"] - base["received"] - base["skipped"] == len(ids)
    log = {a["id"]: a for a in page.answers()}
    asked = {**first.asked, **second.asked}  # asked before the checkpoint, or by the re-run
    for a in second.got:
        key = second.request(a.id)
        # the key the re-run's request is stored under: its id, or id.n for another sample
        keys = [k for k, v in log.items() if k.split(".")[0] == a.id]
        match = [k for k in keys if second.request(k)["digest"] == asked[a.id]]
        assert key is not None and match, a
        assert log[match[-1]]["label"] == a.label
