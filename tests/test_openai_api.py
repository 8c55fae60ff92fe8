"""The OpenAI-compatible API of isan-serve (POST /v1/completions, GET /v1/models, the tokenizer
endpoints), end to end on a running server: scores against the library (`isan score`), the
response's shape as vLLM and llama.cpp give it, generation, streaming, errors in OpenAI's shape;
then the real `openai` client (dev extra; skipped without it). lm-evaluation-harness is in
tests/test_evalharness.py. Also the WebSocket Origin check of /v1/stream."""

import json
import math

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from isan.engine.serve.completions import EOT  # noqa: E402
from isan.engine.paths import DEFAULT_MODEL  # noqa: E402
from server_helpers import running  # noqa: E402
from tolerances import U64, engine_float32_tolerance, float64_sums_tolerance, next_char_tolerance  # noqa: E402

LN2 = math.log(2)
NAME = DEFAULT_MODEL  # the served name: the default bundle's directory name


@pytest.fixture(scope="module")
def server(default_engine):
    app = create_app(default_engine, config=ServeConfig(max_chars=200_000, max_sample_chars=500))
    with running(app) as addr:
        with httpx.Client(base_url=f"http://{addr}", timeout=60) as c:
            yield c, default_engine, addr


def complete(c, **body):
    r = c.post("/v1/completions", json={"model": NAME, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_models_and_tokenizer(server):
    c, eng, _ = server
    models = c.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [NAME]
    info = c.get("/tokenizer_info").json()
    V = len(eng.alphabet)
    assert info["eos_token"] == info["bos_token"] == EOT and info["vocab_size"] == V + 1
    tok = c.post("/tokenize", json={"prompt": "The Cat" + EOT + "x"}).json()
    assert tok["tokens"] == [int(i) for i in eng.prepare("The Cat").ids] + [V, int(eng.encode("x")[0])]
    assert c.post("/tokenize", json={"prompt": EOT}).json()["tokens"] == [V]  # lm-eval's eos_token_id
    assert c.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"] == "the cat" + EOT + "x"


def test_echo_scores_equal_the_library(server, text8_valid_head):
    """max_tokens 0 with echo: token_logprobs are -bits ln 2 of /v1/score, per character."""
    c, eng, _ = server
    text = text8_valid_head[:5000]
    out = complete(c, prompt=text, max_tokens=0, echo=True, logprobs=0)
    ch = out["choices"][0]
    lp = ch["logprobs"]
    ref = eng.score(text, per_char=True)
    assert ch["text"] == text and ch["finish_reason"] == "length"
    assert lp["tokens"] == list(text)
    got = np.array(lp["token_logprobs"])
    tol = engine_float32_tolerance(eng, text).twice()  # the server's batch vs the library: two float32
    np.testing.assert_allclose(got, -ref.per_char_bits * LN2, rtol=0, atol=tol.bits * LN2)
    summed = float64_sums_tolerance(len(got), ref.bits * LN2)  # the sum here, in float64
    assert abs(got.sum() + ref.bits * LN2) <= tol.total_bits * LN2 + summed
    assert lp["text_offset"] == list(range(len(text)))
    assert all(d == {t: v} for d, t, v in zip(lp["top_logprobs"], lp["tokens"], lp["token_logprobs"]))
    assert out["usage"] == {"prompt_tokens": len(text), "completion_tokens": 0, "total_tokens": len(text)}


def test_normaliser_shows_in_text_offset(server):
    c, eng, _ = server
    text = "The  Cat, sat!"
    lp = complete(c, prompt=text, max_tokens=0, echo=True, logprobs=1)["choices"][0]["logprobs"]
    ref = eng.score(text, per_char=True)
    assert "".join(lp["tokens"]) == ref.text == "the cat sat "
    assert lp["text_offset"] == ref.per_char_offsets.tolist() == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13]
    tol = engine_float32_tolerance(eng, text).twice()  # the server's batch vs the library: two float32
    summed = float64_sums_tolerance(len(lp["token_logprobs"]), ref.bits * LN2)
    assert abs(sum(lp["token_logprobs"]) + ref.bits * LN2) <= tol.total_bits * LN2 + summed


def test_top_logprobs(server):
    """logprobs = n: the n most likely symbols, best first, plus the token itself with its
    token_logprobs value (so is_greedy is exact); logprobs = V is the whole distribution."""
    c, eng, _ = server
    V = len(eng.alphabet)
    lp = complete(c, prompt="the cat sat on the", max_tokens=0, echo=True, logprobs=V)["choices"][0]["logprobs"]
    st = eng.initial_state()
    # the distribution is the float64 reference's but for the token's own entry, the scoring kernel's float32
    # value: they sum to 1 within that entry's float32 error and the float64 rounding (tests/tolerances.py)
    tol = engine_float32_tolerance(eng, "the cat sat on the")
    own = (tol.bits + tol.in_precision(U64).bits) * LN2
    for tok, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == V and top[tok] == v
        assert abs(math.log(sum(math.exp(x) for x in top.values()))) <= own + float64_sums_tolerance(V, 1.0)
        best = eng.top_k(st, 3)
        assert list(top)[:3] == [b["symbol"] for b in best]
        next_bits, _ = next_char_tolerance(eng, st.h, tol.state)  # the library's float32 state vs float64
        np.testing.assert_allclose([top[b["symbol"]] for b in best], [math.log(b["prob"]) for b in best], rtol=0,
                                   atol=next_bits * LN2 + own)
        st = eng.advance(tok, st, normalize="none")
    two = complete(c, prompt="the cat", max_tokens=0, echo=True, logprobs=2)["choices"][0]["logprobs"]
    assert all(2 <= len(d) <= 3 for d in two["top_logprobs"])


def test_token_prompt_with_endoftext(server):
    """lm-evaluation-harness's rolling form: <|endoftext|> first (the initial state, null), then the text."""
    c, eng, _ = server
    V = len(eng.alphabet)
    ids = [int(i) for i in eng.encode("the quick brown fox")]
    ch = complete(c, prompt=[V] + ids, max_tokens=1, echo=True, logprobs=1, temperature=0)["choices"][0]
    lp = ch["logprobs"]
    assert lp["tokens"][0] == EOT and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == len(ids) + 2  # the prompt, and the one generated token
    ref = eng.score("the quick brown fox")
    tol = engine_float32_tolerance(eng, "the quick brown fox").twice()  # the server's batch vs the library
    assert abs(sum(lp["token_logprobs"][1:-1]) + ref.bits * LN2) <= tol.total_bits * LN2 + float64_sums_tolerance(
        len(ids), ref.bits * LN2)
    assert ch["text"].startswith(EOT + "the quick brown fox") and len(ch["text"]) == len(EOT) + len(ids) + 1
    assert lp["text_offset"][:3] == [0, len(EOT), len(EOT) + 1]
    greedy = eng.top_k(ref.state, 1)[0]["symbol"]
    assert lp["tokens"][-1] == greedy and max(lp["top_logprobs"][-1].values()) == lp["token_logprobs"][-1]
    # a batch of token prompts (lm-eval with batch_size > 1) and string prompts
    out = complete(c, prompt=[ids[:5], [V] + ids], max_tokens=0, echo=True, logprobs=0)
    assert [ch["index"] for ch in out["choices"]] == [0, 1]
    assert out["usage"]["prompt_tokens"] == 5 + len(ids) + 1


def test_generation(server):
    c, eng, _ = server
    greedy = complete(c, prompt="the united states of", max_tokens=40, temperature=0)["choices"][0]
    assert greedy["text"] == eng.sample("the united states of", n=40, top_k=1, seed=0).text
    a = complete(c, prompt=["the cat", "a dog"], max_tokens=30, n=2, seed=7, logprobs=1)
    b = complete(c, prompt=["the cat", "a dog"], max_tokens=30, n=2, seed=7, logprobs=1)
    assert [ch["text"] for ch in a["choices"]] == [ch["text"] for ch in b["choices"]]
    assert [ch["index"] for ch in a["choices"]] == [0, 1, 2, 3] and a["usage"]["completion_tokens"] == 120
    ch = a["choices"][1]  # "the cat", seed 8: its logprobs are the unscaled model's on its text
    assert ch["text"] == eng.sample("the cat", n=30, seed=8).text
    full = eng.score("the cat" + ch["text"], per_char=True)
    tol = engine_float32_tolerance(eng, "the cat" + ch["text"]).twice()  # the sampler's float32 and the library's
    np.testing.assert_allclose(ch["logprobs"]["token_logprobs"], -full.per_char_bits[7:] * LN2, rtol=0,
                               atol=tol.bits * LN2)
    assert ch["logprobs"]["text_offset"] == list(range(30))
    stop = complete(c, prompt="the cat", max_tokens=200, seed=3, stop=[" ", "zz"])["choices"][0]
    whole = eng.sample("the cat", n=200, seed=3).text
    assert stop["finish_reason"] == "stop" and stop["stop_reason"] == " " and stop["text"] == whole.split(" ")[0]
    nucleus = complete(c, prompt="the cat", max_tokens=50, seed=1, top_p=0.5, temperature=0.8)["choices"][0]
    assert len(nucleus["text"]) == 50


def test_stream(server):
    c, eng, _ = server
    body = {"model": NAME, "prompt": "the cat", "max_tokens": 150, "seed": 5, "echo": True, "logprobs": 1,
            "stop": "qq", "stream": True, "stream_options": {"include_usage": True}}
    with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in r.read().decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 150
    text = "".join(ch["choices"][0]["text"] for ch in chunks[:-1])
    once = complete(c, **{k: v for k, v in body.items() if k not in ("stream", "stream_options", "model")})
    assert text == once["choices"][0]["text"] == "the cat" + eng.sample("the cat", n=150, seed=5).text
    offsets = [o for ch in chunks[:-1] if ch["choices"][0]["logprobs"] for o in ch["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == once["choices"][0]["logprobs"]["text_offset"] == list(range(157))
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_errors_have_openai_shape(server):
    c, eng, _ = server
    V = len(eng.alphabet)

    def err(r, status):
        assert r.status_code == status, r.text
        e = r.json()["error"]
        assert set(e) == {"message", "type", "param", "code"} and e["code"] == status and e["message"]
        return e

    assert NAME in err(c.post("/v1/completions", json={"model": "gpt-4", "prompt": "x"}), 404)["message"]
    assert err(c.post("/v1/completions", json={"prompt": [1, V, 2]}), 422)["param"] == "prompt"
    assert err(c.post("/v1/completions", json={"prompt": [V + 1]}), 400)["param"] == "prompt"
    err(c.post("/v1/completions", json={"prompt": "x", "logprobs": V + 1}), 400)
    err(c.post("/v1/completions", json={"prompt": "x", "bogus": 1}), 400)
    err(c.post("/tokenize", json={"prompt": "x", "bogus": True}), 400)
    err(c.get("/v1/completions"), 405)
    err(c.post("/v1/completions", content=b"{", headers={"content-type": "application/json"}), 400)
    assert "max_tokens" in err(c.post("/v1/completions", json={"prompt": "x", "max_tokens": 10**6}), 400)["message"]
    # the OpenAI API's paths this server does not serve: 404 in OpenAI's shape, saying what to use instead
    chat = err(c.post("/v1/chat/completions", json={"model": NAME, "messages": [{"role": "user", "content": "x"}]}),
               404)
    assert "POST /v1/completions" in chat["message"] and "chat" in chat["message"]
    for path in ("/v1/embeddings", f"/v1/models/{NAME}", "/v1/responses"):
        assert "/v1/completions" in err(c.post(path, json={}), 404)["message"]
    other = c.get("/v1/no-such-thing")  # other unknown paths keep the API's own shape
    assert other.status_code == 404 and other.json()["status"] == 404


def test_api_key_in_openai_shape(default_engine):
    app = create_app(default_engine, config=ServeConfig(api_key="secret-key-1"))
    with running(app) as addr:
        r = httpx.post(f"http://{addr}/v1/completions", json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
        r = httpx.get(f"http://{addr}/v1/models", headers={"Authorization": "Bearer secret-key-1"})
        assert r.status_code == 200


# ---- the openai client ------------------------------------------------------------------------
def test_openai_client_scores_like_isan_score(server, text8_valid_head, tmp_path):
    """The `openai` Python client against isan-serve: echo + logprobs scores equal `isan score`."""
    openai = pytest.importorskip("openai")
    from click.testing import CliRunner

    from isan.cli import main as isan_main

    c, eng, addr = server
    client = openai.OpenAI(base_url=f"http://{addr}/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == [NAME]
    text = text8_valid_head[:3000]
    path = tmp_path / "t.txt"
    path.write_text(text)
    res = CliRunner().invoke(isan_main, ["score", "--json", str(path)])
    assert res.exit_code == 0, res.output
    bits = json.loads(res.output)["bits"]
    out = client.completions.create(model=NAME, prompt=text, max_tokens=0, echo=True, logprobs=1)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(text) and lp.text_offset[-1] == len(text) - 1
    tol = engine_float32_tolerance(eng, text).twice()  # the server's batch vs `isan score`: two float32
    assert abs(-sum(lp.token_logprobs) / LN2 - bits) <= tol.total_bits + float64_sums_tolerance(len(text), bits)
    gen = client.completions.create(model=NAME, prompt="the cat", max_tokens=20, temperature=0)
    assert gen.choices[0].text == eng.sample("the cat", n=20, top_k=1, seed=0).text
    stream = client.completions.create(model=NAME, prompt="the cat", max_tokens=40, seed=2, stream=True)
    assert "".join(ch.choices[0].text for ch in stream) == eng.sample("the cat", n=40, seed=2).text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-3.5-turbo-instruct", prompt="x")
    with pytest.raises(openai.NotFoundError, match="POST /v1/completions"):  # the client shows the server's message
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "the cat"}])


# ---- the Origin check of /v1/stream -------------------------------------------------------------
@pytest.mark.parametrize("origin, allowed", [
    (None, True), ("http://127.0.0.1:3000", True), ("http://localhost", True), ("http://[::1]:8080", True),
    ("SELF", True), ("https://evil.example", False), ("null", False), ("http://127.0.0.1.evil.example", False),
    ("https://app.example.com", True),  # allowed by --allow-origin
])
def test_stream_origin(default_engine, origin, allowed):
    from websockets.sync.client import connect

    app = create_app(default_engine, config=ServeConfig(allow_origins=("https://app.example.com",)))
    with running(app) as addr:
        kw = {}
        if origin is not None:
            kw["origin"] = f"http://{addr}" if origin == "SELF" else origin
        with connect(f"ws://{addr}/v1/stream", **kw) as ws:
            if allowed:
                ws.send(json.dumps({"text": "the cat"}))
            ans = json.loads(ws.recv(timeout=10))
            if allowed:
                assert ans["chars"] == 7
            else:
                assert ans["status"] == 403 and "--allow-origin" in ans["error"]
                assert ws.protocol.close_rcvd is None or ws.protocol.close_rcvd.code == 1008
