"""The server under test of ``isan bench serve`` (:mod:`isan.bench.serve`): ``isan-serve`` in a process of
its own on a free port (:class:`ServerProcess`), its resident memory and its workers' health read from
/proc and ``/healthz``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from isan.errors import IsanError


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the operating system's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started (its worker processes, with ``--workers``)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the task ended
            pass
    return out


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB of a process and the processes it started (a server's workers), summed."""
    rss = hwm = 0.0
    for p in [pid, *child_pids(pid)]:
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


def get_healthz(host: str, port: int) -> dict | None:
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


def worker_shares(before: dict[int, dict], after: dict[int, dict], pids, connections: dict[int, int]) -> list[dict]:
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
        self.port = free_port()
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
        return get_healthz("127.0.0.1", self.port)

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
