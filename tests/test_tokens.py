"""Token alphabets in the engine (issue "Beyond 27 characters"): byte, pair and word bundles score,
attribute and serve like a plain loop over their tokens; their tables key tokens; old bundles load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import DATA, random_params
from tolerances import isan_float32_tolerance
from isan.alphabet import Alphabet
from isan.engine import Engine
from isan.engine.bundle import read_manifest, write_bundle
from isan.errors import AlphabetError
from isan.tokens import ByteAlphabet, PairAlphabet, WordAlphabet, alphabet_from_json, alphabet_to_json

TEXT = "Héllo wörld, the end of the line — and the next\n"  # multi-byte characters and a newline


def plain_bits(params, alphabet, text: str) -> np.ndarray:
    """The obvious loop: output ids y_t, inputs input_map[y_t], float64, bits of y_t before reading it."""
    p = params.astype(np.float64)
    y = alphabet.encode(text)
    x = y if alphabet.input_map is None else alphabet.input_map[y]
    h, out = p.h0.copy(), []
    for yt, xt in zip(y, x):
        logits = p.W_ro @ h + p.b_ro
        m = logits.max()
        out.append(-(logits[yt] - m - np.log(np.exp(logits - m).sum())) / np.log(2))
        h = p.W[xt] @ h + p.b[xt]
    return np.array(out)


def f32_tol(params, alphabet, text: str):
    """The float32 tolerance derived from the computation (tests/tolerances.py) of scoring ``text``: outputs
    y_t, inputs input_map[y_t], from h0."""
    p = params.astype(np.float64)
    y = alphabet.encode(text)
    x = y if alphabet.input_map is None else alphabet.input_map[y]
    return isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, y, samples=4, inputs=x)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """A text file to mine tables from: Tiny Shakespeare's head when present, else a repeated sentence."""
    src = DATA / "tinyshakespeare" / "input.txt"
    text = src.read_text(encoding="utf-8")[:60_000] if src.exists() else (TEXT * 2000)
    f = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    f.write_text(text + TEXT * 200, encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def byte_alphabet(corpus_file):
    return ByteAlphabet.from_data(corpus_file.read_text(encoding="utf-8"), K=12)


@pytest.fixture(scope="module")
def byte_params(byte_alphabet):
    return random_params(K=byte_alphabet.K, V=256, d=8, seed=3)


@pytest.fixture(scope="module")
def byte_bundle(tmp_path_factory, byte_params, byte_alphabet, corpus_file):
    from isan.export.tables import make_table

    out = tmp_path_factory.mktemp("tok") / "bytes"

    def hook(tmp, manifest):
        make_table(tmp, manifest, byte_params, byte_alphabet, str(corpus_file), "text", budget="4MB", max_len=12,
                   progress_bar=False)

    write_bundle(out, byte_params.as_dict(), byte_alphabet, kind="isan", hook=hook)
    return out


def test_alphabets_round_trip_and_json():
    b = ByteAlphabet.from_data("aab c", K=3)
    assert b.K == 3 and len(b) == 256 and b.input_map[ord("a")] == 0 and b.input_map[ord("z")] == 2
    ids, offs = b.tokenize("aé")
    assert ids.tolist() == [97, 0xC3, 0xA9] and offs.tolist() == [0, 1, 1] and b.decode(ids) == "aé"
    p = PairAlphabet(Alphabet.text8())
    assert p.K == len(p) == 729 and p.decode(p.encode("the cat")) == "the cat "  # odd: padded with a space
    w = WordAlphabet(("boy", "sees", "dog", "."), unk=".")
    assert w.encode("boy  sees\tdog .").tolist() == [0, 1, 2, 3] and w.decode([2, 1, 0]) == "dog sees boy"
    with pytest.raises(AlphabetError, match="'cat' at offset 4"):
        w.encode("boy cat")
    assert w.encode("boy cat", unknown="skip").tolist() == [0] and w.encode("boy cat", unknown="replace").tolist() == [0, 3]
    for a in (b, p, w, Alphabet.text8()):
        assert alphabet_from_json(json.loads(json.dumps(alphabet_to_json(a)))) == a
    with pytest.raises(AlphabetError):
        alphabet_from_json({"kind": "bytes", "frequent": [1, 1]})


def test_byte_bundle_manifest_and_every_path_equal_the_plain_loop(byte_bundle, byte_params, byte_alphabet):
    m = read_manifest(byte_bundle)
    assert m["format_version"] == 3 and m["unit"] == "byte" and m["alphabet"]["kind"] == "bytes"
    assert m["table"]["entries"] > 256  # the single bytes plus mined multi-byte entries
    ref = plain_bits(byte_params, byte_alphabet, TEXT)
    eng = Engine.load(byte_bundle)
    assert eng.table is not None and eng.params.K == 256  # (W, b) read by output id
    tol = f32_tol(byte_params, byte_alphabet, TEXT)
    for path in ("reference", "composed", "chunked"):
        r = eng.score(TEXT, per_char=True, path=path)
        assert r.chars == len(TEXT.encode("utf-8")) and r.text_chars == len(TEXT)
        np.testing.assert_allclose(r.per_char_bits, ref, rtol=0, atol=tol.bits, err_msg=path)
    long = TEXT * 400  # past the chunk-parallel threshold: cut into chunks, equal to one pass
    r = eng.score(long)
    assert r.scoring["path"] == "chunked"
    # the tolerance on 20 repeats carried to 400 (a contraction: each byte's error depends on its recent past)
    tol = f32_tol(byte_params, byte_alphabet, TEXT * 20).for_chars(len(long.encode()))
    assert abs(r.bits - eng.score(long, path="reference").bits) <= tol.total_bits
    j = r.to_json()
    assert j["unit"] == "byte" and j["tokens"] == len(long.encode()) and j["chars"] == len(long)
    assert j["bits_per_token"] == pytest.approx(r.bits / j["tokens"]) and j["bpc"] == pytest.approx(r.bits / len(long))
    assert j["nnl"] == pytest.approx(j["bits_per_token"] / 8.0)  # base |A| = 256 outputs


def test_byte_streaming_and_batch_equal_whole(byte_bundle, byte_params, byte_alphabet):
    eng = Engine.load(byte_bundle)
    whole = eng.score(TEXT).bits
    tol = f32_tol(byte_params, byte_alphabet, TEXT).twice().total_bits  # two float32 computations
    st = None
    for i in range(0, len(TEXT), 7):
        st = eng.score(TEXT[i : i + 7], state=st).state
    assert abs(st.bits - whole) <= tol
    res = eng.score_batch([TEXT, TEXT[:20]])
    assert abs(res[0].bits - whole) <= tol and res[1].chars == len(TEXT[:20].encode())


def test_byte_attribution_sums_and_sources(byte_bundle):
    eng = Engine.load(byte_bundle)
    a = eng.attribute("the wörld", by="char")
    assert a.kappa.shape[0] == len("the wörld".encode()) and a.max_abs_error < 1e-6
    np.testing.assert_allclose(a.b_ro + a.kappa.sum(axis=1), a.logits, atol=1e-8)
    w = eng.attribute("the wörld", by="word")
    assert w.sources == ["<h0>", "the", " ", "wörld"]
    np.testing.assert_allclose(w.b_ro + w.kappa.sum(axis=1), w.logits, atol=1e-8)
    out = w.to_json()
    assert len(out["targets"]) == len("the wörld".encode())


def test_byte_sampling_is_reproducible_text(byte_bundle):
    eng = Engine.load(byte_bundle)
    s1, s2 = eng.sample("the ", n=30, seed=5), eng.sample("the ", n=30, seed=5)
    assert s1.text == s2.text and isinstance(s1.text, str) and np.isfinite(s1.bits)


def test_pair_bundle_scores_pairs(tmp_path):
    pa = PairAlphabet(Alphabet.text8())
    params = random_params(K=729, V=729, d=6, seed=4)
    out = tmp_path / "pairs"
    write_bundle(out, params.as_dict(), pa, kind="isan", normalizer="text8")
    eng = Engine.load(out)
    text = "The cat, sat."  # normalised by text8 to "the cat sat " (12 characters, 6 pairs)
    r = eng.score(text, per_char=True, path="reference")
    assert r.chars == 6 and r.text == "the cat sat " and r.normalization["unit"] == "pair"
    np.testing.assert_allclose(r.per_char_bits, plain_bits(params, pa, "the cat sat "), atol=1e-8)
    assert abs(eng.score(text, path="chunked").bits - r.bits) <= f32_tol(params, pa, "the cat sat ").total_bits
    with pytest.raises(AlphabetError):
        Engine.load(out).score("caf\u00e9", normalize="none")


def test_word_bundle_errors_name_the_word(tmp_path):
    wa = WordAlphabet(("boy", "boys", "sees", "see", "dog", "."))
    params = random_params(K=6, V=6, d=5, seed=5)
    write_bundle(tmp_path / "w", params.as_dict(), wa, kind="isan")
    eng = Engine.load(tmp_path / "w")
    r = eng.score("boy sees dog .", per_char=True)
    assert r.chars == 4 and r.per_char_offsets.tolist() == [0, 4, 9, 13]
    np.testing.assert_allclose(r.per_char_bits, plain_bits(params, wa, "boy sees dog ."), rtol=0,
                               atol=f32_tol(params, wa, "boy sees dog .").bits)
    assert r.to_json()["nnl"] == pytest.approx(r.bits / 4 / np.log2(6))
    with pytest.raises(AlphabetError, match="'cats' at offset 4"):
        eng.score("boy cats .")
    assert eng.score("boy cats .", unknown="skip").chars == 2
    a = eng.attribute("boy sees dog", by="word")
    assert a.sources == ["<h0>", "boy", "sees", "dog"]


def test_cli_scores_and_attributes_a_byte_bundle(byte_bundle):
    from click.testing import CliRunner

    from isan.cli import main

    run = CliRunner().invoke(main, ["score", "--model", str(byte_bundle), "--json", "-"], input=TEXT)
    assert run.exit_code == 0, run.output
    out = json.loads(run.output)
    assert out["unit"] == "byte" and out["tokens"] == len(TEXT.encode()) and out["chars"] == len(TEXT)
    run = CliRunner().invoke(main, ["attribute", "--model", str(byte_bundle), "--text", "the wörld", "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.output)["sources"][-1] == "wörld"


def test_server_scores_a_byte_bundle(byte_bundle, byte_params, byte_alphabet):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from isan.engine.serve import ServeConfig, create_app
    from server_helpers import running

    eng = Engine.load(byte_bundle)
    with running(create_app(eng, config=ServeConfig(state_secret=b"k" * 32))) as addr:
        r = httpx.post(f"http://{addr}/v1/score", json={"text": TEXT, "top_k": 3}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert abs(body["bits"] - eng.score(TEXT).bits) <= f32_tol(byte_params, byte_alphabet, TEXT).twice().total_bits
        r = httpx.post(f"http://{addr}/v1/attribute", json={"text": "the wörld", "by": "word"}, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.post(f"http://{addr}/v1/sample", json={"prompt": "the ", "n": 20, "seed": 3, "stream": False},
                       timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["text"] == eng.sample("the ", n=20, seed=3).text  # 20 bytes, decoded
        # the OpenAI-compatible API on a byte model: tokens are bytes, offsets point into the prompt
        prompt = "the wörld"
        r = httpx.post(f"http://{addr}/v1/completions", json={"prompt": prompt, "max_tokens": 0, "echo": True,
                                                               "logprobs": 2}, timeout=30)
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == len(prompt.encode()) == len(lp["token_logprobs"])
        bits = -sum(lp["token_logprobs"]) / np.log(2)
        assert abs(bits - eng.score(prompt).bits) <= f32_tol(byte_params, byte_alphabet, prompt).twice().total_bits
        assert all(0 <= o < len(prompt) for o in lp["text_offset"])
        r = httpx.post(f"http://{addr}/v1/completions", json={"prompt": "the ", "max_tokens": 8, "seed": 1,
                                                               "logprobs": 1}, timeout=30)
        assert r.status_code == 200, r.text


def test_onnx_backend_on_a_byte_bundle_equals_numpy(byte_bundle, byte_params, byte_alphabet, tmp_path):
    pytest.importorskip("onnxruntime")
    import shutil

    from isan.engine import load_engine
    from isan.export.onnx_export import export_bundle_onnx

    b = tmp_path / "bytes"
    shutil.copytree(byte_bundle, b)
    export_bundle_onnx(b)
    eng = Engine.load(b)
    onx = load_engine(b, runtime="onnx")
    r = onx.score(TEXT, per_char=True)
    assert r.chars == len(TEXT.encode()) and r.unit == "byte"
    np.testing.assert_allclose(r.per_char_bits, eng.score(TEXT, per_char=True).per_char_bits, rtol=0,
                               atol=f32_tol(byte_params, byte_alphabet, TEXT).twice().bits)  # both float32


def test_byte_lstm_bundle_reads_inputs_through_the_map(tmp_path, byte_alphabet):
    """A baseline on a byte alphabet: E has K rows; the numpy runner reads output ids through input_map."""
    from isan.engine import load_engine
    from isan.engine.baselines.recurrent import baseline_shapes

    K, V, d = byte_alphabet.K, 256, 6
    config = {"kind": "gru", "K": K, "V": V, "d": d, "input": "onehot"}
    rng = np.random.default_rng(0)
    tensors = {n: (rng.normal(size=s) * 0.3).astype(np.float32) for n, s in baseline_shapes(config).items()}
    write_bundle(tmp_path / "gru", tensors, byte_alphabet, kind="gru", extra={"model": config, "d": d})
    eng = load_engine(tmp_path / "gru")
    r = eng.score("the wörld", per_char=True)
    assert r.chars == len("the wörld".encode()) and r.to_json()["unit"] == "byte"
    # the plain loop: the input term of byte y is row input_map[y] of the K-row input table
    from isan.engine.baselines.recurrent import BaselineParams, baseline_step_ref
    from isan.engine.reference import log_softmax

    p = BaselineParams.from_tensors(config, tensors)
    s, bits = p.initial_state(), []
    for y in byte_alphabet.encode("the wörld"):
        bits.append(-log_softmax(p.readout(s))[y] / np.log(2))
        s = baseline_step_ref(p, s, p.input_table()[byte_alphabet.input_map[y]])
    np.testing.assert_allclose(r.per_char_bits, bits, atol=1e-10)


def test_word_spans_of_a_word_model_are_its_words():
    """Attribution by word on a word model: every symbol (a word) is its own source (the lens
    reviewer found them lumped into one run of non-space symbols)."""
    from isan.engine.prepare import word_spans
    from isan.tokens import WordAlphabet

    al = WordAlphabet(("the", "cat", "sat"))
    ids = al.encode("the cat sat the")
    assert word_spans(ids, "", al) == [(k, k + 1) for k in range(len(ids))]
