"""The memory budget (``--max-pending-mb``) end to end (issue 34): every way a stream's client leaves
gives its share back, and an answer's log-probs are counted before they are built."""

import json
import socket
import struct

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from isan.engine import Engine  # noqa: E402
from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from server_helpers import SlowEngine, running, wait_for  # noqa: E402

#: characters of each frame the stream tests send
FRAME = 5_000


def _abort(ws) -> None:
    """Drop the TCP connection without a close frame (a reset, as a killed client)."""
    ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.socket.close()


def _leave(kind: str, frames: int, addr: str, text: str, service, eng: SlowEngine) -> None:
    """Open a stream, send ``frames`` frames while the scorer is held (1: the frame is in a round;
    4: one in a round, one queued, one read ahead and one the reader holds while the queue is full),
    then leave as ``kind`` says."""
    frame = json.dumps({"text": text[:FRAME]})
    with connect(f"ws://{addr}/v1/stream", close_timeout=1, max_size=None) as ws:
        if kind == "mid-answer":  # answers are being sent while the client goes away
            eng.gate.set()
            for _ in range(frames):
                ws.send(json.dumps({"text": text[:FRAME], "per_char": True}))
            ws.recv(timeout=30)
            _abort(ws)
            return
        pending = service.scheduler.pending
        for _ in range(frames):
            ws.send(frame)
        wait_for(lambda: service.scheduler.pending > pending, f"the first frame of a stream ({kind}) reached the scheduler")
        if kind == "error":  # answered error frames, then a frame over the size limit: the server closes (1009)
            ws.send("not json")
            ws.send(b"\x00binary")
            ws.send("x" * (service.config.max_body_bytes + 2**20 + 1))
            with pytest.raises(ConnectionClosed):
                while True:
                    ws.recv(timeout=30)
        elif kind == "close":
            ws.close()
        elif kind == "abort":
            _abort(ws)
        elif kind == "timeout":  # each frame is answered 503 (--request-timeout), then the stream idles until
            with pytest.raises(ConnectionClosed):  # the server closes it (--stream-idle-timeout)
                while True:
                    ws.recv(timeout=30)
        else:  # pragma: no cover
            raise ValueError(kind)


def test_streams_give_back_their_budget_however_they_leave(small_bundle, text8_valid_head):
    """Streams that leave with frames in flight (closed, aborted, closed by the server for a frame
    too big, timed out, or gone while their answers are sent) return every byte they reserved:
    /healthz's pending_mb is 0 once they are closed, and a request that needs the whole budget is
    then answered (issue 34: 50 aborted streams left 458 MB reserved for good and the server 503)."""
    eng = SlowEngine(Engine.load(small_bundle))
    cfg = ServeConfig(max_chars=20_000, max_stream_frames=2, request_timeout_s=1.0, stream_idle_timeout_s=1.0,
                      max_pending_mb=4)
    app = create_app(eng, config=cfg)
    service = app.state.service
    text = text8_valid_head
    with running(app) as addr:
        for kind, frames in (("close", 1), ("close", 4), ("abort", 1), ("abort", 4), ("error", 1),
                             ("mid-answer", 4), ("timeout", 2)):
            eng.gate.clear()
            for _ in range(1 if kind == "timeout" else 2):
                _leave(kind, frames, addr, text, service, eng)
            eng.gate.set()
            wait_for(lambda: service.streams_open == 0, f"the streams that left by {kind} were closed")
            wait_for(lambda: service.scheduler.pending == 0, "the scheduler dropped their work")
            health = httpx.get(f"http://{addr}/healthz", timeout=30).json()["server"]
            assert (kind, frames, service.budget.used, health["pending_mb"]) == (kind, frames, 0, 0), health
        # the whole budget is free: the largest request that fits is answered
        r = httpx.post(f"http://{addr}/v1/score", json={"text": text[:20_000]}, timeout=60)
        assert r.status_code == 200, r.text
        assert service.budget.used == 0
