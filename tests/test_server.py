"""isan-serve end to end: a real uvicorn server on localhost, a real HTTP and WebSocket client."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from websockets.sync.client import connect  # noqa: E402

from isan.engine import Engine  # noqa: E402
from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from server_helpers import free_port, running  # noqa: E402
from tolerances import engine_float32_tolerance, next_char_tolerance, serve_bench_tolerance  # noqa: E402


@pytest.fixture(scope="module")
def server(small_bundle):
    eng = Engine.load(small_bundle)
    with running(create_app(eng, max_chars=50_000)) as addr:
        yield addr, eng


@pytest.fixture(scope="module")
def text8_server(default_engine):
    """The shipped model (text8 normaliser, composed path offline) behind the batching server."""
    with running(create_app(default_engine, config=ServeConfig(max_chars=200_000, state_secret=b"k" * 32))) as addr:
        yield addr, default_engine


def test_healthz(server):
    addr, eng = server
    r = httpx.get(f"http://{addr}/healthz")
    body = r.json()
    assert r.status_code == 200 and body["status"] == "ready" and body["model"]["d"] == eng.d
    assert body["server"]["batching"] is True and body["server"]["max_chars"] == 50_000


def test_score_equals_library(server, text8_valid_head):
    addr, eng = server
    text = text8_valid_head[:10_000]
    r = httpx.post(f"http://{addr}/v1/score", json={"text": text, "per_char": True}, timeout=60)
    assert r.status_code == 200
    body = r.json()
    lib = eng.score(text, per_char=True)
    tol = engine_float32_tolerance(eng, text).twice()  # batched vs the library's path: two float32 computations
    assert body["chars"] == 10_000 and abs(body["bits"] - lib.bits) <= tol.total_bits
    np.testing.assert_allclose(body["per_char_bits"], lib.per_char_bits, rtol=0, atol=tol.bits)
    assert body["per_char_offsets"] == lib.per_char_offsets.tolist()
    assert body["scoring"] == {"path": "batched", "rounds": 1}


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
        # chunk boundaries change the table's segmentation: two float32 computations (tests/tolerances.py)
        tol = engine_float32_tolerance(eng, text + "a").twice()
        assert abs(msg["total_bits"] - whole.bits) <= tol.total_bits
        # a bad frame is answered with an error and loses nothing
        ws.send(json.dumps({"text": "ABC"}))
        err = json.loads(ws.recv(timeout=30))
        assert err["status"] == 422 and "'A'" in err["error"]
        ws.send("not json")
        assert json.loads(ws.recv(timeout=30))["status"] == 400
        ws.send(b"\x00binary")
        assert json.loads(ws.recv(timeout=30))["status"] == 400
        ws.send(json.dumps({"text": "a"}))
        after = json.loads(ws.recv(timeout=30))
        assert after["total_chars"] == 3001
        assert abs(after["bits"] - eng.score("a", state=whole.state).bits) <= tol.bits
        ws.send(json.dumps({"reset": True}))
        assert json.loads(ws.recv(timeout=30)) == {"reset": True, "total_chars": 0, "total_bits": 0.0, "total_bpc": None,
                                                   "total_nnl": None}
    np.testing.assert_allclose(got, whole.per_char_bits, rtol=0, atol=tol.bits)  # float32 rounding (see above)


def test_pipelined_frames_are_answered_in_order(server, text8_valid_head):
    """A client may send frames ahead of the answers; they are scored one after another, in order."""
    addr, eng = server
    text = text8_valid_head[:4000]
    with connect(f"ws://{addr}/v1/stream") as ws:
        for a in range(0, 4000, 200):
            ws.send(json.dumps({"text": text[a : a + 200]}))
        totals = [json.loads(ws.recv(timeout=30))["total_chars"] for _ in range(20)]
    assert totals == list(range(200, 4001, 200))


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"per_char": true}', 400, '"text"'),
    (b'{"text": 5}', 400, '"text"'),
    (b'{"text": ""}', 400, "empty"),
    (b'{"text": "Hello"}', 422, "offset 0"),
    (b'{"text": "abc", "bogus": 1}', 400, "unknown fields"),
    (b'{"text": "abc", "unknown": "drop"}', 400, '"unknown"'),
    (b'{"text": "abc", "per_char": 1}', 400, '"per_char"'),
    (b'{"text": "abc", "top_k": 28}', 400, '"top_k"'),
    (b'{"text": "abc", "unknown": "replace"}', 400, '"replacement"'),
    (b'{"text": "abc", "replacement": "A", "unknown": "replace"}', 400, '"replacement"'),
    (b'{"text": "abc", "state": "not a token!"}', 400, "snapshot"),
    (b'{"text": "abc", "state": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}', 400, "snapshot"),
])
def test_bad_requests_get_json_4xx(server, body, status, words):
    addr, _ = server
    r = httpx.post(f"http://{addr}/v1/score", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and words in r.json()["error"] and r.json()["status"] == status


def test_every_error_has_one_shape(server):
    """404, 405, 426 (HTTP on the WebSocket path) and 413 answer {"error", "status"} like every other error."""
    addr, _ = server
    cases = [("GET", "/nope", 404, "GET /healthz"), ("POST", "/healthz", 405, "GET"),
             ("DELETE", "/v1/score", 405, "POST"), ("GET", "/v1/stream", 426, "WebSocket"),
             ("GET", "/v1/score", 405, "POST")]
    for method, path, status, words in cases:
        r = httpx.request(method, f"http://{addr}{path}")
        assert r.status_code == status, (method, path, r.text)
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["status"] == status and words in r.json()["error"], r.text


def test_oversized_payloads(server):
    addr, _ = server
    r = httpx.post(f"http://{addr}/v1/score", json={"text": "a" * 50_001})
    assert r.status_code == 413 and "limit" in r.json()["error"] and r.json()["status"] == 413
    r = httpx.post(f"http://{addr}/v1/score", content=b"x" * 400_000, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "bytes" in r.json()["error"]


def test_unknown_policy_over_http(server):
    addr, eng = server
    r = httpx.post(f"http://{addr}/v1/score", json={"text": "Hello", "unknown": "skip"})
    assert r.status_code == 200 and r.json()["chars"] == 4
    r = httpx.post(f"http://{addr}/v1/score", json={"text": "Hello", "unknown": "replace", "replacement": "h"})
    tol = engine_float32_tolerance(eng, "hello").twice()
    assert r.status_code == 200 and abs(r.json()["bits"] - eng.score("hello").bits) <= tol.total_bits


def test_metrics(server):
    addr, _ = server
    httpx.post(f"http://{addr}/v1/score", json={"text": "abc"})
    r = httpx.get(f"http://{addr}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'isan_requests_total{endpoint="score",status="200"}' in r.text and "isan_rounds_total" in r.text


def test_top_k_and_snapshots_over_http(text8_server, text8_valid_head):
    """``return_state`` hands out the state; continuing from it gives the bits of the whole text;
    ``top_k`` gives the next-character distribution after the text."""
    addr, eng = text8_server
    text = text8_valid_head[:6000]
    whole = eng.score(text, per_char=True)
    cuts = [0, 2500, 2501, 6000]
    state, per_char = None, []
    for a, b in zip(cuts, cuts[1:]):
        req = {"text": text[a:b], "return_state": True, "per_char": True, "top_k": 3}
        if state is not None:
            req["state"] = state
        body = httpx.post(f"http://{addr}/v1/score", json=req, timeout=60).json()
        state = body["state"]
        per_char.extend(body["per_char_bits"])
        assert body["total_chars"] == b
    tol = engine_float32_tolerance(eng, text).twice()  # cut and batched vs whole: two float32 computations
    assert abs(body["total_bits"] - whole.bits) <= tol.total_bits
    np.testing.assert_allclose(per_char, whole.per_char_bits, rtol=0, atol=tol.bits)
    want = eng.top_k(whole.state, 3)
    assert [n["symbol"] for n in body["next"]] == [w["symbol"] for w in want]
    next_bits, _ = next_char_tolerance(eng, whole.state.h, tol.state / 2)
    np.testing.assert_allclose([n["bits"] for n in body["next"]], [w["bits"] for w in want], rtol=0, atol=next_bits)
    # the server's state within the derived tolerance of the library's, and its next bits read out of it
    from isan.engine.serve.snapshot import decode_state

    mine = decode_state(state, eng.params_sha256, b"k" * 32, eng.d)
    np.testing.assert_allclose(mine.h, whole.state.h, rtol=0, atol=tol.state)
    assert [n["bits"] for n in body["next"]] == [w["bits"] for w in eng.top_k(mine, 3)]


def test_snapshots_are_refused_when_changed_or_foreign(text8_server, server):
    addr, eng = text8_server
    token = httpx.post(f"http://{addr}/v1/score", json={"text": "the cat", "return_state": True}).json()["state"]
    ok = httpx.post(f"http://{addr}/v1/score", json={"text": " sat", "state": token})
    assert ok.status_code == 200 and ok.json()["total_chars"] == len("the cat sat")
    import base64

    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    for pos in (9, 40, 50, 60, len(raw) - 40, len(raw) - 1):  # model hash, totals, state, signature
        bad = bytearray(raw)
        bad[pos] ^= 1
        t = base64.urlsafe_b64encode(bytes(bad)).rstrip(b"=").decode()
        r = httpx.post(f"http://{addr}/v1/score", json={"text": " sat", "state": t})
        assert r.status_code == 403 and "signature" in r.json()["error"], (pos, r.text)
    # the small model's server (another model, another secret) refuses it
    small_addr, _ = server
    r = httpx.post(f"http://{small_addr}/v1/score", json={"text": "abc", "state": token})
    assert r.status_code in (400, 403) and r.json()["status"] == r.status_code
    # another model signed with the same secret: 409, naming both models
    from isan.engine.serve.snapshot import encode_state

    foreign = encode_state(eng.initial_state(), "ab" * 32, b"k" * 32)
    r = httpx.post(f"http://{addr}/v1/score", json={"text": "abc", "state": foreign})
    assert r.status_code == 409 and "another model" in r.json()["error"]


def test_stream_snapshot_and_restore(text8_server, text8_valid_head):
    addr, eng = text8_server
    text = text8_valid_head[:3000]
    whole = eng.score(text)
    with connect(f"ws://{addr}/v1/stream") as ws:
        ws.send(json.dumps({"text": text[:1200], "snapshot": True}))
        token = json.loads(ws.recv(timeout=30))["state"]
    with connect(f"ws://{addr}/v1/stream") as ws:
        ws.send(json.dumps({"restore": token}))
        assert json.loads(ws.recv(timeout=30))["total_chars"] == 1200
        ws.send(json.dumps({"text": text[1200:]}))
        msg = json.loads(ws.recv(timeout=30))
        ws.send(json.dumps({"restore": token[:-2] + ("AA" if token[-2:] != "AA" else "BB")}))
        bad = json.loads(ws.recv(timeout=30))
        ws.send(json.dumps({"snapshot": True}))
        still = json.loads(ws.recv(timeout=30))
    tol = engine_float32_tolerance(eng, text).twice()  # cut and restored vs whole: two float32 computations
    assert msg["total_chars"] == 3000 and abs(msg["total_bits"] - whole.bits) <= tol.total_bits
    assert bad["status"] == 403 and still["total_chars"] == 3000  # a refused snapshot changes nothing


def test_whitespace_chunk_after_a_space_scores_nothing(text8_server):
    """A chunk that normalises to nothing at a chunk boundary scores zero characters (streaming),
    as in the library; an empty request is an error."""
    addr, eng = text8_server
    with connect(f"ws://{addr}/v1/stream") as ws:
        ws.send(json.dumps({"text": "a cat "}))
        ws.recv(timeout=30)
        ws.send(json.dumps({"text": "\n\n", "per_char": True}))
        msg = json.loads(ws.recv(timeout=30))
    assert msg["chars"] == 0 and msg["bpc"] is None and msg["total_chars"] == 6 and msg["per_char_bits"] == []
    r = httpx.post(f"http://{addr}/v1/score", json={"text": "!", "normalize": "none", "unknown": "skip"})
    assert r.status_code == 422 and "empty" in r.json()["error"]  # well-formed, but nothing for the model to score


def test_real_text_is_normalised_as_offline(text8_server):
    """Shakespeare (capitals, punctuation, newlines) through the text8 normaliser: the server's
    numbers and report equal the library's."""
    from conftest import DATA, need

    addr, eng = text8_server
    text = need(DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:20_000]
    body = httpx.post(f"http://{addr}/v1/score", json={"text": text, "per_char": True}, timeout=120).json()
    lib = eng.score(text, per_char=True)
    assert body["chars"] == lib.chars and body["normalization"] == lib.normalization
    tol = engine_float32_tolerance(eng, text).twice()  # batched vs the library's path: two float32 computations
    assert abs(body["bits"] - lib.bits) <= tol.total_bits
    assert body["per_char_offsets"] == lib.per_char_offsets.tolist()
    np.testing.assert_allclose(body["per_char_bits"], lib.per_char_bits, rtol=0, atol=tol.bits)


def test_isan_serve_with_no_arguments_matches_isan_score(text8_valid_head):
    """`isan-serve` with the default model answers HTTP and WebSocket with the bits of `isan score`."""
    text = text8_valid_head[:4000]
    cli = json.loads(subprocess.run([sys.executable, "-m", "isan.cli", "score", "--json", "-"], input=text,
                                    capture_output=True, text=True, timeout=300, check=True).stdout)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "isan.engine.serve", "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while True:  # the server listens while the model loads: /healthz says loading, then ready
            try:
                h = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
                assert h.json()["status"] in ("loading", "ready"), h.text
                if h.json()["status"] == "ready":
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
            time.sleep(0.1)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/score", json={"text": text}, timeout=60)
        body = r.json()
        assert r.status_code == 200 and body["chars"] == cli["chars"] and body["normalization"] == cli["normalization"]
        # batched (float32, symbol-grouped) vs the composed path offline: two float32 computations
        tol = engine_float32_tolerance(Engine.default(), text).twice()
        assert abs(body["bits"] - cli["bits"]) <= tol.total_bits
        health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
        assert health["model"]["path"] == "composed" and health["server"]["batching"] is True
        with connect(f"ws://127.0.0.1:{port}/v1/stream") as ws:
            for a in range(0, len(text), 1000):
                ws.send(json.dumps({"text": text[a : a + 1000]}))
                msg = json.loads(ws.recv(timeout=60))
        assert msg["total_chars"] == cli["chars"] and abs(msg["total_bits"] - cli["bits"]) <= tol.total_bits
    finally:
        proc.terminate()
        proc.wait(10)


def test_isan_serve_bad_model_is_a_clean_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "isan.engine.serve", "--model", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_isan_serve_bad_limit_is_a_clean_error():
    r = subprocess.run([sys.executable, "-m", "isan.engine.serve", "--round-chars", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--round-chars" in r.stderr and "Traceback" not in r.stderr


def test_isan_bench_serve_runs(small_bundle, text8_path, tmp_path):
    """`isan bench serve` end to end with a small model and a tiny load (the real figures are in the README)."""
    out = tmp_path / "serve.json"
    r = subprocess.run([sys.executable, "-m", "isan.cli", "bench", "serve", "--model", str(small_bundle),
                        "--data", str(text8_path), "--clients", "3", "--duration", "0.5", "--streams", "5",
                        "--chunks", "2", "--big-chars", "20000", "--big-requests", "2", "--slow-conns", "6",
                        "--server-args", "--read-timeout 0.5 --max-connections 4", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    eng = Engine.load(small_bundle)  # each load's furthest text within twice its derived float32 tolerance
    for load in ("http", "completions", "stream"):
        assert res[load]["max_abs_bits_error"] <= serve_bench_tolerance(eng, text8_path, res[load]), load
    assert res["http"]["ok"] > 0 and res["completions"]["ok"] > 0
    assert "/v1/completions" in r.stdout
    assert res["stream"]["errors"] == 0
    assert res["memory"]["statuses"] == {"200": 2} and "requests/s" in r.stdout
    assert res["stream"]["rss_peak_mib"] > 0 and res["slow"]["then_a_request"] == 200
    assert sum(res["slow"]["statuses"].values()) == 6 and res["slow"]["statuses"].get("408", 0) >= 1
