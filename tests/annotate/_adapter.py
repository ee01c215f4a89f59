"""A stand-in adapting process for the durability tests (run as a script, killed with SIGKILL).

It behaves as a method does towards its annotator: each step it collects answers, applies them
(records them in its state, checking each against the sample it asked about), asks about one new
sample under a deterministic id, and checkpoints its state together with the queue's
(``json`` to a temporary file, then ``os.replace``). On restart it resumes from the checkpoint and
re-runs the steps after it, re-asking under the same ids. With ``--diverge`` the sample asked at a
step depends on the answers applied so far, so a re-run may ask something else under an id.
It stops once it has taken ``--steps`` steps and waits for no answer.

The answer a poster gives is a function of the image it was shown (:func:`expected`), so an
answer applied to the wrong sample is detected.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from typing import Any

import torch

from eatta.annotate import Answer, LabelQueue, LabelRequest
from eatta.annotate.queue import tensor_to_png


def expected(png: bytes) -> dict[str, Any]:
    """The answer the test's poster gives to an image: a class, or a yes/no for a third."""
    h = int(hashlib.sha256(png).hexdigest(), 16)
    return {"correct": bool(h % 2)} if h % 3 == 0 else {"label": h % 10}


def request(step: int, seed: int, prefix: str = "run") -> LabelRequest:
    g = torch.Generator().manual_seed(seed)
    return LabelRequest(
        f"{prefix}-{step}-0", torch.rand(1, 6, 6, generator=g), torch.randn(10, generator=g),
        "label", step, 0,
    )  # fmt: skip


def save(path: str, state: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queue", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--diverge", action="store_true")
    parser.add_argument("--prefix", default="run")
    parser.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    args = parser.parse_args()
    queue = LabelQueue(args.queue)
    state: dict[str, Any] = {
        "prefix": f"{args.prefix}-",
        "step": 0,
        "asked": {},
        "applied": [],
        "queue": queue.state_dict(),
    }
    if os.path.exists(args.checkpoint):
        with open(args.checkpoint) as f:
            state = json.load(f)
        queue.load_state_dict(state["queue"])
    print(f"adapter: from step {state['step']}", flush=True)
    while True:
        for answer in queue.collect():
            seed = state["asked"][answer.id]  # KeyError: an answer to nothing asked
            png = tensor_to_png(request(0, seed).sample)
            state["applied"].append(
                {"id": answer.id, "answer": answer.to_dict(), "ok": answer_matches(answer, png)}
            )
        if state["step"] < args.steps:
            state["step"] += 1
            step = state["step"]
            seed = 1000 * step + (len(state["applied"]) % 3 if args.diverge else 0)
            r = request(step, seed, args.prefix)
            queue.submit([r])
            state["asked"][r.id] = seed
        done = state["step"] >= args.steps and not queue.awaited
        if done or state["step"] % args.every == 0:
            state["queue"] = queue.state_dict()
            save(args.checkpoint, state)
        if done:
            break
        time.sleep(args.pause)
    print(f"adapter: done, {len(state['applied'])} answers applied", flush=True)


def answer_matches(answer: Answer, png: bytes) -> bool:
    return answer.skip or {k: v for k, v in answer.to_dict().items() if k != "id"} == expected(png)


if __name__ == "__main__":
    main()
