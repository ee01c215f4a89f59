"""The whole server through Triton's own HTTP client, its page's API and its metrics: a person's
answers reach the method within its budget; the page's host and token rules hold everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from _serve_helpers import SHAPE, batches, make_service, running

from _threaded import wait_until

pytestmark = pytest.mark.small_batches
http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

SAMPLE = re.compile(r'^[a-z_]+(\{[a-z]+="[^"]*"(,[a-z]+="[^"]*")*\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$')


def _input(x: torch.Tensor, binary: bool = True) -> object:
    tensor = http.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x.numpy().astype(np.float32), binary_data=binary)
    return tensor


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"http://{url}/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def test_tritons_client_infers_and_a_person_answers_within_the_budget(tmp_path: Path) -> None:
    service = make_service(tmp_path / "s", name="tiny")
    with running(service) as url:
        client = http.InferenceServerClient(url)
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("tiny")
        meta = client.get_model_metadata("tiny")
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, *SHAPE]}]
        sent: dict[str, torch.Tensor] = {}
        for i, x in enumerate(batches(12, 3)):  # 36 samples: 4 steps on a window of 8
            wait_until(lambda: service.adapter.idle, what="the adapter idle")  # none skipped
            rid = f"req-{i}"
            result = client.infer("tiny", [_input(x, binary=i % 2 == 0)], request_id=rid)
            sent[rid] = x
            assert result.get_response()["id"] == rid
            logits = result.as_numpy("logits")
            assert logits.shape == (3, 5)
            assert result.as_numpy("class").tolist() == logits.argmax(1).tolist()
        plain = client.infer("tiny", [_input(x)], outputs=[http.InferRequestedOutput("class")])
        assert plain.as_numpy("logits") is None and plain.get_response()["id"]  # an id is given
        wait_until(lambda: service.adapter.stats.steps >= 4, what="four steps")
        pending = httpx.get(f"http://{url}/api/pending").json()
        assert len(pending) >= 4
        for item in pending:  # the page names the inference request and the row
            assert item["request_id"] in sent and 0 <= item["row"] < 3
            r = httpx.post(f"http://{url}/api/answers", json={"id": item["id"], "label": 2})
            assert r.status_code == 200
        for x in batches(6, 3, seed=1):  # more steps: the answers are collected
            wait_until(lambda: service.adapter.idle, what="the adapter idle")
            client.infer("tiny", [_input(x)])
        wait_until(
            lambda: service.adapter.stats.annotation.get("received") == len(pending),
            what="the answers applied",
        )
        m = _metrics(url)
        steps = m["eatta_steps_total"]
        assert m['eatta_labels_total{what="answered"}'] == len(pending)
        assert m['eatta_labels_total{what="asked"}'] <= steps * 1  # budget 1 a step
        assert m['eatta_requests_total{outcome="ok"}'] == 19
        assert m["eatta_rows_total"] == 19 * 3
        assert m["eatta_batch_rows_total"] == 57
        assert (
            sum(v for k, v in m.items() if k.startswith("eatta_served_batches_total"))
            == m["eatta_batches_total"]
        )
        assert m["eatta_queue_answered_total"] == len(pending)
        assert m["eatta_request_latency_seconds_count"] == 19
        assert 'eatta_fallback{stat="steps"}' in m


def test_bad_requests_get_a_clear_status_and_change_nothing(tmp_path: Path) -> None:
    service = make_service(tmp_path / "s")
    with running(service) as url:
        client = http.InferenceServerClient(url)
        with pytest.raises(InferenceServerException, match="unknown model 'other'"):
            client.infer("other", [_input(torch.zeros(1, *SHAPE))])
        with pytest.raises(InferenceServerException, match=r"has shape \[-1, 3, 8, 8\]"):
            client.infer("model", [_input(torch.zeros(1, 3, 4, 4))])
        with pytest.raises(InferenceServerException, match="at most 8 rows"):
            client.infer("model", [_input(torch.zeros(9, *SHAPE))])
        nan = torch.zeros(1, *SHAPE)
        nan[0, 0, 0, 0] = float("nan")
        with pytest.raises(InferenceServerException, match="NaN"):
            client.infer("model", [_input(nan)])
        r = httpx.post(
            f"http://{url}/v2/models/model/infer",
            content=b"{}",
            headers={"content-type": "text/plain"},
        )
        assert r.status_code == 415  # the page's cross-site rule: a form cannot post here
        r = httpx.post(
            f"http://{url}/v2/models/model/infer",
            content=b'{"inputs": []}',
            headers={"content-type": "application/json", "origin": "http://evil.example"},
        )
        assert r.status_code == 403
        assert httpx.get(f"http://{url}/v2/models/model/versions/2").status_code == 404
        m = _metrics(url)
        assert m['eatta_requests_total{outcome="invalid"}'] == 4
        assert m["eatta_batches_total"] == 0 and m["eatta_adapted_batches_total"] == 0


def test_the_page_rules_hold_for_the_whole_server(tmp_path: Path) -> None:
    with running(make_service(tmp_path / "a")) as url:
        r = httpx.get(f"http://{url}/v2/health/live", headers={"host": "example.com"})
        assert r.status_code == 403 and "not allowed without a token" in r.json()["error"]
    token = "s3cret-token"
    with running(make_service(tmp_path / "b"), token=token) as url:
        for path in ("/v2/health/live", "/v2/models/model", "/metrics", "/api/pending", "/"):
            assert httpx.get(f"http://{url}{path}").status_code == 401, path
        client = http.InferenceServerClient(url)
        with pytest.raises(InferenceServerException):
            client.infer("model", [_input(torch.zeros(1, *SHAPE))])
        auth = {"Authorization": f"Bearer {token}"}
        result = client.infer("model", [_input(torch.zeros(2, *SHAPE))], headers=dict(auth))
        assert result.as_numpy("logits").shape == (2, 5)
        r = httpx.get(f"http://{url}/v2/health/live", headers={**auth, "host": "example.com"})
        assert r.status_code == 200
