"""The load of ``isan bench serve`` (:mod:`isan.bench.serve`): a small HTTP/1.1 keep-alive client, the
closed-loop HTTP and WebSocket stream loads, each answer checked against the library's bits, and the
probes (slow connections, memory, cancelled requests).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time

import numpy as np

from isan.bench.serve_process import rss_mib


def percentiles(xs: list[float]) -> dict:
    """{"p50", "p90", "p99", "max"} of ``xs`` (seconds in, seconds out), each None when ``xs`` is empty."""
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(xs)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


# ---- a small HTTP/1.1 keep-alive client (asyncio streams; cheaper than a full client per request) ----
class HttpConn:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            k = k.strip().lower()
            if k == "content-length":
                length = int(v)
            elif k == "connection" and v.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, data

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def score_request_body(t: str) -> dict:
    """What a client of ``POST /v1/score`` sends for the text ``t``."""
    return {"text": t}


def score_answer_bits(answer: dict) -> float:
    """The text's total bits in an answer of ``POST /v1/score``."""
    return answer["bits"]


def completions_request_body(t: str) -> dict:
    """What a scoring client of the OpenAI API sends (lm-eval's form without generation)."""
    return {"prompt": t, "max_tokens": 0, "echo": True, "logprobs": 1}


def completions_answer_bits(answer: dict) -> float:
    """The text's total bits in an answer of ``POST /v1/completions`` (its echoed log-probabilities, nats)."""
    return -sum(answer["choices"][0]["logprobs"]["token_logprobs"]) / math.log(2)


async def http_load(host, port, texts, expected, clients, duration_s, path="/v1/score", make_body=score_request_body,
                     bits_of=score_answer_bits, connect_first=False, spans=None):
    """``clients`` closed-loop clients on keep-alive connections for ``duration_s``. ``connect_first``:
    the clients connect one after another before the load (each connection answered a GET /healthz
    before the next opens), as clients that arrive over time; else each connects at its first
    request, all at once: with ``--workers``, one worker's accept loop may take such a burst whole
    (it accepts every connection waiting when it wakes), and the load then measures that worker.
    ``spans``: where each text comes from (any JSON value a text), reported for the text whose bits
    differ most from ``expected`` (``worst_span``, with ``max_abs_bits_error``)."""
    lat: list[float] = []
    statuses: dict[int, int] = {}
    worst = [0.0]
    worst_abs: list = [0.0, None]  # the largest absolute difference in bits, and its text's index
    bodies = [json.dumps(make_body(t)).encode() for t in texts]
    conns = [HttpConn(host, port) for _ in range(clients)]
    by_pid: dict[int, int] = {}  # connections each worker took
    if connect_first:
        for conn in conns:
            st, data = await conn.request("GET", "/healthz")
            pid = json.loads(data)["worker"]["pid"]
            by_pid[pid] = by_pid.get(pid, 0) + 1
    stop_at = time.perf_counter() + duration_s

    async def client(k):
        conn = conns[k]
        i = k
        while time.perf_counter() < stop_at:
            j = i % len(texts)
            i += clients
            t0 = time.perf_counter()
            try:
                st, data = await conn.request("POST", path, bodies[j])
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                statuses[-1] = statuses.get(-1, 0) + 1
                conn.close()
                continue
            lat.append(time.perf_counter() - t0)
            statuses[st] = statuses.get(st, 0) + 1
            if st == 200:
                b = bits_of(json.loads(data))
                worst[0] = max(worst[0], abs(b - expected[j]) / abs(expected[j]))
                if abs(b - expected[j]) >= worst_abs[0]:
                    worst_abs[:] = [abs(b - expected[j]), j]
        conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    wall = time.perf_counter() - t0
    ok = statuses.get(200, 0)
    return {"path": path, "clients": clients, "text_chars": len(texts[0]), "seconds": round(wall, 3),
            "requests": sum(statuses.values()),
            "ok": ok, "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "requests_per_s": ok / wall, "chars_per_s": ok * len(texts[0]) / wall, "latency_s": percentiles(lat),
            "max_rel_bits_error": worst[0], **worst_of(worst_abs, spans),
            **({"connections_by_pid": by_pid} if by_pid else {})}


def worst_of(worst_abs: list, spans) -> dict:
    """``{"max_abs_bits_error", "worst_span"}`` from ``[difference, text index]`` and the texts' spans."""
    span = spans[worst_abs[1]] if spans is not None and worst_abs[1] is not None else None
    return {"max_abs_bits_error": worst_abs[0], "worst_span": span}


async def stream_load(host, port, stream_texts, expected, plans, pid=None, spans=None):
    """Every stream sends its text in chunks of the sizes in ``plans[k]``, waiting for each answer;
    ``spans`` as for :func:`http_load`."""
    from websockets.asyncio.client import connect

    lat: list[float] = []
    errors: list[str] = []
    worst = [0.0]
    worst_abs: list = [0.0, None]
    opened = asyncio.Event()
    n_open = [0]
    rss0 = rss_mib(pid)[0] if pid else None
    peak = [rss0 or 0.0]
    done = asyncio.Event()

    async def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid)[0])
            await asyncio.sleep(0.05)

    async def stream(k):
        text = stream_texts[k]
        try:
            async with connect(f"ws://{host}:{port}/v1/stream", max_size=None, ping_interval=None,
                               open_timeout=120, close_timeout=10) as ws:
                n_open[0] += 1
                if n_open[0] == len(stream_texts):
                    opened.set()
                await asyncio.wait_for(opened.wait(), 180)  # all streams open before any sends
                msg = None
                pos = 0
                for size in plans[k]:
                    t0 = time.perf_counter()
                    await ws.send(json.dumps({"text": text[pos : pos + size]}))
                    pos += size
                    msg = json.loads(await ws.recv())
                    lat.append(time.perf_counter() - t0)
                    if "error" in msg:
                        errors.append(msg["error"][:200])
                        return
                worst[0] = max(worst[0], abs(msg["total_bits"] - expected[k]) / abs(expected[k]))
                if abs(msg["total_bits"] - expected[k]) >= worst_abs[0]:
                    worst_abs[:] = [abs(msg["total_bits"] - expected[k]), k]
        except Exception as e:  # noqa: BLE001 - reported, not raised: the benchmark counts failures
            errors.append(f"{type(e).__name__}: {e}"[:200])
            opened.set()

    sampler = asyncio.ensure_future(sample()) if pid else None
    t0 = time.perf_counter()
    await asyncio.gather(*(stream(k) for k in range(len(stream_texts))))
    wall = time.perf_counter() - t0
    done.set()
    if sampler is not None:
        await sampler
    sizes = [c for p in plans for c in p]
    out = {"streams": len(stream_texts), "chunks": len(plans[0]) if plans else 0,
           "chunk_chars": f"{min(sizes)}-{max(sizes)}" if sizes and min(sizes) != max(sizes) else (sizes[0] if sizes else 0),
           "mean_chunk_chars": round(float(np.mean(sizes)), 1) if sizes else 0, "seconds": round(wall, 3),
           "frames_ok": len(lat) - len(errors), "errors": len(errors), "first_errors": errors[:3],
           "frames_per_s": len(lat) / wall, "chars_per_s": sum(sizes) / wall if not errors else None,
           "chunk_latency_s": percentiles(lat), "max_rel_bits_error": worst[0], **worst_of(worst_abs, spans)}
    if pid:
        out["rss_before_mib"], out["rss_peak_mib"] = round(rss0, 1), round(peak[0], 1)
    return out


async def slow_body_probe(host, port, n, sent=14, declared=1000):
    """``n`` connections that declare a body of ``declared`` bytes and send ``sent``."""
    t0 = time.perf_counter()
    conns = []
    for _ in range(n):
        try:
            r, w = await asyncio.open_connection(host, port)
        except OSError:
            conns.append(None)
            continue
        w.write((f"POST /v1/score HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {declared}\r\n\r\n").encode() + b'{"text": "ab' + b"c" * (sent - 12))
        conns.append((r, w))

    async def outcome(c):
        if c is None:
            return "refused", 0.0
        r, w = c
        try:
            line = await asyncio.wait_for(r.readline(), 120)
            await asyncio.wait_for(r.read(), 10)
        except (asyncio.TimeoutError, OSError):
            line = b""
        dt = time.perf_counter() - t0
        w.close()
        status = line.split()[1].decode() if len(line.split()) > 1 else "closed"
        return status, dt

    res = await asyncio.gather(*(outcome(c) for c in conns))
    statuses: dict[str, int] = {}
    for st, _ in res:
        statuses[st] = statuses.get(st, 0) + 1
    conn = HttpConn(host, port)
    st, _ = await conn.request("POST", "/v1/score", json.dumps({"text": "the cat sat on the mat"}).encode())
    conn.close()
    return {"connections": n, "declared_bytes": declared, "sent_bytes": sent, "statuses": statuses,
            "last_closed_after_s": round(max(dt for _, dt in res), 2), "then_a_request": st}


async def memory_probe(host, port, pid, big_text, n):
    """``n`` requests of ``big_text`` at once: the server's resident memory (MiB) before and at its peak,
    and the latencies."""
    rss0, _ = rss_mib(pid)
    peak = [rss0]
    done = asyncio.Event()

    async def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid)[0])
            await asyncio.sleep(0.02)

    body = json.dumps({"text": big_text}).encode()

    async def one():
        conn = HttpConn(host, port)
        t0 = time.perf_counter()
        st, data = await conn.request("POST", "/v1/score", body)
        conn.close()
        return st, time.perf_counter() - t0

    sampler = asyncio.ensure_future(sample())
    res = await asyncio.gather(*(one() for _ in range(n)))
    done.set()
    await sampler
    statuses: dict[str, int] = {}
    for st, _ in res:
        statuses[str(st)] = statuses.get(str(st), 0) + 1
    ok = max(1, statuses.get("200", 0))
    return {"requests": n, "chars": len(big_text), "statuses": statuses, "rss_before_mib": round(rss0, 1),
            "rss_peak_mib": round(peak[0], 1), "peak_extra_mib_per_admitted_request": round((peak[0] - rss0) / ok, 1),
            "latency_s": percentiles([t for _, t in res])}


def prometheus_sample(text: str, name: str, labels: str = "") -> float:
    """The value of the sample ``name{labels}`` in a Prometheus text exposition, 0.0 when absent."""
    pat = r"^" + re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.eE+-]+)$"
    m = re.search(pat, text, re.MULTILINE)  # a sample's line, not its HELP or TYPE line
    return float(m.group(1)) if m else 0.0


async def cancel_probe(host, port, big_text, after_s, clients=12):
    """``clients`` clients each send ``big_text`` and disconnect after ``after_s``; then a new stream
    sends a 200-character chunk: how much of the big texts was scored, and how long the new stream waited."""
    from websockets.asyncio.client import connect

    async def metrics():
        c = HttpConn(host, port)
        st, data = await c.request("GET", "/metrics")
        c.close()
        return data.decode()

    m0 = await metrics()
    body = json.dumps({"text": big_text}).encode()
    writers = []
    for _ in range(clients):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write((f"POST /v1/score HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        writers.append(writer)
    await asyncio.gather(*(w.drain() for w in writers))
    await asyncio.sleep(after_s)
    for w in writers:
        w.close()
    t0 = time.perf_counter()
    async with connect(f"ws://{host}:{port}/v1/stream", ping_interval=None, open_timeout=120) as ws:
        await ws.send(json.dumps({"text": big_text[:200]}))
        json.loads(await ws.recv())
    stream_wait = time.perf_counter() - t0
    await asyncio.sleep(max(1.0, 4 * after_s))  # the server notices, drops the jobs; in-flight rounds finish
    m1 = await metrics()
    scored = prometheus_sample(m1, "isan_chars_scored_total") - prometheus_sample(m0, "isan_chars_scored_total")
    cancelled = (prometheus_sample(m1, "isan_cancelled_total", 'reason="disconnect"')
                 - prometheus_sample(m0, "isan_cancelled_total", 'reason="disconnect"'))
    return {"clients": clients, "chars": len(big_text), "disconnect_after_s": after_s, "chars_scored": int(scored),
            "cancelled": int(cancelled), "new_stream_first_chunk_s": round(stream_wait, 3)}


# ---- streams reset abruptly: the server's memory over time ------------------------------------------
async def _reset_stream(host: str, port: int, frame: bytes, frames: int, wait_s: float = 120.0) -> bool:
    """One WebSocket that sends ``frames`` copies of ``frame``, waits for the first byte of an answer
    and resets its connection (SO_LINGER 0: a TCP RST, no close frame). Whether an answer had begun."""
    import socket
    import struct

    from websockets.client import ClientProtocol
    from websockets.http11 import Response
    from websockets.uri import parse_uri

    proto = ClientProtocol(parse_uri(f"ws://{host}:{port}/v1/stream"), max_size=None)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        proto.send_request(proto.connect())
        writer.write(b"".join(proto.data_to_send()))
        while not any(isinstance(e, Response) for e in proto.events_received()):
            data = await asyncio.wait_for(reader.read(4096), wait_s)
            if not data:
                return False
            proto.receive_data(data)
        for _ in range(frames):
            proto.send_text(frame)
        writer.write(b"".join(proto.data_to_send()))
        await writer.drain()
        return bool(await asyncio.wait_for(reader.read(1), wait_s))
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


async def _server_gauges(host: str, port: int) -> dict:
    c = HttpConn(host, port)
    _, data = await c.request("GET", "/metrics")
    c.close()
    text = data.decode()
    return {"streams_open": prometheus_sample(text, "isan_streams_open"),
            "pending_bytes": prometheus_sample(text, "isan_pending_bytes")}


def _fds(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/fd"))


async def reset_probe(host, port, pid, text, streams, frames=1, concurrency=20, every=250, settle_s=5.0):
    """``streams`` WebSocket streams, ``concurrency`` at a time, each sending ``frames`` frames of ``text``
    with ``per_char`` and resetting its connection once the answer has begun (:func:`_reset_stream`).
    The server's resident memory (VmRSS, MiB) after every ``every`` streams, then after ``settle_s``
    seconds of quiet with its open file descriptors and its stream and memory-budget gauges."""
    frame = json.dumps({"text": text, "per_char": True}).encode()
    sem = asyncio.Semaphore(concurrency)
    begun = [0]

    async def one():
        async with sem:
            ok = await _reset_stream(host, port, frame, frames)
            begun[0] += ok  # after the await: ``begun[0] += await ...`` would read the count before it

    fds0 = _fds(pid)
    samples = [{"streams": 0, "seconds": 0.0, "rss_mib": round(rss_mib(pid)[0], 1)}]
    t0 = time.perf_counter()
    while samples[-1]["streams"] < streams:
        k = min(every, streams - samples[-1]["streams"])
        await asyncio.gather(*(one() for _ in range(k)))
        samples.append({"streams": samples[-1]["streams"] + k, "seconds": round(time.perf_counter() - t0, 1),
                        "rss_mib": round(rss_mib(pid)[0], 1)})
    await asyncio.sleep(settle_s)
    return {"streams": streams, "chars": len(text), "frames": frames, "frame_bytes": len(frame),
            "concurrency": concurrency, "answers_begun": begun[0], "samples": samples,
            "rss_mib_settled": round(rss_mib(pid)[0], 1), "fds_before": fds0, "fds_settled": _fds(pid),
            **await _server_gauges(host, port)}
