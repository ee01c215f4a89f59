"""Which server eatta-serve is built on: KServe's Python model server or Starlette, measured.

Three servers of the same trivial model (the first 10 values of each row are its logits), each a
child process on loopback, answer Triton's HTTP client (binary tensors, one request at a time):

- ``kserve``: ``kserve.ModelServer`` (its REST server, FastAPI on uvicorn), run by the Python of a
  separate virtual environment where KServe is installed (``--kserve-python``);
- ``starlette``: a bare Starlette route parsing and replying with ``eatta.serve.protocol`` (no
  batcher, no checks in front): the framework's own cost;
- ``eatta-serve``: the command itself (``--method source --max-wait-ms 0``): the guard, the
  batcher's thread hand-off, the snapshot.

Rounds alternate the servers (the first rotating), so the machine's load hits all alike; each
round sends ``--requests`` requests of 1 and of 8 rows to each. It also counts the distributions
each choice adds to an install of eatta (the closure of its requirements, less torch's and
typing-extensions'), read from the installed metadata of each environment.

    python -m venv /tmp/kserve && /tmp/kserve/bin/pip install -c constraints.txt kserve==0.21.0
    python benchmarks/serve_frameworks.py --kserve-python /tmp/kserve/bin/python

Writes ``benchmarks/results/serve_frameworks.json`` (``--out``). The top-level imports are the
standard library's only: the same file runs the KServe server under the other environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "serve_frameworks.json"
SHAPE = (3, 32, 32)
CLASSES = 10

_CLOSURE = r"""
import importlib.metadata as md, json, os, re, sys
def norm(n): return re.sub(r"[-_.]+", "-", n).lower()
def closure(roots):
    seen, stack = {}, [(r, frozenset()) for r in roots]
    while stack:
        name, extras = stack.pop()
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        key = norm(dist.metadata["Name"])
        if key in seen and extras <= seen[key][1]:
            continue
        seen[key] = (dist, extras | (seen[key][1] if key in seen else frozenset()))
        for req in dist.requires or []:
            m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(\[([^\]]*)\])?", req)
            marker = req.split(";", 1)[1] if ";" in req else ""
            wanted = set(re.findall(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker))
            if wanted and not wanted & set(extras):
                continue
            inner = frozenset(e.strip() for e in (m.group(3) or "").split(",") if e.strip())
            stack.append((m.group(1), inner))
    out = {}
    for key, (dist, _) in seen.items():
        size = 0
        for f in dist.files or []:
            try:
                size += os.path.getsize(dist.locate_file(f))
            except OSError:
                pass
        out[key] = size
    return out
print(json.dumps(closure(sys.argv[1:])))
"""


# -- the servers --------------------------------------------------------------------------------
def trivial() -> Any:
    """The trivial model as a torch module (eatta-serve's ``--model``): the first 10 values."""
    import torch
    from torch import nn

    class FirstValues(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)[:, :CLASSES]

    return FirstValues()


def run_kserve(port: int) -> None:
    """KServe's model server with the trivial model (run by the KServe environment's Python)."""
    import numpy as np
    from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

    class Trivial(Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__("model")
            self.ready = True

        def predict(self, payload: InferRequest, headers: Any = None) -> InferResponse:
            x = payload.inputs[0].as_numpy()
            logits = np.ascontiguousarray(x.reshape(x.shape[0], -1)[:, :CLASSES], dtype=np.float32)
            out = InferOutput("logits", list(logits.shape), "FP32")
            out.set_data_from_numpy(logits)
            cls = InferOutput("class", [logits.shape[0]], "INT64")
            cls.set_data_from_numpy(logits.argmax(1).astype(np.int64))
            return InferResponse(
                payload.id,
                self.name,
                [out, cls],
                use_binary_outputs=payload.use_binary_outputs,
                requested_outputs=payload.request_outputs,
            )

    ModelServer(http_port=port, enable_grpc=False, enable_latency_logging=False).start([Trivial()])


def run_bare(port: int) -> None:
    """A bare Starlette route: eatta.serve.protocol's parsing and reply around the model."""
    import torch
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from eatta.serve.protocol import ModelSpec, ProtocolError, encode_reply, parse_infer

    spec = ModelSpec("model", SHAPE, CLASSES, 64)
    model = trivial()

    async def infer(request: Request) -> Response:
        try:
            parsed = parse_infer(
                await request.body(), request.headers.get("inference-header-content-length"), spec
            )
        except ProtocolError as err:
            return JSONResponse({"error": str(err)}, status_code=err.status)
        with torch.no_grad():
            logits = model(parsed.x)
        body, headers = encode_reply(spec, parsed.id, parsed.outputs, logits)
        return Response(body, headers=headers)

    def ready(request: Request) -> Response:
        return JSONResponse({"ready": True})

    app = Starlette(
        routes=[
            Route("/v2/models/model/infer", infer, methods=["POST"]),
            Route("/v2/health/ready", ready),
        ]
    )
    from eatta.annotate.cli import bind

    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[bind("127.0.0.1", port)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    src = HERE.parent / "src"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(HERE), env.get("PYTHONPATH", "")])
    return env


def _start(name: str, kserve_python: str, state: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    if name == "kserve":
        cmd = [kserve_python, __file__, "_kserve", str(port)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")  # its own environment: no eatta, no torch
    elif name == "starlette":
        cmd = [sys.executable, __file__, "_bare", str(port)]
        env = _env()
    else:
        cmd = [
            sys.executable, "-m", "eatta.serve.cli", "--state", state, "--port", str(port),
            "--model", "serve_frameworks:trivial", "--method", "source", "--max-wait-ms", "0",
        ]  # fmt: skip
        env = _env()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2):
                return proc, port
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{name} did not start ({' '.join(cmd)})") from None
            time.sleep(0.2)


# -- the measurement ----------------------------------------------------------------------------
def _timed(port: int, rows: int, n: int, seed: int) -> list[float]:
    """Seconds of ``n`` sequential requests of ``rows`` rows through Triton's client."""
    import numpy as np
    import tritonclient.http as http

    client = http.InferenceServerClient(f"127.0.0.1:{port}")
    x = np.random.default_rng(seed).random((rows, *SHAPE), dtype=np.float32)
    tensor = http.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        result = client.infer("model", [tensor], request_id=f"b{i}")
        out.append(time.perf_counter() - t0)
        if i == 0 and not np.array_equal(
            result.as_numpy("logits"), x.reshape(rows, -1)[:, :CLASSES]
        ):
            raise RuntimeError(f"the server on port {port} answered other logits")
    client.close()
    return out


def _summary(seconds: list[float], rounds: list[float]) -> dict[str, Any]:
    ms = sorted(1e3 * s for s in seconds)
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49], 3),
        "p90_ms": round(cuts[89], 3),
        "p99_ms": round(cuts[98], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        "round_medians_ms": [round(1e3 * r, 3) for r in rounds],
        "requests": len(ms),
    }


def dependencies(python: str, roots: list[str]) -> dict[str, int]:
    """Each distribution in the closure of ``roots`` in ``python``'s environment: its size."""
    done = subprocess.run(
        [python, "-c", _CLOSURE, *roots], capture_output=True, text=True, check=True
    )
    found: dict[str, int] = json.loads(done.stdout)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kserve-python", required=True, help="the Python of a venv with kserve")
    parser.add_argument(
        "--requests", type=int, default=200, help="requests per server, size, round"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    names = ["kserve", "starlette", "eatta-serve"]
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    samples: dict[str, dict[int, list[float]]] = {n: {1: [], 8: []} for n in names}
    medians: dict[str, dict[int, list[float]]] = {n: {1: [], 8: []} for n in names}
    with tempfile.TemporaryDirectory() as state:
        try:
            for name in names:
                procs[name] = _start(name, args.kserve_python, os.path.join(state, "s"))
            for name in names:
                for rows in (1, 8):
                    _timed(procs[name][1], rows, args.warmup, 0)
            for r in range(args.rounds):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    for rows in (1, 8):
                        got = _timed(procs[name][1], rows, args.requests, r)
                        samples[name][rows] += got
                        medians[name][rows].append(statistics.median(got))
        finally:
            for proc, _ in procs.values():
                proc.terminate()
            for proc, _ in procs.values():
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    base = dependencies(sys.executable, ["torch", "typing-extensions"])
    kserve = dependencies(args.kserve_python, ["kserve"])
    starlette = dependencies(sys.executable, ["starlette", "uvicorn"])
    versions = subprocess.run(
        [args.kserve_python, "-c", "import importlib.metadata as m; print(m.version('kserve'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip

    def added(found: dict[str, int]) -> dict[str, Any]:
        extra = {k: v for k, v in found.items() if k not in base}
        return {
            "count": len(extra),
            "megabytes": round(sum(extra.values()) / 1e6, 1),
            "names": sorted(extra),
        }

    latency = {
        name: {
            f"rows_{rows}": _summary(samples[name][rows], medians[name][rows]) for rows in (1, 8)
        }
        for name in names
    }
    doc = {
        "what": "latency of a trivial model's infer over loopback through tritonclient.http "
        "(binary tensors, one request at a time), and the distributions each server adds",
        "command": "python benchmarks/serve_frameworks.py " + " ".join(argv or sys.argv[1:]),
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "kserve_version": versions,
        "latency": latency,
        "p50_ratio_to_kserve": {
            name: {
                f"rows_{rows}": round(
                    latency[name][f"rows_{rows}"]["p50_ms"]
                    / latency["kserve"][f"rows_{rows}"]["p50_ms"],
                    3,
                )
                for rows in (1, 8)
            }
            for name in names
        },
        "dependencies_added": {"kserve": added(kserve), "starlette+uvicorn": added(starlette)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for name in names:
        row = latency[name]
        print(
            f"{name:<12} p50 {row['rows_1']['p50_ms']:.2f} / {row['rows_8']['p50_ms']:.2f} ms, "
            f"p99 {row['rows_1']['p99_ms']:.2f} / {row['rows_8']['p99_ms']:.2f} ms (1 / 8 rows)"
        )
    for name, found in doc["dependencies_added"].items():
        print(f"{name} adds {found['count']} distributions, {found['megabytes']} MB")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("_kserve", "_bare"):
        (run_kserve if sys.argv[1] == "_kserve" else run_bare)(int(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
