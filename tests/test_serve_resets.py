"""``python -m isan.bench.serve`` (the server's memory under WebSocket streams reset abruptly), run
small: every stream's connection is reset once its per-character answer has begun, and afterwards
the server holds no stream, no reserved byte and no extra file descriptor, at each mmap threshold."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("websockets")


def test_reset_streams_leave_nothing_behind(small_bundle, text8_path, tmp_path):
    out = tmp_path / "resets.json"
    r = subprocess.run([sys.executable, "-m", "isan.bench.serve", "--model", str(small_bundle), "--data",
                        str(text8_path), "--streams", "12", "--chars", "3000", "--frames", "2", "--concurrency", "4",
                        "--every", "6", "--thresholds", "128,0", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["command"].startswith("python -m isan.bench.serve --model ")
    assert res["benchmark"] == "serve_resets" and [x["malloc_mmap_threshold_kib"] for x in res["runs"]] == [128, 0]
    for run in res["runs"]:
        assert [s["streams"] for s in run["samples"]] == [0, 6, 12]
        assert run["answers_begun"] == 12, run  # each was reset with its answer under way
        assert run["streams_open"] == 0 and run["pending_bytes"] == 0 and run["fds_settled"] == run["fds_before"], run
        assert all(s["rss_mib"] > 0 for s in run["samples"]) and run["rss_mib_settled"] > 0
    assert "| 128 |" in r.stdout and "| 0 |" in r.stdout


def test_bad_thresholds_are_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "isan.bench.serve", "--thresholds", "128,lots"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--thresholds" in r.stderr and "Traceback" not in r.stderr, r.stderr
