"""The ASGI app of ``isan-serve`` (FastAPI): parse, call :class:`~isan.engine.serve.service.Service`, format.

Endpoints:

* ``GET /healthz``: ``{"status": "ok", "model": {...}, "server": {limits, load}}``.
* ``GET /metrics``: Prometheus metrics (:mod:`isan.engine.serve.metrics`).
* ``POST /v1/score``: ``{"text", "per_char", "unknown", "replacement", "normalize", "state",
  "return_state", "top_k"}`` -> ``{"chars", "bits", "bpc", "normalization", "scoring"}`` (+
  ``per_char_bits``, ``per_char_offsets``; ``total_*`` when continuing a ``state`` or returning
  one; ``state``; ``next``). The OpenAPI schema at ``/openapi.json`` states every field and limit.
* WebSocket ``/v1/stream``: JSON frames ``{"text": chunk, ...the options above...}``, ``{"reset":
  true}``, ``{"restore": snapshot}``, ``{"snapshot": true}`` (combinable: reset or restore first,
  then the text, then the snapshot); each answer has the frame's fields and the running
  ``total_chars``, ``total_bits``, ``total_bpc``. Answers come in frame order; a bad frame gets
  ``{"error", "status"}`` and leaves the stream's state as it was.

Every 4xx and 5xx, 404 and 405 included, is ``{"error": message, "status": code, ...}``; no
traceback and no NaN reaches a client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.websockets import WebSocketDisconnect

from isan.engine.serve.budget import Reservation
from isan.engine.serve.config import DEFAULT_MAX_CHARS, ServeConfig
from isan.engine.serve.errors import RequestError, busy
from isan.engine.serve.metrics import Metrics
from isan.engine.serve.models import ErrorResponse, HealthResponse, ScoreResponse, build_models, parse
from isan.engine.serve.service import Client, ClientGone, Service, encode_json
from isan.engine.serve.snapshot import token_chars

log = logging.getLogger(__name__)

JSON = "application/json"
#: answers with more per-character numbers than this are encoded in a worker thread
ENCODE_INLINE_CHARS = 50_000
ENDPOINTS = "GET /healthz, GET /metrics, POST /v1/score, WebSocket /v1/stream, GET /docs, GET /openapi.json"

DESCRIPTION = """Score text with an Input Switched Affine Network, in bits.

All requests and stream frames are scored by one scheduler that batches the pending texts of every
client into rounds (continuous batching). Limits (see `GET /healthz`): texts up to `max_chars`
characters; request data held at once up to `max_pending_mb` (503 with `Retry-After` beyond);
`request_timeout_s` per text (503). Errors are always `{"error", "status", ...}`.

**WebSocket `/v1/stream`** (not described by OpenAPI): send JSON frames `{"text": "chunk"}` (with the
options of `POST /v1/score`), `{"reset": true}`, `{"restore": "<snapshot>"}`, `{"snapshot": true}`;
each answer carries the chunk's `chars`, `bits`, `bpc` and the running `total_chars`, `total_bits`,
`total_bpc`. The state is carried across frames, so chunking never changes the bits.
"""


def _error_responses(*codes: int) -> dict:
    what = {400: "bad request (the message names the field)", 403: "a snapshot changed or signed by another server",
            404: "no such endpoint", 405: "method not allowed", 408: "the body was too slow to arrive",
            409: "a snapshot of another model",
            413: "text or body over the limit", 422: "text the model cannot score (alphabet, diverging state)",
            426: "a WebSocket endpoint", 500: "internal error", 503: "busy or timed out: retry after Retry-After"}
    return {c: {"model": ErrorResponse, "description": what.get(c, "error")} for c in codes}


def create_app(engine, max_chars: int = DEFAULT_MAX_CHARS, config: ServeConfig | None = None) -> FastAPI:
    """The ASGI app serving ``engine`` (an :class:`isan.engine.Engine` or an engine with its API).

    Args:
        max_chars: the largest text (ignored when ``config`` is given).
        config: every limit (:class:`ServeConfig`); default ``ServeConfig(max_chars=max_chars)``.
    """
    from isan.engine.normalize import choices

    config = config or ServeConfig(max_chars=max_chars)
    metrics = Metrics()
    service = Service(engine, config, metrics)
    models = build_models(service.symbols, config.max_chars, choices(), token_chars(service.state_size))

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(service.close)

    app = FastAPI(title="isan-serve", version="2", description=DESCRIPTION, docs_url="/docs", lifespan=lifespan)
    app.state.service = service
    app.state.metrics = metrics

    def error_response(e: RequestError, endpoint: str | None = None) -> Response:
        if endpoint is not None:
            metrics.requests.labels(endpoint, str(e.status)).inc()
        return Response(encode_json(e.body()), status_code=e.status, media_type=JSON, headers=e.headers or None)

    # ---- one error shape for everything ---------------------------------------------------
    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        path, method = request.url.path, request.method
        if path == "/v1/stream":
            e = RequestError(426, "/v1/stream is a WebSocket endpoint: connect with a WebSocket client "
                                  "(ws://HOST:PORT/v1/stream) and send JSON frames like {\"text\": \"...\"}")
            return error_response(e)
        if exc.status_code == 404:
            msg = f"there is no {method} {path}; the endpoints are {ENDPOINTS}"
        elif exc.status_code == 405:
            allow = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "?")
            msg = f"{method} is not allowed on {path}; allowed: {allow}"
        else:
            msg = str(exc.detail)
        return error_response(RequestError(exc.status_code, msg, headers=exc.headers))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):  # pragma: no cover - no route declares params
        return error_response(RequestError(400, f"bad request: {exc.errors()}"))

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(RequestError(500, "internal error; the server log has the details"))

    # ---- HTTP ---------------------------------------------------------------------------
    @app.get("/healthz", response_model=HealthResponse, responses=_error_responses(405))
    async def healthz():
        return Response(encode_json(service.health()), media_type=JSON)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def metrics_endpoint():
        metrics.pending_bytes.set(service.budget.used)
        metrics.pending_jobs.set(service.scheduler.pending)
        return Response(metrics.render(), media_type=metrics.content_type)

    score_schema = models.score.model_json_schema()
    score_schema["additionalProperties"] = False

    @app.post("/v1/score", response_model=None,
              responses={200: {"model": ScoreResponse, "description": "the bits of the text"},
                         **_error_responses(400, 403, 408, 409, 413, 422, 500, 503)},
              openapi_extra={"requestBody": {"required": True,
                                             "content": {JSON: {"schema": score_schema}}}})
    async def v1_score(request: Request):
        """Score one text (see the app's description)."""
        t0 = time.perf_counter()
        res = Reservation(service.budget)
        watcher = None
        try:
            try:
                async with asyncio.timeout(config.request_timeout_s):
                    raw = await _read_body(request, res, config.max_body_bytes)
            except TimeoutError:
                raise RequestError(408, f"the request body did not arrive within {config.request_timeout_s:g} s "
                                        "(--request-timeout)") from None
            req = parse(models.score, raw, models.allowed, config.max_chars)
            del raw
            client = Client()
            watcher = asyncio.ensure_future(_watch_disconnect(request, client))
            state = service.restore(req.state) if req.state is not None else None
            out, new_state = await service.score_text(req.text, state, state is not None, req, res, client)
            if state is not None or req.return_state:
                out.update(service.totals(new_state))
            if req.return_state:
                out["state"] = service.snapshot(new_state)
            if req.top_k:
                out["next"] = service.next_chars(new_state, req.top_k)
            per = out["chars"] if req.per_char else 0
            body = await asyncio.to_thread(encode_json, out) if per > ENCODE_INLINE_CHARS else encode_json(out)
        except RequestError as e:
            res.release()
            return error_response(e, "score")
        except ClientGone:
            res.release()
            metrics.requests.labels("score", "499").inc()
            return Response(status_code=499)
        except BaseException:
            res.release()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        metrics.requests.labels("score", "200").inc()
        metrics.request_seconds.labels("score").observe(time.perf_counter() - t0)
        return _HeldResponse(body, res)

    # ---- WebSocket ----------------------------------------------------------------------
    @app.websocket("/v1/stream")
    async def v1_stream(ws: WebSocket):
        if service.streams_open >= config.max_streams:
            metrics.rejected.labels("streams").inc()
            await ws.accept()
            e = busy(f"the server has {service.streams_open} open streams, its limit (--max-streams); retry shortly")
            await ws.send_text(encode_json(e.body()).decode())
            await ws.close(code=1013)
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
                try:
                    if err is not None:
                        raise err
                    out, state = await _frame(raw, state, res, client)
                    status = 200
                except RequestError as e:
                    out, status = e.body(), e.status
                except ClientGone:
                    break
                payload = encode_json(out)
                try:
                    await ws.send_text(payload.decode())
                finally:
                    res.release()
                metrics.frames.labels(str(status)).inc()
                if status == 200:
                    metrics.frame_seconds.observe(time.perf_counter() - t0)
        except (WebSocketDisconnect, RuntimeError):  # the client left while we answered
            pass
        finally:
            client.leave()
            reader.cancel()
            while not queue.empty():
                item = queue.get_nowait()
                if item is not None:
                    item[3].release()
            service.streams_open -= 1
            metrics.streams_open.dec()

    async def _frame(raw: str, state, res: Reservation, client: Client):
        frame = parse(models.frame, raw, models.frame_allowed, config.max_chars, what="frame")
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

    return app


class _HeldResponse(Response):
    """A JSON answer whose memory stays reserved until it has been sent (or the send failed)."""

    def __init__(self, body: bytes, res: Reservation):
        super().__init__(body, media_type=JSON)
        self._res = res

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._res.release()


async def _read_body(request: Request, res: Reservation, limit: int) -> bytes:
    """The request body, its bytes reserved in the budget as they arrive (413 over ``limit``,
    503 if the budget is full)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        n = int(declared)
        if n > limit:
            raise RequestError(413, f"the body has {n:,} bytes; the limit is {limit:,} (6 bytes a character of "
                                    "--max-chars); split the text, or use /v1/stream")
        if n > res.budget.limit:
            raise RequestError(413, f"the body has {n:,} bytes, more than the server's memory for pending requests "
                                    "(--max-pending-mb); split the text, or use /v1/stream")
        if not res.grow(n):
            raise busy("the server is busy: no room for this request's body within --max-pending-mb; retry shortly")
    parts = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise RequestError(413, f"the body exceeds {limit:,} bytes (6 bytes a character of --max-chars); split "
                                    "the text, or use /v1/stream")
        if size > res.bytes and not res.grow(size - res.bytes):
            raise busy("the server is busy: no room for this request's body within --max-pending-mb; retry shortly")
        parts.append(part)
    return b"".join(parts)


async def _watch_disconnect(request: Request, client: Client) -> None:
    """``client.leave()`` when the client disconnects (the body has been read, so the next message is that)."""
    try:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                client.leave()
                return
    except asyncio.CancelledError:
        raise
    except Exception:  # pragma: no cover - a server without disconnect messages
        return


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
            await queue.put((t0, text if err is None else None, err, res))
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        client.leave()
        try:
            queue.put_nowait(None)
        except asyncio.QueueFull:
            pass
