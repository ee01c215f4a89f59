"""LabelQueue: the Annotator protocol over SQLite, answers' checks, restarts, images, stats."""

from __future__ import annotations

import io
import sqlite3
import threading
from pathlib import Path

import pytest
import torch
from _annotate_helpers import make_request

from eatta.annotate import Annotator, Answer, LabelQueue, LabelRequest, is_asynchronous
from eatta.annotate.queue import AnswerRefused, encode_png, sample_digest, tensor_to_png

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

req = make_request


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "labels.db"


def test_is_an_asynchronous_annotator(path: Path) -> None:
    with LabelQueue(path) as q:
        assert isinstance(q, Annotator) and is_asynchronous(q)
        assert q.feedback == "label"


def test_answers_reach_the_consumer_once_in_answer_order(path: Path) -> None:
    consumer, page = LabelQueue(path), LabelQueue(path)  # as two processes would
    consumer.submit([req("a", 1, pred=2), req("b", 2, pred=5), req("c", 3)])
    assert consumer.collect() == []
    assert [p["id"] for p in page.pending()] == ["c", "b", "a"]  # newest first by default
    assert [p["id"] for p in page.pending(order="oldest")] == ["a", "b", "c"]
    assert [p["id"] for p in LabelQueue(path, order="oldest").pending(2)] == ["a", "b"]
    assert page.answer(Answer("b", correct=False)) == 1
    assert page.answer(Answer("a", label=7), seconds=3.0) == 2
    assert consumer.collect() == [Answer("b", correct=False), Answer("a", label=7)]
    assert consumer.state_dict()["cursor"] == 2  # the log was read up to its last answer
    assert consumer.collect() == []
    assert consumer.awaited == ["c"]
    page.answer(Answer("c", skip=True))
    assert consumer.collect() == [Answer("c", skip=True)]
    assert consumer.collect() == [] and consumer.awaited == []
    assert [p["id"] for p in page.pending()] == []


def test_pending_lists_what_the_page_shows(path: Path) -> None:
    names = [f"digit {k}" for k in range(10)]
    with LabelQueue(path, class_names=names) as q:
        r = req("a", 4, pred=6)
        q.submit([r])
        (item,) = q.pending()
    assert item["prediction"] == 6 and item["classes"] == names and item["has_image"]
    assert item["confidence"] == pytest.approx(float(r.logits.softmax(-1).max()))
    assert (item["step"], item["index"], item["kind"]) == (1, 4, "label")


@pytest.mark.parametrize(
    ("answer", "status", "needle"),
    [
        (Answer("nobody", label=1), 404, "unknown"),
        (Answer("x' OR 1=1 --", label=1), 404, "unknown"),
        (Answer("a", label=10), 422, r"outside \[0, 10\)"),
        (Answer("a", label=-1), 422, "outside"),
        (Answer("done", label=1), 409, "already answered"),
        (Answer("gone", label=1), 410, "expired"),
    ],
)
def test_refused_answers_change_nothing(
    path: Path, answer: Answer, status: int, needle: str
) -> None:
    q = LabelQueue(path)
    q.submit([req("a", 1), req("done", 2), req("gone", 3)])
    q.answer(Answer("done", label=4))
    q.cancel(["gone"])
    before = (q.answers(), q.stats(), q.pending())
    with pytest.raises(AnswerRefused, match=needle) as err:
        q.answer(answer)
    assert err.value.status == status
    assert (q.answers(), q.stats(), q.pending()) == before
    assert q.collect() == [Answer("done", label=4)]


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), 1e9, True, "3"])
def test_a_bad_answer_time_is_refused(path: Path, seconds: object) -> None:
    with LabelQueue(path) as q:
        q.submit([req("a", 1)])
        with pytest.raises(AnswerRefused) as err:
            q.answer(Answer("a", label=1), seconds=seconds)  # type: ignore[arg-type]
        assert err.value.status == 422 and q.stats()["answered"] == 0


def test_concurrent_answers_one_wins_per_request(path: Path) -> None:
    consumer = LabelQueue(path)
    consumer.submit([req(f"r{i}", i) for i in range(40)])
    pages = [LabelQueue(path) for _ in range(4)]  # separate connections, as separate processes
    won: dict[str, list[int]] = {}
    refused: list[int] = []
    lock = threading.Lock()

    def post(page: LabelQueue, label: int) -> None:
        for i in range(40):
            try:
                page.answer(Answer(f"r{i}", label=label))
            except AnswerRefused as err:
                with lock:
                    refused.append(err.status)
            else:
                with lock:
                    won.setdefault(f"r{i}", []).append(label)

    threads = [threading.Thread(target=post, args=(p, k)) for k, p in enumerate(pages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(len(v) == 1 for v in won.values()) and len(won) == 40
    assert refused == [409] * 120
    got = consumer.collect()
    assert sorted(a.id for a in got) == sorted(won)
    assert all(a.label == won[a.id][0] for a in got)


def test_resubmitting_the_same_request_is_idempotent(path: Path) -> None:
    q = LabelQueue(path)
    q.submit([req("a", 1)])
    q.submit([req("a", 1)])
    assert len(q.pending()) == 1 and q.awaited == ["a"]
    q.answer(Answer("a", label=3))
    assert q.collect() == [Answer("a", label=3)]


def test_a_different_sample_under_an_awaited_id_is_an_error(path: Path) -> None:
    q = LabelQueue(path)
    q.submit([req("a", 1)])
    with pytest.raises(ValueError, match="different sample"):
        q.submit([req("b", 5), req("a", 2)])
    assert [p["id"] for p in q.pending()] == ["a"]  # the whole batch was rolled back
    assert q.awaited == ["a"]


def test_restored_state_redelivers_exactly_what_it_had_not_applied(path: Path) -> None:
    q = LabelQueue(path)
    q.submit([req("a", 1), req("b", 2)])
    q.answer(Answer("a", label=1))
    assert q.collect() == [Answer("a", label=1)]
    checkpoint = q.state_dict()
    q.answer(Answer("b", label=2))
    assert q.collect() == [Answer("b", label=2)]  # applied by a run that then dies
    q.close()
    restarted = LabelQueue(path)
    restarted.load_state_dict(checkpoint)
    assert restarted.collect() == [Answer("b", label=2)]  # the restored state had not applied it
    assert restarted.collect() == []


def test_a_rerun_gets_answers_to_requests_made_after_the_checkpoint(path: Path) -> None:
    q = LabelQueue(path)
    q.submit([req("a", 1)])
    checkpoint = q.state_dict()
    q.submit([req("b", 2), req("c", 3)])  # the dead run asked more after its checkpoint
    q.answer(Answer("b", label=5))
    q.answer(Answer("a", label=4))
    assert q.collect() == [Answer("b", label=5), Answer("a", label=4)]
    q.cancel(["c"])  # ... and gave up on one
    restarted = LabelQueue(path)
    restarted.load_state_dict(checkpoint)
    assert restarted.collect() == [Answer("a", label=4)]  # b is not asked yet: held back
    restarted.submit([req("b", 2), req("c", 3)])  # the re-run asks the same again
    assert restarted.collect() == [Answer("b", label=5)]
    assert [p["id"] for p in restarted.pending()] == ["c"]  # reopened, not expired
    restarted.answer(Answer("c", correct=True))
    assert restarted.collect() == [Answer("c", correct=True)]
    assert restarted.collect() == []


def test_an_early_answer_found_at_submit_survives_a_checkpoint(path: Path) -> None:
    q = LabelQueue(path)
    q.submit([req("b", 2)])
    q.answer(Answer("b", label=5))
    checkpoint = q.state_dict()
    assert q.collect() == [Answer("b", label=5)]
    restarted = LabelQueue(path)
    restarted.load_state_dict({**checkpoint, "open": {}, "cursor": 1})  # b not asked yet
    restarted.submit([req("b", 2)])  # the cursor is past b's answer: kept as ready
    saved = restarted.state_dict()
    assert saved["ready"] == [{"id": "b", "label": 5}]
    again = LabelQueue(path)
    again.load_state_dict(saved)
    assert again.collect() == [Answer("b", label=5)] and again.collect() == []


@pytest.mark.parametrize("change", ["sample", "prediction"])
def test_a_diverged_rerun_never_gets_the_old_samples_answer(path: Path, change: str) -> None:
    q = LabelQueue(path)
    checkpoint = q.state_dict()
    q.submit([req("a", 1, pred=3)])
    q.answer(Answer("a", correct=True))  # "yes, 3" about the dead run's sample
    restarted = LabelQueue(path)
    restarted.load_state_dict(checkpoint)
    other = req("a", 2, pred=3) if change == "sample" else req("a", 1, pred=4)
    restarted.submit([other])
    assert restarted.collect() == []
    assert restarted.request("a")["status"] == "answered"  # type: ignore[index]
    (item,) = restarted.pending()
    assert item["id"] == "a.2" and restarted.request("a.2")["digest"] == sample_digest(  # type: ignore[index]
        other.sample
    )
    restarted.answer(Answer("a.2", label=8))
    assert restarted.collect() == [Answer("a", label=8)]  # under the method's id


def test_a_pending_old_sample_is_superseded(path: Path) -> None:
    q = LabelQueue(path)
    checkpoint = q.state_dict()
    q.submit([req("a", 1)])
    restarted = LabelQueue(path)
    restarted.load_state_dict(checkpoint)
    restarted.submit([req("a", 2)])
    with pytest.raises(AnswerRefused, match="superseded") as err:
        restarted.answer(Answer("a", label=1))
    assert err.value.status == 410
    assert [p["id"] for p in restarted.pending()] == ["a.2"]


def test_cancel_expires_and_reset_cancels_everything(path: Path) -> None:
    q = LabelQueue(path)
    q.submit([req("a", 1), req("b", 2), req("c", 3), req("d", 4)])
    q.cancel(["a", "unknown"])
    q.answer(Answer("d", label=1))
    q.cancel(["d"])  # given up on after it was answered: the answer stays in the log
    assert q.request("d")["status"] == "answered"  # type: ignore[index]
    assert q.stats()["answered"] == 1 and q.collect() == []
    assert [p["id"] for p in q.pending()] == ["c", "b"]
    q.reset()
    assert q.pending() == [] and q.awaited == []
    with pytest.raises(AnswerRefused, match="expired"):
        q.answer(Answer("b", label=0))


def test_submit_checks_ids_and_kinds(path: Path) -> None:
    q = LabelQueue(path)
    for bad in ("", "a/b", "../x", "a b", "-a", "x" * 201, "a'b"):
        with pytest.raises(ValueError, match="not usable"):
            q.submit([req(bad, 1)])
    r = req("a", 1)
    binary = LabelRequest("a", r.sample, r.logits, "binary", 1, 0)
    with pytest.raises(ValueError, match="binary"):
        q.submit([binary])
    with pytest.raises(ValueError, match="repeats"):
        q.submit([req("a", 1), req("a", 1)])
    with pytest.raises(ValueError, match="class names"):
        LabelQueue(path, class_names=["x", "y"]).submit([r])
    assert q.pending() == []


def test_binary_queue_and_stats(path: Path) -> None:
    q = LabelQueue(path, feedback="binary")
    rs = [req(f"r{i}", i, pred=i % 3) for i in range(6)]
    q.submit([LabelRequest(r.id, r.sample, r.logits, "binary", 1, 0) for r in rs])
    q.answer(Answer("r0", correct=True), seconds=1.0)
    q.answer(Answer("r1", correct=False), seconds=2.0)
    q.answer(Answer("r2", label=2), seconds=6.0)  # a class: right (the prediction is 2)
    q.answer(Answer("r3", label=1))  # wrong (prediction 0), untimed
    q.answer(Answer("r4", skip=True), seconds=4.0)
    assert q.stats() == {
        "pending": 1,
        "answered": 5,
        "skipped": 1,
        "median_seconds": 3.0,
        "mean_seconds": 13.0 / 4,
        "model_right": 2,
        "model_judged": 4,
        "model_accuracy": 0.5,
        "selected_judged": 4,
        "selected_accuracy": 0.5,
        "monitor": None,
    }


def test_a_queue_of_another_schema_is_refused(path: Path) -> None:
    LabelQueue(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '99' WHERE name = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(RuntimeError, match="schema 99"):
        LabelQueue(path)


def test_the_file_is_in_wal_mode_with_full_sync(path: Path) -> None:
    q = LabelQueue(path)
    assert q._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert q._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


# -- images ------------------------------------------------------------------------------------
def decode(png: bytes) -> torch.Tensor:
    from PIL import Image

    img = Image.open(io.BytesIO(png))
    img.load()
    data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return data.reshape(img.height, img.width, -1), img.mode  # type: ignore[return-value]


def test_png_round_trips_grey_rgb_and_rgba() -> None:
    g = torch.Generator().manual_seed(0)
    for channels, mode in ((1, "L"), (3, "RGB"), (4, "RGBA")):
        pixels = torch.randint(0, 256, (5, 7, channels), dtype=torch.uint8, generator=g)
        got, got_mode = decode(encode_png(pixels))
        assert got_mode == mode and torch.equal(got, pixels)


def test_tensor_to_png_scales_each_image_to_full_range() -> None:
    x = torch.tensor([[[-2.0, 0.0], [2.0, 1.0]]])  # 1 x 2 x 2, normalized-looking values
    got, mode = decode(tensor_to_png(x))
    assert mode == "L"
    assert got[..., 0].tolist() == [[0, 128], [255, 191]]
    flat, _ = decode(tensor_to_png(torch.full((3, 2, 2), 0.7)))
    assert flat.sum() == 0
    with pytest.raises(ValueError, match="as an image"):
        tensor_to_png(torch.zeros(5, 4, 4))


def test_images_are_stored_with_requests_or_left_out(path: Path) -> None:
    q = LabelQueue(path)
    r = req("a", 1)
    q.submit([r])
    got, _ = decode(q.image("a"))  # type: ignore[arg-type]
    want, _ = decode(tensor_to_png(r.sample))
    assert torch.equal(got, want) and got.shape == (8, 8, 1)
    tabular = LabelRequest("t", torch.randn(20), torch.randn(10), "label", 1, 0)
    q.submit([tabular])
    assert q.image("t") is None and q.pending()[0]["has_image"] is False
    assert q.image("../../etc/passwd") is None and q.image("nobody") is None
    custom = LabelQueue(path, to_image=lambda s: b"\x89PNG custom")
    custom.submit([req("c", 3)])
    assert q.image("c") == b"\x89PNG custom"


def test_audits_are_told_apart_and_the_monitor_is_published_for_the_page(path: Path) -> None:
    import eatta
    from conftest import tiny_cnn
    from eatta.monitor import AccuracyMonitor

    q = LabelQueue(path)
    method = eatta.create("tent", tiny_cnn(5), monitor=AccuracyMonitor(q, share=0.5, seed=0))
    source = method.given
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    method(x)
    audits = q.pending()
    assert audits and all(p["id"].startswith("audit-") for p in audits)
    for p in audits:  # the adapted model's prediction is right on every audit
        q.answer(Answer(p["id"], label=p["prediction"]))
    before = q.stats()
    assert before["monitor"] is None and before["selected_judged"] == 0
    assert before["selected_accuracy"] is None and before["model_judged"] == len(audits)
    method(x)  # collects the answers and publishes the monitor's figures
    page = q.stats()["monitor"]
    assert page["audits"] == len(audits) and page["adapted"] == 1.0
    assert page["adapted_low"] < 1.0 == page["adapted_high"]
    with torch.no_grad():
        s = source(x[[int(p["index"]) for p in audits]]).argmax(1)
    right = sum(int(a == int(b)) for a, b in zip([p["prediction"] for p in audits], s, strict=True))
    assert page["source"] == pytest.approx(right / len(audits))


def test_unknown_order_is_an_error_naming_it(path: Path) -> None:
    with pytest.raises(ValueError, match="unknown queue order 'lifo'"):
        LabelQueue(path, order="lifo")  # type: ignore[arg-type]  # a bad value on purpose
    with LabelQueue(path) as q, pytest.raises(ValueError, match="'random'"):
        q.pending(order="random")  # type: ignore[arg-type]  # a bad value on purpose


def test_a_request_names_its_origin_in_the_same_write(path: Path) -> None:
    where = {"a": ("infer-7", 3), "b": None}
    consumer = LabelQueue(path, origin=lambda r: where[r.id])
    consumer.submit([req("a", 1), req("b", 2)])
    listed = {p["id"]: (p["request_id"], p["row"]) for p in LabelQueue(path).pending()}
    assert listed == {"a": ("infer-7", 3), "b": (None, None)}
    where["c"] = ("x", -1)
    with pytest.raises(ValueError, match="row >= 0"):
        consumer.submit([req("c", 3)])
    where["c"] = ("", 0)
    with pytest.raises(ValueError, match="request id of 1-200"):
        consumer.submit([req("c", 3)])
    assert [p["id"] for p in consumer.pending()] == ["b", "a"]  # the refused submit wrote nothing


def test_a_restored_consumer_expires_the_requests_it_never_waits_for(path: Path) -> None:
    consumer = LabelQueue(path)
    consumer.submit([req("a", 1)])
    saved = consumer.state_dict()  # a checkpoint; then the run asks more, answered or not
    consumer.submit([req("b", 2), req("c", 3)])
    LabelQueue(path).answer(Answer("b", label=1))
    restored = LabelQueue(path)
    restored.load_state_dict(saved)
    assert restored.expire_unawaited() == 1  # c: pending, and nobody waits for it
    assert [p["id"] for p in restored.pending()] == ["a"]
    with pytest.raises(AnswerRefused) as refused:
        LabelQueue(path).answer(Answer("c", label=1))
    assert refused.value.status == 410
    assert [a["id"] for a in restored.answers()] == ["b"]  # the acknowledged answer stays
    assert restored.expire_unawaited() == 0
