"""The HTTP side: the Open Inference Protocol, the metrics and the labelling page, on one server.

Routes (``docs/guide/deploy.md``):

- ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``: the server's metadata and health;
- ``GET /v2/models/{name}`` (and ``/versions/{v}``): the model's metadata; ``.../ready``;
- ``POST /v2/models/{name}/infer`` (and ``/versions/{v}/infer``): inference, JSON or binary
  tensor data (:mod:`eatta.serve.protocol`); 400 for a bad request, 404 for another model, 503
  when the server is full (``Retry-After``) or stopping, 500 when the model failed;
- ``GET /metrics``: Prometheus text (:mod:`eatta.serve.metrics`);
- everything else: the labelling page and its JSON API (:func:`eatta.annotate.server.make_page`).

The page's checks (:func:`eatta.annotate.server.guard`) stand in front of all of it: without a
token only loopback ``Host`` names are served, with one every request carries it; inference
bodies may be JSON, ``application/octet-stream`` or untyped (as Triton's client sends them), up
to a size the model's input sets, and a POST from another origin is refused.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from eatta import __version__
from eatta.annotate.server import BodyRule, guard, make_page
from eatta.serve.batcher import Closed, Overloaded
from eatta.serve.protocol import ProtocolError, encode_reply, model_metadata, parse_infer
from eatta.serve.service import Service

__all__ = ["INFER_TYPES", "make_server_app", "max_infer_body"]

#: The content types an inference request may have ("": none, as Triton's client sends it).
INFER_TYPES = frozenset({"application/json", "application/octet-stream", ""})
#: Bodies longer than this are parsed off the event loop.
_PARSE_INLINE = 64 * 1024


def max_infer_body(sample_shape: tuple[int, ...], max_rows: int) -> int:
    """The largest inference body taken: ``max_rows`` samples as JSON (at most 32 bytes a value,
    which ``repr`` of any float32 fits) plus 64 KiB for the rest."""
    return 32 * max_rows * math.prod(sample_shape) + 64 * 1024


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class _Protocol:
    """The handlers of the protocol's routes over one :class:`Service`."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.ready = False

    def _model(self, request: Request) -> str | None:
        """Why the path names no model served here (None: it names this one)."""
        spec = self.service.spec
        name = request.path_params["name"]
        version = request.path_params.get("version")
        if name != spec.name:
            return f"unknown model {name!r}; this server serves {spec.name!r}"
        if version is not None and version != spec.version:
            return f"model {name!r} has version {spec.version!r} only, not {version!r}"
        return None

    def server(self, request: Request) -> Response:
        return JSONResponse(
            {"name": "eatta-serve", "version": __version__, "extensions": ["binary_tensor_data"]}
        )

    def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    def health_ready(self, request: Request) -> Response:
        return JSONResponse({"ready": self.ready}, status_code=200 if self.ready else 503)

    def metadata(self, request: Request) -> Response:
        wrong = self._model(request)
        if wrong:
            return _error(404, wrong)
        return JSONResponse(model_metadata(self.service.spec))

    def model_ready(self, request: Request) -> Response:
        wrong = self._model(request)
        if wrong:
            return _error(404, wrong)
        return JSONResponse(
            {"name": self.service.spec.name, "ready": self.ready},
            status_code=200 if self.ready else 503,
        )

    async def metrics(self, request: Request) -> Response:
        text = await run_in_threadpool(self.service.metrics_text)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def infer(self, request: Request) -> Response:
        started = time.monotonic()
        service, metrics = self.service, self.service.metrics
        wrong = self._model(request)
        if wrong:
            metrics.request("invalid")
            return _error(404, wrong)
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            metrics.request("invalid")
            return _error(415, f"Content-Encoding {encoding!r} is not taken; send the body as is")
        body = await request.body()
        header = request.headers.get("inference-header-content-length")
        try:
            if len(body) > _PARSE_INLINE:
                parsed = await run_in_threadpool(parse_infer, body, header, service.spec)
            else:
                parsed = parse_infer(body, header, service.spec)
        except ProtocolError as err:
            metrics.request("invalid")
            return _error(err.status, str(err))
        rid = parsed.id if parsed.id is not None else service.new_id()
        batcher = service.batcher
        try:
            if batcher is None or not self.ready:
                raise Closed("the server is not ready")
            future = batcher.submit(parsed.x, rid)
        except (Overloaded, Closed) as err:
            metrics.request("overloaded")
            return _error(503, str(err), {"retry-after": "1"})
        try:
            logits, snap = await asyncio.wrap_future(future)
        except Exception as err:
            metrics.request("error")
            return _error(500, f"the model failed on this batch: {type(err).__name__}: {err}")
        extra: dict[str, Any] = {"served_by": snap.serving, "snapshot": snap.version}
        content, headers = encode_reply(service.spec, rid, parsed.outputs, logits, extra)
        metrics.request("ok", time.monotonic() - started, int(parsed.x.shape[0]))
        return Response(content, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, str(exc.detail))


def make_server_app(service: Service, token: str | None = None) -> Any:
    """The whole server's ASGI app over ``service`` (started and stopped by its lifespan),
    behind the page's checks (``token``: see :func:`eatta.annotate.server.guard`)."""
    p = _Protocol(service)
    page = make_page(service.state.queue, order=service.options.order)  # type: ignore[arg-type]
    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with page.router.lifespan_context(page):
            service.start()
            p.ready = True
            try:
                yield
            finally:
                p.ready = False
                await run_in_threadpool(service.stop)

    app = Starlette(
        routes=[
            Route("/v2", p.server, methods=["GET"]),
            Route("/v2/health/live", p.live, methods=["GET"]),
            Route("/v2/health/ready", p.health_ready, methods=["GET"]),
            Route(model, p.metadata, methods=["GET"]),
            Route(versioned, p.metadata, methods=["GET"]),
            Route(model + "/ready", p.model_ready, methods=["GET"]),
            Route(versioned + "/ready", p.model_ready, methods=["GET"]),
            Route(model + "/infer", p.infer, methods=["POST"]),
            Route(versioned + "/infer", p.infer, methods=["POST"]),
            Route("/metrics", p.metrics, methods=["GET"]),
            Mount("/", app=page),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    size = max_infer_body(service.spec.sample_shape, service.spec.max_rows)
    return guard(app, token, bodies=[BodyRule("/v2/", size, INFER_TYPES)])
