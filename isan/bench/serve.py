"""The load benchmark behind ``isan bench serve``: a real ``isan-serve`` process under many clients.

The server runs in a subprocess (its own interpreter, so client and server do not share a GIL; they
do share the machine's cores). Measurements, each checked against the library's offline bits:

* **http**: ``clients`` closed-loop clients each POST texts of ``text_chars`` characters (slices of
  real text) for ``duration_s`` seconds over keep-alive connections: requests/s, latency p50/p90/p99,
  statuses, and the largest relative difference of a response's bits from ``Engine.score``.
* **stream**: ``streams`` WebSocket streams open at once, each sending ``chunks`` chunks of
  ``chunk_chars`` characters (a fixed size, or sizes drawn uniformly from a range such as 1-400)
  and waiting for each answer: per-chunk latency p50/p90/p99, frames/s, every stream's running
  total against scoring its whole text offline, and the server's resident memory before and at
  its peak during the run.
* **memory**: ``big_requests`` concurrent requests of ``big_chars`` characters: the server's resident
  memory before and at its peak (sampled from /proc), the statuses (503 beyond the budget).
* **cancel**: ``cancel_clients`` clients each send a request of ``big_chars`` characters (at most
  500,000) and disconnect after ``cancel_after_s``; then a new stream sends a chunk: how many of
  their characters were scored before the server dropped them (from ``/metrics``), and how long
  the new stream waited.
* **slow**: ``slow_conns`` connections each declare a 1,000-byte body and send 14 bytes of it:
  how many the server refuses at once (503, ``--max-connections``), how many it answers 408
  (``--read-timeout``) and when the last one is closed; then whether a normal request is served.

With ``workers`` (``isan bench serve --workers 1,2``) the measurements run against ``isan-serve
--workers N`` for each count in turn, in one run, each once every worker has answered ``/healthz``,
and ``scaling`` gives each count's requests/s, its ratio to the first count's and each worker's
share of the HTTP load (memory is then summed over the server's processes).

With ``url`` (``isan bench serve --url http://HOST:PORT``) no server is started: the HTTP and
stream load go to the server or load balancer already answering there (HAProxy in front of
replicas, docs/guide/deployment.md), every answer checked against the library as above.

Example:
    >>> res = run_bench(model=None, data="../shared/data/text8_head/text8_head.txt", clients=100)
    >>> res["http"]["requests_per_s"], res["http"]["latency_s"]["p99"]
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from isan.errors import IsanError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(xs)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (its worker processes, with ``--workers``)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the task ended
            pass
    return out


def _rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB of a process and the processes it started (a server's workers), summed."""
    rss = hwm = 0.0
    for p in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) / 1024
                    elif line.startswith("VmHWM:"):
                        hwm += int(line.split()[1]) / 1024
        except OSError:  # a worker that just ended
            pass
    return rss, hwm


def _healthz(host: str, port: int) -> dict | None:
    """``GET /healthz`` over a new connection: its JSON (whatever its status), or None."""
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return json.loads(data.partition(b"\r\n\r\n")[2])
    except (OSError, ValueError):
        return None


def _shares(before: dict[int, dict], after: dict[int, dict], pids, connections: dict[int, int]) -> list[dict]:
    """Each worker's part of the characters scored between two :meth:`ServerProcess.worker_health`
    readings: ``[{"pid", "connections", "chars_scored", "share"}]`` by pid (None for a worker that
    did not answer); ``connections``: the load's connections each took."""
    chars = {pid: after[pid]["server"]["chars_scored"] - before[pid]["server"]["chars_scored"]
             if pid in before and pid in after else None for pid in sorted(pids)}
    total = sum(c for c in chars.values() if c)
    return [{"pid": pid, "connections": connections.get(pid, 0), "chars_scored": c,
             "share": c / total if c is not None and total else None} for pid, c in chars.items()]


def _workers_in(args: list[str]) -> int:
    """The ``--workers N`` of isan-serve's arguments (1 without it)."""
    for i, a in enumerate(args):
        if a == "--workers" and i + 1 < len(args):
            return int(args[i + 1])
        if a.startswith("--workers="):
            return int(a.partition("=")[2])
    return 1


class ServerProcess:
    """``python -m isan.engine.serve`` on a free port, stopped by :meth:`stop` (or as a context manager).

    It runs in a session (and process group) of its own, as a terminal starts a command:
    ``os.killpg(proc.pid, SIGINT)`` is then Ctrl-C for it and its workers alone, and :meth:`stop`
    can kill every process it started. Its temporary files (``TMPDIR``: the run folder of
    ``--workers``) are in a folder of this object's, removed by :meth:`stop`.

    Ready when ``/healthz`` says ``"ready"`` and, with ``--workers N``, has been answered by N
    distinct worker processes (:attr:`worker_pids`), so that a measurement starts with every
    worker serving.

    Raises:
        IsanError: the server exited, or was not ready within ``timeout_s`` (it is stopped then).
    """

    def __init__(self, args: list[str], timeout_s: float = 300.0):
        self.port = _free_port()
        self.workers = _workers_in(args)
        self.worker_pids: set[int] = set()
        self.tmp = tempfile.mkdtemp(prefix="isan-bench-serve-")
        cmd = [sys.executable, "-m", "isan.engine.serve", "--port", str(self.port), "--log-level", "warning", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                     env={**os.environ, "TMPDIR": self.tmp})
        self.url = f"127.0.0.1:{self.port}"
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while True:  # the server listens while it loads the model: wait until /healthz says ready, on every worker
            if self.proc.poll() is not None:
                raise IsanError(f"isan-serve exited: {self.proc.stderr.read().decode()[-2000:]}")
            h = self.healthz()
            if h is not None and h.get("status") == "ready":
                self.worker_pids.add(h["worker"]["pid"])
                if len(self.worker_pids) >= self.workers:
                    return
            if time.time() > deadline:
                raise IsanError(f"isan-serve was not ready within {timeout_s:g} s"
                                + (f" ({len(self.worker_pids)} of its {self.workers} workers answered)"
                                   if self.worker_pids else ""))
            time.sleep(0.02 if self.worker_pids else 0.2)  # once one answers, a new connection may reach another

    def healthz(self) -> dict | None:
        """``GET /healthz`` over a new connection (any worker may take it): its JSON, or None."""
        return _healthz("127.0.0.1", self.port)

    def worker_health(self, tries: int = 2000) -> dict[int, dict]:
        """{pid: that worker's ``/healthz``} of every worker in :attr:`worker_pids` (new connections
        until each has answered, at most ``tries``; one that never does is left out)."""
        seen: dict[int, dict] = {}
        for _ in range(tries):
            h = self.healthz()
            if h is not None and "worker" in h:
                seen[h["worker"]["pid"]] = h
            if self.worker_pids <= seen.keys():
                break
        return seen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (a graceful shutdown); after ``timeout_s`` SIGKILL to the server's process group,
        its workers included. Whatever the server left in its group is killed, and the temporary
        folder removed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # the group: workers left by a parent that did not stop them (or was killed)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(30)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


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


def _score_body(t: str) -> dict:
    return {"text": t}


def _score_bits(answer: dict) -> float:
    return answer["bits"]


def _completions_body(t: str) -> dict:
    """What a scoring client of the OpenAI API sends (lm-eval's form without generation)."""
    return {"prompt": t, "max_tokens": 0, "echo": True, "logprobs": 1}


def _completions_bits(answer: dict) -> float:
    return -sum(answer["choices"][0]["logprobs"]["token_logprobs"]) / math.log(2)


async def _http_load(host, port, texts, expected, clients, duration_s, path="/v1/score", make_body=_score_body,
                     bits_of=_score_bits, connect_first=False):
    """``clients`` closed-loop clients on keep-alive connections for ``duration_s``. ``connect_first``:
    the clients connect one after another before the load (each connection answered a GET /healthz
    before the next opens), as clients that arrive over time; else each connects at its first
    request, all at once: with ``--workers``, one worker's accept loop may take such a burst whole
    (it accepts every connection waiting when it wakes), and the load then measures that worker."""
    lat: list[float] = []
    statuses: dict[int, int] = {}
    worst = [0.0]
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
        conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    wall = time.perf_counter() - t0
    ok = statuses.get(200, 0)
    return {"path": path, "clients": clients, "text_chars": len(texts[0]), "seconds": round(wall, 3),
            "requests": sum(statuses.values()),
            "ok": ok, "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "requests_per_s": ok / wall, "chars_per_s": ok * len(texts[0]) / wall, "latency_s": _pct(lat),
            "max_rel_bits_error": worst[0], **({"connections_by_pid": by_pid} if by_pid else {})}


async def _stream_load(host, port, stream_texts, expected, plans, pid=None):
    """Every stream sends its text in chunks of the sizes in ``plans[k]``, waiting for each answer."""
    from websockets.asyncio.client import connect

    lat: list[float] = []
    errors: list[str] = []
    worst = [0.0]
    opened = asyncio.Event()
    n_open = [0]
    rss0 = _rss_mib(pid)[0] if pid else None
    peak = [rss0 or 0.0]
    done = asyncio.Event()

    async def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib(pid)[0])
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
           "chunk_latency_s": _pct(lat), "max_rel_bits_error": worst[0]}
    if pid:
        out["rss_before_mib"], out["rss_peak_mib"] = round(rss0, 1), round(peak[0], 1)
    return out


async def _slow_probe(host, port, n, sent=14, declared=1000):
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


async def _memory_probe(host, port, pid, big_text, n):
    rss0, _ = _rss_mib(pid)
    peak = [rss0]
    done = asyncio.Event()

    async def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib(pid)[0])
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
            "latency_s": _pct([t for _, t in res])}


def _metric(text: str, name: str, labels: str = "") -> float:
    pat = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.eE+-]+)"
    m = re.search(pat, text)
    return float(m.group(1)) if m else 0.0


async def _cancel_probe(host, port, big_text, after_s, clients=12):
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
    scored = _metric(m1, "isan_chars_scored_total") - _metric(m0, "isan_chars_scored_total")
    cancelled = (_metric(m1, "isan_cancelled_total", 'reason="disconnect"')
                 - _metric(m0, "isan_cancelled_total", 'reason="disconnect"'))
    return {"clients": clients, "chars": len(big_text), "disconnect_after_s": after_s, "chars_scored": int(scored),
            "cancelled": int(cancelled), "new_stream_first_chunk_s": round(stream_wait, 3)}


def parse_chunk_chars(spec) -> tuple[int, int]:
    """``200`` -> (200, 200); ``"1-400"`` -> (1, 400)."""
    text = str(spec)
    lo, _, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise IsanError(f"chunk sizes must be N or MIN-MAX; got {text!r}") from None
    if not 1 <= a <= b:
        raise IsanError(f"chunk sizes must satisfy 1 <= MIN <= MAX; got {text!r}")
    return a, b


def run_bench(model: str | None = None, data: str = "../shared/data/text8_head/text8_head.txt", clients: int = 100,
              text_chars: int = 1000, duration_s: float = 10.0, streams: int = 1000, chunks: int = 5,
              chunk_chars="1-400", big_chars: int = 1_000_000, big_requests: int = 4, cancel_after_s: float = 0.5,
              slow_conns: int = 500, cancel_clients: int = 12, server_args: list[str] | None = None,
              which: tuple[str, ...] = ("http", "completions", "stream", "memory", "cancel", "slow"), seed: int = 0,
              workers: tuple[int, ...] | None = None, url: str | None = None, progress=None) -> dict:
    """Start ``isan-serve`` and measure it (see the module docstring); returns a JSON-able dict.

    Texts come from the text8-10M valid split (``data``); the memory and cancel probes use the
    test split's first ``big_chars`` characters (at most 500,000 each, repeated to length).

    Args:
        workers: worker counts (``isan-serve --workers N``): the measurements run against a server
            with each in turn, one after the other in this run; the answer then holds them under
            ``"workers"`` (one entry a count, with the server's memory summed over its processes)
            and, with ``http``, ``"scaling"``: each count's requests/s and its ratio to the first
            count's, with the latency and each worker's share of the characters scored (also
            under ``http.workers``: pid, chars_scored, share, from each worker's ``/healthz``).
            None: one server as ``server_args`` start it.
        url: measure the server or load balancer already answering there (``http://HOST:PORT``,
            for example HAProxy in front of replicas) instead of starting one: the ``http``,
            ``completions`` and ``stream`` measurements only (the others read one server's memory
            or metrics), with the model of ``model`` (its ``params_sha256`` must be what the
            endpoint's ``/healthz`` names). No memory figures then.

    Raises:
        IsanError: ``url`` with ``workers``, ``server_args`` or another measurement, a ``url``
            that is not ``http://HOST[:PORT]``, or an endpoint that does not answer ``/healthz``
            ready with the same model.
    """
    from isan.engine import load_engine
    from isan.data import read_text8_split

    if url is not None:
        host, port = _endpoint(url, which, workers, server_args)
    say = progress or (lambda msg: None)
    valid = read_text8_split(data, "valid")
    test = read_text8_split(data, "test")
    eng = load_engine(model)
    from isan.bench.engine import machine

    out: dict = {"benchmark": "serve", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
                 "model": {"source": str(eng.source), "params_sha256": eng.params_sha256},
                 "server_args": list(server_args or [])}
    if url is not None:
        h = _healthz(host, port)
        if h is None or h.get("status") != "ready":
            raise IsanError(f"{url} does not answer GET /healthz as a ready isan-serve "
                            f"({'no answer' if h is None else h.get('status') or h.get('error')})")
        theirs = (h.get("model") or {}).get("params_sha256")
        if theirs != eng.params_sha256:
            raise IsanError(f"{url} serves another model (params_sha256 {theirs}) than the benchmark's "
                            f"{eng.source} ({eng.params_sha256}): give its bundle with --model")
        out["url"] = url
    args = list(server_args or [])
    if model:
        args += ["--model", str(model)]
    n = max(1, min(len(valid) // text_chars, max(2 * clients, 16), 200))  # distinct texts, cycled
    texts = [valid[i * text_chars : (i + 1) * text_chars] for i in range(n)]
    expected = [r.bits for r in (eng.score(t) for t in texts)] if {"http", "completions"} & set(which) else []
    lo, hi = parse_chunk_chars(chunk_chars)
    rng = np.random.default_rng(seed)
    plans = [rng.integers(lo, hi + 1, size=chunks).tolist() for _ in range(streams)]
    starts = rng.integers(0, max(1, len(valid) - chunks * hi), size=streams)
    stream_texts = [valid[a : a + sum(p)] for a, p in zip(starts, plans)]
    big = (test * (big_chars // len(test) + 1))[:big_chars]

    def measure(host: str, port: int, srv: ServerProcess | None = None) -> dict:
        """The measurements against ``host:port``; ``srv``: the server started here (memory, workers)."""
        pid = srv.pid if srv is not None else None
        res: dict = {"server_pid_rss_mib_idle": round(_rss_mib(pid)[0], 1)} if pid else {}
        if "http" in which:
            say(f"http: {clients} clients posting {text_chars}-character texts for {duration_s:g} s")
            asyncio.run(_http_load(host, port, texts[:2], expected[:2], 2, 1.0))  # warm-up
            before = srv.worker_health() if workers and srv is not None else None
            res["http"] = asyncio.run(_http_load(host, port, texts, expected, clients, duration_s,
                                                 connect_first=before is not None))
            if before is not None:  # how the kernel shared the connections among the workers
                res["http"]["workers"] = _shares(before, srv.worker_health(), srv.worker_pids,
                                                 res["http"].pop("connections_by_pid", {}))
        if "completions" in which:  # the same texts through the OpenAI-compatible API (echo, logprobs=1)
            say(f"completions: {clients} clients posting {text_chars}-character prompts (max_tokens 0, echo, "
                f"logprobs 1) for {duration_s:g} s")
            res["completions"] = asyncio.run(_http_load(host, port, texts, expected, clients, duration_s,
                                                        path="/v1/completions", make_body=_completions_body,
                                                        bits_of=_completions_bits))
        if "stream" in which:
            say(f"stream: {streams} WebSocket streams x {chunks} chunks of {lo}-{hi} characters")
            want = [eng.score(t).bits for t in stream_texts]  # offline, on the engine's own path
            res["stream"] = asyncio.run(_stream_load(host, port, stream_texts, want, plans, pid))
        if "memory" in which:
            say(f"memory: {big_requests} concurrent requests of {big_chars:,} characters")
            res["memory"] = asyncio.run(_memory_probe(host, port, pid, big, big_requests))
        if "cancel" in which:
            k = min(big_chars, 500_000)
            say(f"cancel: {cancel_clients} clients send {k:,} characters and leave after {cancel_after_s:g} s; then a "
                "new stream")
            res["cancel"] = asyncio.run(_cancel_probe(host, port, big[:k], cancel_after_s, cancel_clients))
        if "slow" in which:
            say(f"slow: {slow_conns} connections that send 14 of the 1,000 bytes they declare")
            res["slow"] = asyncio.run(_slow_probe(host, port, slow_conns))
        if pid:
            res["server_rss_mib_end"], res["server_rss_mib_peak"] = (round(x, 1) for x in _rss_mib(pid))
        return res

    if url is not None:
        say(f"the endpoint at {url}")
        out.update(measure(host, port))
        return out
    if not workers:
        with ServerProcess(args) as srv:
            out.update(measure("127.0.0.1", srv.port, srv))
        return out
    out["workers"] = []
    for count in workers:
        say(f"isan-serve --workers {count}")
        with ServerProcess(args + ["--workers", str(count)]) as srv:
            out["workers"].append({"workers": count, **measure("127.0.0.1", srv.port, srv)})
    if "http" in which:
        base = out["workers"][0]["http"]["requests_per_s"]
        out["scaling"] = [{"workers": w["workers"], "requests_per_s": w["http"]["requests_per_s"],
                           "ratio": w["http"]["requests_per_s"] / base if base else None,
                           "latency_s": w["http"]["latency_s"], "statuses": w["http"]["statuses"],
                           "max_rel_bits_error": w["http"]["max_rel_bits_error"],
                           "worker_shares": [x["share"] for x in w["http"]["workers"]]} for w in out["workers"]]
    return out


#: the measurements ``run_bench(url=...)`` takes: the load, not one server's memory or metrics
URL_MEASUREMENTS = ("http", "completions", "stream")


def _endpoint(url: str, which, workers, server_args) -> tuple[str, int]:
    """(host, port) of ``run_bench``'s ``url``, after checking what goes with it."""
    from urllib.parse import urlsplit

    if workers or server_args:
        raise IsanError("--url measures a server that is already running: --workers and --server-args start one")
    other = [w for w in which if w not in URL_MEASUREMENTS]
    if other:
        raise IsanError(f"--url takes the measurements {', '.join(URL_MEASUREMENTS)}, not {', '.join(other)} (they "
                        "read one server's memory or metrics: run them without --url); choose with --only")
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError as e:
        raise IsanError(f"--url {url!r}: {e}") from None
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise IsanError(f"--url takes http://HOST[:PORT] (the server or balancer's address), not {url!r}")
    return parts.hostname, port


def markdown(res: dict) -> str:
    """The results as the README's tables (with worker counts: the scaling table, then each count's tables)."""
    lines = [f"Machine: {res['machine']['cpu']}, {res['machine']['cores']} cores, Python {res['machine']['python']}; "
             + (f"endpoint {res['url']} (running already: not started by the benchmark)" if res.get("url") else
                f"server options: {' '.join(res['server_args']) or '(defaults)'}")]
    if res.get("command"):
        lines.append(f"Command: `{res['command']}`")
    lines.append("")
    if "workers" not in res:
        return "\n".join(lines + [_tables(res)])
    if "scaling" in res:
        lines += ["| isan-serve --workers | requests/s (200) | ratio to the first | latency p50 / p90 / p99 | statuses "
                  "| each worker's share |", "|---:|---:|---:|---|---|---|"]
        for w in res["scaling"]:
            shares = " / ".join("-" if x is None else f"{100 * x:.0f}%" for x in w.get("worker_shares") or [])
            lines.append(f"| {w['workers']} | {w['requests_per_s']:,.1f} | {w['ratio']:.2f}x | {_pct_ms(w['latency_s'])} "
                         f"| {w['statuses']} | {shares or '-'} |")
        lines.append("")
    for w in res["workers"]:
        lines += [f"{w['workers']} worker{'s' if w['workers'] > 1 else ''}:", "", _tables(w)]
    return "\n".join(lines)


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1000:,.0f} ms"


def _pct_ms(d: dict) -> str:
    return f"{_ms(d['p50'])} / {_ms(d['p90'])} / {_ms(d['p99'])}"


def _tables(res: dict) -> str:
    """The tables of one server's measurements."""
    lines: list[str] = []
    for key, title in (("http", "HTTP load (/v1/score)"), ("completions", "HTTP load (/v1/completions, echo, logprobs 1)")):
        if key not in res:
            continue
        h = res[key]
        lines += [f"| {title} | value |", "|---|---:|",
                  f"| clients x text | {h['clients']} x {h['text_chars']:,} chars |",
                  f"| requests/s (200) | {h['requests_per_s']:,.1f} |",
                  f"| chars/s | {h['chars_per_s']:,.0f} |",
                  f"| latency p50 / p90 / p99 | {_pct_ms(h['latency_s'])} |",
                  f"| statuses | {h['statuses']} |",
                  f"| max relative bits difference from offline | {h['max_rel_bits_error']:.2e} |", ""]
    if "stream" in res:
        s = res["stream"]
        lines += ["| WebSocket load | value |", "|---|---:|",
                  f"| streams x chunks x chars | {s['streams']} x {s['chunks']} x {s['chunk_chars']} "
                  f"(mean {s['mean_chunk_chars']}) |",
                  f"| frames/s | {s['frames_per_s']:,.1f} |",
                  f"| chunk latency p50 / p90 / p99 | {_pct_ms(s['chunk_latency_s'])} |",
                  f"| errors | {s['errors']} |",
                  f"| max relative total-bits difference from offline | {s['max_rel_bits_error']:.2e} |"]
        if "rss_peak_mib" in s:
            lines.append(f"| server RSS before / peak | {s['rss_before_mib']:,.0f} / {s['rss_peak_mib']:,.0f} MiB |")
        lines.append("")
    if "memory" in res:
        m = res["memory"]
        lines += ["| memory | value |", "|---|---:|",
                  f"| concurrent requests x chars | {m['requests']} x {m['chars']:,} |",
                  f"| statuses | {m['statuses']} |",
                  f"| server RSS before / peak | {m['rss_before_mib']:,.0f} / {m['rss_peak_mib']:,.0f} MiB |",
                  f"| peak extra per admitted request | {m['peak_extra_mib_per_admitted_request']:,.1f} MiB |", ""]
    if "cancel" in res:
        c = res["cancel"]
        lines += ["| cancellation | value |", "|---|---:|",
                  f"| clients x chars / left after | {c['clients']} x {c['chars']:,} / {c['disconnect_after_s']:g} s |",
                  f"| chars scored before the jobs were dropped | {c['chars_scored']:,} |",
                  f"| jobs cancelled on disconnect | {c['cancelled']} |",
                  f"| a new stream's first 200-char chunk took | {c['new_stream_first_chunk_s'] * 1000:,.0f} ms |", ""]
    if "slow" in res:
        w = res["slow"]
        lines += ["| slow bodies | value |", "|---|---:|",
                  f"| connections x bytes sent / declared | {w['connections']} x {w['sent_bytes']} / {w['declared_bytes']} |",
                  f"| answers | {w['statuses']} |",
                  f"| last one closed after | {w['last_closed_after_s']:g} s |",
                  f"| then a normal request | {w['then_a_request']} |", ""]
    return "\n".join(lines)


def write_json(res: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(res, indent=2) + "\n")
