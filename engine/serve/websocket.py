"""WebSocket ``/v1/stream``: a stream of text scored in frames, its state carried between them.

Frames are JSON: ``{"text": chunk, ...the options of /v1/score...}``, ``{"reset": true}``,
``{"restore": snapshot}``, ``{"snapshot": true}`` (combinable: reset or restore first, then the
text, then the snapshot); each answer has the frame's fields and the running ``total_chars``,
``total_bits``, ``total_bpc``, ``total_nnl``. Answers come in frame order; a bad frame gets
``{"error", "status"}`` and leaves the stream's state as it was.

A reader task reads frames ahead of their answers into a bounded queue (``--max-stream-frames``;
a full queue stops reading: TCP back-pressure), each frame's bytes reserved in the memory budget
until it is answered. The handshake is refused (an error frame, then a close code) for a ``Host``
or ``Origin`` that is not allowed (1008), a missing API key (1008), a model not loaded (1013) and
more than ``--max-streams`` streams (1013).

**Handed back on shutdown.** When the server shuts down gracefully (SIGTERM or SIGINT; with
``--workers``, each worker), every open stream answers the frame it is scoring, then sends one last
frame ``{"event": "shutdown", "state": snapshot}``, the snapshot of its state after the last frame
it answered (:data:`SHUTDOWN_EVENT`), and closes with code 1012 (service restart). Frames read
ahead of it and not yet scored are dropped: a client restores the snapshot on another server
(``{"restore": state}``) and sends again every frame it got no answer to; the bits go on as if
nothing happened. Should no snapshot be possible (running totals beyond what a snapshot carries),
``state`` is null and ``error``, ``status`` say why. A stream that has answered no frame on its
connection hands back ``"state": null`` (no error): its state is the initial one, not yet the
client's (whose first frame, a restore or a reset, was not read), so the client keeps what it has.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.websockets import WebSocket, WebSocketDisconnect

from isan.engine.serve.access import host_error, host_refused, hosts_error, key_error, origin_error, origin_refused
from isan.engine.serve.budget import Reservation
from isan.engine.serve.clients import Client, ClientGone
from isan.engine.serve.connections import HAND_BACK
from isan.engine.serve.errors import RequestError, busy
from isan.engine.serve.schemas import Schemas, parse
from isan.engine.serve.service import Service, encode_json

log = logging.getLogger(__name__)

#: the ``event`` of the last frame of a stream handed back on shutdown
SHUTDOWN_EVENT = "shutdown"
#: queued to wake a stream waiting for frames when the server shuts down
_HAND_BACK = object()


class StreamEndpoint:
    """The ASGI handler of ``/v1/stream`` for one app: ``await endpoint(scope, receive, send, authorized)``."""

    def __init__(self, service: Service, schemas: Schemas):
        self.service = service
        self.schemas = schemas
        self.config = service.config
        self.metrics = service.metrics

    def refusal(self, scope, authorized: bool) -> tuple[RequestError, int] | None:
        """Why a handshake is refused, with the close code; None when it is accepted."""
        service, config, metrics = self.service, self.config, self.metrics
        host = host_refused(scope, config.allow_hosts)
        origin = origin_refused(scope, config.allow_origins)
        if hosts_error(scope) is not None:
            metrics.rejected.labels("host").inc()
            return hosts_error(scope), 1008
        if host is not None:
            metrics.rejected.labels("host").inc()
            return host_error(host), 1008
        if origin is not None:
            metrics.rejected.labels("origin").inc()
            return origin_error(origin), 1008
        if not authorized:
            return key_error(stream=True), 1008
        if service.engine is None:
            try:
                service.ready()
            except RequestError as e:
                return e, 1013
        elif service.streams_open >= config.max_streams:
            metrics.rejected.labels("streams").inc()
            return busy(f"the server has {service.streams_open} open streams, its limit (--max-streams); retry "
                        "shortly"), 1013
        return None

    async def __call__(self, scope, receive, send, authorized: bool) -> None:
        service, config, metrics = self.service, self.config, self.metrics
        ws = WebSocket(scope, receive, send)
        refusal = self.refusal(scope, authorized)
        if refusal is not None:
            await _refuse(ws, *refusal)
            return
        queue: asyncio.Queue = asyncio.Queue(maxsize=config.max_stream_frames)
        handed_back: list = []
        scope[HAND_BACK] = _hand_back_function(queue, handed_back)
        await ws.accept()
        service.streams_open += 1
        metrics.streams_open.inc()
        client = Client()
        reader = asyncio.ensure_future(read_frames(ws, queue, client, service))
        state = service.engine.initial_state()
        try:
            await self._frames(ws, queue, client, handed_back, state)
        except (WebSocketDisconnect, RuntimeError, OSError):  # the client left while we answered
            pass
        finally:
            self._close(scope, client, reader, queue)

    async def _frames(self, ws: WebSocket, queue: asyncio.Queue, client: Client, handed_back: list, state) -> None:
        """Answer the frames in order, from the stream's first ``state``, until the client leaves, the
        stream is idle too long (408, close code 1001) or the server hands it back."""
        answered = 0  # frames answered on this connection
        while True:
            if handed_back:
                await self.hand_back(ws, state if answered else None)
                return
            if client.gone and queue.empty():
                return
            item = await self._next(ws, queue)
            if item is None:
                return
            if item is _HAND_BACK:
                continue
            answer = await self._answer(ws, item, state, client)
            if answer is None:  # the client left
                return
            status, state = answer
            answered += 1
            self.metrics.frames.labels(str(status)).inc()
            if status == 200:
                self.metrics.frame_seconds.observe(time.perf_counter() - item[0])

    async def _next(self, ws: WebSocket, queue: asyncio.Queue):
        """The next queued item: a frame, :data:`_HAND_BACK`, or None when the reader is done or no
        frame came within the idle timeout (then the stream is answered 408 and closed with 1001)."""
        config = self.config
        try:
            async with asyncio.timeout(config.stream_idle_timeout_s):
                return await queue.get()
        except TimeoutError:
            e = RequestError(408, f"no frame for {config.stream_idle_timeout_s:g} s (--stream-idle-timeout); "
                                  "the stream is closed: open a new one, or restore a snapshot")
            await ws.send_text(encode_json(e.body()).decode())
            await ws.close(code=1001)
            return None

    async def _answer(self, ws: WebSocket, item: tuple, state, client: Client):
        """Answer one queued frame ``(t0, raw, err, res)``: (its status, the stream's state after
        it), or None when the client left while it was scored."""
        _, raw, err, res = item
        with res:  # the frame's bytes are given back however its answer ends
            try:
                if err is not None:
                    raise err
                out, state = await self.frame(raw, state, res, client)
                status = 200
            except RequestError as e:
                out, status = e.body(), e.status
            except ClientGone:
                return None
            except Exception:
                log.exception("unhandled error in a stream frame")
                out, status = RequestError(500, "internal error; the server log has the details").body(), 500
            await ws.send_text(encode_json(out).decode())
        return status, state

    def _close(self, scope, client: Client, reader: asyncio.Future, queue: asyncio.Queue) -> None:
        """The stream has ended: stop its reader, give back the bytes of its frames still queued, and
        leave the count of open streams."""
        scope.pop(HAND_BACK, None)
        client.leave()
        reader.cancel()  # a frame the reader holds is given back by the reader
        while not queue.empty():
            item = queue.get_nowait()
            if item is not None and item is not _HAND_BACK:
                item[3].release()
        self.service.streams_open -= 1
        self.metrics.streams_open.dec()

    async def hand_back(self, ws: WebSocket, state) -> None:
        """The last frame of a stream when the server shuts down: ``{"event": "shutdown", "state":
        snapshot}`` (module docstring; null for ``state`` None: no frame answered), then close code 1012."""
        try:
            out = {"event": SHUTDOWN_EVENT, "state": None if state is None else self.service.snapshot(state)}
        except RequestError as e:
            out = {"event": SHUTDOWN_EVENT, "state": None, "error": e.message, "status": e.status}
        await ws.send_text(encode_json(out).decode())
        await ws.close(code=1012)

    async def frame(self, raw: str, state, res: Reservation, client: Client):
        """The answer to one frame and the stream's state after it."""
        service, schemas = self.service, self.schemas
        frame = parse(schemas.frame, raw, schemas.allowed(schemas.frame), self.config.max_chars, what="frame")
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


async def _refuse(ws: WebSocket, error: RequestError, code: int) -> None:
    """Refuse a handshake: accept it, send ``error``'s JSON, close with ``code`` (a client that left
    is let go)."""
    try:
        await ws.accept()
        await ws.send_text(encode_json(error.body()).decode())
        await ws.close(code=code)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


def _hand_back_function(queue: asyncio.Queue, handed_back: list):
    """The function a stream puts under :data:`~isan.engine.serve.connections.HAND_BACK` in its
    scope: called when the server shuts down, it marks the stream handed back (``handed_back``
    gets an item) and wakes it if it waits for a frame."""

    def hand_back() -> None:  # the server shuts down (connections.ws_protocol_class)
        handed_back.append(True)
        try:  # wake the loop if it waits for a frame; if the queue is full it is busy and looks after the frame
            queue.put_nowait(_HAND_BACK)
        except asyncio.QueueFull:
            pass

    return hand_back


async def read_frames(ws: WebSocket, queue: asyncio.Queue, client: Client, service: Service) -> None:
    """Read frames into ``queue`` (bounded: a full queue stops reading), each with its bytes reserved;
    on disconnect ``client.leave()`` and queue None."""
    config = service.config
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
