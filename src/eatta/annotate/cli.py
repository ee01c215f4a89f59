"""``eatta-annotate``: serve the labelling page for a label queue, or print the queue's numbers.

    eatta-annotate serve --queue labels.db [--host 127.0.0.1] [--port 8765] [--token T]
    eatta-annotate stats --queue labels.db

``serve`` binds to 127.0.0.1 by default, where a token is optional. Any other host needs a token:
``--token``, ``$EATTA_ANNOTATE_TOKEN``, or one generated at start; the URL printed at start
carries it. ``--port 0`` picks a free port (the printed URL names it).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
from collections.abc import Sequence

from eatta.annotate.paced import ORDERS, Order
from eatta.annotate.queue import LabelQueue
from eatta.console import HelpFormatter, UsageError, exit_on_user_error

__all__ = ["bind", "main", "token_for"]

_SERVE = (
    "Serve the labelling page and its JSON API for a label queue. On 127.0.0.1 (the default) a "
    "token is optional; any other host needs one: --token, $EATTA_ANNOTATE_TOKEN, or one "
    "generated at start. The URL printed at start carries it; --port 0 picks a free port."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eatta-annotate",
        description="Serve the labelling page for a label queue, or print the queue's numbers.",
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve the labelling page and its JSON API",
        description=_SERVE,
        formatter_class=HelpFormatter,
    )
    serve.add_argument("--queue", required=True, help="the label queue file (SQLite)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind")
    serve.add_argument("--port", type=_port, default=8765, help="port (0: a free one)")
    serve.add_argument(
        "--token",
        help="token every request must carry (default: $EATTA_ANNOTATE_TOKEN; one is generated "
        "when --host is not loopback)",
    )
    serve.add_argument(
        "--order",
        choices=ORDERS,
        default="newest",
        help="which pending request the page shows first (see docs/real-annotators.md)",
    )
    stats = sub.add_parser(
        "stats",
        help="print the queue's numbers as JSON",
        description="Print the label queue's numbers as JSON.",
        formatter_class=HelpFormatter,
    )
    stats.add_argument("--queue", required=True, help="the label queue file (SQLite)")
    return parser


def _port(text: str) -> int:
    """``--port``: 0 to 65535."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {text!r}")
    return int(text)


def _url(host: str, port: int, token: str | None) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def token_for(host: str, token: str | None) -> str | None:
    """The token to require: the one given, or a fresh one when ``host`` is not loopback."""
    from eatta.annotate.server import is_loopback

    if token:
        return token
    return None if is_loopback(host) else secrets.token_urlsafe(24)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port); a :class:`UsageError` when
    the port is taken or the address is not this machine's.

    The socket names its protocol (``IPPROTO_TCP``): asyncio turns Nagle's algorithm off
    (``TCP_NODELAY``) only on such sockets, and with it on, a reply written as headers then body
    waits for the client's delayed acknowledgement, about 40 ms a request on Linux.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:  # taken, or not an address of this machine
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


def serve(queue: str, host: str, port: int, token: str | None, order: Order = "newest") -> None:
    """Bind, print the page's URL (with the token), and serve until interrupted."""
    try:
        import uvicorn

        from eatta.annotate.server import make_app
    except ImportError as err:
        raise SystemExit(
            f"eatta-annotate serve needs Starlette and uvicorn: pip install 'eatta[annotate]' "
            f"({err})"
        ) from None
    token = token_for(host, token)
    LabelQueue(queue).close()  # create the file and fail early on a bad path or schema
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    app = make_app(queue, token=token, order=order)
    config = uvicorn.Config(
        app,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=2,
    )
    try:  # announced inside: a Ctrl-C any time after "serving" says where the answers are
        print(f"eatta-annotate: serving {queue} at {_url(host, bound, token)}", flush=True)
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down first, then re-raises Ctrl-C
        print(f"eatta-annotate: stopped; the queue {queue} keeps every answer", file=sys.stderr)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eatta-annotate``; the exit status: 2 for a user's mistake (a bad flag, a
    queue's folder that does not exist, a port taken), 130 when stopped with Ctrl-C."""
    args = _parser().parse_args(argv)
    return exit_on_user_error("eatta-annotate", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        try:
            # read here, not as the parser's default: a secret has no place in --help
            token = args.token or os.environ.get("EATTA_ANNOTATE_TOKEN")
            serve(args.queue, args.host, args.port, token, args.order)
        except KeyboardInterrupt:
            return 130
        return 0
    with LabelQueue(args.queue) as q:
        json.dump(q.stats(), sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
