"""Connection limits that uvicorn lacks: a deadline for a request's headers and a cap on HTTP connections.

uvicorn starts no timer when a connection opens, so a client that connects and sends nothing, or
sends its headers a byte at a time, holds the connection for ever; and its ``limit_concurrency``
answers beyond the limit in plain text. :func:`protocol_class` subclasses uvicorn's httptools
protocol with:

* a **header deadline**: a request's headers must be complete within ``read_timeout_s`` of its
  first byte (of the connection's opening for the first request); otherwise the client gets 408
  (``{"error", "status"}``) and the connection is closed. The body has its own deadline in the app
  (:func:`isan.engine.serve.asgi.read_body`), and idle keep-alive connections are closed by
  uvicorn's ``timeout_keep_alive``;
* a **connection cap**: at most ``max_connections`` open HTTP connections (WebSocket streams
  leave the count when they upgrade: ``--max-streams`` bounds them). When a connection arrives
  at the cap, every admitted connection that has kept its slot waiting for its client for
  :data:`SATURATED_GRACE_S` (1 s, or ``read_timeout_s`` if shorter) is closed to make room: one
  that sent nothing since it opened, is in the middle of its headers, or has sent no byte of its
  body for that long is answered 408; one kept alive after an answer and silent since is closed
  as its keep-alive timeout would. So idle connections cannot lock clients out for
  ``read_timeout_s``: at the cap, that deadline becomes the grace. A connection whose request
  is being answered is never closed. If no slot frees, the new connection is refused: its
  request is answered 503 with ``Retry-After`` (or, if none comes within the grace, 503 then)
  and the connection is closed;
* **malformed HTTP** (a request httptools cannot parse) is answered 400 with the JSON error shape,
  not uvicorn's plain text; so is a WebSocket handshake that the websockets library refuses
  (:func:`ws_protocol_class`: a missing or bad ``Sec-WebSocket-Key``, another version);
* **WebSocket handshakes** stay in the connection count until the handshake is answered; one that
  the websockets library cannot read (a request line or a header line over 8 KiB, too many headers)
  is answered with its status (414, 431; 400 otherwise) in the JSON error shape and closed: the
  library left it unanswered and open. A handshake that comes while the cap is full still opens a
  stream: streams have their own cap, ``max_streams``;
* **streams handed back** on a graceful shutdown (SIGTERM, SIGINT): uvicorn closes every open
  WebSocket at once with code 1012; :func:`ws_protocol_class` first lets the stream hand itself back
  (the app put a function under :data:`HAND_BACK` in its scope: it sends the stream's last state and
  closes with 1012, :mod:`isan.engine.serve.websocket`), and closes as uvicorn does only if the app
  has not within :data:`HAND_BACK_GRACE_S`; a connection still open then (a client that reads
  nothing: its answers fill the socket's buffers, so no close frame gets through) is aborted;
* **a send deadline** on streams: an answer that cannot be written for ``stream_idle_timeout_s``
  (the client reads nothing) aborts the connection, so a stream that does not read cannot hold
  its memory, nor a shutdown, for ever.

Example:
    >>> cls = protocol_class(max_connections=256, read_timeout_s=10)
    >>> uvicorn.Config(app, http=cls)                      # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus

from isan.engine.serve.errors import RequestError, busy
from isan.errors import install_hint

log = logging.getLogger(__name__)


def _raw_response(e: RequestError) -> bytes:
    from isan.engine.serve.service import encode_json

    body = encode_json(e.body())
    reason = HTTPStatus(e.status).phrase
    head = [f"HTTP/1.1 {e.status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close", *(f"{k.lower()}: {v}" for k, v in e.headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _refuse_app(max_connections: int):
    e = busy(f"the server has {max_connections} open HTTP connections, its limit (--max-connections); retry "
             "shortly, and reuse connections (keep-alive)")
    from isan.engine.serve.service import encode_json

    body = encode_json(e.body())

    async def refuse(scope, receive, send):  # an ASGI app answering 503 and closing the connection
        if scope["type"] != "http":  # pragma: no cover - upgrades are answered by the app
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), (b"retry-after", e.headers["Retry-After"].encode())]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse


class ConnectionCount:
    """Open HTTP connections of one server (shared by its protocol instances; the event loop's thread only).

    Attributes:
        open: admitted connections (at most ``max_connections``).
        conns: the admitted connections' protocols.
        refused, header_timeouts, evicted: how many connections were refused at the cap, answered
            408 for slow headers, and closed at the cap because they kept a slot waiting.
    """

    def __init__(self):
        self.open = 0
        self.conns: set = set()
        self.refused = 0
        self.header_timeouts = 0
        self.evicted = 0


#: at the connection cap, a connection that has waited this long for its client (or
#: ``--read-timeout`` if shorter) gives its slot to a new one; a refused connection gets this
#: long to send its request (then 503 and closed)
SATURATED_GRACE_S = 1.0


class _HttpLimits:
    """The limits of one server's HTTP connections, and the answers that enforce them
    (:func:`protocol_class`'s arguments)."""

    def __init__(self, max_connections: int, read_timeout_s: float, count: ConnectionCount):
        self.count = count
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.refuse = _refuse_app(max_connections)
        self.grace = grace = min(SATURATED_GRACE_S, read_timeout_s)
        self.timeout_answer = _raw_response(RequestError(
            408, f"the request's headers did not arrive within {read_timeout_s:g} s (--read-timeout); the connection "
                 "is closed"))
        self.evicted_answer = _raw_response(RequestError(
            408, f"the server is at its limit of {max_connections} HTTP connections (--max-connections) and this one "
                 f"waited {grace:g} s or more for its request; it is closed to let another client in: send the "
                 "request right after connecting"))
        self.refused_answer = _raw_response(busy(
            f"the server has {max_connections} open HTTP connections, its limit (--max-connections), and this one "
            f"sent no request within {grace:g} s; retry shortly, and reuse connections (keep-alive)"))
        self.bad_answer = _raw_response(RequestError(
            400, "the request is not valid HTTP/1.1 (the server could not parse it); send a request line such as "
                 "'POST /v1/score HTTP/1.1', headers of the form 'Name: value' and at most one Content-Length"))

    def evict_waiting(self, now: float) -> None:
        """Close every admitted connection that has kept its slot waiting for its client ``grace`` s or more."""
        for conn in [c for c in self.count.conns if c._isan_waiting_since(now) is not None]:
            conn._isan_evict()


class _LimitedHttp:
    """The header deadline, the connection cap and the JSON answer to malformed HTTP, mixed into
    uvicorn's httptools protocol by :func:`protocol_class` (which sets ``_isan``, the limits)."""

    _isan: _HttpLimits

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        limits = self._isan
        self._isan_timer = None
        self._isan_counted = False
        self._isan_refused = False
        self._isan_in_headers = False
        self._isan_sent = False  # a byte came on this connection since its last answer
        self._isan_since = self.loop.time()  # when it began to wait for its client
        self._isan_last = self._isan_since  # its last byte
        if limits.count.open >= limits.max_connections:
            limits.evict_waiting(self._isan_since)
        if limits.count.open < limits.max_connections:
            self._isan_counted = True
            limits.count.open += 1
            limits.count.conns.add(self)
            self._isan_arm()
        else:  # refused: 503 when its request comes, or when it has not come within the grace
            limits.count.refused += 1
            self._isan_refused = True
            self.app = limits.refuse
            self._isan_timer = self.loop.call_later(limits.grace, self._isan_expired)

    def _isan_waiting_since(self, now: float) -> float | None:
        """When this connection began to wait for bytes its client owes (None if it is busy
        answering, or has waited less than ``grace``)."""
        cycle = self.cycle
        if self._isan_in_headers:
            since = self._isan_since  # headers, even trickled, take milliseconds
        elif cycle is None or cycle.response_complete:
            if self.pipeline:  # pragma: no cover - pipelined requests are being answered
                return None
            since = self._isan_since  # idle: new, or kept alive after an answer
        elif cycle.more_body and not cycle.response_started:
            since = self._isan_last  # the body: no byte for a while
        else:
            return None
        return since if now - since >= self._isan.grace else None

    def _isan_evict(self) -> None:
        self._isan_disarm()
        self._isan_uncount()
        self._isan.count.evicted += 1
        if self.transport.is_closing():
            return
        cycle = self.cycle
        # a connection kept alive after an answer, silent since, is closed as its keep-alive timeout would;
        # one that was opened, or began a request, is answered 408
        if not (cycle is not None and cycle.response_complete and not self._isan_sent):
            self.transport.write(self._isan.evicted_answer)
        if cycle is not None and not cycle.response_complete:  # the app waits for the body: it is gone
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def _isan_arm(self) -> None:
        if self._isan_timer is None:
            self._isan_timer = self.loop.call_later(self._isan.read_timeout_s, self._isan_expired)

    def _isan_disarm(self) -> None:
        if self._isan_timer is not None:
            self._isan_timer.cancel()
            self._isan_timer = None

    def _isan_uncount(self) -> None:
        if self._isan_counted:
            self._isan_counted = False
            self._isan.count.open -= 1
            self._isan.count.conns.discard(self)

    def _isan_expired(self) -> None:
        self._isan_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:  # pragma: no cover - pipelining
            self.cycle.keep_alive = False
            return
        if self._isan_refused:
            self.transport.write(self._isan.refused_answer)
        else:
            self._isan.count.header_timeouts += 1
            self.transport.write(self._isan.timeout_answer)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._isan_last = self.loop.time()
        self._isan_sent = True
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._isan_in_headers = True
        self._isan_since = self.loop.time()
        if not self._isan_refused:
            self._isan_arm()

    def on_headers_complete(self) -> None:
        self._isan_in_headers = False
        self._isan_disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._isan_since = self.loop.time()  # idle (kept alive) from now
        self._isan_sent = False

    def send_400_response(self, msg: str) -> None:  # malformed HTTP: the JSON error shape, not plain text
        self._isan_disarm()
        if not self.transport.is_closing():
            self.transport.write(self._isan.bad_answer)
            self.transport.close()

    def handle_websocket_upgrade(self) -> None:
        # A stream is counted by max_streams, not by this cap, even when it came while the cap was
        # full (a burst of 1,000 streams must open, as isan bench serve's stream load does); the
        # WebSocket protocol counts the connection here until its handshake is answered.
        self._isan_disarm()
        self._isan_uncount()
        super().handle_websocket_upgrade()

    def connection_lost(self, exc) -> None:
        self._isan_disarm()
        self._isan_uncount()
        super().connection_lost(exc)


def protocol_class(max_connections: int, read_timeout_s: float, count: ConnectionCount | None = None):
    """A uvicorn HTTP protocol class with the header deadline, the connection cap and JSON answers
    to malformed HTTP (module docstring).

    Args:
        count: where the open connections are counted (default: a new :class:`ConnectionCount`,
            readable as the class attribute ``count``).
    Returns:
        the class, or None when httptools is missing (uvicorn's h11 protocol is then used as is).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is in the serve extra
        log.warning("httptools is missing: no header deadline and no connection cap (%s)", install_hint("serve"))
        return None
    limits = _HttpLimits(max_connections, read_timeout_s, count or ConnectionCount())

    class IsanHttpProtocol(_LimitedHttp, HttpToolsProtocol):
        _isan = limits
        count = limits.count

    return IsanHttpProtocol


#: the scope key under which a stream puts the function that hands it back on a graceful shutdown
HAND_BACK = "isan.hand_back"
#: seconds a stream has to hand itself back (its frame in flight answered, its last state sent)
HAND_BACK_GRACE_S = 10.0


def _unread_handshake(status: int) -> bytes:
    """The answer to a WebSocket handshake the websockets library could not read (``status``: the
    library's, 414 or 431 for a line or headers too long; 400 otherwise)."""
    why = {414: "its request line is longer than 8 KiB", 431: "a header line is longer than 8 KiB, or it has more "
           "than 128 headers"}.get(status, "it is not a valid HTTP request")
    return _raw_response(RequestError(status, f"the WebSocket handshake was refused: {why}; connect to "
                                              "ws://HOST:PORT/v1/stream with short headers"))


def _json_refusal(response):
    """The websockets library's refusal of a handshake (``response``, not 101) with the JSON error
    shape as its body instead of the library's plain text."""
    from isan.engine.serve.service import encode_json

    if response.status_code != 101:
        why = bytes(response.body).decode("utf-8", "replace").strip().rstrip(".")
        why = why.removeprefix("Failed to open a WebSocket connection: ") or "the handshake failed"
        body = encode_json(RequestError(response.status_code, (
            f"the WebSocket handshake was refused ({why}); connect with a WebSocket client "
            "(ws://HOST:PORT/v1/stream), which sends Upgrade, Connection, Sec-WebSocket-Key and "
            "Sec-WebSocket-Version: 13")).body())
        response.body = body
        response.headers["Content-Type"] = "application/json"
        response.headers["Content-Length"] = str(len(body))
    return response


class _HandingBackWebSocket:
    """JSON refusals of handshakes, the hand back on a graceful shutdown and the send deadline,
    mixed into uvicorn's WebSocket protocol by :func:`ws_protocol_class` (which sets
    ``_isan_count`` and ``_isan_send_timeout_s``, its arguments)."""

    _isan_count: ConnectionCount | None
    _isan_send_timeout_s: float | None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._isan_counted = self._isan_count is not None
        if self._isan_counted:
            self._isan_count.open += 1

    def _isan_uncount(self) -> None:
        if self._isan_counted:
            self._isan_counted = False
            self._isan_count.open -= 1

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.handshake_exc is not None and not self.handshake_initiated and not self.transport.is_closing():
            sent = b"".join(self.conn.data_to_send())  # the library's plain-text refusal, if it made one
            status = int(sent[9:12]) if sent[9:12].isdigit() else 400
            self.transport.write(_unread_handshake(status))
            self.transport.close()
            self._isan_uncount()

    async def send(self, message) -> None:
        send_timeout_s = self._isan_send_timeout_s
        if send_timeout_s is not None and not self.writable.is_set():
            try:
                async with asyncio.timeout(send_timeout_s):
                    await self.writable.wait()
            except TimeoutError:  # the client reads nothing: its answers cannot be sent
                log.info("a stream's client read nothing for %g s; its connection is aborted", send_timeout_s)
                self.transport.abort()
        await super().send(message)
        if self.handshake_complete:
            self._isan_uncount()

    def handle_connect(self, event) -> None:
        accept = self.conn.accept

        def json_accept(request):
            return _json_refusal(accept(request))

        self.conn.accept = json_accept
        super().handle_connect(event)

    def shutdown(self) -> None:
        hand_back = getattr(self, "scope", {}).get(HAND_BACK)
        handing_back = not (hand_back is None or not self.handshake_complete or self.close_sent or self.disconnected)
        if handing_back:  # the stream answers its frame in flight, sends its last state, closes with 1012
            self.stop_keepalive()
            hand_back()
        else:
            super().shutdown()
        self._isan_grace = self.loop.call_later(HAND_BACK_GRACE_S, self._isan_close, handing_back)

    def _isan_close(self, handing_back: bool) -> None:
        if self.disconnected:
            return
        if handing_back:  # not handed back in time: closed as uvicorn closes it
            super().shutdown()
        if self.transport.get_write_buffer_size():  # the client reads nothing: the close cannot get out
            log.info("a stream's connection was not closed within %g s of the shutdown (its client reads "
                     "nothing); it is aborted", HAND_BACK_GRACE_S)
            self.transport.abort()

    def connection_lost(self, exc) -> None:
        grace = getattr(self, "_isan_grace", None)
        if grace is not None:
            grace.cancel()
        self._isan_uncount()
        super().connection_lost(exc)


def ws_protocol_class(count: ConnectionCount | None = None, send_timeout_s: float | None = None):
    """uvicorn's WebSocket protocol (websockets, sans-I/O) answering a refused handshake with the
    JSON error shape instead of the library's plain text (and answering one the library could not
    read at all), letting a stream hand itself back on a graceful shutdown, and aborting a
    connection whose answers cannot be sent (module docstring).

    Args:
        count: the HTTP connections' count (:func:`protocol_class`): a connection stays in it until
            its handshake is answered (None: not counted).
        send_timeout_s: a send that waits longer than this for the client to read aborts the
            connection (None: no deadline).
    Returns:
        the class, or None when that protocol is missing (uvicorn's choice is then used as is).
    """
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
    except ImportError:  # pragma: no cover - websockets is in the serve extra
        return None

    class IsanWebSocketProtocol(_HandingBackWebSocket, WebSocketsSansIOProtocol):
        _isan_count = count
        _isan_send_timeout_s = send_timeout_s

    return IsanWebSocketProtocol


def uvicorn_options(config) -> dict:
    """The ``uvicorn.Config`` options of a server with these limits (a :class:`ServeConfig`): its
    protocols (``http``, ``ws``: :func:`protocol_class`, :func:`ws_protocol_class`) and timeouts."""
    count = ConnectionCount()
    http = protocol_class(config.max_connections, config.read_timeout_s, count)
    out = {"http": http} if http is not None else {"limit_concurrency": config.max_connections + config.max_streams}
    ws = ws_protocol_class(count if http is not None else None, config.stream_idle_timeout_s)
    if ws is not None:
        out["ws"] = ws
    # frames up to a MiB over the limit are read and answered 413; larger ones close the stream with
    # 1009 (message too big), as the WebSocket protocol has it
    return {**out, "ws_max_size": config.max_body_bytes + 2**20, "ws_per_message_deflate": False,
            "timeout_keep_alive": config.keep_alive_s, "proxy_headers": False, "server_header": False}
