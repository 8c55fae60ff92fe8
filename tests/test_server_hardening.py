"""isan-serve against the findings of a new user's and a reliability run (issue 19): the path
option, snapshots of other models and forged totals, duplicate JSON keys, the Content-Type of a
body, idle connections at the connection limit, malformed HTTP, the schema saying what the server
does, the /docs page, and the ``nnl`` of ``isan score --json``."""

import json
import math
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from websockets.sync.client import connect  # noqa: E402

from isan.engine import Engine  # noqa: E402
from isan.engine.results import State  # noqa: E402
from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from isan.engine.serve.snapshot import encode_state  # noqa: E402
from server_helpers import free_port, raw_http, running  # noqa: E402
from tolerances import engine_float32_tolerance  # noqa: E402

SECRET = b"s" * 32


@pytest.fixture(scope="module")
def big(default_engine):
    """The shipped model (d = 216) with a known state secret."""
    cfg = ServeConfig(max_chars=100_000, state_secret=SECRET, max_attribute_chars=100)
    app = create_app(default_engine, config=cfg)
    with running(app) as addr:
        yield f"http://{addr}", addr, default_engine, app


@pytest.fixture(scope="module")
def small(small_bundle):
    """A d = 16 model with the same state secret as ``big``."""
    eng = Engine.load(small_bundle)
    with running(create_app(eng, config=ServeConfig(max_chars=100_000, state_secret=SECRET))) as addr:
        yield f"http://{addr}", addr, eng


def post(url, path, body, **kw):
    return httpx.post(url + path, json=body, timeout=60, **kw)


def split_response(raw: bytes) -> tuple[int, dict, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def assert_error_shape(status: int, headers, body, code: int) -> dict:
    assert status == code, body[:300]
    assert headers["content-type"].startswith("application/json"), headers
    err = json.loads(body)
    assert err["status"] == code and isinstance(err["error"], str) and len(err["error"]) > 20, err
    return err


# ---- (a) --path chunked ------------------------------------------------------------------------
def test_isan_serve_path_chunked(default_engine, text8_valid_head):
    """`isan-serve --path chunked` serves the chunk-parallel path (the README's option list has it):
    with --no-batching the bits are Engine.score's on that path, bit for bit."""
    text = text8_valid_head[:3000]
    want = default_engine.with_path("chunked").score(text)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "isan.engine.serve", "--port", str(port), "--path", "chunked",
                             "--no-batching", "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while True:
            try:
                h = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
                if h.json()["status"] == "ready":
                    break
                assert h.json()["status"] == "loading", h.text
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline
            time.sleep(0.1)
        assert h.json()["model"]["path"] == "chunked"
        body = httpx.post(f"http://127.0.0.1:{port}/v1/score", json={"text": text}, timeout=60).json()
        assert body["scoring"]["path"] == "chunked" and body["chars"] == want.chars and body["bits"] == want.bits
    finally:
        proc.terminate()
        proc.wait(10)
    r = subprocess.run([sys.executable, "-m", "isan.engine.serve", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert "chunked" in r.stdout


# ---- (b) snapshots of another model; forged totals ----------------------------------------------
def test_snapshot_of_another_model_is_409_both_ways(big, small):
    """Same secret, other model: 409 naming both models, whichever state is the larger."""
    big_url, big_addr, _, _ = big
    small_url, small_addr, _ = small
    big_token = post(big_url, "/v1/score", {"text": "the cat", "return_state": True}).json()["state"]
    small_token = post(small_url, "/v1/score", {"text": "the cat", "return_state": True}).json()["state"]
    assert len(big_token) > 2 * len(small_token)
    for url, addr, token in ((small_url, small_addr, big_token), (big_url, big_addr, small_token)):
        for path, body in (("/v1/score", {"text": "abc", "state": token}), ("/v1/next", {"state": token}),
                           ("/v1/sample", {"state": token, "n": 3, "stream": False})):
            r = post(url, path, body)
            assert r.status_code == 409 and r.json()["status"] == 409, (path, r.text)
            assert "another model" in r.json()["error"] and "params_sha256" in r.json()["error"], r.text
        with connect(f"ws://{addr}/v1/stream") as ws:
            ws.send(json.dumps({"restore": token}))
            ans = json.loads(ws.recv(timeout=30))
            assert ans["status"] == 409 and "another model" in ans["error"], ans


def _forged(eng, chars: int, bits: float = 10.0, last: str = "a") -> str:
    """A token signed with the secret, packed by hand (encode_state refuses totals out of range)."""
    import base64
    import hashlib
    import hmac
    import struct

    from isan.engine.serve.snapshot import HEADER, MAGIC, VERSION

    h = np.ascontiguousarray(eng.initial_state().h, dtype="<f8")
    sym = last.encode("utf-8")
    payload = (HEADER.pack(MAGIC, VERSION, bytes.fromhex(eng.params_sha256), len(h), chars, bits)
               + struct.pack("<B", len(sym)) + sym + h.tobytes())
    raw = payload + hmac.new(SECRET, payload, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def test_forging_helper_matches_encode_state(big):
    _, _, eng, _ = big
    st = State(eng.initial_state().h, 12, 3.5, "a")
    assert _forged(eng, 12, 3.5, "a") == encode_state(st, eng.params_sha256, SECRET)


@pytest.mark.parametrize("chars, bits", [(2**64 - 1, 10.0), (2**53 + 1, 10.0), (5, -1.0), (5, 1e300)])
def test_forged_totals_are_refused_never_500(big, chars, bits):
    """A snapshot signed with the secret (so only a holder of the secret can make it) whose running
    totals no scoring reaches is refused with 422 on every endpoint; nothing answers 500."""
    url, addr, eng, _ = big
    token = _forged(eng, chars, bits)
    for path, body in (("/v1/score", {"text": "abc", "state": token, "return_state": True}),
                       ("/v1/score", {"text": "abc", "state": token}),
                       ("/v1/next", {"state": token, "return_state": True}),
                       ("/v1/sample", {"state": token, "n": 3, "stream": False, "return_state": True}),
                       ("/v1/attribute", {"text": "abc", "state": token})):
        r = post(url, path, body)
        assert r.status_code == 422 and "running totals" in r.json()["error"], (path, r.status_code, r.text)
    with connect(f"ws://{addr}/v1/stream") as ws:
        ws.send(json.dumps({"restore": token, "snapshot": True}))
        ans = json.loads(ws.recv(timeout=30))
        assert ans["status"] == 422, ans
        ws.send(json.dumps({"text": "the cat"}))
        assert json.loads(ws.recv(timeout=30))["total_chars"] == 7


def test_totals_near_the_limit_still_answer(big):
    """A snapshot at the largest total accepted continues, and its next snapshot is refused cleanly
    when the total passes the limit (422, not a 500 from packing the token)."""
    from isan.engine.serve.snapshot import MAX_TOTAL_CHARS

    url, _, eng, _ = big
    ok = post(url, "/v1/score", {"text": "abc", "state": _forged(eng, MAX_TOTAL_CHARS - 10)})
    assert ok.status_code == 200 and ok.json()["total_chars"] == MAX_TOTAL_CHARS - 7
    over = post(url, "/v1/score", {"text": "a" * 20, "state": _forged(eng, MAX_TOTAL_CHARS - 10), "return_state": True})
    assert over.status_code == 422 and "running totals" in over.json()["error"], over.text
    odd = post(url, "/v1/score", {"text": "abc", "state": _forged(eng, 5, last="\x00\u2603 z")})
    assert odd.status_code < 500, odd.text


# ---- (c) duplicate JSON keys -------------------------------------------------------------------
@pytest.mark.parametrize("body", [b'{"text": "abc", "text": "xyz"}', b'{"text": "abc", "per_char": true, "per_char": false}',
                                  b'{"text": "abc", "\\u0074ext": "xyz"}', b'{"texts": ["a"], "texts": ["b", "c"]}'])
def test_duplicate_keys_are_422(big, body):
    url, _, _, _ = big
    path = "/v1/score/batch" if b"texts" in body else "/v1/score"
    r = httpx.post(url + path, content=body, headers={"content-type": "application/json"})
    err = assert_error_shape(r.status_code, r.headers, r.content, 422)
    assert "duplicate" in err["error"] and "once" in err["error"]


def test_duplicate_keys_in_a_stream_frame_are_422_and_keep_the_state(big):
    _, addr, eng, _ = big
    with connect(f"ws://{addr}/v1/stream") as ws:
        ws.send(json.dumps({"text": "the cat"}))
        assert json.loads(ws.recv(timeout=30))["total_chars"] == 7
        ws.send('{"text": " sat", "text": " ran", "reset": false}')
        ans = json.loads(ws.recv(timeout=30))
        assert ans["status"] == 422 and '"text"' in ans["error"] and "duplicate" in ans["error"], ans
        ws.send('{"reset": true, "reset": false}')
        assert json.loads(ws.recv(timeout=30))["status"] == 422
        ws.send(json.dumps({"text": " sat"}))
        ans = json.loads(ws.recv(timeout=30))
        tol = engine_float32_tolerance(eng, "the cat sat").twice()  # streamed vs the library: two float32 computations
        assert ans["total_chars"] == 11 and abs(ans["total_bits"] - eng.score("the cat sat").bits) <= tol.total_bits


# ---- (d) Content-Type --------------------------------------------------------------------------
@pytest.mark.parametrize("ctype", [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/xml", "application/jsonx",
                                   "application/json-patch+json"])
def test_a_body_that_is_not_declared_json_is_415(big, ctype):
    """A body must be declared application/json: the types a browser may send cross-site without a
    preflight (text/plain, forms) cannot reach the endpoints of a server without an API key."""
    url, _, _, _ = big
    headers = {} if ctype is None else {"content-type": ctype}
    for path in ("/v1/score", "/v1/score/batch", "/v1/next", "/v1/sample", "/v1/attribute"):
        r = httpx.post(url + path, content=b'{"text": "abc", "texts": ["abc"]}', headers=headers)
        err = assert_error_shape(r.status_code, r.headers, r.content, 415)
        assert "application/json" in err["error"], err


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8", "Application/JSON",
                                   "application/json;charset=UTF-8"])
def test_json_bodies_are_read(big, ctype):
    url, _, _, _ = big
    r = httpx.post(url + "/v1/score", content=b'{"text": "abc"}', headers={"content-type": ctype})
    assert r.status_code == 200 and r.json()["chars"] == 3


# ---- (e) idle connections at the connection limit ------------------------------------------------
def test_idle_connections_do_not_lock_clients_out(small_bundle):
    """Connections that send nothing fill the cap; a real client then waits at most about a second
    (not --read-timeout): at the cap, the connection that has waited longest for its client is
    answered 408 and closed to make room. Over-cap connections that never send a request are
    answered 503 within a second."""
    from isan.engine.serve.connections import SATURATED_GRACE_S

    eng = Engine.load(small_bundle)
    app = create_app(eng, config=ServeConfig(read_timeout_s=30, max_connections=8))
    with running(app) as addr:
        host, port = addr.split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(30)]
        time.sleep(SATURATED_GRACE_S + 0.3)
        t0 = time.time()
        with httpx.Client(timeout=10) as c:
            for _ in range(5):  # each new client evicts one idle connection
                r = c.post(f"http://{addr}/v1/score", json={"text": "the cat"}, headers={"connection": "close"})
                assert r.status_code == 200, r.text
        assert time.time() - t0 < 3
        answers = []
        for s in idle:
            s.settimeout(5)
            try:
                answers.append(s.recv(4096))
            except (socket.timeout, ConnectionResetError):
                answers.append(b"")
            s.close()
        assert time.time() - t0 < 8
        codes = [a.split(b" ")[1] if a.startswith(b"HTTP/1.1 ") else a for a in answers]
        assert codes.count(b"408") >= 5 and codes.count(b"503") >= 20, codes
        assert all(c in (b"408", b"503") for c in codes), codes
        for a in answers:
            status, headers, body = split_response(a)
            assert_error_shape(status, headers, body, status)
        assert httpx.post(f"http://{addr}/v1/score", json={"text": "the cat"}).status_code == 200


def test_a_busy_connection_is_never_evicted(small_bundle):
    """A connection whose request is being scored is not closed to make room: the new connection is
    refused (503) instead, and the busy one gets its answer."""
    from server_helpers import SlowEngine

    eng = SlowEngine(Engine.load(small_bundle))
    eng.gate.clear()
    app = create_app(eng, config=ServeConfig(read_timeout_s=30, max_connections=2, batching=False))
    with running(app) as addr:
        import threading

        from isan.engine.serve.connections import SATURATED_GRACE_S

        results = []

        def client():
            results.append(httpx.post(f"http://{addr}/v1/score", json={"text": "the cat"}, timeout=30).status_code)

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(SATURATED_GRACE_S + 0.5)
        r = httpx.post(f"http://{addr}/v1/score", json={"text": "the cat"}, timeout=10)
        assert r.status_code == 503 and "--max-connections" in r.json()["error"]
        eng.gate.set()
        for t in threads:
            t.join(30)
        assert results == [200, 200]


# ---- (f) malformed HTTP -------------------------------------------------------------------------
@pytest.mark.parametrize("data", [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n",
                                  b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                                  b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"])  # TLS to the plain-HTTP port
def test_malformed_http_gets_the_json_error_shape(big, data):
    _, addr, _, _ = big
    status, headers, body = split_response(raw_http(addr, data))
    err = assert_error_shape(status, headers, body, 400)
    assert "HTTP" in err["error"]
    assert httpx.get(f"http://{addr}/healthz").status_code == 200


@pytest.mark.parametrize("extra", [b"", b"Sec-WebSocket-Key: abc\r\nSec-WebSocket-Version: 13\r\n",
                                   b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n"])
def test_a_refused_websocket_handshake_gets_the_json_error_shape(big, extra):
    _, addr, _, _ = big
    data = b"GET /v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" + extra + b"\r\n"
    status, headers, body = split_response(raw_http(addr, data))
    assert status in (400, 426), body
    err = assert_error_shape(status, headers, body, status)
    assert "WebSocket" in err["error"] and "Sec-WebSocket" in err["error"], err
    with connect(f"ws://{addr}/v1/stream") as ws:  # a real client still connects
        ws.send(json.dumps({"text": "the cat"}))
        assert json.loads(ws.recv(timeout=30))["chars"] == 7


# ---- (g) the schema says what the server does -----------------------------------------------------
def _request_schema(url: str, path: str) -> dict:
    schema = httpx.get(url + "/openapi.json").json()
    return schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


@pytest.mark.parametrize("path, body, status", [
    ("/v1/score", {"text": "abc", "state": "0"}, 400),
    ("/v1/score", {"text": "abc", "state": "AAAA"}, 400),
    ("/v1/next", {"state": "Zm9v"}, 400),
    ("/v1/score", {"text": "abc", "unknown": "replace"}, 400),
    ("/v1/score", {"text": "abc", "unknown": "replace", "replacement": None}, 400),
    ("/v1/score/batch", {"texts": ["abc"], "unknown": "replace"}, 400),
    ("/v1/next", {"text": "abc", "unknown": "replace"}, 400),
    ("/v1/attribute", {"text": "abc", "unknown": "replace"}, 400),
    ("/v1/score", {"text": "Hello", "normalize": "none"}, 422),
    ("/v1/score", {"text": "hello!", "normalize": "none-v1", "unknown": "error"}, 422),
    ("/v1/score/batch", {"texts": ["ok", "Not ok"], "normalize": "none"}, 422),
    ("/v1/next", {"text": "7", "normalize": "none"}, 422),
    ("/v1/sample", {"prompt": "The", "normalize": "none", "n": 2}, 422),
    ("/v1/attribute", {"text": "a.b", "normalize": "none"}, 422),
    ("/v1/sample", {"prompt": "the", "temperature": 1.0, "inverse_temperature": 1.0, "n": 2}, 400),
])
def test_what_the_schema_refuses_the_server_refuses(big, path, body, status):
    """Requests the server refuses are invalid per /openapi.json (so a schema-valid request is never
    a 400, and schemathesis's positive and negative checks agree with the server)."""
    import jsonschema

    url, _, _, _ = big
    schema = _request_schema(url, path)
    assert not jsonschema.Draft202012Validator(schema).is_valid(body), body
    r = post(url, path, body)
    assert r.status_code == status, r.text


@pytest.mark.parametrize("path, body", [
    ("/v1/score", {"text": "Hello, World!"}),
    ("/v1/score", {"text": "Hello", "normalize": "none", "unknown": "skip"}),
    ("/v1/score", {"text": "Hello", "normalize": "none", "unknown": "replace", "replacement": "x"}),
    ("/v1/score", {"text": "hello world", "normalize": "none"}),
    ("/v1/score", {"text": "abc", "unknown": "skip"}),
    ("/v1/score/batch", {"texts": ["the", "cat"], "normalize": "none"}),
    ("/v1/next", {"normalize": "none"}),
    ("/v1/sample", {"prompt": "", "normalize": "none", "n": 2, "stream": False}),
    ("/v1/sample", {"prompt": "the", "temperature": 1.0, "inverse_temperature": None, "n": 2, "stream": False}),
    ("/v1/attribute", {"text": "a b", "normalize": "none"}),
])
def test_what_the_schema_accepts_the_server_accepts(big, path, body):
    import jsonschema

    url, _, _, _ = big
    jsonschema.Draft202012Validator(_request_schema(url, path)).validate(body)
    r = post(url, path, body)
    assert r.status_code == 200, r.text


def test_a_snapshot_token_matches_the_schema(big, small):
    import jsonschema

    url, _, _, _ = big
    schema = _request_schema(url, "/v1/score")
    v = jsonschema.Draft202012Validator(schema)
    for u in (url, small[0]):
        token = post(u, "/v1/score", {"text": "the cat", "return_state": True}).json()["state"]
        assert v.is_valid({"text": "abc", "state": token})


def test_text_that_normalises_to_nothing_is_422(big):
    """A schema-valid text the model cannot score (nothing left after normalisation) is 422, like
    characters outside the alphabet; 400 is kept for requests that break the schema."""
    url, _, _, _ = big
    r = post(url, "/v1/score", {"text": "ABC", "normalize": "none", "unknown": "skip"})
    assert r.status_code == 422 and "empty" in r.json()["error"]
    r = post(url, "/v1/score/batch", {"texts": ["ok", "\ufeff"]})
    assert r.status_code == 422 and r.json()["index"] == 1


# ---- (h) /docs renders its markdown ---------------------------------------------------------------
def test_docs_render_markdown_without_a_cdn(big):
    url, _, _, _ = big
    page = httpx.get(url + "/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "**" not in html and "`" not in html, [html[max(0, i - 60): i + 60] for i in (html.find("**"), html.find("`"))]
    assert "<strong>WebSocket <code>/v1/stream</code></strong>" in html
    assert "<code>POST /v1/score</code>" in html and "<p>" in html
    assert "<script" not in html and "http://" not in html and "https://" not in html and "//cdn" not in html
    assert " src=" not in html and "@import" not in html


def test_markdown_renderer_escapes_html():
    from isan.engine.serve.docs import markdown

    out = markdown("a <b>x</b> `<i>` **bold** and *em*\n\n- one\n- two `2`\n\nlast & [link](javascript:alert(1))")
    assert "<b>" not in out and "&lt;b&gt;" in out and "<code>&lt;i&gt;</code>" in out
    assert "<strong>bold</strong>" in out and "<em>em</em>" in out and "<ul><li>one</li><li>two <code>2</code></li></ul>" in out
    assert "javascript:" not in out or "href" not in out


# ---- (i) nnl ---------------------------------------------------------------------------------------
def _nnl(bits: float, chars: int, V: int):
    return bits / chars / math.log2(V) if chars else None


def test_answers_have_nnl_as_isan_score_json(big, text8_valid_head):
    """nnl (mean negative log-likelihood in base V) is in every answer that has bits, as in
    `isan score --json`; answers with running totals have total_nnl."""
    url, addr, eng, _ = big
    text = text8_valid_head[:2000]
    lib = eng.score(text).to_json()
    V = len(eng.alphabet)
    body = post(url, "/v1/score", {"text": text, "return_state": True}).json()
    # the server's float32 bits and the library's: twice the derived tolerance, divided as nnl divides the bits
    nnl_tol = engine_float32_tolerance(eng, text).twice().total_bits / len(text) / math.log2(V)
    assert abs(body["nnl"] - lib["nnl"]) <= nnl_tol
    assert abs(body["total_nnl"] - lib["nnl"]) <= nnl_tol
    cont = post(url, "/v1/score", {"text": "the cat", "state": body["state"]}).json()
    assert cont["nnl"] == pytest.approx(_nnl(cont["bits"], 7, V), rel=1e-9)
    assert cont["total_nnl"] == pytest.approx(_nnl(cont["total_bits"], 2007, V), rel=1e-9)
    batch = post(url, "/v1/score/batch", {"texts": [text[:500], text[500:]]}).json()
    assert batch["nnl"] == pytest.approx(_nnl(batch["bits"], batch["chars"], V), rel=1e-9)
    for res in batch["results"]:
        assert res["nnl"] == pytest.approx(_nnl(res["bits"], res["chars"], V), rel=1e-9)
    nxt = post(url, "/v1/next", {"text": "the cat"}).json()
    assert nxt["nnl"] == pytest.approx(_nnl(nxt["bits"], 7, V), rel=1e-9) and nxt["total_nnl"] == nxt["nnl"]
    assert post(url, "/v1/next", {}).json()["nnl"] is None
    with connect(f"ws://{addr}/v1/stream") as ws:
        ws.send(json.dumps({"text": text[:1000]}))
        a = json.loads(ws.recv(timeout=30))
        ws.send(json.dumps({"text": text[1000:]}))
        b = json.loads(ws.recv(timeout=30))
        ws.send(json.dumps({"reset": True}))
        c = json.loads(ws.recv(timeout=30))
    assert a["nnl"] == pytest.approx(_nnl(a["bits"], 1000, V), rel=1e-9)
    assert abs(b["total_nnl"] - lib["nnl"]) <= nnl_tol
    assert c["total_nnl"] is None
    schema = httpx.get(url + "/openapi.json").json()["components"]["schemas"]
    for name, fields in (("ScoreResponse", ("nnl", "total_nnl")), ("BatchResponse", ("nnl",)),
                         ("NextResponse", ("nnl", "total_nnl"))):
        assert set(fields) <= set(schema[name]["properties"]), name
    assert np.isfinite(body["nnl"])


# ---- (issue 34) the Host check against DNS rebinding --------------------------------------------
def _ws_handshake(addr: str, host: str, origin: str) -> bytes:
    """A browser's WebSocket handshake to /v1/stream, sent raw (a client library sets Host itself)."""
    return raw_http(addr, (f"GET /v1/stream HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode(), wait=5)


def test_dns_rebinding_is_refused(small_bundle):
    """A web page that points its own name at 127.0.0.1 is the server's own origin, but its requests
    carry its name in Host: they are refused with 403 in the API's JSON error shape (OpenAI's on its
    paths), a stream with an error frame and close code 1008. Loopback names and addresses pass, and
    names given with --allow-host (issue 34: Host and Origin evil.example:PORT were served)."""
    app = create_app(Engine.load(small_bundle), config=ServeConfig(allow_hosts=("App.Example.com",)))
    with running(app) as addr:
        port = addr.split(":")[1]
        body = b'{"text": "the cat"}'

        def ask(host: str, path: str = "/v1/score", method: str = "POST"):
            head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            if method == "POST":
                head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            return split_response(raw_http(addr, head.encode() + b"\r\n" + (body if method == "POST" else b"")))

        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LocalHost", f"[::1]:{port}", "127.0.0.2",
                     f"app.example.com:{port}"):
            status, _, answer = ask(host)
            assert status == 200 and json.loads(answer)["chars"] == 7, (host, answer)
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", "localhost.evil.example",
                     f"10.0.0.1:{port}"):
            for path, method in (("/v1/score", "POST"), ("/healthz", "GET"), ("/", "GET")):
                err = assert_error_shape(*ask(host, path, method), 403)
                assert "Host" in err["error"] and "localhost" in err["error"], (host, err)
            status, _, answer = ask(host, "/v1/completions")
            assert status == 403 and json.loads(answer)["error"]["code"] == 403, answer
        assert "--allow-host evil.example" in assert_error_shape(*ask(f"evil.example:{port}"), 403)["error"]
        raw = _ws_handshake(addr, f"evil.example:{port}", f"http://evil.example:{port}")
        assert raw.startswith(b"HTTP/1.1 101") and b'"status":403' in raw and b"--allow-host evil.example" in raw, raw
        assert b"\x88\x02\x03\xf0" in raw  # the close frame: code 1008
        assert b'"status":403' not in _ws_handshake(addr, f"localhost:{port}", f"http://localhost:{port}")
        assert 'isan_rejected_total{reason="host"}' in httpx.get(f"http://{addr}/metrics").text


@pytest.mark.parametrize("host, local, allowed, refused", [
    ("127.0.0.1:8000", "127.0.0.1", (), False),
    ("[::1]", "::1", (), False),
    ("[::ffff:127.0.0.1]:80", "127.0.0.1", (), False),
    ("evil.example:8000", "127.0.0.1", (), True),
    ("10.0.0.5:8000", "127.0.0.1", (), True),  # an address that is not loopback, on a loopback server
    ("10.0.0.5:8000", "10.0.0.5", (), False),  # bound to 0.0.0.0 or 10.0.0.5: addresses pass, no DNS in them
    ("192.168.1.9", "10.0.0.5", (), False),  # behind NAT or a container's port mapping
    ("myhost.lan:8000", "10.0.0.5", (), True),  # a name: only with --allow-host
    ("MyHost.lan:8000", "10.0.0.5", ("myhost.lan",), False),
    ("evil.example", "127.0.0.1", ("*",), False),
    (None, "127.0.0.1", (), False),  # no Host (HTTP/1.0): not a browser
    ("evil.example", "testserver", (), False),  # an in-process client (Starlette's TestClient): no socket
])
def test_host_rules(host, local, allowed, refused):
    from isan.engine.serve.access import host_refused

    scope = {"type": "http", "server": (local, 8000), "headers": [] if host is None else [(b"host", host.encode())]}
    assert (host_refused(scope, allowed) is not None) == refused


def test_allow_host_option(monkeypatch):
    """isan-serve --allow-host NAME (repeatable) reaches the server's config, and so does the --host
    name when it is a name; a value that is not a host name is a clean error."""
    import uvicorn
    from click.testing import CliRunner

    from isan.engine.serve.cli import main

    seen = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **kw: seen.append(self.config.app.service.config))
    res = CliRunner().invoke(main, ["--host", "myhost.lan", "--allow-host", "a.example", "--allow-host", "*"])
    assert res.exit_code == 0, res.output
    assert seen[-1].allow_hosts == ("a.example", "*", "myhost.lan")
    assert CliRunner().invoke(main, ["--host", "0.0.0.0"]).exit_code == 0 and seen[-1].allow_hosts == ()
    res = CliRunner().invoke(main, ["--allow-host", "not a name"])
    assert res.exit_code != 0 and "--allow-host 'not a name'" in res.output and "Traceback" not in res.output
