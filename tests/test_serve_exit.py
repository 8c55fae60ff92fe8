"""How ``isan-serve`` ends: exit status 0 after a graceful shutdown on SIGTERM or Ctrl-C (SIGINT to
its process group, as a terminal sends it), with one process or ``--workers 2``, and no
``Aborted!`` or traceback on its error output. Real processes on loopback."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from isan.bench.serve import ServerProcess  # noqa: E402


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_graceful_shutdown_exits_0(small_bundle, workers, sig):
    with ServerProcess(["--model", str(small_bundle), "--workers", str(workers), "--no-ui", "--no-docs"],
                       timeout_s=180) as srv:
        if sig == signal.SIGINT:
            os.killpg(srv.pid, sig)  # Ctrl-C: the server and its workers
        else:
            srv.proc.send_signal(sig)  # a process manager: the server alone
        code = srv.proc.wait(120)
        err = srv.proc.stderr.read().decode()
    assert code == 0, (code, err[-3000:])
    assert "Aborted" not in err and "Traceback" not in err, err[-3000:]
