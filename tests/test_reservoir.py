"""ESN, ESN+, NPM-U, NPM-U+, NPM-T (isan.train.reservoir_variants) and their scorers and bundles
(isan.engine.baselines.reservoir), against plain implementations."""

import json
import math

import numpy as np
import pytest

from isan.engine.baselines.reservoir import (ReservoirParams, load_reservoir_bundle, nearest_context,
                                       reservoir_score_ref, write_reservoir_bundle)
from isan.errors import BundleFormatError
from isan.train.tasks import elman as EG
from isan.train import reservoir_variants as RV

V = 24


@pytest.fixture(scope="module")
def ids():
    return EG.encode(EG.generate(400, 21)), EG.encode(EG.generate(100, 22))


def plain_states(W_in, W, b, ids, h):
    """h_t = tanh(W_in onehot(x_t) + W h_{t-1} + b), element by element."""
    n = W.shape[0]
    out = []
    for x in ids:
        new = np.zeros(n)
        for i in range(n):
            s = W_in[i, x] + b[i]
            for j in range(n):
                s += W[i, j] * h[j]
            new[i] = math.tanh(s)
        h = new
        out.append(h)
    return np.array(out)


def plain_esn_bits(W_in, W, W_out, b_out, o_min, ids):
    h = np.zeros(W.shape[0])
    H = plain_states(W_in, W, np.zeros(W.shape[0]), ids, h)
    before = np.vstack([h, H[:-1]])
    bits = []
    for t, x in enumerate(ids):
        o = [max(sum(W_out[a, j] * before[t, j] for j in range(len(h))) + b_out[a], o_min) for a in range(V)]
        bits.append(-math.log2(o[x] / sum(o)))
    return np.array(bits)


@pytest.mark.parametrize("plus", [False, True])
def test_esn_forward_equals_a_plain_implementation(ids, plus):
    tr, te = ids
    cfg, t = RV.train_esn(tr, V, 7, seed=3, plus=plus)
    p = ReservoirParams.from_tensors(cfg, t)
    bits, h = reservoir_score_ref(p, te[:120], p.initial_state())
    ref = plain_esn_bits(t["E"].T, t["W_hh"], t["W_out"], t["b_out"], cfg["o_min"], te[:120])
    assert np.allclose(bits, ref, rtol=0, atol=1e-9)


def test_esn_construction(ids):
    tr, _ = ids
    rng = np.random.default_rng(0)
    E, W = RV.esn_network(50, V, rng)
    assert max(abs(np.linalg.eigvals(W))) == pytest.approx(0.98)
    assert np.abs(E).max() < 1
    Rm = RV.transition_ratios(tr, V)
    cols = Rm.sum(0)
    assert np.allclose(cols[cols > 0], 1.0)  # column j: the distribution of the symbol after j
    E2, _ = RV.esn_network(50, V, np.random.default_rng(0), Rm)
    assert np.abs(E2).max() <= 0.01 + 1e-12  # T_rand in (-0.01, 0.01) times ratios that sum to 1
    # symbols that are followed alike get alike input weights (boy and girl, not boy and who)
    i = {w: k for k, w in enumerate(EG.SYMBOLS)}
    d = lambda a, b: np.linalg.norm(E2[i[a]] - E2[i[b]])  # noqa: E731
    assert d("boy", "girl") < d("boy", "who")


def test_readout_is_the_least_squares_solution():
    rng = np.random.default_rng(2)
    H = rng.normal(size=(300, 5))
    y = rng.integers(0, 4, 300)
    W_out, b = RV.fit_readout(H, y, 4, ridge=0.0, washout=0)
    X = np.hstack([H, np.ones((300, 1))])
    sol = np.linalg.lstsq(X, np.eye(4)[y], rcond=None)[0]
    assert np.allclose(W_out, sol[:5].T, atol=1e-8) and np.allclose(b, sol[5], atol=1e-8)


@pytest.mark.parametrize("variant", ["npm-u", "npm-u+"])
def test_npm_forward_equals_a_plain_implementation(ids, variant):
    tr, te = ids
    cfg, t = RV.train_npm_u(tr, V, 12, seed=1, plus=variant == "npm-u+")
    assert cfg["variant"] == variant and cfg["gamma"] == pytest.approx(1 / 24)
    p = ReservoirParams.from_tensors(cfg, t)
    x = te[:150]
    bits, _ = reservoir_score_ref(p, x, p.initial_state())
    h = np.zeros(16)
    H = np.vstack([h, plain_states(t["E"].T, t["W_hh"], np.zeros(16), x, h)[:-1]])
    C, N = t["centroids"], t["counts"]
    for k in range(len(x)):
        c = min(range(len(C)), key=lambda j: (float(((H[k] - C[j]) ** 2).sum()), j))
        prob = (N[c, x[k]] + 1 / 24) / (N[c].sum() + 24 * (1 / 24))  # eq. 1, gamma = 1/|A|
        assert bits[k] == pytest.approx(-math.log2(prob), abs=1e-9)


def test_npm_counts_are_the_training_transitions(ids):
    tr, _ = ids
    cfg, t = RV.train_npm_u(tr, V, 1, seed=0)
    assert t["counts"].shape == (1, V)
    assert np.array_equal(t["counts"][0], np.bincount(tr, minlength=V))  # one context: the unigram


def test_npm_t_uses_a_trained_network(ids):
    tr, te = ids
    E, W, info = RV.train_srn(tr[:1200], V, epochs=3, seed=0, bptt=16)
    assert info["train_bits_per_epoch"][2] < info["train_bits_per_epoch"][0]
    cfg, t = RV.train_npm_t(tr, V, 8, seed=0, net=(E, W))
    assert cfg["variant"] == "npm-t" and np.array_equal(t["W_hh"], W)


def test_kmeans_finds_separated_clusters():
    rng = np.random.default_rng(0)
    centers = np.array([[0, 0], [10, 0], [0, 10.0]])
    X = np.vstack([c + rng.normal(scale=0.1, size=(100, 2)) for c in centers])
    C = RV.kmeans(X, 3, seed=1)
    assert len(C) == 3
    assert np.allclose(np.sort(C[:, 0] + 3 * C[:, 1]), np.sort(centers[:, 0] + 3 * centers[:, 1]), atol=0.1)
    assert len(RV.kmeans(np.zeros((50, 2)), 5, seed=0)) == 1  # fewer distinct states than k


def test_nearest_context_ties_go_to_the_lower_index():
    C = np.array([[1.0, 0], [-1.0, 0]])
    assert nearest_context(C, np.array([[0.0, 0.0], [0.5, 0], [-0.5, 0]])).tolist() == [0, 0, 1]


def test_bundle_round_trip_and_integrity(ids, tmp_path):
    tr, te = ids
    text = EG.to_text(EG.generate(50, 4))
    for kind, (cfg, t) in (("esn", RV.train_esn(tr, V, 9, seed=0)), ("npm", RV.train_npm_u(tr, V, 5, seed=0))):
        path = write_reservoir_bundle(tmp_path / kind, kind, cfg, t, EG.elman_alphabet())
        m = json.loads((path / "manifest.json").read_text())
        assert m["kind"] == kind and m["alphabet"]["kind"] == "words" and len(m["files"]) == 1
        r = load_reservoir_bundle(path)
        s = r.score_text(text)
        p = ReservoirParams.from_tensors(cfg, {k: np.float32(v) for k, v in t.items()})
        bits, _ = reservoir_score_ref(p, EG.elman_alphabet().encode(text), p.initial_state())
        assert s["bits"] == pytest.approx(bits.sum(), rel=1e-12)
        assert s["nnl"] == pytest.approx(s["bits_per_token"] / math.log2(24), rel=1e-12)  # NNL = bits / log2|A|
        assert s["unit"] == "word" and s["tokens"] == len(text.split())
        # `isan score --model` reads it through the engine's loader, with the same bits and NNL
        from isan.engine import load_engine

        e = load_engine(path).score(text).to_json()
        assert e["bits"] == pytest.approx(s["bits"], rel=1e-12) and e["nnl"] == pytest.approx(s["nnl"], rel=1e-12)
        # an edited manifest is refused
        m2 = dict(m, d=m["d"] + 1)
        (path / "manifest.json").write_text(json.dumps(m2))
        with pytest.raises(BundleFormatError, match="manifest_sha256"):
            load_reservoir_bundle(path)
        (path / "manifest.json").write_text(json.dumps(m))
        # a corrupted weights file is refused
        w = path / "weights.safetensors"
        raw = bytearray(w.read_bytes())
        raw[-3] ^= 0xFF
        w.write_bytes(bytes(raw))
        with pytest.raises(BundleFormatError):
            load_reservoir_bundle(path)


def test_runner_protocol(ids):
    tr, te = ids
    cfg, t = RV.train_esn(tr, V, 6, seed=0)
    from isan.engine.baselines.reservoir import NumpyReservoirRunner

    r = NumpyReservoirRunner(ReservoirParams.from_tensors(cfg, t))
    s0 = r.initial_state()
    b1, s1 = r.score_ids(te[:40], s0)
    b2, s2 = r.score_ids(te[40:80], s1)
    b, s = r.score_ids(te[:80], s0)  # chunking invariance: the state carries
    assert np.allclose(np.concatenate([b1, b2]), b) and np.allclose(s2, s)
    assert np.allclose(r.advance_ids(te[:80], s0), s)
    lp = r.readout(s0)
    assert np.exp(lp).sum() == pytest.approx(1.0)


def test_the_studys_batched_esn_equals_one_run_at_a_time(ids):
    from isan.train.studies.elman_study import esn_batched

    tr, te = ids
    for plus in (False, True):
        got = esn_batched([0, 3], {"train": tr, "test": te}, 4, plus=plus)
        for run, v in zip((0, 3), got):
            cfg, t = RV.train_esn(tr, V, 4, seed=1000 * run + 4, plus=plus)
            assert v == pytest.approx(RV.score(cfg, t, te).nnl, rel=1e-9)


def test_table_summary_and_claims():
    from isan.train.studies.elman_study import claims, summarise

    recs = [{"model": m, "size": s, "run": r, "nnl": base - (0.1 if m.endswith("+") else 0) + 0.01 * r}
            for m, base in (("esn", 0.8), ("esn+", 0.8)) for s in (1, 10) for r in range(3)]
    s = summarise(recs)
    assert s["esn"][10]["mean"] == pytest.approx(0.81) and s["esn"][10]["runs"] == 3
    c = claims(s)["esn+ vs esn"]
    assert c["sizes_plus_better"] == 2 and all(r["beyond_std"] for r in c["rows"])
