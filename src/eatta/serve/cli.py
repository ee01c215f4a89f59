"""``eatta-serve``: serve a model that adapts while it predicts, and its labelling page.

    eatta-serve --state DIR [--model pkg.module:factory] [--method eatta-safe] [--port 8000]

The Open Inference Protocol (KServe v2, Triton) over REST at ``/v2/...``, the labelling page at
``/``, Prometheus metrics at ``/metrics``, on one port (docs/guide/deploy.md). It binds to
127.0.0.1 by default, where a token is optional; any other host needs one (``--token``,
``$EATTA_SERVE_TOKEN``, or one generated at start, printed in the page's URL).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import eatta
from eatta.console import HelpFormatter, UsageError, exit_on_user_error
from eatta.methods.presets import DATASETS
from eatta.serve.options import ADAPTERS

__all__ = ["main"]

_DESCRIPTION = (
    "Serve a model over the Open Inference Protocol (KServe v2 / Triton REST) while a method "
    "adapts it on the requests, with the labelling page for its label requests and Prometheus "
    "metrics on the same port. On 127.0.0.1 (the default) a token is optional; any other host "
    "needs one: --token, $EATTA_SERVE_TOKEN, or one generated at start. --port 0 picks a free port."
)


def _positive(kind: type[int] | type[float], least: float, most: float | None = None):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < least or (most is not None and value > most):
            span = f">= {least}" if most is None else f"{least} to {most}"
            raise argparse.ArgumentTypeError(f"expected {span}, got {text!r}")
        return value

    return parse


def _shape(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"a sample's shape is positive integers like 3,32,32; got {text!r}"
        )
    return tuple(int(p) for p in parts)


def _parser() -> argparse.ArgumentParser:
    from eatta.serve.model import DEMO

    p = argparse.ArgumentParser(
        prog="eatta-serve", description=_DESCRIPTION, formatter_class=HelpFormatter
    )
    p.add_argument(
        "--state",
        required=True,
        help="folder of the durable state: the method's checkpoint and the label queue "
        "(created if missing)",
    )
    p.add_argument(
        "--model",
        default=DEMO,
        help="pkg.module:factory, a callable returning the torch.nn.Module (the demo, "
        f"{DEMO}, is the packaged digits CNN)",
    )
    p.add_argument(
        "--input-shape",
        type=_shape,
        default="3,32,32",
        metavar="C,H,W",
        help="one sample's shape, as the model takes it (3,32,32: the demo's)",
    )
    p.add_argument(
        "--method",
        default="eatta-safe",
        choices=eatta.available(),
        metavar="NAME",
        help="the adaptation method (eatta.available())",
    )
    p.add_argument(
        "--dataset",
        choices=DATASETS,
        metavar="NAME",
        help="the method's per-benchmark hyperparameters, as eatta.create(dataset=) takes "
        f"them: one of {', '.join(DATASETS)} (default: the method's general row)",
    )
    p.add_argument("--name", default="model", help="the served model's name in /v2/models/NAME")
    p.add_argument(
        "--budget", type=_positive(int, 0), default=1, help="labels the method may ask per step"
    )
    p.add_argument(
        "--window",
        type=_positive(int, 2),
        default=64,
        help="samples a step adapts on: requests join a window of this many, and a step comes "
        "every as many samples",
    )
    p.add_argument(
        "--hp",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the method's settings (a Python literal), as eatta.create takes it, e.g. "
        "--hp tolerance=1.0 for eatta-safe; repeat for more",
    )
    _serving_options(p)
    _running_options(p)
    return p


#: Settings with flags of their own (--hp may not give them twice).
_OWN_FLAGS = ("dataset", "window", "budget", "oracle")


def method_settings(method: str, items: Sequence[str]) -> dict[str, Any]:
    """``--hp`` items as the method's checked settings, parsed as ``eatta-bench --hp`` parses
    them (a :class:`UsageError` for a malformed item, a key the method does not have, a value of
    the wrong type, or a key with its own flag), before the state folder is touched."""
    from eatta.bench.commands import parse_hparams

    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--hp expects KEY=VALUE, got {item!r}")
        if key.strip() in _OWN_FLAGS:
            raise UsageError(f"--hp {item!r}: give {key.strip()} with --{key.strip()}")
    try:  # each key the one method's own (METHOD.KEY), so an unknown one is named as such
        return parse_hparams([f"{method}.{item.strip()}" for item in items], [method])[method]
    except ValueError as err:
        raise UsageError(str(err)) from None


def _serving_options(p: argparse.ArgumentParser) -> None:
    """Batching and checkpoints."""
    p.add_argument(
        "--max-batch",
        type=_positive(int, 1),
        default=64,
        help="the most rows a batch (and a request) holds",
    )
    p.add_argument(
        "--max-wait-ms",
        type=_positive(float, 0, 60000),
        default=5.0,
        help="milliseconds a request may wait for others to join its batch",
    )
    p.add_argument(
        "--max-queue",
        type=_positive(int, 1),
        default=4096,
        help="rows that may wait for a batch; a request beyond is refused with 503",
    )
    p.add_argument(
        "--checkpoint-s",
        type=_positive(float, 0),
        default=1.0,
        help="the least seconds between two checkpoints, written after a step (0: after each)",
    )


def _running_options(p: argparse.ArgumentParser) -> None:
    """Where the model and the method run, and where the server listens."""
    p.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda, cuda:1)")
    p.add_argument(
        "--threads",
        type=_positive(int, 1),
        help="torch's CPU threads (default: torch's own choice)",
    )
    p.add_argument(
        "--adapter",
        choices=ADAPTERS,
        default="process",
        help="where the method steps: its own process, at a lower priority (a step never holds "
        "the server's Python lock), or a thread of the server",
    )
    p.add_argument(
        "--adapter-nice",
        type=_positive(int, 0, 19),
        default=5,
        help="how much lower the adapter process's CPU priority is (os.nice): higher serves "
        "faster on a busy machine and adapts on fewer batches",
    )
    p.add_argument(
        "--order",
        choices=("newest", "oldest"),
        default="newest",
        help="which pending label request the page shows first",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument(
        "--port", type=_positive(int, 0, 65535), default=8000, help="port (0: a free one)"
    )
    p.add_argument(
        "--token",
        help="token every request must carry (default: $EATTA_SERVE_TOKEN; one is generated "
        "when --host is not loopback)",
    )


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}"


def serve(args: argparse.Namespace, token: str | None) -> None:
    """Build the service, bind, print where it serves, and serve until stopped."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise SystemExit(
            f"eatta-serve needs Starlette and uvicorn: pip install 'eatta[serve]' ({err})"
        ) from None
    import torch

    from eatta.annotate.cli import token_for
    from eatta.serve.state import StateDir

    hparams = method_settings(args.method, args.hp)
    if args.max_queue < args.max_batch:
        raise UsageError(
            f"--max-queue ({args.max_queue}) must be >= --max-batch ({args.max_batch})"
        )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        raise UsageError(f"--device {args.device!r}: {err}") from None
    token = token_for(args.host, token)
    state = StateDir(args.state)
    try:
        state.lock()
    except RuntimeError as err:
        raise UsageError(str(err)) from None
    try:
        _serve_locked(args, token, state, device, hparams)
    finally:
        state.unlock()


def _serve_locked(
    args: argparse.Namespace, token: str | None, state: Any, device: Any, hparams: dict[str, Any]
) -> None:
    """:func:`serve` once the state folder is this process's."""
    import uvicorn

    from eatta.annotate.cli import bind
    from eatta.serve.app import make_server_app
    from eatta.serve.model import load_model
    from eatta.serve.service import Options, Service
    from eatta.serve.state import StateMismatch

    options = Options(
        model=args.model, method=args.method, dataset=args.dataset or "default", name=args.name,
        input_shape=args.input_shape, window=args.window, budget=args.budget,
        max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
        checkpoint_s=args.checkpoint_s, device=str(device), order=args.order,
        adapter=args.adapter, adapter_nice=args.adapter_nice, threads=args.threads,
        hparams=hparams,
    )  # fmt: skip
    try:
        service = Service(load_model(args.model), options, state)
    except StateMismatch as err:
        raise UsageError(str(err)) from None
    sock = bind(args.host, args.port)
    config = uvicorn.Config(
        make_server_app(service, token),
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=10,
    )
    url = _url(args.host, sock.getsockname()[1])
    resumed = (
        f"resumed from its checkpoint ({service.resumed_steps} steps; {service.orphans} label "
        "request(s) made after it expired)"
        if service.resumed_steps is not None
        else "fresh"
    )
    lines = [f"{args.method} on {args.model}, {resumed}; state {args.state}"]
    if service.adapter_pid is not None:
        lines.append(f"the method steps in process {service.adapter_pid}")
    lines.append(f"inference {url}/v2/models/{args.name}/infer, metrics {url}/metrics")
    lines.append(f"serving the labelling page at {url}/" + (f"?token={token}" if token else ""))
    try:
        print("\n".join(f"eatta-serve: {line}" for line in lines), flush=True)
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        print(f"eatta-serve: stopped; the state {args.state} keeps every answer", file=sys.stderr)
        raise
    finally:
        sock.close()
        service.queue.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eatta-serve``; the exit status: 2 for a user's mistake (a bad flag, a
    model that cannot be loaded, a state of other options, a port taken), 130 on Ctrl-C."""
    args = _parser().parse_args(argv)
    return exit_on_user_error("eatta-serve", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    try:
        token = args.token or os.environ.get("EATTA_SERVE_TOKEN")
        serve(args, token)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
