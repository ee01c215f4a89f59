"""Under load on loopback, bounded in time: every request is answered with its own rows or
refused with 503 and Retry-After; none is dropped, and the server counts what the clients saw."""

from __future__ import annotations

import http.client
import json
import random
import struct
import threading
import time
from pathlib import Path

import pytest
import torch
from _serve_helpers import SHAPE, make_service, running
from test_app import _metrics

from conftest import tiny_cnn

pytestmark = pytest.mark.small_batches

CLIENTS, SECONDS, MOST = 8, 2.0, 150  # each client stops at whichever comes first


def _body(x: torch.Tensor, rid: str) -> tuple[bytes, dict[str, str]]:
    raw = struct.pack(f"<{x.numel()}f", *x.flatten().tolist())
    head = json.dumps(
        {
            "id": rid,
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "logits"}],
        }
    ).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head))}


def test_concurrent_clients_are_all_answered_or_refused_clearly(tmp_path: Path) -> None:
    # the lean rule serves the given model while no answer came (the promise may spend its
    # allowance on the adapted model's predictions without one: rows would not be checkable)
    service = make_service(
        tmp_path / "s", max_batch=8, max_queue=8, max_wait_ms=20.0,
        hparams={"fallback_start": "blend"},
    )  # fmt: skip
    given = tiny_cnn(seed=0).eval()  # what serves without answers
    seen: dict[int, int] = {}
    failures: list[str] = []
    lock = threading.Lock()

    def client(k: int, url: str) -> None:
        rng = random.Random(k)
        host, port = url.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        deadline = time.monotonic() + SECONDS
        for i in range(MOST):
            if time.monotonic() > deadline:
                break
            x = torch.randn(
                rng.randint(1, 8), *SHAPE, generator=torch.Generator().manual_seed(k * 1000 + i)
            )
            body, headers = _body(x, f"c{k}-{i}")
            try:
                conn.request("POST", "/v2/models/model/infer", body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as err:  # a dropped request
                failures.append(f"c{k}-{i}: {type(err).__name__}: {err}")
                return
            with lock:
                seen[r.status] = seen.get(r.status, 0) + 1
            if r.status == 200:
                doc = json.loads(data)
                if doc["id"] != f"c{k}-{i}":
                    failures.append(f"c{k}-{i}: the reply of {doc['id']}")
                got = torch.tensor(doc["outputs"][0]["data"]).reshape(x.shape[0], 5)
                with torch.no_grad():
                    if not torch.allclose(got, given(x), atol=1e-5):
                        failures.append(f"c{k}-{i}: other rows' logits")
            elif (
                r.status != 503
                or r.getheader("retry-after") != "1"
                or "error" not in json.loads(data)
            ):
                failures.append(f"c{k}-{i}: status {r.status} {data[:200]!r}")
        conn.close()

    with running(service) as url:
        threads = [threading.Thread(target=client, args=(k, url)) for k in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SECONDS + 30)
        assert not any(t.is_alive() for t in threads)
        m = _metrics(url)
    assert failures == []
    assert set(seen) <= {200, 503} and seen.get(200, 0) > CLIENTS and seen.get(503, 0) > 0, seen
    assert m['eatta_requests_total{outcome="ok"}'] == seen[200]
    assert m['eatta_requests_total{outcome="overloaded"}'] == seen[503]
    assert m["eatta_batch_rows_max"] <= 8
    assert m["eatta_batches_total"] < seen[200]  # requests were gathered into batches
