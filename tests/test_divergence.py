"""No NaN or inf ever: a diverging state is a StateDivergedError naming the offset, on every path
(reference, composed, batched, ONNX, runners, sampling, attribution), exit status 2 in the CLI and
422 from the server; and `isan model check` finds the letters and pairs that diverge."""

import json
import subprocess
import sys

import numpy as np
import pytest

from isan.alphabet import Alphabet
from isan.engine import Engine, State
from isan.engine.baselines.recurrent import RunnerEngine
from isan.engine.bundle import write_bundle
from isan.engine.guard import MAX_STATE_ABS, first_out_of_range
from isan.errors import StateDivergedError
from isan.params import ISANParams

from conftest import UNCONSTRAINED, random_params
from tolerances import isan_float32_tolerance

A8 = Alphabet.text8()
Z = A8.id("z")


def diverging_params(seed=5, zscale=3.0, only_z=False) -> ISANParams:
    """A small stable ISAN whose 'z' matrix has spectral radius 2.7 (like the shipped model's 2.17);
    with ``only_z`` its readout predicts 'z' with probability ~1 whatever the state."""
    p = random_params(d=16, seed=seed).as_dict()
    p["W"] = p["W"].copy()
    p["W"][Z] *= zscale
    if only_z:
        p["W_ro"] = np.zeros_like(p["W_ro"])
        p["b_ro"] = np.zeros_like(p["b_ro"])
        p["b_ro"][Z] = 50.0
    return ISANParams(**p)


DIV = Engine(diverging_params(), A8, manifest={"normalizer": {"name": "text8", "version": 1}})


def expected_offset(engine, text, h=None):
    ids = A8.encode(text)
    p = engine.params
    return first_out_of_range(p.W, p.b, ids, p.h0 if h is None else h)


def test_reference_path_raises_with_the_offset():
    text = "ab" + "z" * 60
    t = expected_offset(DIV, text)
    assert t is not None and 2 < t < 40
    with pytest.raises(StateDivergedError) as e:
        DIV.score(text)
    err = e.value
    assert err.offset == t and err.input_offset == t and "state overflow" in err.cause
    assert isinstance(err, ArithmeticError) and f"offset {t}" in str(err) and "'z'" in str(err)
    assert "isan model check" in str(err)


def test_offsets_are_given_in_the_input_too():
    text = "Hello, " + "Z" * 60        # normalised: "hello " + 'z' * 60 (the comma dropped)
    t = expected_offset(DIV, "hello " + "z" * 60)
    with pytest.raises(StateDivergedError) as e:
        DIV.score(text)
    assert e.value.offset == t and e.value.input_offset == t + 1
    assert f"input offset {t + 1}" in str(e.value)


def test_a_state_that_leaves_the_range_and_comes_back_is_refused():
    # 12 z's push |h| far beyond the range; the spaces after them would shrink it again
    text = "z" * 12 + " " * 100
    assert expected_offset(DIV, text) is not None
    with pytest.raises(StateDivergedError):
        DIV.score(text, normalize="none")


def test_every_entry_point_of_the_numpy_engine():
    text = "the " + "z" * 60
    with pytest.raises(StateDivergedError):
        DIV.advance(text)
    with pytest.raises(StateDivergedError, match="text 1 of the batch"):
        DIV.score_batch(["the cat", text], group="symbol")
    with pytest.raises(StateDivergedError):
        DIV.attribute(text)
    with pytest.raises(StateDivergedError):
        DIV.sample(text, n=5)
    # streaming: the chunk that crosses the limit raises, and names its own offset
    s = DIV.score("the " + "z" * 5).state
    with pytest.raises(StateDivergedError) as e:
        DIV.score("z" * 60, state=s)
    assert e.value.offset == expected_offset(DIV, "z" * 60, s.h)
    # a state out of range is refused as such, not scored from
    bad = State(np.full(16, 2 * MAX_STATE_ABS))
    for call in (lambda: DIV.score("a", state=bad), lambda: DIV.top_k(bad), lambda: DIV.logits(bad)):
        with pytest.raises(StateDivergedError, match="given state"):
            call()
    with pytest.raises(StateDivergedError):
        DIV.score("a", state=State(np.full(16, np.nan)))


def test_sampling_that_diverges_raises():
    eng = Engine(diverging_params(only_z=True), A8)     # the readout all but forces 'z'
    with pytest.raises(StateDivergedError, match="generated character") as e:
        eng.sample("the", n=200, seed=0)
    assert e.value.offset < 200
    assert len(eng.sample("the", n=3, seed=0).text) == 3  # short runs are fine


def test_shipped_model_composed_and_batched_paths(unconstrained_engine):
    """'z' x 200 printed {"bits": NaN} before; now every path raises at offset 14 (the 15th 'z')."""
    for eng in (unconstrained_engine, unconstrained_engine.with_path("reference")):
        with pytest.raises(StateDivergedError) as e:
            eng.score("z" * 200)
        assert e.value.offset == 14 and "'z'" in str(e.value)
    with pytest.raises(StateDivergedError) as e:
        unconstrained_engine.score("qx" * 2000)
    assert e.value.offset == 41
    with pytest.raises(StateDivergedError, match="text 1 of the batch"):
        unconstrained_engine.score_batch(["the cat sat", "z" * 3000])
    with pytest.raises(StateDivergedError, match="text 0 of the batch"):
        unconstrained_engine.score_batch(["z" * 3000], group="symbol")
    with pytest.raises(StateDivergedError):
        unconstrained_engine.advance("z" * 200)
    # real text is untouched by the guard
    assert np.isfinite(unconstrained_engine.score("the zzz of a jazz buzz").bits)


class NaNRunner:
    """A runner whose model overflows: the engine must turn its NaN into an error, not a number."""

    backend = provider = "numpy"
    kind = "rnn"
    K = V = 27
    d = state_size = 4
    state_names = ["h"]

    def initial_state(self):
        return np.zeros(4)

    def readout(self, s):
        return np.zeros(27)

    def score_ids(self, ids, s):
        bits = np.ones(len(ids))
        bits[len(ids) // 2:] = np.nan
        return bits, np.full(4, np.nan)

    def advance_ids(self, ids, s):
        return np.full(4, np.inf)

    def score_batch(self, ids_list, states):
        return [self.score_ids(x, s) for x, s in zip(ids_list, states)]


def test_runner_engines_never_return_nan():
    eng = RunnerEngine(NaNRunner(), A8)
    with pytest.raises(StateDivergedError, match="offset 5") as e:
        eng.score("abcdefghij")
    assert e.value.cause == "non-finite bits"
    with pytest.raises(StateDivergedError):
        eng.advance("abc")
    with pytest.raises(StateDivergedError, match="text 0 of the batch"):
        eng.score_batch(["abcd"])


def test_onnx_path_raises(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from isan.engine.baselines.onnx import load_onnx_engine
    from isan.export.onnx_export import onnx_hook

    b = write_bundle(tmp_path / "div", diverging_params().as_dict(), A8, hook=onnx_hook, normalizer="text8")
    eng = load_onnx_engine(b)
    text = "ab" + "z" * 300
    t = expected_offset(DIV, text)
    with pytest.raises(StateDivergedError) as e:
        eng.score(text)
    assert e.value.offset == t and "onnx" in str(e.value)
    with pytest.raises(StateDivergedError, match="text 1 of the batch"):
        eng.score_batch(["the cat", text])
    with pytest.raises(StateDivergedError):
        eng.advance(text)
    assert np.isfinite(eng.score("The cat.").bits)


# ---- isan model check ----------------------------------------------------------------------------
def test_model_check_finds_the_diverging_letter_and_pairs():
    r = DIV.check_divergence(max_chars=500)
    assert [x["symbol"] for x in r["letters"]] == ["z"]
    assert r["letters"][0]["after_chars"] == expected_offset(DIV, "z" * 500) + 1
    assert r["pairs"] and all(p["after_chars"] > 0 for p in r["pairs"])
    for p in r["pairs"][:20]:
        t = first_out_of_range(DIV.params.W, DIV.params.b, A8.encode(p["pair"] * 300), DIV.params.h0)
        assert t + 1 == p["after_chars"]
    stable = Engine(random_params(d=16, seed=5), A8).check_divergence(max_chars=500)
    assert stable["letters"] == [] and stable["pairs"] == []
    assert stable["n_letters_checked"] == 27 and stable["n_pairs_checked"] == 27 * 26


def test_model_check_on_the_shipped_model(unconstrained_engine):
    r = unconstrained_engine.check_divergence(max_chars=2000)
    letters = {x["symbol"]: x["after_chars"] for x in r["letters"]}
    assert letters["z"] == 15 and letters["x"] == 23 and " " not in letters and "e" not in letters
    pairs = {x["pair"]: x["after_chars"] for x in r["pairs"]}
    assert pairs["qx"] == 42


def test_model_check_decides_by_spectral_radius_past_any_finite_run(unconstrained_engine):
    """Issue #19: a run of 2,000 characters missed 'a' (2,088), 'r' (2,775) and 'h' (26,808)."""
    r = unconstrained_engine.check_divergence(max_chars=2000)
    W = unconstrained_engine.params.W
    letters = {x["symbol"]: x for x in r["letters"]}
    radius = {s: float(np.abs(np.linalg.eigvals(W[A8.id(s)].astype(np.float64))).max()) for s in A8.symbols}
    assert set(letters) == {s for s, rho in radius.items() if rho > 1}  # exactly the letters above 1
    for s in letters:
        assert letters[s]["spectral_radius"] == pytest.approx(radius[s], rel=1e-9)
    p = unconstrained_engine.params
    for s in ("a", "r", "h"):  # slow ones, found past the 2,000 stepped characters, checked by a plain run
        n = letters[s]["after_chars"]
        assert n > 2000
        assert first_out_of_range(p.W, p.b, A8.encode(s * (n + 5)), p.h0) + 1 == n
    # a letter below 1 converges however long it repeats: it scores
    calm = min(radius, key=radius.get)
    assert calm not in letters and radius[calm] < 1
    assert np.isfinite(unconstrained_engine.score(calm * 100_000).bits)
    # the pairs' radii: rho(W[y] W[x]) for a few
    for x in r["pairs"][:3] + r["pairs"][-3:]:
        a, b = A8.id(x["pair"][0]), A8.id(x["pair"][1])
        rho = np.abs(np.linalg.eigvals(W[b].astype(np.float64) @ W[a].astype(np.float64))).max()
        assert x["spectral_radius"] == pytest.approx(rho, rel=1e-9) and rho > 1
    assert r["certificate"] is None
    assert r["adversarial"]["diverged"] and r["adversarial"]["chars"] <= 20


@pytest.mark.parametrize("path", ["composed", "chunked"])
def test_the_repeat_count_in_the_message_covers_the_whole_run(unconstrained_engine, path):
    """Issue #19: 26,808 h's were reported as 2,232 and a 1M-character 'a' body as 40."""
    text = "the " + "h" * 30_000
    with pytest.raises(StateDivergedError) as e:
        unconstrained_engine.score(text, path=path)
    t = e.value.offset
    assert f"after {t - 3} characters repeating 'h'" in str(e.value)
    with pytest.raises(StateDivergedError) as e:
        unconstrained_engine.score("a" * 1_000_000, path=path)
    assert "after 2088 characters repeating 'a'" in str(e.value)


# ---- CLI and server --------------------------------------------------------------------------------
def isan(*args, input=None):
    return subprocess.run([sys.executable, "-m", "isan.cli", *map(str, args)], input=input, capture_output=True,
                          text=True, timeout=300)


def test_cli_exit_2_and_no_nan(tmp_path):
    r = isan("score", "--json", "--model", UNCONSTRAINED, "-", input="z" * 200 + "\n")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("Error: ") and "offset 14" in r.stderr and "'z'" in r.stderr
    assert r.stderr.count("\n") == 1 and "Warning" not in r.stderr
    r = isan("score", "--path", "reference", "--model", UNCONSTRAINED, "-", input="z" * 200)
    assert r.returncode == 2 and "offset 14" in r.stderr
    b = write_bundle(tmp_path / "div", diverging_params().as_dict(), A8)
    r = isan("model", "check", "--model", b, "--json", "--max-chars", 300)
    j = json.loads(r.stdout)
    assert r.returncode == 0 and [x["symbol"] for x in j["letters"]] == ["z"]
    out = isan("model", "check", "--model", b, "--max-chars", 300).stdout
    assert "letters (1): 'z'" in out and "above 1: 1 of 27 letters" in out and "certificate: none" in out


def test_server_answers_422_and_never_nan(unconstrained_engine):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # starlette's notice about httpx
        from fastapi.testclient import TestClient
    from isan.engine.serve import create_app

    client = TestClient(create_app(unconstrained_engine))
    r = client.post("/v1/score", json={"text": "z" * 200})
    assert r.status_code == 422 and r.json()["offset"] == 14 and "diverges" in r.json()["error"]
    r = client.post("/v1/score", json={"text": "The cat.\n", "per_char": True})
    assert r.status_code == 200 and r.json()["normalization"]["changed"] == 2
    assert "NaN" not in r.text and "Infinity" not in r.text
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_text(json.dumps({"reset": True}))
        assert json.loads(ws.receive_text())["total_bpc"] is None
        ws.send_text(json.dumps({"text": "the cat "}))
        first = json.loads(ws.receive_text())
        ws.send_text(json.dumps({"text": "\n"}))          # squeezed away: zero characters, null bpc
        empty = ws.receive_text()
        assert "NaN" not in empty and json.loads(empty)["chars"] == 0 and json.loads(empty)["bpc"] is None
        ws.send_text(json.dumps({"text": "z" * 200}))
        err = json.loads(ws.receive_text())
        assert err["status"] == 422 and 0 < err["offset"] <= 14
        ws.send_text(json.dumps({"text": "sat"}))          # the stream's state survived the bad frame
        after = json.loads(ws.receive_text())
        assert after["total_chars"] == first["total_chars"] + 3


# ---- a certified model (issue #20) ---------------------------------------------------------------
def certified_bundle(tmp_path, scale: float):
    """A bundle of orthogonal W scaled to ``scale`` (a contraction with P = I) and its certificate."""
    from isan.engine.certificate import CERT_FILE, certificate
    from safetensors.numpy import save_file

    p = random_params(d=16, seed=3, scale=scale)
    c = certificate(p.W, p.b, p.h0)
    save_file({"P": np.eye(16)}, str(tmp_path / CERT_FILE))
    return write_bundle(tmp_path / "cert", p.as_dict(), A8, normalizer="text8", files={CERT_FILE: tmp_path / CERT_FILE},
                        extra={"certificate": {"rho": c["rho"], "state_bound": c["state_bound"], "file": CERT_FILE}})


def certified_tolerance(eng, ids: np.ndarray, window: slice):
    """The derived float32 tolerance (tests/tolerances.py) of the certified model on ``ids[window]``, a stretch
    holding each kind of text in ``ids``, carried to all of them: a contraction forgets an error within its
    bound (a few times shorter than the window), so each character's error depends on its recent past only."""
    assert 4 * eng.forget_bound_chars() < window.stop - window.start
    p = eng.params.astype(np.float64)
    return isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, ids[window], samples=4).for_chars(len(ids))


def test_a_certified_model_scores_chunk_parallel_without_the_float64_fallback(tmp_path, text8_test):
    """Orthogonal W scaled to 0.9 is a contraction with P = I: the certificate holds, any start-state
    error provably dies within the bound, every chunk corrects itself, and the bits are exact."""
    b = certified_bundle(tmp_path, scale=0.9)
    eng = Engine.load(b, path_mode="chunked")
    assert eng.certificate()["holds"] and eng.certificate()["rho"] == pytest.approx(0.9, rel=1e-5)
    bound = eng.forget_bound_chars()
    assert bound is not None and bound <= 1024
    text = text8_test[:60_000] + "z" * 5_000 + "".join(np.random.default_rng(0).choice(list("abcxyz"), 20_000))
    r = eng.score(text, per_char=True)
    assert r.scoring["forget_bound_chars"] == bound and r.scoring["fallback_chunks"] == 0
    ref = Engine.load(b, path_mode="reference").score(text, per_char=True)
    tol = certified_tolerance(eng, eng.alphabet.encode(text), slice(55_000, 75_000))  # English, z's, random
    assert np.max(np.abs(r.per_char_bits - ref.per_char_bits)) <= tol.bits
    m = eng.check_divergence(max_chars=200)
    assert m["certificate"]["holds"] and m["letters"] == [] and m["pairs"] == []


def test_chunks_follow_a_certificate_that_needs_more_than_the_minimum(tmp_path, text8_test):
    """A certified model whose proof of forgetting needs more than MIN_CHUNK characters (rho 0.99): the
    CPU plan cuts chunks at least that long, so none can need the float64 fallback and the bits are
    exact; chunk counts a caller gives that make shorter chunks are scored with the fallback ready."""
    from isan.engine.kernels.chunked import MIN_CHUNK

    b = certified_bundle(tmp_path, scale=0.99)
    eng = Engine.load(b, path_mode="chunked")
    bound = eng.forget_bound_chars()
    assert eng.certificate()["holds"] and bound > MIN_CHUNK  # the case under test
    assert eng.min_chunk() >= bound and eng.min_chunk() % 256 == 0 and eng.min_chunk() - bound < 256
    text = text8_test[:80_000]
    r = eng.score(text, per_char=True, threads=2)
    assert r.scoring["forget_bound_chars"] == bound and r.scoring["fallback_chunks"] == 0
    ref = Engine.load(b, path_mode="reference").score(text, per_char=True)
    ids = eng.alphabet.encode(text)
    tol = certified_tolerance(eng, ids, slice(0, 20_000))
    assert np.max(np.abs(r.per_char_bits - ref.per_char_bits)) <= tol.bits
    short = [len(ids) // MIN_CHUNK]  # chunks of MIN_CHUNK characters, shorter than the proof
    bits, _, rep = eng.score_ids([ids], eng.params.h0[None, :], chunks=short)
    assert np.max(np.abs(bits[0] - ref.per_char_bits)) <= tol.bits and rep.chunks == short[0]
    from isan.engine.kernels.chunked import Float64Fallback

    assert isinstance(eng.chunk_fallback([len(ids)], short), Float64Fallback)
    r2 = eng.score(text, per_char=True, threads=2)  # and the engine's own plan keeps its proof after
    assert r2.scoring["forget_bound_chars"] == bound and r2.bits == r.bits


def test_the_default_model_keeps_the_proof_in_chunk_parallel_scoring(default_engine, text8_test):
    """The default's certificate needs more than MIN_CHUNK characters in float32 (text8-d216-distil:
    1,064); its chunks are cut that long, so its scoring still says why no chunk can fall back."""
    eng = default_engine
    bound = eng.forget_bound_chars()
    assert bound is not None and eng.min_chunk() >= bound
    r = eng.score(text8_test[:100_000], threads=2)
    assert r.scoring["forget_bound_chars"] == bound and r.scoring["fallback_chunks"] == 0


def test_the_default_model_scores_every_text(default_engine):
    """Issue #20: no text, however made, makes the default model's state diverge. The certificate
    proves it (recomputed here from the bundle); the texts that broke the first default model score."""
    eng = default_engine
    c = eng.certificate()
    assert c is not None and c["holds"] and c["rho"] < 1 and np.isfinite(c["state_bound"])
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    junk = ["".join(rng.choice(letters, 1_000_000)),  # 1M uniformly random letters
            "".join(rng.choice(np.append(letters, " "), 200_000)),
            "he said " + "z" * 20 + " and slept", "abcdefghijklmnopqrstuvwxyz " * 40]
    for text in junk:
        r = eng.score(text)
        assert np.isfinite(r.bits) and r.scoring.get("fallback_chunks", 0) == 0
    # every letter, and pairs (all of them are decided exactly by model check below), repeated for
    # 10,000 characters, in one batch through the kernels
    pairs = [a + b for a in letters for b in letters if a != b]
    units = list(letters) + [pairs[i] for i in rng.choice(len(pairs), 40, replace=False)]
    for r in eng.score_batch([(u * (10_000 // len(u)))[:10_000] for u in units]):
        assert np.isfinite(r.bits)
    m = eng.check_divergence(max_chars=200)
    assert m["letters"] == [] and m["pairs"] == [] and not m["adversarial"]["diverged"]
    assert m["adversarial"]["max_abs_h"] <= c["state_bound"]
