"""Replicas behind a real load balancer, and streams that survive a replica (issue #38).

Two parts. The stream client (engine/serve/client.py) against a stand-in replica whose answers
depend on the stream's state, so that every way of losing a connection is made on purpose:
a graceful shutdown's last snapshot, a connection cut, refusals, a refused re-sent frame.
Then real processes on loopback: two ``isan-serve`` replicas sharing a state secret behind
HAProxy run with the committed docs/guide/deploy/haproxy.cfg, as docs/guide/deployment.md has
them; HTTP is spread over both and answers as the library; many streams of real text go through
the balancer with the client; one replica is killed (SIGKILL) or shut down (SIGTERM) in the
middle; every stream completes with the bits of the library's scoring of its chunks.
``ISAN_LB_STREAMS=1000 python -m pytest tests/test_serve_lb.py -s -k replica`` runs the issue's
1,000 streams (default 40) and prints how long the resumes took.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("websockets.asyncio.server")
from websockets.asyncio.server import serve  # noqa: E402

from conftest import DATA, need  # noqa: E402
from isan.engine import Engine  # noqa: E402
from isan.engine.serve.client import (FrameError, ResumableStream, StreamLostError,  # noqa: E402
                                      SyncResumableStream)
from isan.engine.serve.snapshot import encode_state  # noqa: E402
from server_helpers import free_port, wait_for  # noqa: E402
from tolerances import engine_float32_tolerance, serve_bench_tolerance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide" / "deployment.md"
HAPROXY_CFG = REPO / "docs" / "guide" / "deploy" / "haproxy.cfg"
#: the replica's options in the guide (after `isan-serve --port PORT`); the test runs them, the secret
#: file ($ISAN_SECRET_FILE, which the guide puts outside the repository) in its temporary folder
REPLICA_OPTIONS = ["--state-secret-file", '"$ISAN_SECRET_FILE"', "--threads", "1"]
STREAMS = int(os.environ.get("ISAN_LB_STREAMS", "40"))
#: Debian's haproxy (in /usr/sbin, which a user's PATH may lack)
HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


# ---- the client against a stand-in replica --------------------------------------------------
def fake_bits(chars: int, text: str) -> float:
    """The stand-in's bits of ``text`` after ``chars`` characters: they depend on the state."""
    return sum(((chars + i) % 7 + 1) * (ord(c) % 5 + 1) for i, c in enumerate(text)) / 8


def fake_token(chars: int, bits: float) -> str:
    return "T" + json.dumps([chars, bits])


def fake_reference(chunks: list[str]) -> list[dict]:
    """The answers of a stream that is never interrupted (chars, bits and running totals)."""
    out, chars, total = [], 0, 0.0
    for c in chunks:
        b = fake_bits(chars, c)
        chars, total = chars + len(c), total + b
        out.append({"chars": len(c), "bits": b, "total_chars": chars, "total_bits": total})
    return out


class FakeReplica:
    """``/v1/stream`` as isan-serve answers it (text, reset, restore, snapshot; error frames keep the
    state), with one plan a connection: ``refuse`` (status, close code) at once; ``shutdown_after`` k
    answers, then the shutdown event and close 1012; ``shutdown_first``: the shutdown event as the
    first frame arrives, unanswered, with the initial state (what a server that began its shutdown
    before it read the restore handed back before it sent null there), then close 1012;
    ``abort_after`` k answers, then the TCP connection cut (no close frame); ``refuse_restore``
    status; ``busy_first_text`` (a 503 answer)."""

    def __init__(self, plans):
        self.plans = list(plans)
        self.frames: list[list[dict]] = []  # the frames each connection received

    async def handler(self, ws):
        plan = self.plans[len(self.frames)] if len(self.frames) < len(self.plans) else {}
        got: list[dict] = []
        self.frames.append(got)
        if "refuse" in plan:
            status, code = plan["refuse"]
            await ws.send(json.dumps({"error": "refused on purpose", "status": status}))
            await ws.close(code)
            return
        chars, bits, answered, busy = 0, 0.0, 0, plan.get("busy_first_text", False)
        async for raw in ws:
            f = json.loads(raw)
            got.append(f)
            if plan.get("shutdown_first"):
                await ws.send(json.dumps({"event": "shutdown", "state": fake_token(0, 0.0)}))
                await ws.close(1012)
                return
            if "restore" in f and plan.get("refuse_restore"):
                await ws.send(json.dumps({"error": "not this snapshot", "status": plan["refuse_restore"]}))
                continue
            if "text" in f and (f["text"].startswith("!") or busy):
                busy = False
                await ws.send(json.dumps({"error": "refused frame", "status": 503 if "!" not in f["text"] else 422}))
                continue
            out: dict = {}
            if "restore" in f:
                chars, bits = json.loads(f["restore"][1:])
                out["restored"] = True
            if f.get("reset"):
                chars, bits = 0, 0.0
                out["reset"] = True
            if "text" in f:
                b = fake_bits(chars, f["text"])
                chars, bits = chars + len(f["text"]), bits + b
                out.update(chars=len(f["text"]), bits=b)
                answered += 1
            out.update(total_chars=chars, total_bits=bits)
            if f.get("snapshot"):
                out["state"] = fake_token(chars, bits)
            await ws.send(json.dumps(out))
            if answered and plan.get("shutdown_after") == answered:
                await ws.send(json.dumps({"event": "shutdown", "state": fake_token(chars, bits)}))
                await ws.close(1012)
                return
            if answered and plan.get("abort_after") == answered:
                ws.transport.abort()
                return


@contextmanager
def fake_replica(*plans):
    """A :class:`FakeReplica` on a free loopback port, its own event loop in a thread; yields (url, fake)."""
    fake, port = FakeReplica(plans), free_port()
    loop, started, stop = asyncio.new_event_loop(), threading.Event(), None

    async def main():
        nonlocal stop
        stop = asyncio.Event()
        async with serve(fake.handler, "127.0.0.1", port):
            started.set()
            await stop.wait()

    th = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    th.start()
    assert started.wait(30), "the stand-in replica did not start"
    try:
        yield f"ws://127.0.0.1:{port}/v1/stream", fake
    finally:
        loop.call_soon_threadsafe(stop.set)
        th.join(10)


def plain(answers: list[dict]) -> list[dict]:
    return [{k: a[k] for k in ("chars", "bits", "total_chars", "total_bits")} for a in answers]


CHUNKS = ["the cat ", "sat on ", "the mat ", "and looked ", "at the ", "dog"]


def test_a_graceful_shutdown_hands_the_stream_over_with_its_last_state():
    """Six chunks sent ahead; the replica answers two, sends its shutdown snapshot (the state after
    them; the client's own has none: a snapshot every third frame) and closes with 1012. The client
    restores that snapshot elsewhere and re-sends only the four unanswered chunks."""
    with fake_replica({"shutdown_after": 2}, {}) as (url, fake):
        async def run():
            async with ResumableStream(url, snapshot_every=3) as s:
                for c in CHUNKS:
                    await s.send(c)
                return [await s.recv() for _ in CHUNKS], s.resumes

        answers, resumes = asyncio.run(run())
    want = fake_reference(CHUNKS)
    assert plain(answers) == want and len(resumes) == 1
    again = fake.frames[1]
    assert again[0] == {"restore": fake_token(want[1]["total_chars"], want[1]["total_bits"])}
    assert [f["text"] for f in again[1:]] == CHUNKS[2:]
    assert [("snapshot" in f) for f in again[1:]] == [True, False, False, True]  # frames 3 and 6 ask for one


def test_a_shutdown_before_the_restore_is_answered_does_not_replace_the_snapshot():
    """The replica the client resumes on begins its shutdown before it answers the restore and hands
    back its initial state: the client keeps its own snapshot (not the empty one) and restores it on
    the next replica, where the stream goes on to the undisturbed bits."""
    with fake_replica({"shutdown_after": 2}, {"shutdown_first": True}, {}) as (url, fake):
        async def run():
            async with ResumableStream(url, snapshot_every=3, backoff_s=0.01) as s:
                for c in CHUNKS:
                    await s.send(c)
                return [await s.recv() for _ in CHUNKS], s.resumes

        answers, resumes = asyncio.run(run())
    want = fake_reference(CHUNKS)
    assert plain(answers) == want and len(resumes) == 1 and len(fake.frames) == 3
    token = fake_token(want[1]["total_chars"], want[1]["total_bits"])
    assert fake.frames[1][0] == fake.frames[2][0] == {"restore": token}
    assert [f["text"] for f in fake.frames[2][1:]] == CHUNKS[2:]


def test_a_cut_connection_resumes_from_the_last_snapshot_and_answers_each_chunk_once():
    """The connection is cut (no close frame) after three answers; the last snapshot came with the
    second: the third chunk is re-sent and its second answer dropped; the sync wrapper does the same."""
    with fake_replica({"abort_after": 3}, {}) as (url, fake):
        with SyncResumableStream(url, snapshot_every=2) as s:
            answers = [s.score(c) for c in CHUNKS]
            resumes = s.resumes
    want = fake_reference(CHUNKS)
    assert plain(answers) == want and len(answers) == len(CHUNKS) and len(resumes) == 1
    assert fake.frames[1][0] == {"restore": fake_token(want[1]["total_chars"], want[1]["total_bits"])}
    assert [f["text"] for f in fake.frames[1][1:]] == CHUNKS[2:]


def test_a_refused_chunk_is_an_error_and_is_not_resent():
    """A chunk answered with an error leaves the state as it was (FrameError, the stream goes on);
    after a cut it is not re-sent; without any snapshot the stream starts again from the initial
    state ({"reset": true}) with every chunk since."""
    with fake_replica({"abort_after": 2}, {}) as (url, fake):
        async def run():
            async with ResumableStream(url, snapshot_every=100) as s:
                out = [await s.score(CHUNKS[0])]
                with pytest.raises(FrameError) as err:
                    await s.score("!bad")
                assert err.value.status == 422 and "refused frame" in str(err.value)
                out += [await s.score(c) for c in CHUNKS[1:]]
                return out

        answers = asyncio.run(run())
    assert plain(answers) == fake_reference(CHUNKS)
    assert fake.frames[1][0] == {"reset": True} and [f["text"] for f in fake.frames[1][1:]] == CHUNKS


def test_a_resent_chunk_refused_as_busy_resumes_again():
    """After a cut, the replica answers the first re-sent chunk 503 (busy): that chunk must be in the
    state, so the client resumes once more rather than go on without it."""
    with fake_replica({"abort_after": 2}, {"busy_first_text": True}, {}) as (url, fake):
        async def run():
            async with ResumableStream(url, snapshot_every=100, backoff_s=0.01) as s:
                return [await s.score(c) for c in CHUNKS], s.resumes

        answers, resumes = asyncio.run(run())
    assert plain(answers) == fake_reference(CHUNKS) and len(resumes) == 2 and len(fake.frames) == 3
    assert fake.frames[2][0] == {"reset": True} and [f["text"] for f in fake.frames[2][1:]] == CHUNKS


@pytest.mark.parametrize("plans, code, words", [
    (({"refuse": (401, 1008)},), 401, "401"),  # no API key: no replica takes the stream
    (({"abort_after": 1}, {"refuse_restore": 409}), 409, "same --state-secret-file"),  # a replica of another model
])
def test_refusals_no_replica_would_undo_end_the_stream_at_once(plans, code, words):
    with fake_replica(*plans) as (url, fake):
        async def run():
            async with ResumableStream(url, retries=5, backoff_s=0.01) as s:
                for c in CHUNKS:
                    await s.score(c)

        with pytest.raises(StreamLostError) as err:
            asyncio.run(run())
    assert err.value.code == code and words in str(err.value)
    assert len(fake.frames) == len(plans)  # no further attempt


def test_a_busy_replica_is_tried_again_and_nobody_listening_is_a_clear_error():
    with fake_replica({"refuse": (503, 1013)}, {}) as (url, fake):
        with SyncResumableStream(url, backoff_s=0.01) as s:
            assert plain([s.score("the cat")]) == fake_reference(["the cat"])
    assert len(fake.frames) == 2
    url = f"ws://127.0.0.1:{free_port()}/v1/stream"
    with pytest.raises(StreamLostError, match=r"after 3 attempts .*cannot connect.*GET /healthz"):
        SyncResumableStream(url, retries=3, backoff_s=0.01).connect()
    with pytest.raises(ValueError, match="the client sets"):
        ResumableStream(url, options={"snapshot": False})


# ---- real replicas behind HAProxy ------------------------------------------------------------
def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


class Cluster:
    """Two ``isan-serve`` replicas (the guide's command, on free ports) sharing a state secret,
    behind HAProxy run with the committed template; everything on loopback, logs in ``tmp``."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.replicas: list = []
        self.haproxy = None
        try:  # whatever fails, what was started is stopped
            self._start_all()
        except BaseException:
            self.close()
            raise

    def _start_all(self) -> None:
        self.secret = self.tmp / "state-secret"
        self.secret.write_text(secrets.token_hex(32) + "\n")
        self.ports = [free_port(), free_port()]
        options = [str(self.secret) if o == REPLICA_OPTIONS[1] else o for o in REPLICA_OPTIONS]
        for i, p in enumerate(self.ports):
            self.replicas.append(self._start(["isan-serve", "--port", str(p), *options], f"replica{i + 1}"))
        for i, p in enumerate(self.ports):
            wait_for(lambda: self._ready(i, p), f"replica {i + 1} ready")
        self.front = free_port()
        env = {"ISAN_LB_BIND": f"127.0.0.1:{self.front}", "ISAN_REPLICA_1": f"127.0.0.1:{self.ports[0]}",
               "ISAN_REPLICA_2": f"127.0.0.1:{self.ports[1]}"}
        check = subprocess.run([HAPROXY, "-c", "-f", str(HAPROXY_CFG)], env={**os.environ, **env},
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        self.haproxy = self._start([HAPROXY, "-f", str(HAPROXY_CFG), "-db"], "haproxy", env)
        wait_for(lambda: self._answers(f"http://127.0.0.1:{self.front}/healthz"), "HAProxy answering")

    def _start(self, argv, name, env=None):
        if argv[0] == "isan-serve":  # the console script, as the module (a venv's scripts may not be on PATH)
            argv = [sys.executable, "-m", "isan.engine.serve", *argv[1:]]
        log = open(self.tmp / f"{name}.log", "wb")
        return subprocess.Popen(argv, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def _ready(self, i: int, port: int) -> bool:
        assert self.replicas[i].poll() is None, f"replica {i + 1} exited:\n{self.log(f'replica{i + 1}')}"
        return self._answers(f"http://127.0.0.1:{port}/healthz")

    def _answers(self, url: str) -> bool:
        try:
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.front}"

    def replica_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def streams_open(self, i: int) -> int:
        return httpx.get(f"{self.replica_url(i)}/healthz", timeout=10).json()["server"]["streams_open"]

    def scored(self, i: int) -> float:
        """POST /v1/score requests replica i answered 200."""
        text = httpx.get(f"{self.replica_url(i)}/metrics", timeout=10).text
        return metric(text, 'isan_requests_total{endpoint="score",status="200"}')

    def close(self) -> None:
        procs = [p for p in [self.haproxy, *self.replicas] if p is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.fixture
def cluster(tmp_path):
    if HAPROXY is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy; .ci/run installs it)")
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_a_cluster_that_cannot_start_stops_what_it_started(tmp_path, monkeypatch):
    """Cluster's constructor fails after its replicas started (here HAProxy refuses its config):
    it stops them before raising, so a failed set-up leaves no process behind."""
    if HAPROXY is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy; .ci/run installs it)")
    bad = tmp_path / "bad.cfg"
    bad.write_text("this is not an haproxy configuration\n")
    monkeypatch.setattr(sys.modules[__name__], "HAPROXY_CFG", bad)
    started: list = []
    start = Cluster._start
    monkeypatch.setattr(Cluster, "_start", lambda self, *a: started.append(start(self, *a)) or started[-1])
    with pytest.raises(AssertionError):
        Cluster(tmp_path)
    assert len(started) == 2 and all(p.poll() is not None for p in started), "a replica was left running"


def test_the_guide_shows_the_tested_commands():
    """docs/guide/deployment.md's commands are those the tests below run (other ports aside)."""
    guide = GUIDE.read_text(encoding="utf-8")
    for port in (8001, 8002):
        assert " ".join(["isan-serve", "--port", str(port), *REPLICA_OPTIONS]) in guide
    assert ("ISAN_LB_BIND=127.0.0.1:8000 ISAN_REPLICA_1=127.0.0.1:8001 ISAN_REPLICA_2=127.0.0.1:8002 "
            "haproxy -f docs/guide/deploy/haproxy.cfg -db") in guide
    assert "ISAN_LB_BIND" in HAPROXY_CFG.read_text() and "${ISAN_REPLICA_2}" in HAPROXY_CFG.read_text()
    # the secret is written outside the repository, readable by its owner only (#45 item 11)
    assert 'ISAN_SECRET_FILE="${XDG_CONFIG_HOME:-$HOME/.config}/isan/state-secret"' in guide
    assert '(umask 077 && python -c "import secrets; print(secrets.token_hex(32))" > "$ISAN_SECRET_FILE")' in guide
    assert "> isan-secret" not in guide


def test_http_is_spread_over_the_replicas_and_snapshots_move_between_them(cluster, default_engine, text8_test,
                                                                          small_bundle):
    eng = default_engine
    texts = [text8_test[i * 1000 : i * 1000 + 300 + 37 * i] for i in range(20)]
    with httpx.Client(base_url=cluster.url, timeout=60) as c:  # one keep-alive connection
        for t in texts:
            r, tol = c.post("/v1/score", json={"text": t}), engine_float32_tolerance(eng, t).twice()  # two float32
            assert r.status_code == 200, r.text
            assert r.json()["chars"] == len(t) and abs(r.json()["bits"] - eng.score(t).bits) <= tol.total_bits
        counts = [cluster.scored(0), cluster.scored(1)]
        assert sum(counts) == len(texts) and min(counts) >= len(texts) // 2 - 1, counts  # round robin
        # a snapshot of one replica restores on the other (the shared secret), with the bits of one text
        a, b, whole = texts[0][:150], texts[0][150:], engine_float32_tolerance(eng, texts[0]).twice()  # two float32
        token = httpx.post(f"{cluster.replica_url(0)}/v1/score", json={"text": a, "return_state": True}).json()["state"]
        r = httpx.post(f"{cluster.replica_url(1)}/v1/score", json={"text": b, "state": token})
        assert r.status_code == 200 and abs(r.json()["total_bits"] - eng.score(texts[0]).bits) <= whole.total_bits
        # through the balancer: a changed snapshot is refused (403), another model's (409)
        raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        raw[60] ^= 1
        forged = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
        small = Engine.load(small_bundle)  # another model's snapshot, signed with the replicas' secret
        secret = cluster.secret.read_bytes().strip()
        foreign = encode_state(small.score("the cat").state, small.params_sha256, secret)
        for _ in range(2):  # whichever replica answers
            r = c.post("/v1/score", json={"text": b, "state": forged})
            assert r.status_code == 403 and "signature" in r.json()["error"], r.text
            r = c.post("/v1/score", json={"text": b, "state": foreign})
            assert r.status_code == 409 and "another model" in r.json()["error"], r.text
        # the balancer passes the client's Host on: a name the replicas were not given is refused
        r = c.post("/v1/score", json={"text": b}, headers={"Host": "lm.example.com"})
        assert r.status_code == 403 and "--allow-host" in r.json()["error"]

    async def restore(token):
        async with ResumableStream(f"{cluster.url}/v1/stream", state=token, retries=2) as s:
            return await s.score(b)

    with pytest.raises(StreamLostError) as err:  # the client: a forged snapshot ends the stream, no retry
        asyncio.run(restore(forged))
    assert err.value.code == 403 and "signature" in str(err.value)
    assert abs(asyncio.run(restore(token))["total_bits"] - eng.score(texts[0]).bits) <= whole.total_bits
    # no replica left: the balancer's own answer, in the server's error shape
    for p in cluster.replicas:
        p.kill()
        p.wait(30)
    r = httpx.post(f"{cluster.url}/v1/score", json={"text": b}, timeout=60)
    assert r.status_code == 503 and r.json()["status"] == 503 and "no replica" in r.json()["error"]
    assert r.headers["retry-after"] == "1"


def test_bench_serve_measures_through_the_balancer(cluster, text8_path):
    """isan bench serve --url: the HTTP and stream load through HAProxy to both replicas, every
    answer checked against the library."""
    from isan.bench.serve import markdown, run_bench

    res = run_bench(url=cluster.url, data=str(text8_path), clients=4, duration_s=0.5, streams=6, chunks=2,
                    which=("http", "stream"))
    assert res["url"] == cluster.url and "server_rss_mib_end" not in res
    assert res["http"]["ok"] > 0 and set(res["http"]["statuses"]) == {"200"}
    for load in ("http", "stream"):  # each load's furthest text within twice its derived float32 tolerance
        assert res[load]["max_abs_bits_error"] <= serve_bench_tolerance(Engine.default(), text8_path, res[load]), load
    assert res["stream"]["errors"] == 0
    assert min(cluster.scored(0), cluster.scored(1)) > 0  # round robin: both replicas answered
    assert f"endpoint {cluster.url}" in markdown(res)


def _stream_texts(text8_test: str, n: int) -> list[list[str]]:
    """n streams of 7 chunks (50-400 characters) of real text: text8 and Shakespeare in turn."""
    shakespeare = need(DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        src = shakespeare if i % 2 else text8_test
        sizes = rng.integers(50, 400, size=7)
        start = int(rng.integers(0, len(src) - sizes.sum()))
        cuts = np.concatenate([[0], np.cumsum(sizes)]) + start
        out.append([src[a:b] for a, b in zip(cuts, cuts[1:])])
    return out


def _run_streams(cluster, chunks: list[list[str]], disrupt):
    """Each stream scores chunks 0-2 one by one; then ``disrupt(cluster)``, a generator, runs to its
    first ``yield`` (the number of streams the replica it disturbs holds) and the streams send chunks
    3-5 ahead; once all have, it runs to its end (the replica gone) while they read their answers;
    then each stream scores chunk 6. Snapshots every 1, 2 or 4 frames. Returns each stream's
    answers, its resume times, that number, and each stream's (shutdown snapshots taken, answers
    dropped as already delivered)."""
    n = len(chunks)

    async def main():
        phase1, sent = asyncio.Semaphore(0), asyncio.Semaphore(0)
        go, last = asyncio.Event(), asyncio.Event()

        async def stream(i, cs):
            async with ResumableStream(f"{cluster.url}/v1/stream", snapshot_every=(1, 2, 4)[i % 3],
                                       open_timeout_s=60) as s:
                out = [await s.score(c) for c in cs[:3]]
                phase1.release()
                await go.wait()
                for c in cs[3:6]:
                    await s.send(c)
                sent.release()
                out += [await s.recv() for _ in cs[3:6]]
                await last.wait()
                out.append(await s.score(cs[6]))
                return out, s.resumes, (s.handed_back, s.answers_dropped)

        tasks = [asyncio.ensure_future(stream(i, cs)) for i, cs in enumerate(chunks)]
        for _ in range(n):
            await phase1.acquire()
        steps = disrupt(cluster)
        held = next(steps)  # the victim has stopped taking answers (or was signalled)
        go.set()
        for _ in range(n):
            await sent.acquire()
        await asyncio.to_thread(next, steps, None)  # the victim is gone
        last.set()
        results = await asyncio.gather(*tasks)
        return [r[0] for r in results], [r[1] for r in results], held, [r[2] for r in results]

    return asyncio.run(main())


def _check_streams(eng, chunks, answers, resumes, held):
    assert len(answers) == len(chunks)
    for cs, got in zip(chunks, answers):
        st, tol = eng.initial_state(), engine_float32_tolerance(eng, "".join(cs)).twice()  # batched vs library
        assert len(got) == len(cs)
        for c, a in zip(cs, got):  # each chunk's bits as the library scores it after the ones before
            want = eng.score(c, state=st)
            st = want.state
            assert a["chars"] == want.chars and a["total_chars"] == st.chars
            assert abs(a["bits"] - want.bits) <= 2 * tol.total_bits  # a difference of two totals
            assert abs(a["total_bits"] - st.bits) <= tol.total_bits
    times = [t for r in resumes for t in r]
    print(f"\n{len(chunks)} streams, {held} on the victim; {len(times)} resumes: median "
          f"{1e3 * statistics.median(times):.0f} ms, max {1e3 * max(times):.0f} ms" if times else "no resumes")
    return times


def _victim(cluster) -> tuple[int, int]:
    open_ = [cluster.streams_open(0), cluster.streams_open(1)]
    assert sum(open_) == STREAMS and min(open_) > 0, open_  # leastconn spread the streams
    return int(np.argmax(open_)), max(open_)


def test_streams_survive_a_killed_replica(cluster, default_engine, text8_test):
    """The victim is stopped (SIGSTOP) so that every stream on it has three chunks in flight, then
    killed (SIGKILL): each of its streams resumes once on the other replica from its last snapshot,
    re-sends what was not settled, and every stream's bits are those of an undisturbed run."""
    chunks = _stream_texts(text8_test, STREAMS)

    def disrupt(c):
        i, held = _victim(c)
        c.replicas[i].send_signal(signal.SIGSTOP)
        yield held
        c.replicas[i].kill()
        c.replicas[i].wait(30)
        yield

    answers, resumes, held, _ = _run_streams(cluster, chunks, disrupt)
    times = _check_streams(default_engine, chunks, answers, resumes, held)
    assert len(times) == held  # each stream of the victim resumed once; no other stream did
    assert sum(1 for r in resumes if r) == held


def test_streams_survive_a_replica_shut_down_gracefully(cluster, default_engine, text8_test):
    """The victim is stopped (SIGSTOP) while every stream on it sends three chunks ahead, then sent
    SIGTERM and let go on (SIGCONT), so its shutdown finds chunks in flight: it answers the chunk it
    is scoring, hands each stream back ({"event": "shutdown", "state"}, close 1012) and exits. Every
    stream of the victim took that snapshot, resumed once on the other replica and re-sent only the
    chunks it had no answer to (no answer dropped as a duplicate); no other stream resumed; every
    stream's bits are those of an undisturbed run."""
    chunks = _stream_texts(text8_test, STREAMS)

    def disrupt(c):
        i, held = _victim(c)
        c.replicas[i].send_signal(signal.SIGSTOP)
        yield held
        c.replicas[i].send_signal(signal.SIGTERM)  # pending until it runs again
        c.replicas[i].send_signal(signal.SIGCONT)
        # uvicorn ends a graceful shutdown by raising the signal it caught again
        assert c.replicas[i].wait(60) in (0, -signal.SIGTERM), c.log(f"replica{i + 1}")
        yield

    answers, resumes, held, counts = _run_streams(cluster, chunks, disrupt)
    times = _check_streams(default_engine, chunks, answers, resumes, held)
    assert len(times) == held  # each stream of the victim resumed once; no other stream did
    for r, (handed_back, dropped) in zip(resumes, counts):
        assert handed_back == len(r) and dropped == 0, (len(r), handed_back, dropped)
