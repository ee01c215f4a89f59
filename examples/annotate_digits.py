"""Label with a person: the digits CNN adapts to corrupted digits while a web page asks you.

EATTA adapts the packaged digits CNN on the digits-C stream (a batch every ``--interval`` seconds)
and asks for at most one label per batch. Its requests go into a durable label queue
(``--queue``, one SQLite file); the labelling page on ``http://127.0.0.1:PORT/`` shows them, and
your answers come back to the model on its next steps. It prints the online error and the labels
received as it goes.

    python examples/annotate_digits.py --queue labels.db --port 8765          # then open the page
    python examples/annotate_digits.py --queue labels.db --simulate --delay-s 2 --noise 0.1

``--simulate`` answers through the page's HTTP API (as any script or tool can), ``--delay-s``
seconds after each request, wrong with probability ``--noise`` (the names of ``delay_s`` and
``noise`` in ``eatta.annotate``; a delay without ``_s`` counts batches), so the example also runs
unattended. The process checkpoints the method and the queue's cursor together
(``--checkpoint``, default ``QUEUE.ckpt``) every ``--checkpoint-every`` batches; kill it at any
moment (even ``kill -9``) and start it again with the same arguments: it resumes where its
checkpoint is, and no answer is lost or applied twice. ``--no-serve`` leaves the page to a
separate ``eatta-annotate serve --queue labels.db``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import torch

import eatta
from eatta.annotate import LabelQueue, LabelRequest
from eatta.console import exit_on_user_error
from eatta.data import DIGITS_C_CORRUPTIONS, TestStream, digits_c_domains
from eatta.models.digits_cnn import packaged_digits_source

CORRUPTIONS = ("gaussian_noise", "defocus_blur", "snow", "fog", "contrast", "elastic_transform")


class DigitsQueue(LabelQueue):
    """The label queue, remembering each request's true class for ``--simulate`` only."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.truth: dict[str, int] = {}
        self.batch_labels: torch.Tensor | None = None

    def submit(self, requests: list[LabelRequest]) -> None:  # type: ignore[override]
        super().submit(requests)
        if self.batch_labels is not None:
            for r in requests:
                self.truth[r.id] = int(self.batch_labels[r.index])


def serve_page(queue: str, port: int) -> tuple[str, threading.Thread]:
    """The labelling page in a background thread on 127.0.0.1:``port``."""
    import uvicorn

    from eatta.annotate.cli import bind
    from eatta.annotate.server import make_app

    sock = bind("127.0.0.1", port)  # TCP_NODELAY on: no 40 ms wait a request
    config = uvicorn.Config(make_app(queue), log_level="warning", server_header=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", thread


def _api(url: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def simulate(
    url: str, queue: DigitsQueue, delay_s: float, noise: float, stop: threading.Event
) -> None:
    """A simulated person: answers each pending request over HTTP ``delay_s`` seconds after it
    was made, with the true class, or another one with probability ``noise``."""
    rng = random.Random(0)
    reader = LabelQueue(queue.path)  # for the method id behind a key (keys of re-asked ids differ)
    while not stop.is_set():
        try:
            _, items = _api(url, "/api/pending")
            for item in items:  # in the page's order (newest first by default)
                wait = item["created"] + delay_s - time.time()
                if wait > 0:
                    continue  # too recent for this person yet
                record = reader.request(item["id"])
                truth = queue.truth.get(record["method_id"]) if record else None
                if truth is None:
                    body: dict[str, Any] = {"id": item["id"], "skip": True}
                else:
                    label = truth
                    if rng.random() < noise:
                        label = rng.choice([c for c in range(10) if c != truth])
                    body = {"id": item["id"], "label": label, "seconds": delay_s}
                _api(url, "/api/answers", body)
        except (urllib.error.URLError, OSError):
            pass  # the server is restarting
        stop.wait(0.05)
    reader.close()


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` atomically: a crash leaves the old checkpoint or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> int:
    """Run the example; the exit status (130 when stopped with Ctrl-C)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", required=True, help="the label queue file (SQLite)")
    parser.add_argument("--port", type=int, default=8765, help="the page's port (0: any free)")
    parser.add_argument("--no-serve", action="store_true", help="do not serve the page here")
    parser.add_argument("--url", help="the page's URL when served elsewhere (for --simulate)")
    parser.add_argument("--simulate", action="store_true", help="answer over HTTP, unattended")
    parser.add_argument("--delay-s", type=float, default=2.0, help="--simulate: seconds to answer")
    parser.add_argument("--noise", type=float, default=0.0, help="--simulate: wrong share")
    parser.add_argument("--interval", type=float, default=None, help="seconds between batches")
    parser.add_argument("--batches", type=int, default=None, help="stop after this many batches")
    parser.add_argument(
        "--corruptions",
        nargs="+",
        default=list(CORRUPTIONS),
        choices=DIGITS_C_CORRUPTIONS,
        metavar="NAME",
        help="digits-C corruptions, in order",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--checkpoint", help="checkpoint file (default: QUEUE.ckpt)")
    parser.add_argument("--checkpoint-every", type=int, default=1, help="batches between saves")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    interval = args.interval if args.interval is not None else (0.2 if args.simulate else 3.0)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    checkpoint = Path(args.checkpoint or f"{args.queue}.ckpt")

    source, _ = packaged_digits_source()
    stream = TestStream(digits_c_domains(args.corruptions), args.batch_size, seed=args.seed)
    total = len(stream) if args.batches is None else min(args.batches, len(stream))
    queue = DigitsQueue(args.queue, class_names=[str(k) for k in range(10)])
    model = copy.deepcopy(source)
    method = eatta.create("eatta", model, dataset="digits-c", oracle=queue, budget=1)
    start, tally = 0, {"wrong": 0, "seen": 0}
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        method.load_state_dict(saved["method"])
        queue.load_state_dict(saved["queue"])
        queue.truth = saved["truth"]
        start, tally = saved["batch"], saved["tally"]
        print(f"resumed from {checkpoint} at batch {start}")

    url = args.url
    if not args.no_serve:
        url, _ = serve_page(args.queue, args.port)
        print(f"labelling page: {url}/  (queue {args.queue})", flush=True)
    stop = threading.Event()
    if args.simulate:
        if url is None:
            parser.error("--simulate with --no-serve needs --url")
        sim = (url, queue, args.delay_s, args.noise, stop)
        threading.Thread(target=simulate, args=sim, daemon=True).start()

    print(f"{'batch':>9} {'domain':<18} {'err %':>6} {'online err %':>13} {'labels':>7} "
          f"{'waiting':>8}", flush=True)  # fmt: skip
    progress = {"saved": start if checkpoint.exists() else None}
    try:
        adapt(method, queue, stream, start, total, tally, args, checkpoint, interval, progress)
    except KeyboardInterrupt:
        stop.set()
        saved = progress["saved"]
        where = (
            f"its checkpoint {checkpoint} holds batch {saved}/{total}"
            if saved is not None
            else "no checkpoint was written yet"
        )
        print(
            f"stopped: {where}; run the same command again to resume (the queue {args.queue} "
            "keeps every answer)",
            flush=True,
        )
        return 130
    stop.set()
    page = queue.stats()
    print(
        f"done: online error {100 * tally['wrong'] / max(1, tally['seen']):.1f}% on "
        f"{tally['seen']} images; labels received {method.annotation_stats.get('received', 0)}; "
        f"answers in the queue {page['answered']}, model right on "
        f"{page['model_right']}/{page['model_judged']} answered samples"
    )
    return 0


def adapt(
    method: Any,
    queue: DigitsQueue,
    stream: Any,
    start: int,
    total: int,
    tally: dict[str, int],
    args: argparse.Namespace,
    checkpoint: Path,
    interval: float,
    progress: dict[str, int | None],
) -> None:
    """Adapt on batches ``start`` to ``total``, checkpointing; ``progress["saved"]`` is the
    number of batches the checkpoint holds (a Ctrl-C propagates as KeyboardInterrupt)."""
    due = time.monotonic()
    for t, (x, y, domain) in enumerate(stream.iter_from(start), start):
        if t >= total:
            break
        due += interval
        queue.batch_labels = y
        logits = method(x)
        wrong = int((logits.argmax(1) != y).sum())
        tally["wrong"] += wrong
        tally["seen"] += len(y)
        for rid in list(queue.truth):  # keep the truths of requests still awaited
            if rid not in queue.awaited:
                del queue.truth[rid]
        if (t + 1) % args.checkpoint_every == 0 or t + 1 == total:
            state = {"method": method.state_dict(), "queue": queue.state_dict()}
            state.update(truth=dict(queue.truth), batch=t + 1, tally=dict(tally))
            save_checkpoint(checkpoint, state)
            progress["saved"] = t + 1
        stats = method.annotation_stats
        print(
            f"{t + 1:>4}/{total:<4} {domain:<18} {100 * wrong / len(y):>6.1f} "
            f"{100 * tally['wrong'] / tally['seen']:>13.1f} {stats.get('received', 0):>7} "
            f"{stats.get('pending', 0):>8}",
            flush=True,
        )
        time.sleep(max(0.0, due - time.monotonic()))


if __name__ == "__main__":
    try:
        sys.exit(exit_on_user_error("annotate_digits.py", main))  # a mistake: one line, status 2
    except KeyboardInterrupt:  # before the first batch: nothing to resume
        print("stopped before adapting; no checkpoint was written", file=sys.stderr)
        sys.exit(130)
