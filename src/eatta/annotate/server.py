"""The labelling page's server: a Starlette app over a :class:`~eatta.annotate.queue.LabelQueue`.

``make_app(queue_path)`` serves the page (``/``), its two static files, and a JSON API
(``docs/annotate.md``): ``GET /api/pending``, ``GET /api/stats``, ``GET /api/images/{id}.png``
and ``POST /api/answers``. An answer is acknowledged (200) only after it is committed.

Safe by default (as Jupyter's server): a guard in front of the app refuses, before anything is
parsed, a ``Host`` that is not a loopback name when no token is set (DNS rebinding), a missing or
wrong token when one is set (``Authorization: Bearer``, the cookie the page load sets from
``?token=``, or ``?token=`` on a GET), a POST that is not ``application/json``, that comes from
another origin (``Origin``/``Referer`` checked against ``Host``) or whose body exceeds
``max_body`` bytes. Every error is a JSON ``{"error": message}`` with a 4xx status.

:func:`guard` puts the same checks in front of any ASGI app (``eatta-serve`` puts them in front of
the whole server, with :class:`BodyRule` for the bodies its other paths take), and
:func:`make_page` is the page's app without them, to mount beside other routes.

Starlette and uvicorn are imported only here (``pip install 'eatta[annotate]'``).
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

try:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the labelling page needs Starlette and uvicorn: pip install 'eatta[annotate]'"
    ) from err

from eatta.annotate.paced import Order, check_order
from eatta.annotate.queue import ID_PATTERN, AnswerRefused, LabelQueue
from eatta.annotate.requests import Answer, AnswerError

__all__ = [
    "LOOPBACK_NAMES",
    "MAX_BODY",
    "BodyRule",
    "guard",
    "is_loopback",
    "make_app",
    "make_page",
]

#: Largest request body accepted (bytes); an answer is well under 1 KiB.
MAX_BODY = 16 * 1024
#: Host names that reach only this machine.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_STATIC = {"annotate.js": "text/javascript", "annotate.css": "text/css"}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"content-security-policy", _CSP.encode()),
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, IPv6 with or without brackets) is loopback."""
    name = host.strip("[]").lower()
    return name in LOOPBACK_NAMES or name.startswith("127.")


def _host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8765`` -> ``::1``)."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def _cookie_name(scope: Scope) -> str:
    server = scope.get("server") or ("", 0)
    return f"eatta_annotate_token_{server[1] or 0}"


async def _error(send: Send, status: int, message: str, extra: list[Any] | None = None) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True)
class BodyRule:
    """The POST bodies the paths under ``prefix`` take: at most ``max_body`` bytes, with a
    ``Content-Type`` in ``content_types`` (``""``: none sent). Every other path takes JSON of at
    most the guard's ``max_body``."""

    prefix: str
    max_body: int
    content_types: frozenset[str]


def _check_token(token: str | None) -> None:
    if token is not None and (not isinstance(token, str) or len(token) < 8):
        raise ValueError("a token must be a string of at least 8 characters")


class _Guard:
    """Host, token, cross-site and body-size checks in front of the app (see the module doc)."""

    def __init__(
        self, app: ASGIApp, token: str | None, max_body: int, bodies: Sequence[BodyRule] = ()
    ) -> None:
        self.app = app
        self.token = token
        self.max_body = max_body
        self.bodies = tuple(bodies)

    def _body_rule(self, path: str) -> tuple[int, frozenset[str]]:
        """The largest body and the content types a POST to ``path`` may have."""
        for rule in self.bodies:
            if path.startswith(rule.prefix):
                return rule.max_body, rule.content_types
        return self.max_body, frozenset({"application/json"})

    def _token_ok(self, presented: str | None) -> bool:
        assert self.token is not None
        return presented is not None and hmac.compare_digest(
            presented.encode(), self.token.encode()
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if self.token is None and not is_loopback(_host_name(host)):
            await _error(send, 403, f"host {host!r} is not allowed without a token")
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                given = list(message.get("headers", []))
                if not any(k.lower() == b"cache-control" for k, _ in given):
                    given.append((b"cache-control", b"no-store"))
                message["headers"] = [*given, *_HEADERS]
            await send(message)

        method = scope["method"]
        if method not in ("GET", "HEAD", "POST"):
            await _error(
                secured, 405, f"method {method} is not allowed", [(b"allow", b"GET, POST")]
            )
            return
        if self.token is not None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            from_query = query.get("token", [None])[-1] if method in ("GET", "HEAD") else None
            auth = headers.get("authorization", "")
            bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else None
            cookie = _read_cookie(headers.get("cookie", ""), _cookie_name(scope))
            if not any(self._token_ok(t) for t in (bearer, cookie, from_query)):
                await _error(secured, 401, "a valid token is required (see the server's output)")
                return
            if from_query is not None and scope["path"] == "/":
                # keep the token in an HttpOnly cookie and drop it from the address bar
                cookie_value = f"{_cookie_name(scope)}={self.token}; HttpOnly; SameSite=Strict"
                await secured(
                    {
                        "type": "http.response.start",
                        "status": 303,
                        "headers": [
                            (b"location", b"/"),
                            (b"set-cookie", f"{cookie_value}; Path=/".encode()),
                            (b"content-length", b"0"),
                        ],
                    }
                )
                await secured({"type": "http.response.body", "body": b""})
                return
        if method == "POST":
            max_body, ctypes = self._body_rule(scope["path"])
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype not in ctypes:
                named = " or ".join(sorted(c for c in ctypes if c)) or "no Content-Type"
                await _error(secured, 415, f"send the body as Content-Type: {named}")
                return
            origin = headers.get("origin")
            referer = headers.get("referer")
            expected = f"{scope.get('scheme', 'http')}://{host}".lower()
            if origin is not None and origin.lower() != expected:
                await _error(secured, 403, f"cross-site request from {origin!r} refused")
                return
            if origin is None and referer is not None:
                parts = urlsplit(referer)
                if f"{parts.scheme}://{parts.netloc}".lower() != expected:
                    await _error(secured, 403, "cross-site request refused (Referer)")
                    return
            declared = headers.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > max_body):
                await _error(secured, 413, f"request body over {max_body} bytes")
                return
            body = bytearray()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body.extend(message.get("body", b""))
                if len(body) > max_body:
                    await _error(secured, 413, f"request body over {max_body} bytes")
                    return
                if not message.get("more_body", False):
                    break
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": bytes(body), "more_body": False}
                return await receive()

            await self.app(scope, replay, secured)
            return
        await self.app(scope, receive, secured)


def _read_cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _page_file(name: str) -> bytes:
    return resources.files("eatta.annotate").joinpath("page").joinpath(name).read_bytes()


class _Routes:
    """The page's handlers over one queue, opened on first use and closed when the app stops."""

    def __init__(self, queue_path: str | os.PathLike[str], order: Order, page_limit: int) -> None:
        self.queue_path, self.order, self.page_limit = queue_path, order, page_limit
        self._queue: LabelQueue | None = None

    def queue(self) -> LabelQueue:
        if self._queue is None:
            self._queue = LabelQueue(self.queue_path, order=self.order)
        return self._queue

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if self._queue is not None:
                self._queue.close()
                self._queue = None

    def index(self, request: Request) -> Response:
        return Response(_page_file("index.html"), media_type="text/html; charset=utf-8")

    def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            raise HTTPException(404, "no such file")
        return Response(_page_file(name), media_type=_STATIC[name])

    def favicon(self, request: Request) -> Response:
        return Response(status_code=204)  # no icon, and no 404 in the browser's console

    def pending(self, request: Request) -> Response:
        raw = request.query_params.get("limit", str(self.page_limit))
        if not raw.isdigit():
            raise HTTPException(400, "limit must be a non-negative integer")
        items = self.queue().pending(min(int(raw), self.page_limit))
        for item in items:
            item["image"] = f"/api/images/{item['id']}.png" if item.pop("has_image") else None
            item["prediction_name"] = item["classes"][item["prediction"]]
        return JSONResponse(items)

    def stats(self, request: Request) -> Response:
        return JSONResponse(self.queue().stats())

    def image(self, request: Request) -> Response:
        name = request.path_params["name"]
        key = name[:-4] if name.endswith(".png") else ""
        if ID_PATTERN.fullmatch(key) is None:
            raise HTTPException(404, "no such image")
        png = self.queue().image(key)
        if png is None:
            raise HTTPException(404, f"no image for request {key!r}")
        # a key's image never changes: the page may keep it
        return Response(
            png, media_type="image/png", headers={"cache-control": "private, max-age=3600"}
        )

    async def answers(self, request: Request) -> Response:
        try:
            data = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            raise HTTPException(400, "the body is not valid JSON") from None
        if not isinstance(data, dict):
            raise HTTPException(422, "an answer is a JSON object: {id, label | correct | skip}")
        seconds = data.pop("seconds", None)
        try:
            answer = Answer.from_mapping(data)
        except AnswerError as err:
            raise HTTPException(422, str(err)) from None
        try:
            seq = await run_in_threadpool(self.queue().answer, answer, seconds=seconds)
        except AnswerRefused as err:
            raise HTTPException(err.status, str(err)) from None
        return JSONResponse({"ok": True, "id": answer.id, "seq": seq})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code)


def guard(
    app: ASGIApp,
    token: str | None = None,
    *,
    max_body: int = MAX_BODY,
    bodies: Sequence[BodyRule] = (),
) -> ASGIApp:
    """``app`` behind the page's checks (see the module doc): without ``token`` only loopback
    ``Host`` names are served, with one every request must carry it; POST bodies are JSON of at
    most ``max_body`` bytes, except under the prefixes of ``bodies`` (the first that matches)."""
    _check_token(token)
    return _Guard(app, token, max_body, bodies)


def make_page(
    queue_path: str | os.PathLike[str], *, page_limit: int = 50, order: Order = "newest"
) -> Starlette:
    """The labelling page and its JSON API over the queue at ``queue_path``, without the checks
    of :func:`guard` (put it behind them, as :func:`make_app` does). The queue is opened on
    first use and closed by the app's lifespan."""
    check_order(order)
    r = _Routes(queue_path, order, page_limit)
    return Starlette(
        routes=[
            Route("/", r.index, methods=["GET"]),
            Route("/favicon.ico", r.favicon, methods=["GET"]),
            Route("/static/{name}", r.static, methods=["GET"]),
            Route("/api/pending", r.pending, methods=["GET"]),
            Route("/api/stats", r.stats, methods=["GET"]),
            Route("/api/images/{name}", r.image, methods=["GET"]),
            Route("/api/answers", r.answers, methods=["POST"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=r.lifespan,
    )


def make_app(
    queue_path: str | os.PathLike[str],
    token: str | None = None,
    *,
    max_body: int = MAX_BODY,
    page_limit: int = 50,
    order: Order = "newest",
) -> ASGIApp:
    """The labelling page and its JSON API over the queue at ``queue_path``.

    ``token``: required on every request when given (see the module doc); without one, only
    loopback ``Host`` names are served. ``page_limit``: the most pending requests one
    ``GET /api/pending`` lists (``?limit=`` asks for fewer). ``order``: the request the page
    shows first, ``"newest"`` (default) or ``"oldest"`` (see :class:`LabelQueue`).
    """
    check_order(order)
    _check_token(token)
    return guard(
        make_page(queue_path, page_limit=page_limit, order=order), token, max_body=max_body
    )
