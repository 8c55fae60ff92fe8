"""``isan-serve --workers N`` (issue #38): N processes on one port, each its own scheduler and engine.

Real processes on loopback (``python -m isan.engine.serve --workers 2``): answers equal the library's,
requests land on both workers (``/healthz`` says which answered), ``/metrics`` sums the workers, a
snapshot taken on one worker restores on the other (the parent draws one state secret for all), and
SIGTERM finishes the requests in flight and hands every open stream back (its last state in a
shutdown frame, close 1012): the state continues elsewhere to an undisturbed run's bits, and the
server exits 0 with no worker left.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets.asyncio.client")
pytest.importorskip("prometheus_client")

sys.path.insert(0, str(Path(__file__).parent))
from server_helpers import running, running_server, wait_for  # noqa: E402
from tolerances import engine_float32_tolerance, serve_bench_tolerance  # noqa: E402

from isan.bench.serve import ServerProcess  # noqa: E402
from isan.engine import Engine  # noqa: E402
from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from isan.errors import IsanError  # noqa: E402

SECRET = b"w" * 32
#: characters the sample in flight at SIGTERM generates
SAMPLE = 50_000


def health(url: str) -> dict:
    """``/healthz`` over a new connection (so the kernel may hand it to either worker)."""
    with httpx.Client(base_url=f"http://{url}", timeout=30) as c:
        return c.get("/healthz").json()


def workers_seen(url: str, want: int = 2, tries: int = 400) -> dict[int, dict]:
    """{pid: its /healthz} over new connections until ``want`` workers answered (or ``tries`` ran out)."""
    seen: dict[int, dict] = {}
    for _ in range(tries):
        h = health(url)
        seen[h["worker"]["pid"]] = h
        if len(seen) >= want:
            break
    return seen


def metric(text: str, name: str, labels: str) -> float:
    m = re.search(re.escape(name) + r"\{" + re.escape(labels) + r"\} ([0-9.eE+-]+)", text)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def two_workers():
    with ServerProcess(["--workers", "2", "--no-ui", "--no-docs"], timeout_s=180) as srv:
        yield srv.url


def test_two_workers_answer_with_the_librarys_bits(two_workers, default_engine, text8_test):
    texts = [text8_test[i * 997 : i * 997 + 500 + 37 * i] for i in range(12)]
    for t in texts:
        with httpx.Client(base_url=f"http://{two_workers}", timeout=60) as c:  # a new connection each
            r = c.post("/v1/score", json={"text": t})
        assert r.status_code == 200, r.text
        tol = engine_float32_tolerance(default_engine, t).twice()  # a worker's batch vs the library: two float32
        assert abs(r.json()["bits"] - default_engine.score(t).bits) <= tol.total_bits


def test_requests_land_on_both_workers_and_healthz_names_them(two_workers):
    seen = workers_seen(two_workers)
    assert len(seen) == 2, f"only workers {sorted(seen)} answered"
    for pid, h in seen.items():
        assert h["status"] == "ready" and h["worker"] == {"pid": pid, "workers": 2}
        assert h["server"]["workers"] == 2
        assert h["server"]["state_secret"] == "random per run, shared by the workers"
        assert pid != os.getpid() and Path(f"/proc/{pid}").exists()


def test_metrics_sum_both_workers(two_workers, text8_test):
    def count(text):
        return metric(text, "isan_requests_total", 'endpoint="score",status="200"')

    with httpx.Client(base_url=f"http://{two_workers}", timeout=30) as c:
        before = count(c.get("/metrics").text)
    scored0 = {pid: h["server"]["chars_scored"] for pid, h in workers_seen(two_workers).items()}
    n = 40
    for i in range(n):
        with httpx.Client(base_url=f"http://{two_workers}", timeout=30) as c:
            assert c.post("/v1/score", json={"text": text8_test[i * 100 : i * 100 + 100]}).status_code == 200
    scored = {pid: h["server"]["chars_scored"] - scored0.get(pid, 0) for pid, h in workers_seen(two_workers).items()}
    assert len(scored) == 2 and all(v > 0 for v in scored.values()), f"one worker took every request: {scored}"
    with httpx.Client(base_url=f"http://{two_workers}", timeout=30) as c:
        text = c.get("/metrics").text
    assert count(text) - before == n  # both workers' requests, whichever worker answered /metrics
    assert float(re.search(r"^isan_chars_scored_total ([0-9.eE+-]+)$", text, re.M).group(1)) >= n * 100


def test_a_snapshot_taken_on_one_worker_restores_on_the_other(two_workers, default_engine, text8_test):
    """No --state-secret-file: the parent draws one secret and hands it to both workers."""
    a, b = text8_test[:3000], text8_test[3000:5000]
    with httpx.Client(base_url=f"http://{two_workers}", timeout=30, limits=httpx.Limits(max_connections=1)) as c:
        first = c.get("/healthz").json()["worker"]["pid"]  # the same keep-alive connection: the same worker
        token = c.post("/v1/score", json={"text": a, "return_state": True}).json()["state"]
    for _ in range(400):
        with httpx.Client(base_url=f"http://{two_workers}", timeout=30, limits=httpx.Limits(max_connections=1)) as c:
            if c.get("/healthz").json()["worker"]["pid"] == first:
                continue
            r = c.post("/v1/score", json={"text": b, "state": token})
            break
    else:
        pytest.fail("no connection reached the other worker")
    assert r.status_code == 200, r.text
    body = r.json()
    whole = default_engine.score(a + b)
    tol = engine_float32_tolerance(default_engine, a + b).twice()  # cut over two workers vs one pass
    assert body["total_chars"] == 5000 and abs(body["total_bits"] - whole.bits) <= tol.total_bits


def test_sigterm_finishes_requests_and_hands_every_stream_back(tmp_path, default_engine, text8_test):
    """SIGTERM to isan-serve --workers 2 while streams hold frames in flight on both workers and a
    sample streams its events: the sample ends with its whole text; each stream gets its answers,
    then {"event": "shutdown", "state": snapshot} and close 1012; the snapshot restored on another
    server goes on to the bits of an undisturbed run; the server exits 0 and no worker is left."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    chunks = [[text8_test[k * 20_000 + j * 4000 : k * 20_000 + (j + 1) * 4000] for j in range(5)] for k in range(24)]
    srv = ServerProcess(["--workers", "2", "--no-ui", "--no-docs", "--state-secret-file", str(secret),
                         "--max-sample-chars", str(SAMPLE)], timeout_s=180)
    try:
        pids = set(workers_seen(srv.url))
        assert len(pids) == 2

        started = threading.Event()

        def sample_events() -> list[dict]:
            """A /v1/sample streaming its events (``started`` once the first is in)."""
            out = []
            with httpx.Client(base_url=f"http://{srv.url}", timeout=120) as c:
                with c.stream("POST", "/v1/sample", json={"prompt": "the cat ", "n": SAMPLE, "seed": 3}) as r:
                    assert r.status_code == 200
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            out.append(json.loads(line[6:]))
                            started.set()
            return out

        async def main():
            streams: list = []
            held: dict = {}
            while len(streams) < 6 or len(held) < 2 or not all(held.values()):  # streams on both workers
                assert len(streams) < len(chunks), f"every stream went to one worker: {held}"
                ws = await connect(f"ws://{srv.url}/v1/stream", max_size=None, ping_interval=None)
                await ws.send(json.dumps({"text": chunks[len(streams)][0]}))
                first = json.loads(await ws.recv())
                assert first["total_chars"] == 4000, first
                streams.append(ws)
                held = {pid: h["server"]["streams_open"] for pid, h in workers_seen(srv.url).items()}
            assert sum(held.values()) == len(streams), held
            sample = asyncio.ensure_future(asyncio.to_thread(sample_events))
            await asyncio.to_thread(started.wait, 60)
            for ws, plan in zip(streams, chunks):  # frames sent ahead of their answers, then SIGTERM
                for c in plan[1:]:
                    await ws.send(json.dumps({"text": c}))
            srv.proc.send_signal(signal.SIGTERM)
            results = []
            for ws in streams:
                answers, last = [], None
                try:
                    while True:
                        last = json.loads(await asyncio.wait_for(ws.recv(), 60))
                        if last.get("event") == "shutdown":
                            break
                        assert "error" not in last, last
                        answers.append(last)
                    await asyncio.wait_for(ws.recv(), 60)
                except ConnectionClosed:
                    pass
                results.append((answers, last, ws.close_code))
            return await sample, results

        sample, results = asyncio.run(main())
        assert srv.proc.wait(120) == 0, srv.proc.stderr.read().decode()[-3000:]
    finally:
        srv.stop()
    for pid in pids:  # no worker left
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} is still running"
    # the request in flight was finished: the whole sample, as the library draws it
    assert sample[-1]["text"] == default_engine.sample("the cat ", n=SAMPLE, seed=3).text
    # each stream: its answers in order, then the shutdown frame with the state after the last of them, close 1012
    with running(create_app(default_engine, config=ServeConfig(state_secret=SECRET))) as other:
        async def resume():
            from websockets.asyncio.client import connect

            for plan, (answers, last, code) in zip(chunks, results):  # the streams opened, in order
                assert code == 1012 and last is not None and last["event"] == "shutdown", (code, last)
                assert set(last) == {"event", "state"}
                done = 1 + len(answers)  # chunks answered: the first, then those before the shutdown
                assert [a["total_chars"] for a in answers] == [4000 * (j + 2) for j in range(len(answers))]
                async with connect(f"ws://{other}/v1/stream", max_size=None) as ws:
                    await ws.send(json.dumps({"restore": last["state"]}))
                    msg = json.loads(await ws.recv())
                    assert msg["total_chars"] == 4000 * done, msg
                    for c in plan[done:]:
                        await ws.send(json.dumps({"text": c}))
                        msg = json.loads(await ws.recv())
                whole = default_engine.score("".join(plan))
                tol = engine_float32_tolerance(default_engine, "".join(plan)).twice()  # streamed vs one pass
                assert msg["total_chars"] == 20_000 and abs(msg["total_bits"] - whole.bits) <= tol.total_bits

        asyncio.run(resume())


def test_sigterm_closes_the_port_while_a_worker_drains(default_engine):
    """SIGTERM to isan-serve --workers 2 while a worker holds a request it has begun (its body not yet
    sent, as a slow client or a long sample would hold it): a new connection is refused at once (a
    balancer then tries another replica; accepted by nobody, it would hang), and the request begun is
    still answered, with the library's bits."""
    import socket

    srv = ServerProcess(["--workers", "2", "--no-ui", "--no-docs", "--read-timeout", "120"], timeout_s=180)
    text = "the cat sat on the mat"
    body = json.dumps({"text": text}).encode()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as s:
            s.sendall(f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode())
            assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")  # the app is reading the body: begun
            srv.proc.send_signal(signal.SIGTERM)

            def refused() -> bool:
                try:
                    socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
                except ConnectionRefusedError:
                    return True
                return False

            wait_for(refused, "a new connection refused after SIGTERM", timeout=30, every=0.1)
            assert srv.proc.poll() is None  # the worker still drains its request
            s.sendall(body)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), answer[:500]
        tol = engine_float32_tolerance(default_engine, text).twice()  # server vs library: two float32
        assert abs(json.loads(payload)["bits"] - default_engine.score(text).bits) <= tol.total_bits
        assert srv.proc.wait(60) == 0, srv.proc.stderr.read().decode()[-3000:]
    finally:
        srv.stop()


def test_a_stream_that_answered_no_frame_hands_back_no_state(default_engine):
    """A shutdown that begins after the handshake but before the stream answered a frame: the
    shutdown frame's state is null (the stream holds nothing of the client's: its restore or reset
    was not read), not a snapshot of the initial state a client would take for its own."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    with running_server(create_app(default_engine, config=ServeConfig(state_secret=SECRET))) as (addr, srv):
        async def main():
            async with connect(f"ws://{addr}/v1/stream") as ws:
                srv.should_exit = True  # as SIGTERM
                last = json.loads(await asyncio.wait_for(ws.recv(), 30))
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 30)
                return last, ws.close_code

        last, code = asyncio.run(main())
    assert last == {"event": "shutdown", "state": None} and code == 1012


def test_a_dead_worker_is_replaced_then_ctrl_c_hands_the_streams_back(tmp_path):
    """kill -9 of a worker holding a stream: the supervisor starts another in its place, and /metrics
    no longer counts the dead worker's stream. Then Ctrl-C in a terminal (SIGINT to the server's
    process group: the parent and its workers): each open stream gets its shutdown frame with its
    state and close 1012; the server exits 0 and no worker is left."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    srv = ServerProcess(["--workers", "2", "--no-ui", "--no-docs"], timeout_s=180)  # a session of its own

    def streams_open() -> float:
        with httpx.Client(base_url=f"http://{srv.url}", timeout=30) as c:
            return float(re.search(r"^isan_streams_open ([0-9.eE+-]+)$", c.get("/metrics").text, re.M).group(1))

    try:
        first = set(workers_seen(srv.url))
        assert len(first) == 2

        async def open_streams(streams: list, want: set[int]) -> dict:
            """Open streams until each worker in ``want`` holds one; {pid: streams it holds}."""
            held: dict = {}
            while not want <= {pid for pid, n in held.items() if n}:
                assert len(streams) < 40, f"no stream reached workers {want - set(held)}: {held}"
                ws = await connect(f"ws://{srv.url}/v1/stream", ping_interval=None)
                await ws.send(json.dumps({"text": "the cat sat on the mat"}))
                assert json.loads(await ws.recv())["total_chars"] == 22
                streams.append(ws)
                held = {pid: h["server"]["streams_open"] for pid, h in workers_seen(srv.url).items()}
            return held

        async def main():
            streams: list = []
            held = await open_streams(streams, first)
            victim = min(first)
            os.kill(victim, signal.SIGKILL)
            survivors = []
            for ws in streams:  # the victim's streams are cut (no close frame), the others go on
                try:
                    await ws.send(json.dumps({"text": "and the dog"}))
                    assert json.loads(await asyncio.wait_for(ws.recv(), 30))["total_chars"] == 33
                    survivors.append(ws)
                except ConnectionClosed:
                    pass
            assert len(survivors) == len(streams) - held[victim]
            wait_for(lambda: len(seen := set(workers_seen(srv.url))) == 2 and victim not in seen,
                     "a worker in the dead one's place", timeout=120, every=0.2)
            assert streams_open() == len(survivors)  # the dead worker's gauge is gone
            now = set(workers_seen(srv.url))
            await open_streams(survivors, now)
            os.killpg(srv.proc.pid, signal.SIGINT)
            out = []
            for ws in survivors:
                last = json.loads(await asyncio.wait_for(ws.recv(), 60))
                try:
                    await asyncio.wait_for(ws.recv(), 60)
                except ConnectionClosed:
                    pass
                out.append((last, ws.close_code))
            return now, out

        now, out = asyncio.run(main())
        for last, code in out:
            assert code == 1012 and last["event"] == "shutdown" and last["state"].startswith("SVNBTlNUQVQB"), last
        assert srv.proc.wait(120) == 0, srv.proc.stderr.read().decode()[-3000:]
    finally:
        srv.stop()
    for pid in first | now:
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} is still running"


def _alive(pid: int) -> bool:
    """The process runs (a zombie, ended and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_the_benchmarks_server_is_stopped_with_its_workers_and_folder():
    """ServerProcess.stop() when the server does not stop in time (its parent stopped: SIGSTOP):
    SIGKILL to its process group ends the workers too (they would keep the port), and the run
    folder the parent could not remove goes with the server's temporary folder."""
    srv = ServerProcess(["--workers", "2", "--no-ui", "--no-docs"], timeout_s=180)
    pids, tmp = set(srv.worker_pids), Path(srv.tmp)
    assert len(pids) == 2 and list(tmp.glob("isan-serve-*")), "two workers and the run folder"
    os.kill(srv.pid, signal.SIGSTOP)
    srv.stop(timeout_s=1)
    wait_for(lambda: not any(_alive(p) for p in pids), "the workers ended", timeout=30, every=0.1)
    assert not tmp.exists()


def test_the_benchmarks_server_waits_for_every_worker_within_its_timeout(monkeypatch):
    """ServerProcess is ready once as many workers as --workers says have answered /healthz; when
    they do not within its timeout (here one process, counted as two), a clear error, the server stopped."""
    import isan.bench.serve_process as bench_serve

    monkeypatch.setattr(bench_serve, "_workers_in", lambda args: 2)
    stopped = []
    stop = bench_serve.ServerProcess.stop
    monkeypatch.setattr(bench_serve.ServerProcess, "stop", lambda self: stopped.append(self.proc) or stop(self))
    with pytest.raises(IsanError, match=r"not ready within 8 s \(1 of its 2 workers answered\)"):
        bench_serve.ServerProcess(["--no-ui", "--no-docs"], timeout_s=8)
    assert len(stopped) == 1 and stopped[0].poll() is not None


def test_workers_that_cannot_load_the_model_end_the_server_with_its_message(small_bundle, tmp_path):
    """The manifest reads (the parent checks it) but the weights do not: each worker ends with
    uvicorn's startup failure, the parent stops and says why, with no traceback (a worker left
    running would hold stderr open, and the run would not end)."""
    import shutil
    import subprocess

    bundle = tmp_path / "broken"
    shutil.copytree(small_bundle, bundle)
    for f in bundle.glob("*.safetensors"):
        f.write_bytes(b"not safetensors")
    r = subprocess.run([sys.executable, "-m", "isan.engine.serve", "--workers", "2", "--model", str(bundle),
                        "--port", "0", "--log-level", "warning"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Error: the model could not be loaded" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("secret, env, words", [
    (b"", None, "empty"),                     # an empty --state-secret-file
    (b"  \n", None, "empty"),                 # only blanks: stripped, empty
    (None, "", "empty"),                      # ISAN_STATE_SECRET set but empty
    (b"s" * 31, None, "at least 32 bytes"),   # short: 31 bytes
    (None, "e" * 20, "at least 32 bytes"),
])
def test_an_empty_or_short_state_secret_is_refused_at_startup(tmp_path, secret, env, words):
    """Every worker (and every replica) needs the same key: an empty one would have each process
    draw its own, a short one is guessable. isan-serve refuses both in one line, before loading."""
    import subprocess

    args = ["--workers", "2", "--port", "0", "--log-level", "warning"]
    if secret is not None:
        (tmp_path / "secret").write_bytes(secret)
        args += ["--state-secret-file", str(tmp_path / "secret")]
    environ = {k: v for k, v in os.environ.items() if k != "ISAN_STATE_SECRET"}
    environ["TMPDIR"] = str(tmp_path)  # a server that started leaves its run folder here
    if env is not None:
        environ["ISAN_STATE_SECRET"] = env
    p = subprocess.Popen([sys.executable, "-m", "isan.engine.serve", *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=environ, start_new_session=True)
    try:
        _, stderr = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the parent and its workers
        p.communicate()
        pytest.fail("isan-serve took the secret and started serving")
    assert p.returncode == 1 and words in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert len([line for line in stderr.splitlines() if line.startswith("Error:")]) == 1, stderr
    with pytest.raises(IsanError, match=words):
        ServeConfig(state_secret=secret.strip() if secret is not None else env.encode())


def test_the_config_does_not_show_its_secrets():
    """The state secret and the API key travel in the workers' config: its repr leaves them out."""
    cfg = ServeConfig(state_secret=SECRET, api_key="key-" + "k" * 20)
    assert "w" * 32 not in repr(cfg) and "k" * 20 not in repr(cfg) and "max_chars" in repr(cfg)
    from isan.engine.serve.workers import WorkerSpec

    assert "w" * 32 not in repr(WorkerSpec(None, "auto", "numpy", "cpu", cfg))


def test_bench_serve_measures_each_worker_count_in_one_run(small_bundle, text8_path):
    """isan bench serve --workers 1,2 (run_bench(workers=...)): the HTTP load against one worker then
    two, each answer checked against the library, each worker's share of the load recorded (both
    of the two workers served), and the ratio of the two counts' requests/s."""
    from isan.bench.serve import markdown, run_bench

    res = run_bench(model=str(small_bundle), data=str(text8_path), clients=16, duration_s=0.5, which=("http",),
                    workers=(1, 2))
    eng = Engine.load(small_bundle)
    assert [w["workers"] for w in res["workers"]] == [1, 2]
    for w in res["workers"]:
        assert w["http"]["ok"] > 0 and set(w["http"]["statuses"]) == {"200"}
        assert w["http"]["max_abs_bits_error"] <= serve_bench_tolerance(eng, text8_path, w["http"])
        shares = w["http"]["workers"]  # each worker's characters scored during the load, from its /healthz
        assert len(shares) == w["workers"] and len({x["pid"] for x in shares}) == w["workers"]
        assert all(x["share"] > 0 and x["connections"] > 0 for x in shares), shares
        assert sum(x["chars_scored"] for x in shares) == w["http"]["ok"] * w["http"]["text_chars"]
        assert sum(x["connections"] for x in shares) == 16
    one, two = res["scaling"]
    rate = [w["http"]["ok"] / w["http"]["seconds"] for w in res["workers"]]  # requests/s of each run, anew
    assert one["ratio"] == 1.0 and two["ratio"] == pytest.approx(rate[1] / rate[0], rel=5e-3)
    assert two["worker_shares"] == [x["share"] for x in res["workers"][1]["http"]["workers"]]
    table = markdown(res)
    assert "| isan-serve --workers | requests/s (200) | ratio to the first |" in table
    assert f"| 2 | {two['requests_per_s']:,.1f} | {two['ratio']:.2f}x |" in table


def test_bench_serve_url_takes_only_a_running_server_of_its_model(two_workers, small_bundle, text8_path):
    """isan bench serve --url: what it cannot measure there, and an endpoint of another model, are
    refused before any load (the two workers serve the default model)."""
    from isan.bench.serve import run_bench

    url = f"http://{two_workers}"
    for kwargs, words in [({"which": ("http", "memory")}, "memory"), ({"workers": (1, 2)}, "--workers"),
                          ({"url": "ws://127.0.0.1:1/v1/stream"}, "http://HOST"),
                          ({"model": str(small_bundle)}, "another model")]:
        with pytest.raises(IsanError, match=words):
            run_bench(**{"url": url, "data": str(text8_path), "which": ("http",), **kwargs})
