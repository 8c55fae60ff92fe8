"""``isan-serve --workers 2`` when a process dies outright (issue #45): a parent killed with SIGKILL
takes its workers with it, frees the port, and the next server removes the run folder it left; a
worker killed with SIGKILL stops counting in /metrics' gauges at once, not once the worker in its
place has loaded the model.

Real processes on loopback (:class:`isan.bench.serve.ServerProcess`, each in a session of its own).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from isan.bench.serve import ServerProcess  # noqa: E402
from server_helpers import unread_stream, wait_for  # noqa: E402
from tolerances import engine_float32_tolerance  # noqa: E402


def _alive(pid: int) -> bool:
    """The process runs (a zombie, ended and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_workers_end_with_their_killed_parent_and_the_next_server_cleans_up(default_engine):
    """SIGKILL to the parent of --workers 2 (it can neither stop its workers nor remove its run
    folder): the workers end within 30 s and the port is free; a new isan-serve --workers 2 on the
    same port starts, serves, and removes the dead parent's run folder (not its own)."""
    srv = ServerProcess(["--workers", "2", "--no-ui", "--no-docs"], timeout_s=180)
    pids, tmp = set(srv.worker_pids), Path(srv.tmp)
    try:
        (old_run,) = tmp.glob("isan-serve-*")
        os.kill(srv.pid, signal.SIGKILL)
        srv.proc.wait(30)
        wait_for(lambda: not any(_alive(p) for p in pids), "the workers ended with their parent", timeout=30, every=0.1)
        wait_for(lambda: _refused(srv.port), "the port free", timeout=30, every=0.1)
        assert old_run.name.startswith(f"isan-serve-{srv.pid}-")  # the folder names its owner
        new = subprocess.Popen([sys.executable, "-m", "isan.engine.serve", "--workers", "2", "--port", str(srv.port),
                                "--no-ui", "--no-docs", "--log-level", "warning"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True, env={**os.environ, "TMPDIR": str(tmp)})
        try:
            def ready() -> bool:
                assert new.poll() is None, new.stderr.read().decode()[-2000:]
                try:
                    return httpx.get(f"http://127.0.0.1:{srv.port}/healthz", timeout=5).status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(ready, "the new server ready on the port", timeout=180, every=0.2)
            r = httpx.post(f"http://127.0.0.1:{srv.port}/v1/score", json={"text": "the cat"}, timeout=30)
            tol = engine_float32_tolerance(default_engine, "the cat").twice()  # server vs library: two float32
            assert abs(r.json()["bits"] - default_engine.score("the cat").bits) <= tol.total_bits
            assert not old_run.exists(), "the dead parent's run folder is left"
            assert [p.name for p in tmp.glob("isan-serve-*")] != [], "the new server's own folder was removed"
            new.send_signal(signal.SIGTERM)
            assert new.wait(60) == 0, new.stderr.read().decode()[-2000:]
        finally:
            if new.poll() is None:
                os.killpg(new.pid, signal.SIGKILL)
                new.wait(10)
    finally:
        srv.stop()


def _gauge(text: str, name: str) -> float:
    return float(re.search(rf"^{name} ([0-9.eE+-]+)$", text, re.M).group(1))


def test_a_killed_workers_gauges_go_at_once(tmp_path, small_bundle, text8_test):
    """Streams on both workers, each with frames whose answers the client never reads (so each
    worker holds pending bytes); one worker killed with SIGKILL. The worker in its place cannot
    load the model here (its manifest is then a FIFO nobody writes: the load waits for ever, as a
    slow start on a busy machine would), yet /metrics drops the dead worker's open streams and
    pending bytes within 30 s: the supervisor marks it dead when it sees it gone."""
    model = tmp_path / "model"
    shutil.copytree(small_bundle, model)
    srv = ServerProcess(["--workers", "2", "--no-ui", "--no-docs", "--model", str(model)], timeout_s=180)
    socks: list = []
    try:
        frames = [{"text": text8_test[:240_000], "per_char": True}] * 4
        held: dict = {}
        while len([pid for pid, h in held.items() if h["server"]["pending_mb"] > 0]) < 2:
            assert len(socks) < 30, f"the streams did not reach both workers: {held}"
            socks.append(unread_stream(srv.port, frames))
            wait_for(lambda: sum(h["server"]["streams_open"] for h in srv.worker_health().values()) == len(socks),
                     "the streams open", timeout=60, every=0.1)
            held = srv.worker_health()
            wait_for(lambda: all(h["server"]["pending_mb"] > 0 for pid, h in srv.worker_health().items()
                                 if h["server"]["streams_open"]), "the answers waiting", timeout=60, every=0.2)
            held = srv.worker_health()
        victim = min(held)
        (survivor,) = set(held) - {victim}
        (model / "manifest.json").unlink()
        os.mkfifo(model / "manifest.json")  # the worker in the victim's place cannot load the model
        os.kill(victim, signal.SIGKILL)

        def metrics() -> str:
            return httpx.get(f"http://{srv.url}/metrics", timeout=30).text  # only the survivor serves

        wait_for(lambda: _gauge(metrics(), "isan_streams_open") == held[survivor]["server"]["streams_open"],
                 "the dead worker's streams gone from isan_streams_open", timeout=30, every=0.2)
        now = srv.worker_health(tries=50)
        assert set(now) == {survivor}, "the worker in the victim's place could not have served"
        assert _gauge(metrics(), "isan_pending_bytes") == pytest.approx(now[survivor]["server"]["pending_mb"] * 2**20,
                                                                        rel=1e-2, abs=2**10)
    finally:
        for s in socks:
            s.close()
        srv.stop(timeout_s=20)
