"""The page's server: the JSON API, its checks and its safety defaults (Starlette's test client),
and many concurrent answers against a real uvicorn server."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

import httpx
from _annotate_helpers import make_request, serve_in_thread
from starlette.testclient import TestClient

from eatta.annotate import Answer, LabelQueue
from eatta.annotate.cli import main, token_for
from eatta.annotate.server import MAX_BODY, make_app

BASE = "http://127.0.0.1:8765"
TOKEN = "a-test-token-0123456789"


@pytest.fixture
def queue(tmp_path: Path) -> LabelQueue:
    q = LabelQueue(tmp_path / "labels.db", class_names=[f"c{k}" for k in range(10)])
    q.submit([make_request("a", 1, pred=2), make_request("b", 2, pred=5)])
    q.submit([make_request("c", 3, pred=0), make_request("gone", 4)])
    q.cancel(["gone"])
    return q


@pytest.fixture
def client(queue: LabelQueue) -> TestClient:
    with TestClient(make_app(queue.path), base_url=BASE) as c:
        yield c


def test_pending_lists_requests_newest_first(client: TestClient, queue: LabelQueue) -> None:
    r = client.get("/api/pending")
    assert r.status_code == 200
    items = r.json()
    assert [i["id"] for i in items] == ["c", "b", "a"]
    a = items[2]
    assert a["prediction"] == 2 and a["prediction_name"] == "c2"
    assert a["classes"] == [f"c{k}" for k in range(10)]
    assert a["image"] == "/api/images/a.png" and 0 < a["confidence"] <= 1
    assert [i["id"] for i in client.get("/api/pending?limit=1").json()] == ["c"]
    assert client.get("/api/pending?limit=-1").status_code == 400


def test_the_page_can_serve_the_oldest_first(queue: LabelQueue) -> None:
    with TestClient(make_app(queue.path, order="oldest"), base_url=BASE) as c:
        assert [i["id"] for i in c.get("/api/pending").json()] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="unknown queue order 'fifo'"):
        make_app(queue.path, order="fifo")  # type: ignore[arg-type]  # a bad value on purpose


def test_images_come_from_the_queue_only(client: TestClient, queue: LabelQueue) -> None:
    r = client.get("/api/images/a.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.content == queue.image("a")
    for bad in ("nobody.png", "a.jpg", "a", "..%2F..%2Fetc%2Fpasswd.png", "%2e%2e.png", ".a.png"):
        r = client.get(f"/api/images/{bad}")
        assert r.status_code == 404, bad
        assert "error" in r.json()
    assert client.get("/api/images/../../pyproject.toml").status_code == 404


def test_an_answer_is_taken_once_and_reaches_the_consumer(
    client: TestClient, queue: LabelQueue
) -> None:
    r = client.post("/api/answers", json={"id": "b", "label": 7, "seconds": 2.5})
    assert r.status_code == 200 and r.json() == {"ok": True, "id": "b", "seq": 1}
    r = client.post("/api/answers", json={"id": "a", "correct": False})
    assert r.status_code == 200
    r = client.post("/api/answers", json={"id": "b", "label": 3})
    assert r.status_code == 409 and "already answered" in r.json()["error"]
    assert queue.collect() == [Answer("b", label=7), Answer("a", correct=False)]
    stats = client.get("/api/stats").json()
    assert stats["pending"] == 1 and stats["answered"] == 2 and stats["median_seconds"] == 2.5
    assert stats["model_judged"] == 2 and stats["model_right"] == 0
    assert [i["id"] for i in client.get("/api/pending").json()] == ["c"]


@pytest.mark.parametrize(
    ("body", "headers", "status", "needle"),
    [
        ({"id": "nobody", "label": 1}, {}, 404, "unknown"),
        ({"id": "gone", "label": 1}, {}, 410, "expired"),
        ({"id": "a", "label": 10}, {}, 422, "outside"),
        ({"id": "a", "label": "3"}, {}, 422, "integer"),
        ({"id": "a", "label": True}, {}, 422, "integer"),
        ({"id": "a", "correct": 1}, {}, 422, "bool"),
        ({"id": "a", "label": 1, "skip": True}, {}, 422, "exactly one"),
        ({"id": "a", "label": 1, "path": "/etc"}, {}, 422, "unknown answer key"),
        ({"id": "a", "label": 1, "seconds": -3}, {}, 422, "seconds"),
        ({"label": 1}, {}, 422, "request id"),
        ([{"id": "a", "label": 1}], {}, 422, "JSON object"),
        ({"id": "a", "label": 1}, {"Origin": "http://evil.example"}, 403, "cross-site"),
        ({"id": "a", "label": 1}, {"Origin": "null"}, 403, "cross-site"),
        ({"id": "a", "label": 1}, {"Origin": "http://127.0.0.1:9999"}, 403, "cross-site"),
        ({"id": "a", "label": 1}, {"Referer": "http://evil.example/x"}, 403, "cross-site"),
        ({"id": "a", "label": 1}, {"Content-Type": "text/plain"}, 415, "application/json"),
        (
            {"id": "a", "label": 1},
            {"Content-Type": "application/x-www-form-urlencoded"},
            415,
            "application/json",
        ),
    ],
)
def test_bad_answers_get_a_4xx_with_a_message_and_change_nothing(
    client: TestClient, queue: LabelQueue, body: object, headers: dict, status: int, needle: str
) -> None:
    before = (queue.answers(), queue.pending())
    r = client.post(
        "/api/answers",
        content=json.dumps(body),
        headers={"Content-Type": "application/json", **headers},
    )
    assert r.status_code == status
    assert needle in r.json()["error"]
    assert (queue.answers(), queue.pending()) == before
    assert queue.collect() == []


def test_same_origin_posts_are_taken(client: TestClient, queue: LabelQueue) -> None:
    for rid, headers in (("a", {"Origin": BASE}), ("b", {"Referer": f"{BASE}/"})):
        r = client.post("/api/answers", json={"id": rid, "skip": True}, headers=headers)
        assert r.status_code == 200, r.text
    assert len(queue.collect()) == 2


def test_bodies_are_size_limited_and_must_be_json(client: TestClient, queue: LabelQueue) -> None:
    big = json.dumps({"id": "a", "label": 1, "pad": "x" * MAX_BODY})
    r = client.post("/api/answers", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "bytes" in r.json()["error"]

    def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(40):
            yield b" " * 1024

    r = client.post("/api/answers", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    r = client.post(
        "/api/answers", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    assert queue.answers() == []


def test_other_methods_and_paths_are_refused(client: TestClient) -> None:
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        r = client.request(method, "/api/answers")
        assert r.status_code == 405 and "error" in r.json()
    assert client.get("/api/answers").status_code == 405
    r = client.get("/nothing")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    for name in ("annotate.js", "annotate.css"):
        assert client.get(f"/static/{name}").status_code == 200
    for name in ("index.html", "..%2Fserver.py", "queue.py"):
        assert client.get(f"/static/{name}").status_code == 404


def test_the_page_and_security_headers(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and 'src="/static/annotate.js"' in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"


def test_without_a_token_only_loopback_hosts_are_served(queue: LabelQueue) -> None:
    app = make_app(queue.path)
    for host in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765", "127.0.0.1"):
        with TestClient(app, base_url=f"http://{host}") as c:
            assert c.get("/api/stats").status_code == 200, host
    for host in ("evil.example:8765", "192.168.1.4:8765", "localhost.evil.example"):
        with TestClient(app, base_url=f"http://{host}") as c:
            r = c.get("/api/stats")
            assert r.status_code == 403 and "not allowed" in r.json()["error"], host


def test_a_token_is_checked_on_every_request(queue: LabelQueue) -> None:
    app = make_app(queue.path, token=TOKEN)
    with TestClient(app, base_url="http://192.168.1.4:8765") as c:
        for path in ("/", "/api/pending", "/api/stats", "/api/images/a.png", "/static/annotate.js"):
            r = c.get(path)
            assert r.status_code == 401 and "token" in r.json()["error"], path
        assert c.get("/api/stats", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/stats?token=wrong").status_code == 401
        r = c.post("/api/answers", json={"id": "a", "label": 1})
        assert r.status_code == 401
        r = c.post(f"/api/answers?token={TOKEN}", json={"id": "a", "label": 1})
        assert r.status_code == 401  # a token in the URL is for GETs (the page load) only
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert c.get("/api/stats", headers=auth).status_code == 200
        r = c.post("/api/answers", json={"id": "a", "label": 1}, headers=auth)
        assert r.status_code == 200
        # the page load: ?token= sets an HttpOnly, SameSite=Strict cookie and drops the token
        r = c.get(f"/?token={TOKEN}", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN in cookie
        assert c.get("/").status_code == 200  # the client keeps the cookie
        r = c.post("/api/answers", json={"id": "b", "skip": True})
        assert r.status_code == 200
    assert queue.collect() == [Answer("a", label=1), Answer("b", skip=True)]
    with pytest.raises(ValueError, match="at least 8"):
        make_app(queue.path, token="short")


def test_the_cli_requires_a_token_off_loopback(tmp_path: Path, capsys) -> None:
    assert token_for("127.0.0.1", None) is None and token_for("localhost", None) is None
    assert token_for("::1", None) is None
    made = token_for("0.0.0.0", None)
    assert made is not None and len(made) >= 24 and made != token_for("0.0.0.0", None)
    assert token_for("192.168.1.4", "given-token") == "given-token"
    q = LabelQueue(tmp_path / "q.db")
    q.submit([make_request("a", 1)])
    assert main(["stats", "--queue", str(tmp_path / "q.db")]) == 0
    assert json.loads(capsys.readouterr().out)["pending"] == 1


def test_hundreds_of_concurrent_posts_neither_lose_nor_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "labels.db"
    q = LabelQueue(path)
    ids = [f"r{i}" for i in range(150)]
    q.submit([make_request(rid, i) for i, rid in enumerate(ids)])
    with serve_in_thread(path) as url, httpx.Client(base_url=url, timeout=30) as http:

        def post(job: tuple[str, int]) -> tuple[str, int, int]:
            rid, label = job
            r = http.post("/api/answers", json={"id": rid, "label": label})
            return rid, label, r.status_code

        jobs = [(rid, k) for k in (1, 2) for rid in ids]  # every request answered twice at once
        with ThreadPoolExecutor(max_workers=24) as pool:
            results = list(pool.map(post, jobs))
    won = {rid: label for rid, label, status in results if status == 200}
    assert sorted(status for *_, status in results) == [200] * 150 + [409] * 150
    got = q.collect()
    assert len(got) == 150 and {a.id: a.label for a in got} == won
    assert q.collect() == [] and q.stats()["answered"] == 150
