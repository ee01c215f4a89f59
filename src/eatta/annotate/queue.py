"""A durable label queue on SQLite: the asynchronous annotator a person answers through a page.

:class:`LabelQueue` is an :class:`~eatta.annotate.base.Annotator` (``submit``/``collect``/
``cancel``) whose requests and answers live in one SQLite file (WAL mode, ``synchronous=FULL``),
so that the adapting process and the labelling page's server (two processes) can share it, and so
that ``kill -9`` of either loses nothing that was acknowledged.

Durability design (see ``docs/annotate.md``):

- Requests are rows keyed by a queue key (the method's request id; see below for restarts) with
  the sample as a PNG, its digest, the model's prediction and confidence, class names and time.
- Answers are an append-only log with a sequence number; one answer per request (a ``UNIQUE``
  key), written in one short transaction that first checks the request is still pending, so of
  two concurrent answers exactly one wins. :meth:`answer` returns only after the commit.
- The consumer (the adapting process) keeps a cursor into the log and the set of requests it
  waits for; :meth:`collect` returns the answers after the cursor to those requests and advances
  it. Both are in :meth:`state_dict`, which the adapting process saves in the same checkpoint as
  the method's state: after a restart the restored queue re-delivers exactly the answers the
  restored method has not applied.
- A restarted method re-runs the batches after its checkpoint and re-submits requests under the
  same ids. Re-submitting the same request (same sample digest, prediction, kind and classes) is
  idempotent, and reopens it if the dead run had cancelled it; an answer already given to it is
  delivered. A different request under an id the restored state does not wait for (the re-run
  diverged) closes the old one as ``superseded`` (its answer, if any, is never delivered) and is
  stored under a fresh key ``{id}.{n}``; under an id it does wait for it is a :class:`ValueError`.

A request may name where its sample came from (``origin``: an inference request's id and the
row in it, as ``eatta-serve`` sets it); :meth:`LabelQueue.pending` lists them as ``request_id``
and ``row``, written in the same transaction as the request.

Every SQL statement is parameterized; this module imports only the standard library and torch.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import sqlite3
import statistics
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from eatta.annotate.paced import Order, check_order
from eatta.annotate.requests import Answer, AnswerError, Feedback, LabelRequest, check_feedback

__all__ = ["AnswerRefused", "LabelQueue", "encode_png", "tensor_to_png"]

SCHEMA_VERSION = 1
#: Queue keys (a request id, or an id with a ``.n`` suffix): they appear in URLs, so a safe
#: alphabet. Request ids are at most :data:`MAX_ID` characters of it.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")
MAX_ID = 200
#: Answers whose times the page's pace statistics use (the most recent ones).
PACE_WINDOW = 1000
#: Longest time a person may report for one answer (seconds); longer is refused.
MAX_SECONDS = 86400.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    key TEXT PRIMARY KEY,
    method_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    step INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    prediction INTEGER NOT NULL,
    confidence REAL NOT NULL,
    num_classes INTEGER NOT NULL,
    classes TEXT NOT NULL,
    digest TEXT NOT NULL,
    image BLOB,
    created REAL NOT NULL,
    status TEXT NOT NULL,
    closed REAL
);
CREATE INDEX IF NOT EXISTS requests_method_id ON requests (method_id);
CREATE INDEX IF NOT EXISTS requests_status ON requests (status);
CREATE TABLE IF NOT EXISTS answers (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE REFERENCES requests (key),
    label INTEGER,
    correct INTEGER,
    skip INTEGER NOT NULL,
    seconds REAL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS origins (
    key TEXT PRIMARY KEY REFERENCES requests (key),
    request_id TEXT NOT NULL,
    row INTEGER NOT NULL
);
"""


class AnswerRefused(AnswerError):
    """An answer the queue did not take (nothing was written); ``status`` is the HTTP status the
    page's server replies with: 404 unknown request, 409 already answered, 410 expired or
    superseded, 422 a value out of range or of the wrong type."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# -- images ------------------------------------------------------------------------------------
def _bytes_of(t: Tensor) -> bytes:
    """The raw bytes of a CPU tensor (contiguous copy), without numpy."""
    t = t.detach().to("cpu").contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def sample_digest(sample: Tensor) -> str:
    """SHA-256 of a sample's dtype, shape and values: what identifies "the same sample"."""
    h = hashlib.sha256()
    h.update(f"{sample.dtype}|{tuple(sample.shape)}|".encode())
    h.update(_bytes_of(sample))
    return h.hexdigest()


def encode_png(pixels: Tensor) -> bytes:
    """A PNG of ``pixels``, uint8 ``[H, W]`` (grey) or ``[H, W, 3|4]`` (RGB / RGBA)."""
    if pixels.dtype != torch.uint8:
        raise ValueError(f"encode_png takes uint8 pixels, got {pixels.dtype}")
    if pixels.dim() == 2:
        pixels = pixels.unsqueeze(-1)
    if pixels.dim() != 3 or pixels.shape[-1] not in (1, 3, 4) or min(pixels.shape[:2]) < 1:
        raise ValueError(f"encode_png takes [H, W] or [H, W, 1|3|4] pixels, got {pixels.shape}")
    height, width, channels = (int(v) for v in pixels.shape)
    color_type = {1: 0, 3: 2, 4: 6}[channels]
    raw = _bytes_of(pixels)
    stride = width * channels
    scanlines = b"".join(b"\x00" + raw[i * stride : (i + 1) * stride] for i in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(scanlines, 6))
        + chunk(b"IEND", b"")
    )


def tensor_to_png(image: Tensor) -> bytes:
    """A PNG of a ``[C, H, W]`` (C = 1, 3 or 4) or ``[H, W]`` image, min-max scaled per image
    (so normalized inputs are shown with full contrast); a ValueError for other shapes."""
    x = image.detach().to("cpu", torch.float32)
    if x.dim() == 2:
        x = x.unsqueeze(0)
    if x.dim() != 3 or x.shape[0] not in (1, 3, 4):
        raise ValueError(f"cannot show a sample of shape {tuple(image.shape)} as an image")
    x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = float(x.min()), float(x.max())
    x = (x - lo) / (hi - lo) if hi > lo else torch.zeros_like(x)
    pixels = (x * 255.0).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)
    return encode_png(pixels)


# -- the queue ---------------------------------------------------------------------------------
def _check_id(rid: object) -> str:
    if not isinstance(rid, str) or len(rid) > MAX_ID or ID_PATTERN.fullmatch(rid) is None:
        raise ValueError(
            f"request id {rid!r} is not usable by the label queue: 1-200 characters of "
            "A-Z a-z 0-9 . _ : - (not starting with a punctuation mark)"
        )
    return rid


class LabelQueue:
    """Requests and answers in an SQLite file shared by the adapting process and the page.

    Args:
        path: the queue file (created if missing; ``-wal``/``-shm`` files sit next to it).
        feedback: the feedback kind requests ask for (``"label"`` or ``"binary"``); the page
            takes a class, a yes/no on the prediction or a skip for either.
        class_names: names shown for the classes (default ``"0"``, ``"1"``, ...).
        to_image: ``sample -> PNG bytes`` for samples :func:`tensor_to_png` cannot show well
            (e.g. to undo input normalization). By default a sample that is not an image is
            stored without a picture.
        timeout: seconds to wait for another process's write lock.
        order: which pending request :meth:`pending` (and so the page) lists first:
            ``"newest"`` (the default: measured in docs/real-annotators.md, a person slower than
            the stream then answers about what the stream looks like now) or ``"oldest"``.
        origin: ``request -> (request_id, row)`` or None: where a request's sample came from
            (an inference request's id and the row in it; ``eatta-serve`` sets it), stored with
            the request and listed by :meth:`pending`. Called inside :meth:`submit`.

    The adapting side calls ``submit``/``collect``/``cancel`` (the :class:`Annotator` protocol)
    and saves :meth:`state_dict` with the method's. The page's side calls :meth:`pending`,
    :meth:`image`, :meth:`answer` and :meth:`stats`. A queue is thread-safe (one connection
    behind a lock); open one per process.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        feedback: Feedback = "label",
        class_names: Sequence[str] | None = None,
        to_image: Callable[[Tensor], bytes] | None = None,
        timeout: float = 30.0,
        order: Order = "newest",
        origin: Callable[[LabelRequest], tuple[str, int] | None] | None = None,
    ) -> None:
        self.order: Order = check_order(order)
        self.origin = origin
        self.path = os.fspath(path)
        self.feedback: Feedback = check_feedback(feedback)
        self.class_names = None if class_names is None else [str(c) for c in class_names]
        self.to_image = to_image
        self._lock = threading.RLock()
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):  # SQLite would say only "unable to open database file"
            raise FileNotFoundError(f"label queue {self.path!r}: no folder {folder!r}")
        self._db = sqlite3.connect(
            self.path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        self._db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"{self.path}: SQLite could not switch to WAL mode (got {mode})")
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.execute("PRAGMA foreign_keys = ON")
        with self._write():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            row = self._db.execute("SELECT value FROM meta WHERE name = ?", ("schema",)).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO meta (name, value) VALUES (?, ?)", ("schema", str(SCHEMA_VERSION))
                )
            elif row[0] != str(SCHEMA_VERSION):
                raise RuntimeError(
                    f"{self.path} is a label queue of schema {row[0]}; this eatta reads "
                    f"schema {SCHEMA_VERSION}"
                )
        # the consumer's side (the adapting process): saved with the method's state
        self._cursor = 0  # answers with seq <= cursor have been looked at
        self._open: dict[str, str] = {}  # method request id -> queue key, awaited
        self._ready: list[Answer] = []  # found at submit, delivered at the next collect

    # -- connection ------------------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``: the write lock up front, so concurrent
        writers queue instead of failing on upgrade), committed on success, else rolled back."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> LabelQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the adapting process's side -------------------------------------------------------------
    def _row_for(self, r: LabelRequest) -> dict[str, Any]:
        logits = r.logits.detach().to("cpu", torch.float64)
        classes = self.class_names or [str(c) for c in range(r.num_classes)]
        if len(classes) != r.num_classes:
            raise ValueError(
                f"request {r.id!r} has {r.num_classes} classes but the queue has "
                f"{len(classes)} class names"
            )
        if self.to_image is not None:
            image: bytes | None = bytes(self.to_image(r.sample))
        else:
            try:
                image = tensor_to_png(r.sample)
            except ValueError:
                image = None  # not an image: the page shows the prediction only
        return {
            "kind": r.kind,
            "step": int(r.step),
            "idx": int(r.index),
            "prediction": int(logits.argmax()),
            "confidence": float(logits.softmax(-1).max()),
            "num_classes": int(r.num_classes),
            "classes": json.dumps(classes),
            "digest": sample_digest(r.sample),
            "image": image,
        }

    def submit(self, requests: Sequence[LabelRequest]) -> None:
        """Put ``requests`` in the queue (one transaction); see the module doc for re-submits."""
        rows = []
        for r in requests:
            _check_id(r.id)
            if r.kind != self.feedback:
                raise ValueError(
                    f"request {r.id!r} asks for {r.kind!r} feedback; this queue was opened for "
                    f"{self.feedback!r}"
                )
            rows.append((r.id, self._row_for(r)))
        origins = {r.id: self._origin_of(r) for r in requests}
        if len(rows) != len({rid for rid, _ in rows}):
            raise ValueError("a batch of requests repeats an id")
        now = time.time()
        opened: dict[str, str] = {}
        known: list[str] = []  # keys that were already in the queue: look for their answers
        with self._write() as db:
            for rid, row in rows:
                old = db.execute(
                    "SELECT key, digest, prediction, kind, num_classes, status FROM requests "
                    "WHERE method_id = ? ORDER BY rowid DESC LIMIT 1",
                    (rid,),
                ).fetchone()
                same = old is not None and tuple(old[1:5]) == (
                    row["digest"],
                    row["prediction"],
                    row["kind"],
                    row["num_classes"],
                )
                if same:
                    key, status = old[0], old[5]
                    if status == "expired":  # cancelled by a run that died: asked again
                        db.execute(
                            "UPDATE requests SET status = 'pending', closed = NULL "
                            "WHERE key = ? AND status = 'expired'",
                            (key,),
                        )
                    known.append(key)
                    opened[rid] = key
                    continue
                if old is not None and rid in self._open:
                    raise ValueError(
                        f"request {rid!r} is already in the queue with a different sample or "
                        "prediction; an answer is never applied to another sample"
                    )
                key = rid
                if old is not None:  # a run that died asked something else under this id
                    db.execute(
                        "UPDATE requests SET status = 'superseded', closed = ? "
                        "WHERE method_id = ? AND status IN ('pending', 'expired')",
                        (now, rid),
                    )
                    n = db.execute(
                        "SELECT count(*) FROM requests WHERE method_id = ?", (rid,)
                    ).fetchone()[0]
                    key = f"{rid}.{n + 1}"
                    while db.execute("SELECT 1 FROM requests WHERE key = ?", (key,)).fetchone():
                        n += 1
                        key = f"{rid}.{n + 1}"
                db.execute(
                    "INSERT INTO requests (key, method_id, kind, step, idx, prediction, "
                    "confidence, num_classes, classes, digest, image, created, status) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending')",
                    (
                        key,
                        rid,
                        row["kind"],
                        row["step"],
                        row["idx"],
                        row["prediction"],
                        row["confidence"],
                        row["num_classes"],
                        row["classes"],
                        row["digest"],
                        row["image"],
                        now,
                    ),
                )
                opened[rid] = key
            db.executemany(
                "INSERT INTO origins (key, request_id, row) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET request_id = excluded.request_id, "
                "row = excluded.row",
                [(opened[rid], *origin) for rid, origin in origins.items() if origin is not None],
            )
            early = self._answers_for(known, up_to=self._cursor)
        with self._lock:
            self._open.update(opened)
            by_key = {v: k for k, v in opened.items()}
            for key, answer in early:
                rid = by_key[key]
                if self._open.pop(rid, None) is not None:
                    self._ready.append(_rename(answer, rid))

    def _origin_of(self, r: LabelRequest) -> tuple[str, int] | None:
        """``origin(r)`` checked: a non-empty string of at most :data:`MAX_ID` characters and a
        row >= 0, or None."""
        if self.origin is None:
            return None
        found = self.origin(r)
        if found is None:
            return None
        rid, row = found
        if not isinstance(rid, str) or not 0 < len(rid) <= MAX_ID:
            raise ValueError(
                f"origin of {r.id!r}: a request id of 1-{MAX_ID} characters, got {rid!r}"
            )
        if isinstance(row, bool) or not isinstance(row, int) or row < 0:
            raise ValueError(f"origin of {r.id!r}: a row >= 0, got {row!r}")
        return rid, row

    def _answers_for(self, keys: Sequence[str], up_to: int) -> list[tuple[str, Answer]]:
        """Answers with ``seq <= up_to`` to ``keys`` (answers the cursor has already passed)."""
        out: list[tuple[str, Answer]] = []
        for start in range(0, len(keys), 500):
            part = list(keys[start : start + 500])
            marks = ",".join("?" * len(part))
            rows = self._db.execute(
                "SELECT key, label, correct, skip FROM answers "
                f"WHERE seq <= ? AND key IN ({marks}) ORDER BY seq",
                (up_to, *part),
            ).fetchall()
            out.extend((row[0], _answer_of(row)) for row in rows)
        return out

    def collect(self) -> list[Answer]:
        """Answers that arrived for the requests this consumer waits for, oldest first (never
        blocks); each is returned once, under the id the method gave the request."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, key, label, correct, skip FROM answers WHERE seq > ? ORDER BY seq",
                (self._cursor,),
            ).fetchall()
            out, self._ready = self._ready, []
            if not rows:
                return out
            by_key = {key: rid for rid, key in self._open.items()}
            for row in rows:
                rid = by_key.get(row[1])
                if rid is not None:
                    del self._open[rid]
                    out.append(_rename(_answer_of(row[1:]), rid))
            self._cursor = int(rows[-1][0])
            return out

    def cancel(self, ids: Sequence[str]) -> None:
        """Stop waiting for ``ids``; their pending requests expire (the page then refuses them)."""
        with self._lock:
            keys = [self._open.pop(i) for i in ids if i in self._open]
            if not keys:
                return
            now = time.time()
            with self._write() as db:
                db.executemany(
                    "UPDATE requests SET status = 'expired', closed = ? "
                    "WHERE key = ? AND status = 'pending'",
                    [(now, k) for k in keys],
                )

    def reset(self) -> None:
        """Cancel every awaited request (the cursor stays: old answers are never re-delivered)."""
        with self._lock:
            self.cancel(list(self._open))
            self._ready = []

    def expire_unawaited(self) -> int:
        """Expire every pending request this consumer does not wait for, and return how many:
        after a restart from a checkpoint, the requests the dead run made after it, whose answers
        the restored method would never apply (the page then refuses them with 410). Only for a
        queue file with one consumer: another consumer's requests would expire too."""
        with self._lock:
            waited = set(self._open.values())
            rows = self._db.execute("SELECT key FROM requests WHERE status = 'pending'").fetchall()
            orphans = [row[0] for row in rows if row[0] not in waited]
            if orphans:
                now = time.time()
                with self._write() as db:
                    db.executemany(
                        "UPDATE requests SET status = 'expired', closed = ? "
                        "WHERE key = ? AND status = 'pending'",
                        [(now, k) for k in orphans],
                    )
            return len(orphans)

    @property
    def awaited(self) -> list[str]:
        """Request ids this consumer waits for (submitted, not answered, not cancelled)."""
        with self._lock:
            return list(self._open) + [a.id for a in self._ready]

    def state_dict(self) -> dict[str, Any]:
        """The consumer's position: save it with the method's state, in the same checkpoint."""
        with self._lock:
            return {
                "cursor": self._cursor,
                "open": dict(self._open),
                "ready": [a.to_dict() for a in self._ready],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._cursor = int(state["cursor"])
            self._open = {str(k): str(v) for k, v in state["open"].items()}
            self._ready = [Answer.from_mapping(a) for a in state["ready"]]

    # -- the page's side -------------------------------------------------------------------------
    def answer(self, answer: Answer, *, seconds: float | None = None) -> int:
        """Record ``answer`` (its id is a queue key, as :meth:`pending` lists them) and return its
        sequence number once it is committed; :class:`AnswerRefused` (nothing written) for an
        unknown, expired, superseded or already answered request, or a class out of range.
        ``seconds``: how long the person took, for the pace statistics."""
        if not isinstance(answer, Answer):
            raise AnswerRefused(f"expected an Answer, got {type(answer).__name__}", 422)
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                raise AnswerRefused(f"seconds must be a number, got {seconds!r}", 422)
            if not 0.0 <= seconds <= MAX_SECONDS or math.isnan(seconds):
                raise AnswerRefused(f"seconds must be in [0, {MAX_SECONDS:g}]", 422)
        with self._write() as db:
            row = db.execute(
                "SELECT status, num_classes FROM requests WHERE key = ?", (answer.id,)
            ).fetchone()
            if row is None:
                raise AnswerRefused(f"request {answer.id!r} is unknown", 404)
            status, num_classes = row
            if status == "answered":
                raise AnswerRefused(f"request {answer.id!r} is already answered", 409)
            if status != "pending":
                raise AnswerRefused(
                    f"request {answer.id!r} is {status}: the model no longer waits for it", 410
                )
            try:
                answer.check(int(num_classes))
            except AnswerError as err:
                raise AnswerRefused(str(err), 422) from None
            now = time.time()
            cur = db.execute(
                "INSERT INTO answers (key, label, correct, skip, seconds, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    answer.id,
                    answer.label,
                    None if answer.correct is None else int(answer.correct),
                    int(answer.skip),
                    None if seconds is None else float(seconds),
                    now,
                ),
            )
            db.execute(
                "UPDATE requests SET status = 'answered', closed = ? WHERE key = ?",
                (now, answer.id),
            )
            seq = cur.lastrowid
        assert seq is not None
        return int(seq)

    def pending(self, limit: int = 100, order: Order | None = None) -> list[dict[str, Any]]:
        """Pending requests in ``order`` (default: the queue's; ``"newest"`` or ``"oldest"``
        first): key (``id``), kind, prediction, confidence, class names, whether it has an image,
        step, index, creation time (Unix seconds), and the sample's origin (``request_id`` and
        ``row``: the inference request and the row in it, None when not given)."""
        direction = "DESC" if check_order(order or self.order) == "newest" else "ASC"
        limit = max(0, min(int(limit), 10000))
        with self._lock:
            rows = self._db.execute(
                "SELECT r.key, r.kind, r.prediction, r.confidence, r.classes, r.image IS NOT NULL, "
                "r.step, r.idx, r.created, o.request_id, o.row FROM requests r "
                "LEFT JOIN origins o ON o.key = r.key WHERE r.status = 'pending' "
                f"ORDER BY r.rowid {direction} LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            {
                "id": r[0],
                "kind": r[1],
                "prediction": int(r[2]),
                "confidence": float(r[3]),
                "classes": json.loads(r[4]),
                "has_image": bool(r[5]),
                "step": int(r[6]),
                "index": int(r[7]),
                "created": float(r[8]),
                "request_id": r[9],
                "row": None if r[10] is None else int(r[10]),
            }
            for r in rows
        ]

    def image(self, key: str) -> bytes | None:
        """The PNG of request ``key`` (any status), or None if unknown or without a picture."""
        if not isinstance(key, str) or ID_PATTERN.fullmatch(key) is None:
            return None
        with self._lock:
            row = self._db.execute("SELECT image FROM requests WHERE key = ?", (key,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def request(self, key: str) -> dict[str, Any] | None:
        """One request's record (any status, without the image), or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT key, method_id, kind, prediction, num_classes, digest, status, created "
                "FROM requests WHERE key = ?",
                (key,),
            ).fetchone()
        if row is None:
            return None
        names = ("id", "method_id", "kind", "prediction", "num_classes", "digest", "status")
        return {**dict(zip(names, row[:7], strict=True)), "created": float(row[7])}

    def answers(self) -> list[dict[str, Any]]:
        """The whole answer log, oldest first (for export and audits)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, key, label, correct, skip, seconds, created FROM answers ORDER BY seq"
            ).fetchall()
        return [
            {
                "seq": int(r[0]),
                **_answer_of(r[1:5]).to_dict(),
                "seconds": r[5],
                "created": float(r[6]),
            }
            for r in rows
        ]

    def stats(self) -> dict[str, Any]:
        """What the page shows: pending, answered (of which skipped), median and mean seconds per
        answer (over the last :data:`PACE_WINDOW` timed answers), and how often the model's
        prediction was right on the answered samples (label answers and yes/no; skips excluded)."""
        with self._lock:
            pending = self._db.execute(
                "SELECT count(*) FROM requests WHERE status = 'pending'"
            ).fetchone()[0]
            total, skipped, judged, right = self._db.execute(
                "SELECT count(*), coalesce(sum(a.skip), 0), coalesce(sum(1 - a.skip), 0), "
                "coalesce(sum(CASE WHEN a.label IS NOT NULL AND a.label = r.prediction THEN 1 "
                "WHEN a.correct = 1 THEN 1 ELSE 0 END), 0) "
                "FROM answers a JOIN requests r ON r.key = a.key"
            ).fetchone()
            times = [
                float(r[0])
                for r in self._db.execute(
                    "SELECT seconds FROM answers WHERE seconds IS NOT NULL "
                    "ORDER BY seq DESC LIMIT ?",
                    (PACE_WINDOW,),
                ).fetchall()
            ]
            audit_judged, audit_right = self._db.execute(
                "SELECT coalesce(sum(1 - a.skip), 0), "
                "coalesce(sum(CASE WHEN a.label IS NOT NULL AND a.label = r.prediction THEN 1 "
                "WHEN a.correct = 1 THEN 1 ELSE 0 END), 0) "
                "FROM answers a JOIN requests r ON r.key = a.key WHERE r.key LIKE 'audit-%'"
            ).fetchone()
            published = self._db.execute("SELECT value FROM meta WHERE name = 'monitor'").fetchone()
        selected_judged = int(judged) - int(audit_judged)
        selected_right = int(right) - int(audit_right)
        return {
            "pending": int(pending),
            "answered": int(total),
            "skipped": int(skipped),
            "median_seconds": statistics.median(times) if times else None,
            "mean_seconds": statistics.fmean(times) if times else None,
            "model_right": int(right),
            "model_judged": int(judged),
            "model_accuracy": (int(right) / int(judged)) if judged else None,
            # the method's own requests: the selected, most uncertain samples (biased low)
            "selected_judged": selected_judged,
            "selected_accuracy": selected_right / selected_judged if selected_judged else None,
            # the monitor's figures (eatta.monitor; unbiased): published by the adapting process
            "monitor": None if published is None else json.loads(published[0]),
        }

    def publish_monitor(self, summary: dict[str, Any]) -> None:
        """Store the adapting process's monitor summary (audited accuracy of the adapted and the
        source model with intervals) for the page's :meth:`stats`; a plain JSON object."""
        text = json.dumps(summary, allow_nan=False)
        with self._write() as db:
            db.execute(
                "INSERT INTO meta (name, value) VALUES ('monitor', ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (text,),
            )


def _answer_of(row: Sequence[Any]) -> Answer:
    """An :class:`Answer` from a ``(key, label, correct, skip)`` row of the log."""
    key, label, correct, skip = row
    if skip:
        return Answer(key, skip=True)
    if label is not None:
        return Answer(key, label=int(label))
    return Answer(key, correct=bool(correct))


def _rename(answer: Answer, rid: str) -> Answer:
    """``answer`` under the method's request id (a queue key may carry a ``.n`` suffix)."""
    return Answer(rid, label=answer.label, correct=answer.correct, skip=answer.skip)
