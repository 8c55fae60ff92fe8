"""The ASGI app of ``isan-serve``: parse, call :class:`~isan.engine.serve.service.Service`, format.

Endpoints (each in the OpenAPI schema at ``/openapi.json``, rendered at ``/docs``):

* ``GET /healthz``: ``{"status": "loading" | "ready" | "failed", "model": {...}, "server": {limits,
  load}}`` (200 when ready, 503 otherwise).
* ``GET /metrics``: Prometheus metrics (:mod:`isan.engine.serve.metrics`).
* ``POST /v1/score``: one text -> ``{"chars", "bits", "bpc", "normalization", "scoring"}`` (+
  ``per_char_bits``, ``per_char_offsets``; ``total_*`` when continuing a ``state`` or returning
  one; ``state``; ``next``).
* ``POST /v1/score/batch``: ``{"texts": [...]}`` -> one result per text and the totals.
* ``POST /v1/next``: the top-k next characters (``symbol``, ``prob``, ``bits``) after a text
  and/or a snapshot.
* ``POST /v1/sample``: generated text, streamed as Server-Sent Events (or one JSON answer).
* ``POST /v1/attribute``: exact attribution of the logits to each character or word (kappa),
  with the check that they sum to the logits.
* ``POST /v1/explain``: the prediction at one offset of a text explained: the attribution of a chosen
  target (logit, log-probability, difference of two logits) and the truncated-history curve
  (:mod:`isan.engine.serve.lens`).
* ``GET /``: isan lens, the web page that shows what the model reads (``static/``; ``--no-ui``
  turns it off).
* ``POST /v1/completions``, ``GET /v1/models``, ``GET /tokenizer_info``, ``POST /tokenize``,
  ``POST /detokenize``: the OpenAI-compatible API (:mod:`isan.engine.serve.completions`), as vLLM
  and the llama.cpp server offer it; its errors have OpenAI's shape.
* WebSocket ``/v1/stream``: JSON frames ``{"text": chunk, ...the options of /v1/score...}``,
  ``{"reset": true}``, ``{"restore": snapshot}``, ``{"snapshot": true}`` (combinable: reset or
  restore first, then the text, then the snapshot); each answer has the frame's fields and the
  running ``total_chars``, ``total_bits``, ``total_bpc``. Answers come in frame order; a bad frame
  gets ``{"error", "status"}`` and leaves the stream's state as it was.

The app is built as vLLM builds its server (``build_app``): the routes
(:mod:`isan.engine.serve.routes`, each a few lines that parse and hand off to the
:class:`~isan.engine.serve.service.Service`), the WebSocket (:mod:`isan.engine.serve.websocket`) and
their declarations in the schema (:mod:`isan.engine.serve.openapi`) live in modules of their own;
:func:`create_app` puts them together. The ``/v1`` routes are plain ASGI handlers in front of
FastAPI (:class:`IsanApp`, :mod:`isan.engine.serve.asgi`): FastAPI declares them (the schema,
``/docs``, 404 and 405) but does not sit on their path, where its routing and middleware took more
of the event loop than the handlers themselves. Every 4xx and 5xx, 404 and 405 included, is
``{"error": message, "status": code, ...}`` (on the OpenAI-compatible paths ``{"error": {"message",
"type", "param", "code"}}``); no traceback and no NaN reaches a client.

A WebSocket whose handshake carries an ``Origin`` (a browser's) is refused (403, code 1008) unless
that origin is the server's own, a loopback one, or one of ``--allow-origin``; a request or
handshake whose ``Host`` is not one of the server's names is refused with 403
(:mod:`isan.engine.serve.access` says why).
"""

from __future__ import annotations

import asyncio
import logging
import os
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from isan.engine.serve import openapi, routes
from isan.engine.serve.access import authorized, host_error, host_refused, hosts_error, key_error
from isan.engine.serve.asgi import send_json
from isan.engine.serve.completions import Completions, openai_error, openai_path, unserved_message
from isan.engine.serve.config import DEFAULT_MAX_CHARS, ServeConfig
from isan.engine.serve.errors import RequestError
from isan.engine.serve.metrics import MULTIPROC_ENV, Metrics
from isan.engine.serve.model_info import ModelInfo
from isan.engine.serve.schemas import HealthResponse, build_schemas
from isan.engine.serve.service import Service, encode_json
from isan.engine.serve.websocket import StreamEndpoint

log = logging.getLogger(__name__)

JSON = "application/json"
ENDPOINTS = ("GET /healthz, GET /metrics, POST /v1/score, POST /v1/score/batch, POST /v1/next, POST /v1/sample, "
             "POST /v1/attribute, POST /v1/explain, POST /v1/completions, GET /v1/models, GET /tokenizer_info, POST /tokenize, "
             "POST /detokenize, WebSocket /v1/stream, GET /docs, GET /openapi.json")
#: appended to :data:`ENDPOINTS` in 404 messages where the lens page is served (not with ``--no-ui``)
LENS_ENDPOINT = ", GET / (the lens page)"


class IsanApp:
    """The server's ASGI app: the ``/v1`` handlers, then FastAPI for everything else.

    Attributes:
        fastapi: the FastAPI app (schema, docs, health, metrics, 404 and 405).
        state: ``fastapi.state`` (``service``, ``metrics``).
    """

    def __init__(self, fastapi: FastAPI, http_routes: dict, ws_routes: dict, service: Service, api_key: str | None):
        self.fastapi = fastapi
        self.state = fastapi.state
        self.service = service
        self._http = http_routes
        self._ws = ws_routes
        # compared in its UTF-8 bytes (a key file is read as UTF-8; surrogateescape: an environment's undecodable bytes)
        self._key = api_key.encode("utf-8", "surrogateescape") if api_key else None
        self._protected = {path for _, path in http_routes} | set(ws_routes) | {"/metrics"}

    def openapi(self) -> dict:
        return self.fastapi.openapi()

    async def __call__(self, scope, receive, send) -> None:
        typ = scope["type"]
        if typ == "http":
            path = scope["path"]
            handler = self._http.get((scope["method"], path))
            e = hosts_error(scope)
            host = host_refused(scope, self.service.config.allow_hosts) if e is None else None
            if e is not None or host is not None:
                self.state.metrics.rejected.labels("host").inc()
                e = e or host_error(host)
                await send_json(send, e.status, encode_json(openai_error(e) if openai_path(path) else e.body()),
                                {"Connection": "close"})
                return
            if path in self._protected and not authorized(scope, self._key):
                e = key_error()
                body = openai_error(e) if openai_path(path) else e.body()
                await send_json(send, e.status, encode_json(body), e.headers)
                return
            if handler is not None:
                await handler(scope, receive, send)
                return
        elif typ == "websocket":
            handler = self._ws.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send, authorized(scope, self._key))
                return
        await self.fastapi(scope, receive, send)

    def uvicorn_config(self, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", **kwargs):
        """A ``uvicorn.Config`` for this app with the server's connection limits
        (:mod:`isan.engine.serve.connections`) and timeouts."""
        import uvicorn

        from isan.engine.serve.connections import uvicorn_options

        return uvicorn.Config(self, host=host, port=port, log_level=log_level,
                              **uvicorn_options(self.service.config), **kwargs)


def create_app(engine=None, max_chars: int = DEFAULT_MAX_CHARS, config: ServeConfig | None = None, *,
               loader: Callable[[], object] | None = None, info: ModelInfo | None = None,
               on_load_failed: Callable[[str], None] | None = None) -> IsanApp:
    """The ASGI app serving ``engine`` (an :class:`isan.engine.Engine` or an engine with its API).

    Args:
        max_chars: the largest text (ignored when ``config`` is given).
        config: every limit (:class:`ServeConfig`); default ``ServeConfig(max_chars=max_chars)``.
        loader: instead of ``engine``: a function that loads it, called in a worker thread when the
            server starts; ``/healthz`` says ``"loading"`` (and the ``/v1`` endpoints 503) until it
            returns. Needs ``info`` (:meth:`ModelInfo.of_manifest`).
        on_load_failed: called with the message when ``loader`` raises (the CLI stops the server).
    Raises:
        ValueError: neither or both of ``engine`` and ``loader``.
    """
    from isan.engine.normalize import choices
    from isan.engine.serve.lens import TEXT_FACTOR, build_request as explain_request

    config = config or ServeConfig(max_chars=max_chars)
    if (engine is None) == (loader is None):
        raise ValueError("give an engine or a loader")
    metrics = Metrics(os.environ.get(MULTIPROC_ENV) if config.workers > 1 else None)
    service = Service(engine, config, metrics, info=info)
    schemas = build_schemas(service.symbols, config.max_chars, choices(), service.info.raw_normalize,
                            config.max_batch_texts, config.max_sample_chars, config.max_attribute_chars)
    explain_chars = min(config.max_chars, TEXT_FACTOR * config.max_attribute_chars)
    api = routes.Api(service, schemas, explain_request(service.symbols, explain_chars, choices(),
                                                       service.info.raw_normalize),
                     explain_chars, Completions(service, config, metrics, config.model_name))

    async def load() -> None:
        try:
            eng = await asyncio.to_thread(loader)
            service.attach(eng)
            log.info("model loaded in %.1f s", service.load_seconds)
        except Exception as e:  # noqa: BLE001 - reported on /healthz and to the CLI
            msg = str(e) or type(e).__name__
            log.error("the model could not be loaded: %s", msg)
            service.fail(msg)
            if on_load_failed is not None:
                on_load_failed(msg)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.ensure_future(load()) if loader is not None else None
        yield
        if task is not None and not task.done():
            task.cancel()
        await asyncio.to_thread(service.close)

    fa = FastAPI(title="isan-serve", version=openapi.package_version(), description=openapi.DESCRIPTION,
                 docs_url=None, redoc_url=None, lifespan=lifespan)
    fa.state.service = service
    fa.state.metrics = metrics
    add_fastapi_routes(fa, service)
    http_routes = routes.handlers(api)
    stream = StreamEndpoint(service, schemas)
    openapi.declare(fa, api, http_routes, stream)
    app = IsanApp(fa, http_routes, {"/v1/stream": stream}, service, config.api_key)
    if config.api_key:
        openapi.add_security(fa, app._protected)
    return app


def add_fastapi_routes(fa: FastAPI, service: Service) -> None:
    """What FastAPI answers itself: ``/healthz``, ``/metrics``, the lens page, ``/docs``, and every
    error it raises (404, 405, a plain HTTP request to the WebSocket: 426) in the API's error shape."""
    config, metrics = service.config, service.metrics

    def error_response(e: RequestError, openai: bool = False) -> Response:
        body = openai_error(e) if openai else e.body()
        return Response(encode_json(body), status_code=e.status, media_type=JSON, headers=e.headers or None)

    @fa.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        path, method = request.url.path, request.method
        if path == "/v1/stream":
            e = RequestError(426, "/v1/stream is a WebSocket endpoint: connect with a WebSocket client "
                                  "(ws://HOST:PORT/v1/stream) and send JSON frames like {\"text\": \"...\"}")
            return error_response(e)
        if exc.status_code == 404:
            msg = unserved_message(method, path) or (f"there is no {method} {path}; the endpoints are {ENDPOINTS}"
                                                     f"{LENS_ENDPOINT if config.ui else ''}")
        elif exc.status_code == 405:
            allow = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "?")
            msg = f"{method} is not allowed on {path}; allowed: {allow}"
        else:
            msg = str(exc.detail)
        return error_response(RequestError(exc.status_code, msg, headers=exc.headers), openai=openai_path(path))

    @fa.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):  # pragma: no cover - no route declares params
        return error_response(RequestError(400, "bad request: check the fields against GET /openapi.json"))

    @fa.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(RequestError(500, "internal error; the server log has the details"))

    @fa.get("/healthz", response_model=HealthResponse, responses=openapi.error_responses(403, 405, 503))
    async def healthz():
        """Whether the model is loaded (`ready`), and the server's limits and load."""
        body = service.health()
        status = 200 if body["status"] == "ready" else 503
        headers = {"Retry-After": "2"} if body["status"] == "loading" else None
        return Response(encode_json(body), status_code=status, media_type=JSON, headers=headers)

    @fa.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}},
                                                            **openapi.error_responses(401, 403, 405)})
    async def metrics_endpoint():
        """Prometheus metrics: requests, characters, queue depth, latency histograms."""
        metrics.pending_bytes.set(service.budget.used)
        metrics.pending_jobs.set(service.scheduler.pending if service.scheduler else 0)
        return Response(metrics.render(), media_type=metrics.content_type)

    if config.ui:
        from isan.engine.serve.lens import static_file

        page_headers = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                                   "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                                                   "form-action 'none'; frame-ancestors 'none'",
                        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                        "Cache-Control": "no-cache"}

        def page_file(name: str) -> Response:
            found = static_file(name)
            if found is None:
                return error_response(RequestError(404, f"there is no page file {name!r}; the lens page is at /"))
            return Response(found[0], media_type=found[1], headers=page_headers)

        @fa.get("/", include_in_schema=False)
        async def lens_page():
            return page_file("index.html")

        @fa.get("/lens/{name}", include_in_schema=False)
        async def lens_file(name: str):
            return page_file(name)

    if config.docs:
        @fa.get("/docs", include_in_schema=False)
        async def docs():
            from isan.engine.serve.docs import render_docs

            return HTMLResponse(render_docs(fa.openapi()))
