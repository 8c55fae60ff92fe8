"""The plain ASGI side of the ``/v1`` routes: the body read into the memory budget, the answer sent
as JSON or as Server-Sent Events, every error as one JSON answer.

The routes (:mod:`isan.engine.serve.routes`) are served by :func:`post_handler` and
:func:`get_handler` in front of FastAPI (:class:`isan.engine.serve.app.IsanApp`): FastAPI declares
them (the schema, ``/docs``) but does not sit on their path, where its routing and middleware took
more of the event loop than the handlers themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time

from isan.engine.serve.budget import Reservation
from isan.engine.serve.clients import Client, ClientGone
from isan.engine.serve.completions import openai_error
from isan.engine.serve.config import ServeConfig
from isan.engine.serve.errors import RequestError, busy
from isan.engine.serve.service import encode_json

log = logging.getLogger(__name__)

#: answers with more per-character numbers than this are encoded in a worker thread
ENCODE_INLINE_CHARS = 50_000


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


async def watch_disconnect(receive, client: Client) -> None:
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


class SSE:
    """A route's answer that is a stream of Server-Sent Events: ``events`` yields (event, data dict).

    Attributes:
        named: True: ``event: NAME`` / ``data: {json}`` events; False: OpenAI's form, ``data: {json}``
            events ending with ``data: [DONE]``.
    """

    def __init__(self, events, named: bool = True):
        self.events = events
        self.named = named


async def send_events(send, sse: SSE, client: Client) -> None:
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


def post_handler(service, endpoint: str, work, openai: bool = False):
    """The ASGI handler of a POST route: check the body's type, read it (reserved in the budget),
    wait for the model (``service.ready()``), call ``work(raw, client, res)`` and send its answer
    (a dict as JSON, or :class:`SSE`); every error becomes one JSON error answer (``openai``: in
    OpenAI's shape), counted in ``isan_requests_total{endpoint}``."""
    config, metrics = service.config, service.metrics

    async def handle(scope, receive, send) -> None:
        t0 = time.perf_counter()
        client = Client()
        watcher = None
        error = None
        try:
            with Reservation(service.budget) as res:  # given back however the request ends
                try:
                    check_json_body(scope)
                    raw = await read_body(scope, receive, res, config)
                    watcher = asyncio.ensure_future(watch_disconnect(receive, client))
                    service.ready()
                    out = await work(raw, client, res)
                    if not isinstance(out, SSE):
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
                    if isinstance(out, SSE):
                        await send_events(send, out, client)
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

    return handle


def get_handler(service, endpoint: str, answer):
    """The ASGI handler of a GET route of the OpenAI-compatible API: ``service.ready()``, then
    ``answer()`` as JSON (errors in OpenAI's shape)."""
    metrics = service.metrics

    async def handle(scope, receive, send) -> None:
        try:
            service.ready()
            out = answer()
        except RequestError as e:
            metrics.requests.labels(endpoint, str(e.status)).inc()
            await send_json(send, e.status, encode_json(openai_error(e)), e.headers)
            return
        metrics.requests.labels(endpoint, "200").inc()
        await send_json(send, 200, encode_json(out))

    return handle
