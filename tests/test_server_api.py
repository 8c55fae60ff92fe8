"""The endpoints of isan-serve end to end on real text: a real uvicorn server on localhost, real HTTP
(httpx) and WebSocket clients; every answer checked against the library."""

import json
import socket
import threading
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from websockets.sync.client import connect  # noqa: E402

from isan.engine import Engine, default_model_path  # noqa: E402
from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from isan.engine.serve.service import ModelInfo  # noqa: E402
from server_helpers import raw_http, running  # noqa: E402
from tolerances import engine_float32_tolerance, next_char_tolerance  # noqa: E402

KEY = "s3cret-key-for-tests"


@pytest.fixture(scope="module")
def api(default_engine):
    """The shipped model behind the batching server, as `isan-serve` runs it."""
    cfg = ServeConfig(max_chars=200_000, state_secret=b"k" * 32, max_attribute_chars=300)
    with running(create_app(default_engine, config=cfg)) as addr:
        yield f"http://{addr}", addr, default_engine


def post(url, path, body, **kw):
    return httpx.post(url + path, json=body, timeout=60, **kw)


def sse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_healthz_is_ready_and_shows_no_paths(api):
    url, _, eng = api
    r = httpx.get(url + "/healthz")
    body = r.json()
    assert r.status_code == 200 and body["status"] == "ready" and body["model"]["d"] == eng.d
    assert body["model"]["source"] == default_model_path().name and "path" not in body["model"].get("table", {})
    assert "/work" not in r.text and "/root" not in r.text and "/home" not in r.text and ".cache" not in r.text


def test_score_batch_equals_library(api, text8_valid_head):
    url, _, eng = api
    texts = [text8_valid_head[i * 1000 : i * 1000 + 200 + 97 * i] for i in range(12)]
    r = post(url, "/v1/score/batch", {"texts": texts, "per_char": True, "top_k": 2, "return_state": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["results"]) == 12
    total_tol = 0.0
    for t, res in zip(texts, body["results"]):
        lib = eng.score(t, per_char=True)
        tol = engine_float32_tolerance(eng, t).twice()  # batched vs composed: two float32 computations
        total_tol += tol.total_bits
        assert res["chars"] == lib.chars and res["normalization"] == lib.normalization
        assert abs(res["bits"] - lib.bits) <= tol.total_bits
        np.testing.assert_allclose(res["per_char_bits"], lib.per_char_bits, rtol=0, atol=tol.bits)
        assert [n["symbol"] for n in res["next"]] == [n["symbol"] for n in eng.top_k(lib.state, 2)]
        assert res["total_chars"] == lib.chars and res["state"]
    assert body["chars"] == sum(len(t) for t in texts)
    assert abs(body["bits"] - sum(eng.score(t).bits for t in texts)) <= total_tol
    # a text the model cannot score fails the request, naming it
    r = post(url, "/v1/score/batch", {"texts": ["the cat", "the 7 dogs", "X"], "normalize": "none"})
    assert r.status_code == 422 and r.json()["error"].startswith("texts[1]: ") and r.json()["index"] == 1
    r = post(url, "/v1/score/batch", {"texts": ["ok", ""]})
    assert r.status_code == 400 and "texts[1]" in r.json()["error"] and "empty" in r.json()["error"]
    r = post(url, "/v1/score/batch", {"texts": []})
    assert r.status_code == 400 and "at least one text" in r.json()["error"]
    r = post(url, "/v1/score/batch", {"texts": ["a" * 150_000, "b" * 60_000]})
    assert r.status_code == 413 and "in all" in r.json()["error"]


def test_next_after_text_and_after_snapshot(api, text8_valid_head):
    url, _, eng = api
    text = text8_valid_head[:3000]
    lib = eng.score(text)
    want = eng.top_k(lib.state, 27)
    r = post(url, "/v1/next", {"text": text, "k": 27, "return_state": True})
    body = r.json()
    tol = engine_float32_tolerance(eng, text + " and the").twice()  # two float32 computations
    next_bits, next_prob = next_char_tolerance(eng, lib.state.h, tol.state / 2)
    assert r.status_code == 200 and body["chars"] == 3000 and abs(body["bits"] - lib.bits) <= tol.total_bits
    assert [n["symbol"] for n in body["next"][:5]] == [w["symbol"] for w in want[:5]]
    np.testing.assert_allclose([n["prob"] for n in body["next"]], [w["prob"] for w in want], rtol=0, atol=next_prob)
    np.testing.assert_allclose([n["bits"] for n in body["next"]], [w["bits"] for w in want], rtol=0, atol=next_bits)
    # the server's state within the derived tolerance of the library's, and its distribution read out of it
    from isan.engine.serve.snapshot import decode_state

    mine = decode_state(body["state"], eng.params_sha256, b"k" * 32, eng.d)
    np.testing.assert_allclose(mine.h, lib.state.h, rtol=0, atol=tol.state)
    assert [(n["prob"], n["bits"]) for n in body["next"]] == [(w["prob"], w["bits"]) for w in eng.top_k(mine, 27)]
    assert sum(n["prob"] for n in body["next"]) == pytest.approx(1.0, abs=1e-9)
    # after the snapshot alone: the same distribution; after the snapshot and more text: as the library
    again = post(url, "/v1/next", {"state": body["state"], "k": 3}).json()
    assert [n["symbol"] for n in again["next"]] == [w["symbol"] for w in want[:3]] and again["chars"] == 0
    assert again["total_chars"] == 3000
    more = post(url, "/v1/next", {"state": body["state"], "text": " and the", "k": 3}).json()
    lib2 = eng.score(" and the", state=lib.state)
    assert [n["symbol"] for n in more["next"]] == [w["symbol"] for w in eng.top_k(lib2.state, 3)]
    assert more["total_chars"] == lib2.state.chars and abs(more["bits"] - lib2.bits) <= len(" and the") * tol.bits
    # no text, no state: the initial distribution
    first = post(url, "/v1/next", {}).json()
    assert [n["symbol"] for n in first["next"]] == [w["symbol"] for w in eng.top_k(None, 5)]
    bad = post(url, "/v1/next", {"k": 0})
    assert bad.status_code == 400 and '"k" must be >= 1' in bad.json()["error"]


def test_sample_streams_server_sent_events(api):
    url, _, eng = api
    body = {"prompt": "the meaning of life is", "n": 300, "temperature": 0.8, "top_k": 10, "seed": 7}
    with httpx.stream("POST", url + "/v1/sample", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.read().decode())
    kinds = [e for e, _ in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"chars"} and len(kinds) >= 3  # streamed in pieces
    pieces = [d for e, d in events if e == "chars"]
    assert [p["offset"] for p in pieces] == list(np.cumsum([0] + [len(p["text"]) for p in pieces[:-1]]))
    lib = eng.sample(body["prompt"], n=300, temperature=0.8, top_k=10, seed=7)
    done = events[-1][1]
    assert "".join(p["text"] for p in pieces) == done["text"] == lib.text
    assert done["bits"] == pytest.approx(lib.bits, rel=1e-12) and done["seed"] == 7 and done["chars"] == 300
    # one JSON answer; a seed drawn by the server is answered and repeats the sample
    r = post(url, "/v1/sample", {"prompt": "the cat", "n": 50, "stream": False, "return_state": True})
    one = r.json()
    assert r.status_code == 200 and len(one["text"]) == 50 and isinstance(one["seed"], int) and one["state"]
    assert one["text"] == eng.sample("the cat", n=50, seed=one["seed"]).text
    # inverse temperature 0 samples uniformly; both temperatures is an error
    r = post(url, "/v1/sample", {"n": 20, "inverse_temperature": 0, "stream": False, "seed": 1})
    assert r.status_code == 200 and r.json()["temperature"] is None and len(r.json()["text"]) == 20
    r = post(url, "/v1/sample", {"n": 5, "temperature": 1, "inverse_temperature": 1})
    assert r.status_code == 400 and "not both" in r.json()["error"]
    r = post(url, "/v1/sample", {"prompt": "ABC", "normalize": "none", "n": 5})
    assert r.status_code == 422 and "'A'" in r.json()["error"]
    r = post(url, "/v1/sample", {"n": 10**6})
    assert r.status_code == 400 and '"n" must be <=' in r.json()["error"]


def test_attribute_sums_to_the_logits(api, text8_valid_head):
    url, _, eng = api
    text = text8_valid_head[:120]
    for by in ("char", "word"):
        r = post(url, "/v1/attribute", {"text": text, "by": by})
        assert r.status_code == 200, r.text
        body = r.json()
        lib = eng.attribute(text, by=by)
        assert body["sources"] == lib.sources and body["targets"] == lib.to_json()["targets"]
        np.testing.assert_allclose(body["next_char_kappa"], lib.to_json()["next_char_kappa"], atol=1e-9)
        assert body["check"]["ok"] and body["check"]["max_abs_error"] <= body["check"]["tolerance"]
    full = post(url, "/v1/attribute", {"text": text[:40], "full": True}).json()
    kappa, logits, b_ro = np.array(full["kappa"]), np.array(full["logits"]), np.array(full["b_ro"])
    assert kappa.shape == (40, 41, 27)
    np.testing.assert_allclose(b_ro + kappa.sum(axis=1), logits, atol=1e-9)  # the identity, checked by the client
    r = post(url, "/v1/attribute", {"text": text8_valid_head[:301]})
    assert r.status_code == 413 and "300" in r.json()["error"]
    r = post(url, "/v1/attribute", {"text": text8_valid_head[:250], "full": True})
    assert r.status_code == 413 and '"full"' in r.json()["error"]


def test_schema_and_docs_need_no_cdn(api):
    url, _, _ = api
    schema = httpx.get(url + "/openapi.json").json()
    for path in ("/v1/score", "/v1/score/batch", "/v1/next", "/v1/sample", "/v1/attribute"):
        op = schema["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["properties"], path
        assert "200" in op["responses"] and "400" in op["responses"], path
    assert set(schema["paths"]) >= {"/healthz", "/metrics"}
    page = httpx.get(url + "/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<script" not in page.text and "cdn" not in page.text.lower() and "/v1/attribute" in page.text
    assert httpx.get(url + "/redoc").status_code == 404


def test_docs_show_the_package_version(api):
    """/docs and /openapi.json give the installed package's version (issue 34: the page said
    "isan-serve 3" for isan 0.1.0)."""
    from importlib.metadata import version

    url, _, _ = api
    assert httpx.get(url + "/openapi.json").json()["info"]["version"] == version("isan")
    page = httpx.get(url + "/docs").text
    assert f"<h1>isan-serve <small>{version('isan')}</small></h1>" in page


def test_stream_bad_frames_keep_the_state(api, text8_valid_head):
    """Binary, deeply nested, huge-integer, non-JSON and unknown-field frames are each answered with an
    error; the stream's state is kept; {"reset": true, "text": ...} resets, then scores."""
    _, addr, eng = api
    text = text8_valid_head[:1000]
    with connect(f"ws://{addr}/v1/stream") as ws:
        ws.send(json.dumps({"text": text[:600]}))
        assert json.loads(ws.recv(timeout=30))["total_chars"] == 600
        bad = [b"\x00\xff binary", "[" * 5000 + "]" * 5000, '{"text": "abc", "top_k": ' + "9" * 5000 + "}",
               '{"text": ' + '{"a":' * 1000 + "1" + "}" * 1001, "not json", '{"text": "ab", "bogus": 1}',
               '{"reset": true, "restore": "AAAA"}', '{"top_k": 3}', "{\"text\": \"\\ud800\"}"]
        for frame in bad:
            ws.send(frame)
            ans = json.loads(ws.recv(timeout=30))
            assert ans["status"] == 400 and ans["error"], (frame[:40], ans)
        limit = ServeConfig(max_chars=200_000).max_body_bytes
        ws.send(json.dumps({"text": "a" * limit}))  # over the byte limit of a frame: answered, not dropped
        ans = json.loads(ws.recv(timeout=30))
        assert ans["status"] == 413 and "smaller chunks" in ans["error"]
        ws.send(json.dumps({"text": text[600:]}))
        ans = json.loads(ws.recv(timeout=30))
        tol = engine_float32_tolerance(eng, text).twice()  # streamed vs the library: two float32 computations
        assert ans["total_chars"] == 1000 and abs(ans["total_bits"] - eng.score(text).bits) <= tol.total_bits
        ws.send(json.dumps({"reset": True, "text": "the cat"}))
        ans = json.loads(ws.recv(timeout=30))
        cat = engine_float32_tolerance(eng, "the cat").twice()
        assert ans["reset"] and ans["total_chars"] == 7 and abs(ans["bits"] - eng.score("the cat").bits) <= cat.total_bits


def test_snapshot_mid_stream_equals_the_unbroken_stream(api, text8_valid_head):
    """A snapshot taken mid-stream, restored on a new stream: the same bits, chunk for chunk, as the
    stream that went on; a tampered snapshot is refused and changes nothing."""
    _, addr, eng = api
    text = text8_valid_head[:5000]
    cuts = [0, 700, 2100, 2101, 3600, 5000]
    with connect(f"ws://{addr}/v1/stream") as ws:
        answers = []
        for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
            ws.send(json.dumps({"text": text[a:b], "snapshot": i == 1}))
            answers.append(json.loads(ws.recv(timeout=30)))
    token = answers[1]["state"]
    # restored and unbroken: two float32 computations; a chunk's bits are a difference of two totals
    tol = engine_float32_tolerance(eng, text).twice()
    with connect(f"ws://{addr}/v1/stream") as ws:
        tampered = token[:100] + ("A" if token[100] != "A" else "B") + token[101:]
        ws.send(json.dumps({"restore": tampered}))
        refused = json.loads(ws.recv(timeout=30))
        assert refused["status"] == 403 and "signature" in refused["error"]
        ws.send(json.dumps({"restore": token}))
        assert json.loads(ws.recv(timeout=30))["total_chars"] == 2100
        for j, (a, b) in enumerate(zip(cuts[2:], cuts[3:])):
            ws.send(json.dumps({"text": text[a:b]}))
            got, want = json.loads(ws.recv(timeout=30)), answers[2 + j]
            assert got["total_chars"] == want["total_chars"]
            assert abs(got["bits"] - want["bits"]) <= 2 * tol.total_bits
            assert abs(got["total_bits"] - want["total_bits"]) <= tol.total_bits
    assert abs(answers[-1]["total_bits"] - eng.score(text).bits) <= tol.total_bits


def test_api_key(small_bundle, text8_valid_head):
    eng = Engine.load(small_bundle)
    with running(create_app(eng, config=ServeConfig(api_key=KEY))) as addr:
        url = f"http://{addr}"
        r = post(url, "/v1/score", {"text": "the cat"})
        assert r.status_code == 401 and "API key" in r.json()["error"] and r.json()["status"] == 401
        assert post(url, "/v1/score", {"text": "the cat"}, headers={"Authorization": "Bearer wrong-key"}).status_code == 401
        assert post(url, "/v1/score", {"text": "the cat"}, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert post(url, "/v1/next", {}, headers={"X-API-Key": KEY}).status_code == 200
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/healthz").status_code == 200  # health stays open for load balancers
        schema = httpx.get(url + "/openapi.json").json()
        assert "bearer" in schema["components"]["securitySchemes"]
        assert schema["paths"]["/v1/score"]["post"]["security"]
        with connect(f"ws://{addr}/v1/stream") as ws:
            assert json.loads(ws.recv(timeout=10))["status"] == 401
        with connect(f"ws://{addr}/v1/stream?api_key={KEY}") as ws:
            ws.send(json.dumps({"text": text8_valid_head[:100]}))
            assert json.loads(ws.recv(timeout=10))["chars"] == 100


#: a key beyond Latin-1 (a key file is read as UTF-8)
WIDE_KEY = "clé-€-ключ-키-1"


def test_an_api_key_of_any_characters_works_everywhere(small_bundle):
    """A key with characters beyond Latin-1 works in the header, as a bearer token and in a stream's
    query (percent-encoded UTF-8), compared in its UTF-8 bytes; a wrong query key of any bytes is a
    401 frame and close code 1008, never a 500 (issue 34: ?api_key=%E2%82%AC and %FF were a plain-text
    500); a key no header can carry is refused when the server starts."""
    from urllib.parse import quote

    from websockets.exceptions import ConnectionClosed

    from isan.errors import IsanError

    eng = Engine.load(small_bundle)
    with running(create_app(eng, config=ServeConfig(api_key=WIDE_KEY))) as addr:
        url = f"http://{addr}"
        key = WIDE_KEY.encode()
        assert post(url, "/v1/score", {"text": "the cat"}, headers={"X-API-Key": key}).status_code == 200
        assert post(url, "/v1/next", {}, headers={"Authorization": b"Bearer " + key}).status_code == 200
        assert post(url, "/v1/score", {"text": "the cat"}, headers={"X-API-Key": key[:-1]}).status_code == 401
        assert post(url, "/v1/score", {"text": "the cat"}, headers={"X-API-Key": WIDE_KEY.encode("latin-1", "replace")}).status_code == 401
        for query in ("%E2%82%AC", "%FF", quote(WIDE_KEY[:-1]), quote(WIDE_KEY.encode("latin-1", "replace"))):
            with connect(f"ws://{addr}/v1/stream?api_key={query}") as ws:
                ans = json.loads(ws.recv(timeout=10))
                assert ans["status"] == 401 and "api_key=KEY" in ans["error"], (query, ans)
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=10)
                assert closed.value.rcvd.code == 1008
        with connect(f"ws://{addr}/v1/stream?api_key={quote(WIDE_KEY)}") as ws:
            ws.send(json.dumps({"text": "the cat"}))
            assert json.loads(ws.recv(timeout=10))["chars"] == 7
    for bad in ("two\nlines-key", "tab\tinside-key", " spaces-around-key "):
        with pytest.raises(IsanError, match="API key"):
            ServeConfig(api_key=bad)


def test_loading_then_ready(small_bundle):
    """The server listens while the model loads: /healthz says loading (503) and the endpoints answer
    503 with Retry-After; then ready."""
    from isan.engine.bundle import read_manifest

    gate = threading.Event()

    def loader():
        gate.wait(30)
        return Engine.load(small_bundle)

    info = ModelInfo.of_manifest(read_manifest(small_bundle, verify="none"), str(small_bundle))
    with running(create_app(loader=loader, info=info)) as addr:
        url = f"http://{addr}"
        h = httpx.get(url + "/healthz")
        assert h.status_code == 503 and h.json()["status"] == "loading" and h.headers["retry-after"]
        r = post(url, "/v1/score", {"text": "the cat"})
        assert r.status_code == 503 and "loading" in r.json()["error"] and r.headers["retry-after"]
        with connect(f"ws://{addr}/v1/stream") as ws:
            assert json.loads(ws.recv(timeout=10))["status"] == 503
        gate.set()
        deadline = time.time() + 30
        while httpx.get(url + "/healthz").json()["status"] != "ready":
            assert time.time() < deadline
            time.sleep(0.05)
        assert post(url, "/v1/score", {"text": "the cat"}).status_code == 200


def test_a_failed_load_is_reported(small_bundle):
    from isan.engine.bundle import read_manifest

    def loader():
        raise RuntimeError("the weights are corrupt")

    info = ModelInfo.of_manifest(read_manifest(small_bundle, verify="none"), str(small_bundle))
    with running(create_app(loader=loader, info=info)) as addr:
        deadline = time.time() + 10
        while (h := httpx.get(f"http://{addr}/healthz").json())["status"] == "loading":
            assert time.time() < deadline
            time.sleep(0.05)
        assert h["status"] == "failed" and "corrupt" in h["error"]
        r = post(f"http://{addr}", "/v1/score", {"text": "abc"})
        assert r.status_code == 503 and "could not be loaded" in r.json()["error"]


def _raw(addr: str, data: bytes, wait: float = 10.0) -> str:
    return raw_http(addr, data, wait).decode("latin-1")


def test_connection_limits(small_bundle):
    """Headers or a body that do not arrive within --read-timeout: 408 and closed; connections beyond
    --max-connections: 503 and closed; the server then serves as before."""
    eng = Engine.load(small_bundle)
    app = create_app(eng, config=ServeConfig(read_timeout_s=0.5, max_connections=20))
    with running(app) as addr:
        host, port = addr.split(":")
        t0 = time.time()
        ans = _raw(addr, b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        assert ans.startswith("HTTP/1.1 408") and '"status":408' in ans and "headers" in ans and time.time() - t0 < 5
        ans = _raw(addr, b"")  # connects and sends nothing
        assert ans.startswith("HTTP/1.1 408")
        ans = _raw(addr, b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
               b"{\"text\": \"ab")
        assert ans.startswith("HTTP/1.1 408") and "body" in ans
        # 50 connections that send part of their body: 20 wait (then 408), the others are refused at once
        socks = []
        for _ in range(50):
            s = socket.create_connection((host, int(port)))
            s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"text\": \"ab")
            socks.append(s)
        statuses = []
        for s in socks:
            s.settimeout(10)
            statuses.append(s.recv(4096).decode("latin-1").split(" ")[1])
            s.close()
        # at the cap, a connection that waited --read-timeout (0.5 s here) may give its slot to a later one
        assert statuses.count("408") >= 20 and statuses.count("503") >= 20 and len(statuses) == 50, statuses
        assert set(statuses) <= {"408", "503"}, statuses
        assert app.state.service.budget.used == 0
        r = httpx.post(f"http://{addr}/v1/score", json={"text": "the cat"})
        assert r.status_code == 200
