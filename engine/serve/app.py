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

The ``/v1`` endpoints are plain ASGI handlers in front of FastAPI (:class:`IsanApp`): FastAPI
declares them (the schema, ``/docs``, 404 and 405) but does not sit on their path, where its
routing and middleware took more of the event loop than the handlers themselves. Every 4xx and
5xx, 404 and 405 included, is ``{"error": message, "status": code, ...}`` (on the OpenAI-compatible
paths ``{"error": {"message", "type", "param", "code"}}``); no traceback and no NaN reaches a client.

A WebSocket whose handshake carries an ``Origin`` (a browser's) is refused (403, code 1008) unless
that origin is the server's own, a loopback one, or one of ``--allow-origin``: without an API key,
a web page could otherwise use the server through its visitors' browsers. A request or handshake
whose ``Host`` is not one of the server's names (:func:`host_refused`: loopback ones, the address
the connection came in on when that is not loopback, ``--allow-host``) is refused with 403: a page
that rebinds its own DNS name to the server's address would otherwise be the server's own origin.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import logging
import time
from contextlib import asynccontextmanager
from typing import Callable
from urllib.parse import parse_qs, urlsplit

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.websockets import WebSocketDisconnect

from isan.engine.serve.budget import Reservation
from isan.engine.serve.completions import (PATHS as OPENAI_PATHS, CompletionResponse, Completions, DetokenizeResponse,
                                           ModelList, OpenAIError, TokenizeResponse, TokenizerInfo, openai_error)
from isan.engine.serve.config import DEFAULT_MAX_CHARS, ServeConfig, host_name
from isan.engine.serve.errors import RequestError, busy
from isan.engine.serve.metrics import Metrics
from isan.engine.serve.models import (AttributeResponse, BatchResponse, ErrorResponse, HealthResponse, NextResponse,
                                      SampleResponse, ScoreResponse, build_models, parse)
from isan.engine.serve.service import Client, ClientGone, ModelInfo, Service, encode_json

log = logging.getLogger(__name__)

JSON = "application/json"
#: answers with more per-character numbers than this are encoded in a worker thread
ENCODE_INLINE_CHARS = 50_000
#: characters of the first Server-Sent Event of a sample, and of each later one
SAMPLE_FIRST_PIECE, SAMPLE_PIECE = 16, 64
ENDPOINTS = ("GET /healthz, GET /metrics, POST /v1/score, POST /v1/score/batch, POST /v1/next, POST /v1/sample, "
             "POST /v1/attribute, POST /v1/explain, POST /v1/completions, GET /v1/models, GET /tokenizer_info, POST /tokenize, "
             "POST /detokenize, WebSocket /v1/stream, GET /docs, GET /openapi.json")
#: appended to :data:`ENDPOINTS` in 404 messages where the lens page is served (not with ``--no-ui``)
LENS_ENDPOINT = ", GET / (the lens page)"

DESCRIPTION = """Score, predict, sample and attribute text with an Input Switched Affine Network, in bits.

All texts of all requests and stream frames are scored by one scheduler that batches the pending
work of every client into rounds (continuous batching). Limits (see `GET /healthz`): texts up to
`max_chars` characters; request data held at once up to `max_pending_mb` (503 with `Retry-After`
beyond); `request_timeout_s` per text (503); headers and body each within `read_timeout_s` (408);
`max_connections` HTTP connections and `max_streams` streams (503). Request bodies are JSON sent
with `Content-Type: application/json` (415 otherwise), each key once (422 otherwise). Errors are
always `{"error", "status", ...}`, the message saying what to fix: 400 for a request this schema
refuses (a text outside the alphabet read raw is 422, with its offset), 422 for text the model
cannot score. A request whose `Host` is not one of the server's names (`localhost`, a loopback
address, any IP address on a connection to another address, `--allow-host`) is 403.

Scores are in bits (`bits`, `bpc`) and, as `isan score --json` gives it, `nnl`: the mean negative
log-likelihood in base V, the alphabet's size (`bpc / log2(V)`); running totals have `total_*`.

**WebSocket `/v1/stream`** (not described by OpenAPI): send JSON frames `{"text": "chunk"}` (with the
options of `POST /v1/score`), `{"reset": true}`, `{"restore": "<snapshot>"}`, `{"snapshot": true}`;
each answer carries the chunk's `chars`, `bits`, `bpc` and the running `total_chars`, `total_bits`,
`total_bpc`. The state is carried across frames, so chunking never changes the bits. A bad frame is
answered `{"error", "status"}` and the stream's state kept.

**State snapshots**: `"return_state": true` (or `{"snapshot": true}` on a stream) answers `state`, a
signed token of the state and the running totals; `"state"` (or `{"restore": ...}`) continues from it.
A changed token is refused with 403, one of another model with 409.

**OpenAI-compatible API** (as vLLM and the llama.cpp server offer it): `POST /v1/completions` scores
(`echo`, `logprobs`, `max_tokens: 0`) and generates text; `GET /v1/models`; `GET /tokenizer_info`,
`POST /tokenize`, `POST /detokenize` (lm-evaluation-harness's remote tokenizer). Tokens are the model's
symbols (token id V, `<|endoftext|>`, may start a prompt: the initial state); log-probs are natural logs;
errors are `{"error": {"message", "type", "param", "code"}}`.
"""


def package_version() -> str:
    """The installed ``isan`` package's version (``/docs``, ``/openapi.json``): its metadata, else
    ``isan.__version__`` when it runs from a source tree that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("isan")
    except PackageNotFoundError:  # pragma: no cover - the tests run on an installed package
        import isan

        return isan.__version__


def _error_responses(*codes: int, model=None) -> dict:
    what = {400: "bad request (the message names the field)", 401: "a missing or wrong API key",
            403: "a snapshot changed or signed by another server, or a Host that is not one of the server's names "
                 "(--allow-host)", 404: "no such endpoint", 405: "method not allowed",
            408: "the headers or body were too slow to arrive", 409: "a snapshot of another model",
            413: "text or body over the limit", 415: "a body not sent as Content-Type: application/json",
            422: "text the model cannot score (characters outside its alphabet, nothing left after normalisation, "
                 "a diverging state), or a key given twice",
            426: "a WebSocket endpoint", 500: "internal error",
            503: "busy, loading or timed out: retry after Retry-After"}
    return {c: {"model": model or ErrorResponse, "description": what.get(c, "error")} for c in codes}


class IsanApp:
    """The server's ASGI app: the ``/v1`` handlers, then FastAPI for everything else.

    Attributes:
        fastapi: the FastAPI app (schema, docs, health, metrics, 404 and 405).
        state: ``fastapi.state`` (``service``, ``metrics``).
    """

    def __init__(self, fastapi: FastAPI, http_routes: dict, ws_routes: dict, service: Service, api_key: str | None,
                 openai_paths: tuple[str, ...] = ()):
        self.fastapi = fastapi
        self.state = fastapi.state
        self.service = service
        self._http = http_routes
        self._ws = ws_routes
        # compared in its UTF-8 bytes (a key file is read as UTF-8; surrogateescape: an environment's undecodable bytes)
        self._key = api_key.encode("utf-8", "surrogateescape") if api_key else None
        self._protected = {path for _, path in http_routes} | set(ws_routes) | {"/metrics"}
        self._openai = set(openai_paths)

    def openapi(self) -> dict:
        return self.fastapi.openapi()

    def _authorized(self, scope) -> bool:
        if self._key is None:
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                if hmac.compare_digest(value[7:].strip(), self._key):
                    return True
            elif name == b"x-api-key" and hmac.compare_digest(value.strip(), self._key):
                return True
        if scope["type"] == "websocket" and scope.get("query_string"):
            # latin-1 both ways keeps every byte: the percent-decoded bytes are compared, whatever they are
            for v in parse_qs(scope["query_string"].decode("latin-1"), encoding="latin-1").get("api_key", []):
                if hmac.compare_digest(v.encode("latin-1"), self._key):
                    return True
        return False

    async def __call__(self, scope, receive, send) -> None:
        typ = scope["type"]
        if typ == "http":
            path = scope["path"]
            handler = self._http.get((scope["method"], path))
            host = host_refused(scope, self.service.config.allow_hosts)
            if host is not None:
                self.state.metrics.rejected.labels("host").inc()
                e = host_error(host)
                await send_json(send, e.status, encode_json(openai_error(e) if path in self._openai else e.body()),
                                {"Connection": "close"})
                return
            if path in self._protected and not self._authorized(scope):
                e = RequestError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY' or "
                                      "'X-API-Key: KEY'", headers={"WWW-Authenticate": 'Bearer realm="isan"',
                                                                   "Connection": "close"})
                body = openai_error(e) if path in self._openai else e.body()
                await send_json(send, e.status, encode_json(body), e.headers)
                return
            if handler is not None:
                await handler(scope, receive, send)
                return
        elif typ == "websocket":
            handler = self._ws.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send, self._authorized(scope))
                return
        await self.fastapi(scope, receive, send)

    def uvicorn_config(self, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", **kwargs):
        """A ``uvicorn.Config`` for this app with the server's connection limits
        (:mod:`isan.engine.serve.protocol`) and timeouts."""
        import uvicorn

        from isan.engine.serve.protocol import protocol_class, ws_protocol_class

        cfg = self.service.config
        http = protocol_class(cfg.max_connections, cfg.read_timeout_s)
        extra = {"http": http} if http is not None else {"limit_concurrency": cfg.max_connections + cfg.max_streams}
        ws = ws_protocol_class()
        if ws is not None:
            extra["ws"] = ws
        # frames up to a MiB over the limit are read and answered 413; larger ones close the stream with
        # 1009 (message too big), as the WebSocket protocol has it
        return uvicorn.Config(self, host=host, port=port, log_level=log_level, ws_max_size=cfg.max_body_bytes + 2**20,
                              ws_per_message_deflate=False, timeout_keep_alive=cfg.keep_alive_s, proxy_headers=False,
                              server_header=False, **extra, **kwargs)


async def send_json(send, status: int, body: bytes, headers: dict | None = None) -> None:
    hs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    hs += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body})


def check_json_body(scope) -> None:
    """415 unless the request declares its body ``Content-Type: application/json`` (parameters such
    as ``charset`` aside). The types a browser may send from any page without asking the server
    first (text/plain, forms) are refused, so a page cannot make a visitor's browser use a server
    that has no API key."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            if value.split(b";", 1)[0].strip().lower() == b"application/json":
                return
            got = value.decode("latin-1")[:80]
            break
    else:
        got = None
    raise RequestError(415, f"the body must be JSON sent with the header 'Content-Type: application/json'; "
                            f"{'it came as ' + repr(got) if got is not None else 'the request has no Content-Type'}")


async def read_body(scope, receive, res: Reservation, config: ServeConfig) -> bytes:
    """The request body, its bytes reserved in the budget as they arrive: 413 over
    ``max_body_bytes``, 503 if the budget is full, 408 if it does not arrive within
    ``read_timeout_s`` (the connection is then closed), ClientGone if the client leaves."""
    limit = config.max_body_bytes
    declared = None
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            declared = value
            break
    if declared is not None and declared.isdigit():
        n = int(declared)
        if n > limit:
            raise RequestError(413, f"the body has {n:,} bytes; the limit is {limit:,} (6 bytes a character of "
                                    "--max-chars); split the text, or use /v1/stream", headers={"Connection": "close"})
        if n > res.budget.limit:
            raise RequestError(413, f"the body has {n:,} bytes, more than the server's memory for pending requests "
                                    "(--max-pending-mb); split the text, or use /v1/stream", headers={"Connection": "close"})
        if not res.grow(n):
            raise busy("the server is busy: no room for this request's body within --max-pending-mb; retry shortly")
    parts = []
    size = 0
    try:
        async with asyncio.timeout(config.read_timeout_s):
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    raise ClientGone()
                part = msg.get("body", b"")
                if part:
                    size += len(part)
                    if size > limit:
                        raise RequestError(413, f"the body exceeds {limit:,} bytes (6 bytes a character of --max-chars); "
                                                "split the text, or use /v1/stream", headers={"Connection": "close"})
                    if size > res.bytes and not res.grow(size - res.bytes):
                        raise busy("the server is busy: no room for this request's body within --max-pending-mb; "
                                   "retry shortly")
                    parts.append(part)
                if not msg.get("more_body"):
                    break
    except TimeoutError:
        raise RequestError(408, f"the request body did not arrive within {config.read_timeout_s:g} s (--read-timeout); "
                                f"{size:,} bytes came; the connection is closed", headers={"Connection": "close"}) from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _watch_disconnect(receive, client: Client) -> None:
    """``client.leave()`` when the client disconnects (the body has been read, so the next message is that)."""
    try:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                client.leave()
                return
    except asyncio.CancelledError:
        raise
    except Exception:  # pragma: no cover - a server without disconnect messages
        return


class _SSE:
    """A handler's answer that is a stream of Server-Sent Events: ``events`` yields (event, data dict)."""

    def __init__(self, events, named: bool = True):
        self.events = events
        #: False: OpenAI's form, ``data: {json}`` events ending with ``data: [DONE]``
        self.named = named


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
    """
    from isan.engine.normalize import choices

    config = config or ServeConfig(max_chars=max_chars)
    if (engine is None) == (loader is None):
        raise ValueError("give an engine or a loader")
    metrics = Metrics()
    service = Service(engine, config, metrics, info=info)
    models = build_models(service.symbols, config.max_chars, choices(), service.info.raw_normalize,
                          config.max_batch_texts, config.max_sample_chars, config.max_attribute_chars)
    from isan.engine.serve.lens import TEXT_FACTOR, ExplainResponse, build_request as explain_request

    explain_chars = min(config.max_chars, TEXT_FACTOR * config.max_attribute_chars)
    explain_model = explain_request(service.symbols, explain_chars, choices(), service.info.raw_normalize)
    explain_lock = asyncio.Lock()

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

    fa = FastAPI(title="isan-serve", version=package_version(), description=DESCRIPTION, docs_url=None,
                 redoc_url=None, lifespan=lifespan)
    fa.state.service = service
    fa.state.metrics = metrics

    def error_response(e: RequestError, endpoint: str | None = None, openai: bool = False) -> Response:
        if endpoint is not None:
            metrics.requests.labels(endpoint, str(e.status)).inc()
        body = openai_error(e) if openai else e.body()
        return Response(encode_json(body), status_code=e.status, media_type=JSON, headers=e.headers or None)

    # ---- one error shape for everything FastAPI answers ------------------------------------
    @fa.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        path, method = request.url.path, request.method
        if path == "/v1/stream":
            e = RequestError(426, "/v1/stream is a WebSocket endpoint: connect with a WebSocket client "
                                  "(ws://HOST:PORT/v1/stream) and send JSON frames like {\"text\": \"...\"}")
            return error_response(e)
        if exc.status_code == 404:
            msg = f"there is no {method} {path}; the endpoints are {ENDPOINTS}{LENS_ENDPOINT if config.ui else ''}"
        elif exc.status_code == 405:
            allow = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "?")
            msg = f"{method} is not allowed on {path}; allowed: {allow}"
        else:
            msg = str(exc.detail)
        return error_response(RequestError(exc.status_code, msg, headers=exc.headers), openai=path in OPENAI_PATHS)

    @fa.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):  # pragma: no cover - no route declares params
        return error_response(RequestError(400, "bad request: check the fields against GET /openapi.json"))

    @fa.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(RequestError(500, "internal error; the server log has the details"))

    # ---- FastAPI endpoints ----------------------------------------------------------------
    @fa.get("/healthz", response_model=HealthResponse, responses=_error_responses(403, 405, 503))
    async def healthz():
        """Whether the model is loaded (`ready`), and the server's limits and load."""
        body = service.health()
        status = 200 if body["status"] == "ready" else 503
        headers = {"Retry-After": "2"} if body["status"] == "loading" else None
        return Response(encode_json(body), status_code=status, media_type=JSON, headers=headers)

    @fa.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}},
                                                            **_error_responses(401, 403, 405)})
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

    # ---- the /v1 handlers (plain ASGI, see the module docstring) ----------------------------
    async def run_http(scope, receive, send, endpoint: str, work, openai: bool = False) -> None:
        """Read the body, call ``work(raw, client, res)`` and send its answer (a dict as JSON, or
        Server-Sent Events); every error becomes one JSON error answer."""
        t0 = time.perf_counter()
        client = Client()
        watcher = None
        error = None
        try:
            with Reservation(service.budget) as res:  # given back however the request ends
                try:
                    check_json_body(scope)
                    raw = await read_body(scope, receive, res, config)
                    watcher = asyncio.ensure_future(_watch_disconnect(receive, client))
                    out = await work(raw, client, res)
                    if not isinstance(out, _SSE):
                        big = out.get("chars", 0) > ENCODE_INLINE_CHARS
                        out = await asyncio.to_thread(encode_json, out) if big else encode_json(out)
                except RequestError as e:
                    error = e
                except ClientGone:
                    metrics.requests.labels(endpoint, "499").inc()
                    return
                except Exception:
                    log.exception("unhandled error in %s", endpoint)
                    error = RequestError(500, "internal error; the server log has the details")
                else:
                    if isinstance(out, _SSE):
                        await _send_events(send, out, client)
                    else:
                        await send_json(send, 200, out)
            if error is not None:  # sent once its reservation is given back
                metrics.requests.labels(endpoint, str(error.status)).inc()
                await send_json(send, error.status, encode_json(openai_error(error) if openai else error.body()),
                                error.headers)
                return
            metrics.requests.labels(endpoint, "200").inc()
            metrics.request_seconds.labels(endpoint).observe(time.perf_counter() - t0)
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _send_events(send, sse: _SSE, client: Client) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                                (b"x-accel-buffering", b"no")]})
        async for event, data in sse.events:
            if client.gone:
                break
            try:
                payload = encode_json(data)
            except Exception:  # a bug (a non-finite number): the stream ends with an error event
                log.exception("encoding a %s event failed", event)
                err = RequestError(500, "internal error; the server log has the details")
                event, payload = "error", encode_json(err.body() if sse.named else openai_error(err))
            head = b"event: " + event.encode() + b"\n" if sse.named else b""
            await send({"type": "http.response.body", "more_body": True, "body": head + b"data: " + payload + b"\n\n"})
            if event == "error":
                break
        else:
            if not sse.named and not client.gone:
                await send({"type": "http.response.body", "more_body": True, "body": b"data: [DONE]\n\n"})
        await send({"type": "http.response.body", "body": b""})

    def handler(endpoint: str, work, openai: bool = False):
        async def h(scope, receive, send):
            await run_http(scope, receive, send, endpoint, work, openai)

        return h

    def get_handler(endpoint: str, answer):
        """A GET endpoint of the OpenAI-compatible API: ``answer()`` as JSON (errors in OpenAI's shape)."""
        async def h(scope, receive, send):
            try:
                out = answer()
            except RequestError as e:
                metrics.requests.labels(endpoint, str(e.status)).inc()
                await send_json(send, e.status, encode_json(openai_error(e)), e.headers)
                return
            metrics.requests.labels(endpoint, "200").inc()
            await send_json(send, 200, encode_json(out))

        return h

    async def score_work(raw, client, res):
        service.ready()
        req = parse(models.score, raw, models.allowed(models.score), config.max_chars)
        state = service.restore(req.state) if req.state is not None else None
        out, new_state = await service.score_text(req.text, state, state is not None, req, res, client)
        if state is not None or req.return_state:
            out.update(service.totals(new_state))
        if req.return_state:
            out["state"] = service.snapshot(new_state)
        if req.top_k:
            out["next"] = service.next_chars(new_state, req.top_k)
        return out

    async def batch_work(raw, client, res):
        service.ready()
        req = parse(models.batch, raw, models.allowed(models.batch), config.max_chars)
        return await service.score_many(req.texts, req, res, client)

    async def next_work(raw, client, res):
        service.ready()
        req = parse(models.next, raw, models.allowed(models.next), config.max_chars)
        return await service.next_after(req, res, client)

    async def attribute_work(raw, client, res):
        service.ready()
        req = parse(models.attribute, raw, models.allowed(models.attribute), config.max_chars)
        return await service.attribute(req, res)

    async def explain_work(raw, client, res):
        from isan.engine.serve.lens import explain

        eng = service.ready()
        req = parse(explain_model, raw, tuple(explain_model.model_fields), explain_chars)
        window = config.max_attribute_chars
        service._reserve(res, 8 * (len(req.text) + 64) * (len(service.symbols) + 4))
        async with explain_lock:
            return await asyncio.to_thread(explain, eng, req, window)

    async def sample_work(raw, client, res):
        service.ready()
        req = parse(models.sample, raw, models.allowed(models.sample), config.max_chars)
        if req.temperature is not None and req.inverse_temperature is not None:
            raise RequestError(400, 'give "temperature" or "inverse_temperature", not both')
        if len(req.prompt) > PREPARE_INLINE:
            smp = await asyncio.to_thread(service.sampler, req)
        else:
            smp = service.sampler(req)

        def finish() -> dict:
            out = smp.result()
            st = smp.final_state()
            if st is not None:
                out.update(service.totals(st))
                if req.return_state:
                    out["state"] = service.snapshot(st)
            return out

        async def piece(k: int) -> str:
            try:
                p = await asyncio.to_thread(smp.next_piece, k) if k > 8 else smp.next_piece(k)
            except Exception as e:
                from isan.errors import IsanError
                from isan.engine.serve.errors import from_isan

                if isinstance(e, IsanError):
                    raise from_isan(e) from None
                raise
            metrics.sampled.inc(len(p))
            return p

        if not req.stream:
            k = SAMPLE_PIECE * 4
            while not smp.done:
                if client.gone:
                    raise ClientGone()
                await piece(k)
            return finish()

        async def events():
            k, offset = SAMPLE_FIRST_PIECE, 0
            while not smp.done:
                try:
                    p = await piece(k)
                except RequestError as e:
                    yield "error", e.body()
                    return
                except Exception:  # pragma: no cover - a bug: reported in the stream
                    log.exception("sampling failed")
                    yield "error", RequestError(500, "internal error; the server log has the details").body()
                    return
                yield "chars", {"text": p, "offset": offset}
                offset += len(p)
                k = SAMPLE_PIECE
            try:
                done = finish()
            except RequestError as e:  # a snapshot of running totals out of range
                yield "error", e.body()
                return
            yield "done", done

        return _SSE(events())

    # ---- the OpenAI-compatible API (isan.engine.serve.completions) ----
    oai = Completions(service, config, metrics, config.model_name)

    async def completions_work(raw, client, res):
        service.ready()
        m = oai.models
        try:
            req = parse(m.completion, raw, m.allowed(m.completion), config.max_chars)
        except RequestError as e:
            oai.check_model(raw)  # 404 for a model this server does not serve, as OpenAI answers
            raise e from None
        out = await oai.complete(req, res, client)
        return _SSE(out, named=False) if req.stream else out

    async def tokenize_work(raw, client, res):
        service.ready()
        m = oai.models
        return oai.tokenize(parse(m.tokenize, raw, m.allowed(m.tokenize), config.max_chars))

    async def detokenize_work(raw, client, res):
        service.ready()
        m = oai.models
        return oai.detokenize(parse(m.detokenize, raw, m.allowed(m.detokenize), config.max_chars))

    def ready_then(f):
        def answer():
            service.ready()
            return f()
        return answer

    http_routes = {("POST", "/v1/completions"): handler("completions", completions_work, openai=True),
                   ("POST", "/tokenize"): handler("tokenize", tokenize_work, openai=True),
                   ("POST", "/detokenize"): handler("detokenize", detokenize_work, openai=True),
                   ("GET", "/v1/models"): get_handler("models", ready_then(oai.model_list)),
                   ("GET", "/tokenizer_info"): get_handler("tokenizer_info", ready_then(oai.tokenizer_info)),
                   ("POST", "/v1/score"): handler("score", score_work),
                   ("POST", "/v1/score/batch"): handler("batch", batch_work),
                   ("POST", "/v1/next"): handler("next", next_work),
                   ("POST", "/v1/sample"): handler("sample", sample_work),
                   ("POST", "/v1/attribute"): handler("attribute", attribute_work),
                   ("POST", "/v1/explain"): handler("explain", explain_work)}

    # ---- the same endpoints declared to FastAPI (the schema; and they work if called through it) ----
    def body_schema(model) -> dict:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schema["additionalProperties"] = False
        return {"requestBody": {"required": True, "content": {JSON: {"schema": schema}}}}

    def declare(path: str, model, response, summary: str, codes=(400, 401, 403, 408, 409, 413, 415, 422, 500, 503),
                extra_200: dict | None = None, error_model=None):
        route_handler = http_routes[("POST", path)]

        async def endpoint(request: Request):
            return _Raw(route_handler)

        ok = {"model": response, "description": summary}
        if extra_200:
            ok["content"] = extra_200
        fa.post(path, response_model=None, summary=summary, description=summary,
                responses={200: ok, **_error_responses(*codes, model=error_model)}, openapi_extra=body_schema(model),
                name=path.strip("/").replace("/", "_"))(endpoint)

    declare("/v1/score", models.score, ScoreResponse, "Score one text: its bits, and optionally each character's, "
            "the top-k next characters and a snapshot of the state")
    declare("/v1/score/batch", models.batch, BatchResponse, "Score many independent texts together (one result "
            "each); a text the model cannot score fails the request, naming it (texts[i])")
    declare("/v1/next", models.next, NextResponse, "The k most likely next characters, with probabilities and "
            "bits, after a text (scored) and/or a snapshot")
    declare("/v1/sample", models.sample, SampleResponse, "Generate text after a prompt. With \"stream\": true "
            "(default) the answer is Server-Sent Events: `chars` events {\"text\", \"offset\"} as characters are "
            "generated, then `done` with the data of the JSON answer (or `error` {\"error\", \"status\"})",
            extra_200={"text/event-stream": {"schema": {
                "type": "object", "required": ["event", "data"],
                "description": "one Server-Sent Event; data is JSON: chars {text, offset}, done (as the JSON answer), "
                               "error {error, status}",
                "properties": {"event": {"type": "string", "enum": ["chars", "done", "error"]},
                               "data": {"type": "string"}}}}})
    declare("/v1/attribute", models.attribute, AttributeResponse, "Exact attribution of the logits after each "
            "character to the initial state and to each earlier character or word (kappa, paper eqs. 4-6), with "
            "the check that they sum to the logits")

    declare("/v1/explain", explain_model, ExplainResponse, "The prediction at one offset of a text explained: the "
            "exact attribution of a target (the logit or log-probability of a symbol, or the difference of two "
            "logits) to the initial state and each earlier symbol or word, with the check that they sum to it, and "
            "the bits when only the last n symbols are kept (paper Fig 4c)")

    oai_codes = (400, 401, 403, 404, 408, 413, 415, 422, 500, 503)
    declare("/v1/completions", oai.models.completion, CompletionResponse, "OpenAI-compatible completions (as vLLM "
            "and llama.cpp): score a prompt (echo, logprobs, max_tokens 0) and generate after it. Tokens are the "
            "model's symbols; log-probs natural logs. With \"stream\": true, Server-Sent Events `data: {chunk}` "
            "ending with `data: [DONE]`", codes=oai_codes, error_model=OpenAIError,
            extra_200={"text/event-stream": {"schema": {
                "type": "object", "required": ["data"],
                "description": "one Server-Sent Event (no event name): data is a CompletionResponse with one choice's "
                               "piece, then `[DONE]`; an error ends the stream with {\"error\": {...}}",
                "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}})
    declare("/tokenize", oai.models.tokenize, TokenizeResponse, "The token ids of a text, as the model reads it "
            "(vLLM's /tokenize)", codes=oai_codes, error_model=OpenAIError)
    declare("/detokenize", oai.models.detokenize, DetokenizeResponse, "The text of token ids (vLLM's /detokenize)",
            codes=oai_codes, error_model=OpenAIError)

    def declare_get(path: str, response, summary: str):
        route_handler = http_routes[("GET", path)]

        async def endpoint(request: Request):
            return _Raw(route_handler)

        fa.get(path, response_model=None, summary=summary, description=summary,
               responses={200: {"model": response, "description": summary},
                          **_error_responses(401, 403, 405, 503, model=OpenAIError)},
               name=path.strip("/").replace("/", "_"))(endpoint)

    declare_get("/v1/models", ModelList, "The served model (OpenAI's model list)")
    declare_get("/tokenizer_info", TokenizerInfo, "The tokenizer: the model's symbols, and <|endoftext|> (token id "
                "V), which stands for the initial state (vLLM's /tokenizer_info)")

    @fa.websocket("/v1/stream")
    async def _declared_stream(ws: WebSocket):  # pragma: no cover - IsanApp routes streams to v1_stream
        await v1_stream(ws.scope, ws.receive, ws.send, True)

    # ---- WebSocket ----------------------------------------------------------------------
    async def v1_stream(scope, receive, send, authorized: bool) -> None:
        ws = WebSocket(scope, receive, send)
        refusal = None
        host = host_refused(scope, config.allow_hosts)
        origin = origin_refused(scope, config.allow_origins)
        if host is not None:
            metrics.rejected.labels("host").inc()
            refusal = host_error(host), 1008
        elif origin is not None:
            metrics.rejected.labels("origin").inc()
            refusal = RequestError(403, f"a WebSocket from the web page origin {origin!r} is refused: only the "
                                        "server's own origin and loopback ones are allowed; start the server with "
                                        f"--allow-origin {origin} to allow it"), 1008
        elif not authorized:
            refusal = RequestError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY' "
                                        "or 'X-API-Key: KEY', or connect to /v1/stream?api_key=KEY"), 1008
        elif service.engine is None:
            try:
                service.ready()
            except RequestError as e:
                refusal = e, 1013
        elif service.streams_open >= config.max_streams:
            metrics.rejected.labels("streams").inc()
            refusal = busy(f"the server has {service.streams_open} open streams, its limit (--max-streams); retry "
                           "shortly"), 1013
        if refusal is not None:
            try:
                await ws.accept()
                await ws.send_text(encode_json(refusal[0].body()).decode())
                await ws.close(code=refusal[1])
            except (WebSocketDisconnect, RuntimeError, OSError):
                pass
            return
        await ws.accept()
        service.streams_open += 1
        metrics.streams_open.inc()
        queue: asyncio.Queue = asyncio.Queue(maxsize=config.max_stream_frames)
        client = Client()
        reader = asyncio.ensure_future(_read_frames(ws, queue, client, service, config))
        state = service.engine.initial_state()
        try:
            while True:
                if client.gone and queue.empty():
                    break
                try:
                    async with asyncio.timeout(config.stream_idle_timeout_s):
                        item = await queue.get()
                except TimeoutError:
                    e = RequestError(408, f"no frame for {config.stream_idle_timeout_s:g} s (--stream-idle-timeout); "
                                          "the stream is closed: open a new one, or restore a snapshot")
                    await ws.send_text(encode_json(e.body()).decode())
                    await ws.close(code=1001)
                    break
                if item is None:
                    break
                t0, raw, err, res = item
                with res:  # the frame's bytes are given back however its answer ends
                    try:
                        if err is not None:
                            raise err
                        out, state = await _frame(raw, state, res, client)
                        status = 200
                    except RequestError as e:
                        out, status = e.body(), e.status
                    except ClientGone:
                        break
                    except Exception:
                        log.exception("unhandled error in a stream frame")
                        out, status = RequestError(500, "internal error; the server log has the details").body(), 500
                    await ws.send_text(encode_json(out).decode())
                metrics.frames.labels(str(status)).inc()
                if status == 200:
                    metrics.frame_seconds.observe(time.perf_counter() - t0)
        except (WebSocketDisconnect, RuntimeError, OSError):  # the client left while we answered
            pass
        finally:
            client.leave()
            reader.cancel()  # a frame the reader holds is given back by the reader
            while not queue.empty():
                item = queue.get_nowait()
                if item is not None:
                    item[3].release()
            service.streams_open -= 1
            metrics.streams_open.dec()

    async def _frame(raw: str, state, res: Reservation, client: Client):
        frame = parse(models.frame, raw, models.allowed(models.frame), config.max_chars, what="frame")
        if frame.reset and frame.restore is not None:
            raise RequestError(400, 'a frame takes "reset" or "restore", not both')
        if frame.text is None and not (frame.reset or frame.restore is not None or frame.snapshot):
            raise RequestError(400, 'each frame needs "text", "reset", "restore" or "snapshot", like {"text": "..."}')
        out: dict = {}
        s = state
        if frame.reset:
            s = service.engine.initial_state()
            out["reset"] = True
        if frame.restore is not None:
            s = service.restore(frame.restore)
            out["restored"] = True
        if frame.text is not None:
            fields, s = await service.score_text(frame.text, s, True, frame, res, client)
            out.update(fields)
        out.update(service.totals(s))
        if frame.snapshot or frame.return_state:
            out["state"] = service.snapshot(s)
        if frame.top_k:
            out["next"] = service.next_chars(s, frame.top_k)
        return out, s

    app = IsanApp(fa, http_routes, {"/v1/stream": v1_stream}, service, config.api_key, OPENAI_PATHS)
    if config.api_key:
        _add_security(fa, app._protected)
    return app


_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


def _loopback_ip(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin_refused(scope, allowed: tuple[str, ...] = ()) -> str | None:
    """The ``Origin`` of a WebSocket handshake when it is refused, else None.

    Allowed: no ``Origin`` (a client that is not a browser), the server's own origin (its host and
    port are the ``Host`` header's), a loopback origin (``localhost``, ``127.0.0.0/8``, ``[::1]``),
    an origin in ``allowed`` (as the browser sends it, like ``https://app.example.com``) or ``*``
    in ``allowed``. A browser always sends ``Origin`` on a WebSocket and a page cannot change it.
    """
    origin = host = None
    for name, value in scope.get("headers", ()):
        if name == b"origin":
            origin = value.decode("latin-1").strip()
        elif name == b"host":
            host = value.decode("latin-1").strip().lower()
    if origin is None:
        return None
    if "*" in allowed or origin in allowed or origin.rstrip("/") in allowed:
        return None
    try:
        u = urlsplit(origin)
        oh = (u.hostname or "").lower()
        port = u.port
    except ValueError:
        return origin
    if u.scheme not in ("http", "https") or not oh:
        return origin
    if oh in _LOOPBACK or _loopback_ip(oh):
        return None
    if host is not None:
        default = 443 if u.scheme == "https" else 80
        netloc = oh if ":" not in oh else f"[{oh}]"
        if host in (f"{netloc}:{port or default}",) or (port in (None, default) and host == netloc):
            return None
    return origin


def _ip(text: str):
    """``text`` as an IP address (an IPv4-mapped IPv6 address as its IPv4 one), else None."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    return getattr(ip, "ipv4_mapped", None) or ip


@functools.lru_cache(maxsize=8)
def _names(allowed: tuple[str, ...]) -> frozenset:
    return frozenset(host_name(a) for a in allowed)


def host_refused(scope, allowed: tuple[str, ...] = ()) -> str | None:
    """The ``Host`` of a request or WebSocket handshake when it is refused, else None.

    A web page can make its visitors' browsers reach this server by pointing its own DNS name at
    the server's address (DNS rebinding); the page is then the server's own origin, but its
    requests carry its name in ``Host``. Allowed:

    * ``localhost`` and loopback addresses (``127.0.0.0/8``, ``[::1]``), with any port;
    * on a connection that came in on an address that is not loopback (a server bound to
      ``0.0.0.0``, ``::`` or a network address), any IP address too: no DNS name is involved;
    * the names in ``allowed`` (``--allow-host``; case-insensitive, any port), or any with ``*``;
    * a request without ``Host`` (HTTP/1.0, not a browser), and a connection without an IP address
      (an in-process ASGI client such as Starlette's TestClient, a Unix socket): not checked.

    Starlette's ``TrustedHostMiddleware`` is not used: it answers in plain text (the API's errors
    are JSON, and a refused stream gets an error frame) and has no rule for IP addresses.
    """
    server = scope.get("server")
    local = _ip(str(server[0])) if server else None
    if local is None or "*" in allowed:
        return None
    host = None
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = value.decode("latin-1")
            break
    if host is None:
        return None
    name = host_name(host)
    if name is None:
        return host
    if name == "localhost" or name in _names(allowed):
        return None
    ip = _ip(name)
    if ip is not None and (ip.is_loopback or not local.is_loopback):
        return None
    return host


def host_error(host: str) -> RequestError:
    """403 for a request whose ``Host`` :func:`host_refused` refuses."""
    name = host_name(host)
    fix = (f"or, to serve the name {name!r}, start the server with --allow-host {name}" if name else
           "a Host header is a name or an address with an optional port")
    return RequestError(403, f"the Host {host[:100]!r} is not one of this server's names, so the request is refused "
                             "(a web page could otherwise reach the server by rebinding its own name to the server's "
                             f"address): connect to localhost or 127.0.0.1, {fix}")


#: prompts longer than this are read in a worker thread
PREPARE_INLINE = 20_000


class _Raw(Response):
    """A FastAPI answer that hands the request to a plain ASGI handler (whose body is unread)."""

    def __init__(self, handler):
        super().__init__()
        self._handler = handler

    async def __call__(self, scope, receive, send) -> None:
        await self._handler(scope, receive, send)


def _add_security(fa: FastAPI, protected: set[str]) -> None:
    """Declare the API key in the OpenAPI schema (both ways of sending it) on the protected paths."""
    base = fa.openapi

    def openapi():
        if fa.openapi_schema:
            return fa.openapi_schema
        schema = base()
        comps = schema.setdefault("components", {}).setdefault("securitySchemes", {})
        comps["bearer"] = {"type": "http", "scheme": "bearer", "description": "the server's API key"}
        comps["apiKey"] = {"type": "apiKey", "in": "header", "name": "X-API-Key"}
        for path, ops in schema.get("paths", {}).items():
            if path in protected:
                for op in ops.values():
                    op["security"] = [{"bearer": []}, {"apiKey": []}]
                    op.setdefault("responses", {}).setdefault("401", {
                        "description": "a missing or wrong API key",
                        "content": {JSON: {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
        fa.openapi_schema = schema
        return schema

    fa.openapi = openapi


async def _read_frames(ws: WebSocket, queue: asyncio.Queue, client: Client, service: Service,
                       config: ServeConfig) -> None:
    """Read frames into ``queue`` (bounded: a full queue stops reading), each with its bytes reserved;
    on disconnect ``client.leave()`` and queue None."""
    try:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                break
            t0 = time.perf_counter()
            res = Reservation(service.budget)
            text = msg.get("text")
            err = None
            if text is None:
                err = RequestError(400, "send text frames holding JSON, like {\"text\": \"...\"}; binary frames are not read")
            elif len(text) > config.max_body_bytes:
                err = RequestError(413, f"the frame has {len(text):,} characters; the limit is {config.max_body_bytes:,}; "
                                        "send smaller chunks")
            elif not res.grow(len(text)):
                service.metrics.rejected.labels("busy").inc()
                err = busy("the server is busy: no room for this frame within --max-pending-mb; resend it shortly")
            try:  # waits while the queue is full; from the queue on, the stream owns the reservation
                await queue.put((t0, text if err is None else None, err, res))
            except BaseException:  # cancelled (the stream ended) before the frame was queued
                res.release()
                raise
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass
    finally:
        client.leave()
        try:
            queue.put_nowait(None)
        except asyncio.QueueFull:
            pass
