"""Connection limits that uvicorn lacks: a deadline for a request's headers and a cap on HTTP connections.

uvicorn starts no timer when a connection opens, so a client that connects and sends nothing, or
sends its headers a byte at a time, holds the connection for ever; and its ``limit_concurrency``
answers beyond the limit in plain text. :func:`protocol_class` subclasses uvicorn's httptools
protocol with:

* a **header deadline**: a request's headers must be complete within ``read_timeout_s`` of its
  first byte (of the connection's opening for the first request); otherwise the client gets 408
  (``{"error", "status"}``) and the connection is closed. The body has its own deadline in the app
  (:func:`isan.engine.serve.app.read_body`), and idle keep-alive connections are closed by
  uvicorn's ``timeout_keep_alive``;
* a **connection cap**: at most ``max_connections`` open HTTP connections (WebSocket streams
  leave the count when they upgrade: ``--max-streams`` bounds them). Every request on a connection
  opened beyond the cap is answered 503 with ``Retry-After`` and the connection is closed.

Example:
    >>> cls = protocol_class(max_connections=256, read_timeout_s=10)
    >>> uvicorn.Config(app, http=cls)                      # doctest: +SKIP
"""

from __future__ import annotations

import logging

from isan.engine.serve.errors import RequestError, busy

log = logging.getLogger(__name__)


def _raw_response(e: RequestError) -> bytes:
    from isan.engine.serve.service import encode_json

    body = encode_json(e.body())
    reason = {408: "Request Timeout", 503: "Service Unavailable"}.get(e.status, "Error")
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
    """Open HTTP connections of one server (shared by its protocol instances; the event loop's thread only)."""

    def __init__(self):
        self.open = 0
        self.refused = 0
        self.header_timeouts = 0


def protocol_class(max_connections: int, read_timeout_s: float, count: ConnectionCount | None = None):
    """A uvicorn HTTP protocol class with the header deadline and the connection cap (module docstring).

    Args:
        count: where the open connections are counted (default: a new :class:`ConnectionCount`,
            readable as the class attribute ``count``).
    Returns:
        the class, or None when httptools is missing (uvicorn's h11 protocol is then used as is).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is in the serve extra
        log.warning("httptools is missing: no header deadline and no connection cap (pip install 'isan[serve]')")
        return None
    count = count or ConnectionCount()
    refuse = _refuse_app(max_connections)
    timeout_answer = _raw_response(RequestError(
        408, f"the request's headers did not arrive within {read_timeout_s:g} s (--read-timeout); the connection is "
             "closed"))

    class IsanHttpProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._isan_timer = None
            self._isan_counted = True
            count.open += 1
            if count.open > max_connections:
                count.refused += 1
                self.app = refuse
            self._isan_arm()

        def _isan_arm(self) -> None:
            if self._isan_timer is None:
                self._isan_timer = self.loop.call_later(read_timeout_s, self._isan_expired)

        def _isan_disarm(self) -> None:
            if self._isan_timer is not None:
                self._isan_timer.cancel()
                self._isan_timer = None

        def _isan_uncount(self) -> None:
            if self._isan_counted:
                self._isan_counted = False
                count.open -= 1

        def _isan_expired(self) -> None:
            self._isan_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:  # pragma: no cover - pipelining
                self.cycle.keep_alive = False
                return
            count.header_timeouts += 1
            self.transport.write(timeout_answer)
            self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._isan_arm()

        def on_headers_complete(self) -> None:
            self._isan_disarm()
            super().on_headers_complete()

        def handle_websocket_upgrade(self) -> None:
            self._isan_disarm()
            self._isan_uncount()
            super().handle_websocket_upgrade()

        def connection_lost(self, exc) -> None:
            self._isan_disarm()
            self._isan_uncount()
            super().connection_lost(exc)

    IsanHttpProtocol.count = count
    return IsanHttpProtocol
