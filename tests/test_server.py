"""isan-serve end to end: a real uvicorn server on localhost, a real HTTP and WebSocket client."""

import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
from websockets.sync.client import connect  # noqa: E402

from isan.engine import Engine  # noqa: E402
from isan.engine.server import create_app  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(small_bundle):
    eng = Engine.load(small_bundle)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(eng, max_chars=50_000), host="127.0.0.1", port=port,
                                        log_level="warning", ws_max_size=1 << 20))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"127.0.0.1:{port}", eng
    srv.should_exit = True
    th.join(10)


def test_healthz(server):
    addr, eng = server
    r = httpx.get(f"http://{addr}/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["model"]["d"] == eng.d


def test_score_equals_library(server, text8_valid_head):
    addr, eng = server
    text = text8_valid_head[:10_000]
    r = httpx.post(f"http://{addr}/v1/score", json={"text": text, "per_char": True}, timeout=60)
    assert r.status_code == 200
    body = r.json()
    lib = eng.score(text, per_char=True)
    assert body["chars"] == 10_000 and body["bits"] == pytest.approx(lib.bits, rel=1e-12)
    np.testing.assert_allclose(body["per_char_bits"], lib.per_char_bits, rtol=1e-12)


def test_stream_carries_state_across_chunks(server, text8_valid_head):
    addr, eng = server
    text = text8_valid_head[:3000]
    whole = eng.score(text, per_char=True)
    cuts = [0, 1, 17, 500, 501, 2999, 3000]
    got = []
    with connect(f"ws://{addr}/v1/stream") as ws:
        for a, b in zip(cuts, cuts[1:]):
            ws.send(json.dumps({"text": text[a:b], "per_char": True}))
            msg = json.loads(ws.recv(timeout=30))
            assert msg["chars"] == b - a and msg["total_chars"] == b
            got.extend(msg["per_char_bits"])
        # chunk boundaries change the table's segmentation, so float32 rounding differs slightly
        assert msg["total_bits"] == pytest.approx(whole.bits, rel=1e-7)
        # a bad frame is answered with an error and loses nothing
        ws.send(json.dumps({"text": "ABC"}))
        err = json.loads(ws.recv(timeout=30))
        assert err["status"] == 422 and "'A'" in err["error"]
        ws.send("not json")
        assert json.loads(ws.recv(timeout=30))["status"] == 400
        ws.send(json.dumps({"text": "a"}))
        after = json.loads(ws.recv(timeout=30))
        assert after["total_chars"] == 3001
        assert after["bits"] == pytest.approx(eng.score("a", state=whole.state).bits, abs=1e-4)
        ws.send(json.dumps({"reset": True}))
        assert json.loads(ws.recv(timeout=30))["total_chars"] == 0
    np.testing.assert_allclose(got, whole.per_char_bits, rtol=0, atol=1e-4)  # float32 rounding (see above)


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"per_char": true}', 400, '"text"'),
    (b'{"text": 5}', 400, '"text"'),
    (b'{"text": ""}', 400, "empty"),
    (b'{"text": "Hello"}', 422, "offset 0"),
    (b'{"text": "abc", "bogus": 1}', 400, "unknown fields"),
    (b'{"text": "abc", "unknown": "drop"}', 400, '"unknown"'),
])
def test_bad_requests_get_json_4xx(server, body, status, words):
    addr, _ = server
    r = httpx.post(f"http://{addr}/v1/score", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and words in r.json()["error"]


def test_oversized_payloads(server):
    addr, _ = server
    r = httpx.post(f"http://{addr}/v1/score", json={"text": "a" * 50_001})
    assert r.status_code == 413 and "limit" in r.json()["error"]
    r = httpx.post(f"http://{addr}/v1/score", content=b"x" * 300_000)
    assert r.status_code == 413


def test_unknown_policy_over_http(server):
    addr, eng = server
    r = httpx.post(f"http://{addr}/v1/score", json={"text": "Hello", "unknown": "skip"})
    assert r.status_code == 200 and r.json()["chars"] == 4


def test_isan_serve_with_no_arguments_matches_isan_score(text8_valid_head):
    """`isan-serve` with the default model answers HTTP and WebSocket with the bits of `isan score`."""
    text = text8_valid_head[:4000]
    cli = json.loads(subprocess.run([sys.executable, "-m", "isan.cli", "score", "--json", "-"], input=text,
                                    capture_output=True, text=True, timeout=300, check=True).stdout)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "isan.engine.server", "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while True:
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/score", json={"text": text}, timeout=60)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
                time.sleep(0.2)
        assert r.status_code == 200 and r.json() == cli
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json()["model"]["path"] == "composed"
        with connect(f"ws://127.0.0.1:{port}/v1/stream") as ws:
            for a in range(0, len(text), 1000):
                ws.send(json.dumps({"text": text[a : a + 1000]}))
                msg = json.loads(ws.recv(timeout=60))
        assert msg["total_chars"] == cli["chars"] and msg["total_bits"] == pytest.approx(cli["bits"], rel=1e-6)
    finally:
        proc.terminate()
        proc.wait(10)


def test_isan_serve_bad_model_is_a_clean_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "isan.engine.server", "--model", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "does not exist" in r.stderr and "Traceback" not in r.stderr
