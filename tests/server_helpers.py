"""Helpers of the server tests: a real uvicorn server in a thread, a free port, an engine that waits."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(app):
    """Serve ``app`` with uvicorn on a free localhost port in a thread, with the limits of ``isan-serve``
    (``app.uvicorn_config``); yields ``"127.0.0.1:PORT"``."""
    with running_server(app) as (addr, _):
        yield addr


@contextmanager
def running_server(app):
    """:func:`running`, yielding ``("127.0.0.1:PORT", the uvicorn.Server)``: ``server.should_exit = True``
    starts its graceful shutdown as SIGTERM does."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(app.uvicorn_config("127.0.0.1", port, "warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 30
    while not srv.started:
        assert th.is_alive() and time.time() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"127.0.0.1:{port}", srv
    finally:
        srv.should_exit = True
        th.join(15)


class SlowEngine:
    """An engine whose batched and single scoring first wait: ``delay_s`` each call, and while
    ``gate`` is clear. Everything else is the wrapped engine's."""

    def __init__(self, engine, delay_s: float = 0.0):
        self._engine = engine
        self.delay_s = delay_s
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def _wait(self):
        self.calls += 1
        self.gate.wait(60)
        if self.delay_s:
            time.sleep(self.delay_s)

    def score_batch(self, *args, **kwargs):
        self._wait()
        return self._engine.score_batch(*args, **kwargs)

    def score(self, *args, **kwargs):
        self._wait()
        return self._engine.score(*args, **kwargs)


def raw_http(addr: str, data: bytes, wait: float = 10.0) -> bytes:
    """Send raw bytes to a server and read everything it answers until it closes or ``wait`` passes."""
    host, port = addr.split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(data)
        s.settimeout(wait)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return out


def wait_for(predicate, what: str, timeout: float = 60.0, every: float = 0.02) -> None:
    """Poll ``predicate()`` until it is true; fail naming ``what`` if it is not within ``timeout`` s
    (a bound for a stalled server on a loaded machine, not a measure of speed)."""
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(every)


def unread_stream(port: int, frames: list[dict]) -> socket.socket:
    """A WebSocket to ``/v1/stream`` (the websockets library's sans-I/O client over a raw socket)
    that sends ``frames`` and never reads their answers; the socket, left open."""
    from websockets.client import ClientProtocol
    from websockets.http11 import Response
    from websockets.uri import parse_uri

    proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/v1/stream"), max_size=None)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65_536)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    proto.send_request(proto.connect())
    s.sendall(b"".join(proto.data_to_send()))
    while not any(isinstance(e, Response) for e in proto.events_received()):
        data = s.recv(4096)
        assert data, "the server closed the handshake"
        proto.receive_data(data)
    assert proto.handshake_exc is None, proto.handshake_exc
    for f in frames:
        proto.send_text(json.dumps(f).encode())
        s.sendall(b"".join(proto.data_to_send()))
    return s
