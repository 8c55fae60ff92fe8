"""The paper's analyses (engine/analysis, `isan analyze`) against plain computations on small models."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import random_params
from isan.cli import main
from isan.engine.analysis import attribution, basis, decay, parentheses, pca, stack, studies
from isan.engine.baselines.recurrent import BaselineParams, baseline_shapes, baseline_states_ref
from isan.engine.reference import LOG2E, kappa_ref, log_softmax, segment_kappa_ref, states_ref
from isan.errors import AttributionCheckError, IsanError
from isan.params import ISANParams
from tolerances import U32, gamma

SYMBOLS = tuple(" abcdefghijklmnopqrstuvwxyz")


def _text_ids(n, seed=0, space_every=5):
    """Random 'words': letters with a space about every ``space_every`` characters."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 27, size=n)
    ids[rng.random(n) < 1.0 / space_every] = 0
    return ids


@pytest.fixture(scope="module")
def p64():
    return random_params(d=12, seed=3, scale=0.8).astype(np.float64)


def _logits(p, ids, h=None):
    return states_ref(p, ids, p.h0 if h is None else h) @ p.W_ro.T + p.b_ro


# ------------------------------------------------------------------------------------ Figure 4
def test_window_statistics_against_plain_kappa(p64):
    """Fig 4a-c from the batched window pass equal the same numbers from the full kappa tensor."""
    ids = _text_ids(300, seed=1)
    N = 6
    st = decay.window_statistics(p64, ids, window=N, segments=1, space_id=0, max_word_position=8, dtype=np.float64)
    K = kappa_ref(p64, ids)  # (T, T + 1, V); source s >= 1 is character s - 1
    T = len(ids)
    pos = np.arange(T - 1)  # positions with a next character
    nxt = ids[pos + 1]
    # 4a: mean ||kappa[t, t - k]||, lag k is source t - k + 1 (zero before the start)
    norms = np.array([np.mean([np.linalg.norm(K[t, t - k + 1]) if t - k >= 0 else 0.0 for t in pos]) for k in range(N)])
    np.testing.assert_allclose(st.kappa_norm_mean, norms, rtol=1e-9)
    # 4c: keeping the last n sources; n = 0 is softmax(b_ro)
    for n in (0, 1, 3, N):
        bits = []
        for t in pos:
            lg = p64.b_ro + sum((K[t, t - k + 1] for k in range(n) if t - k >= 0), np.zeros(p64.V))
            bits.append(-log_softmax(lg)[nxt[t]] * LOG2E)
        assert st.bits_keep_last[n] == pytest.approx(np.mean(bits), rel=1e-9)
    assert st.bits_keep_last[0] == pytest.approx(np.mean(-log_softmax(p64.b_ro)[nxt] * LOG2E), rel=1e-12)
    full = -log_softmax(_logits(p64, ids)[pos])[np.arange(len(pos)), nxt] * LOG2E
    assert st.bits_full == pytest.approx(full.mean(), rel=1e-12)
    # 4b: by position in the word, only the space's kappa / without it
    acc = {}
    last = -1
    for t in range(T):
        if ids[t] == 0:
            last = t
        if t == T - 1 or last < 0 or t - last >= N or t - last > 8:
            continue
        lag = t - last
        ks = K[t, last + 1]
        lg = _logits(p64, ids[: t + 1])[-1]
        # the caption's second reading: every space read so far (most of them far outside the window)
        ka = K[t, 1 + np.flatnonzero(ids[: t + 1] == 0)].sum(0)
        a = acc.setdefault(lag, [[], [], [], [], []])
        a[0].append(-log_softmax(lg)[ids[t + 1]] * LOG2E)
        a[1].append(-log_softmax(p64.b_ro + ks)[ids[t + 1]] * LOG2E)
        a[2].append(-log_softmax(lg - ks)[ids[t + 1]] * LOG2E)
        a[3].append(-log_softmax(p64.b_ro + ka)[ids[t + 1]] * LOG2E)
        a[4].append(-log_softmax(lg - ka)[ids[t + 1]] * LOG2E)
    for lag, (f, o, w, ao, an) in acc.items():
        assert st.word_counts[lag] == len(f)
        assert st.word_bits_full[lag] == pytest.approx(np.mean(f), rel=1e-9)
        assert st.word_bits_space_only[lag] == pytest.approx(np.mean(o), rel=1e-9)
        assert st.word_bits_no_space[lag] == pytest.approx(np.mean(w), rel=1e-9)
        assert st.word_bits_spaces_only[lag] == pytest.approx(np.mean(ao), rel=1e-9)
        assert st.word_bits_no_spaces[lag] == pytest.approx(np.mean(an), rel=1e-9)
        for med, v in ((st.word_median_spaces_only, ao), (st.word_median_no_spaces, an)):  # of values kept in float32:
            assert med[lag] == pytest.approx(np.median(v), rel=gamma(2, U32) + 1e-9)  # rounded, or a float32 mean of 2
    # the two readings differ once older spaces exist
    assert np.abs(st.word_bits_spaces_only - st.word_bits_space_only).max() > 1e-3


def test_window_statistics_segments_do_not_change_the_numbers(p64):
    """Segments read in parallel from a warmed-up h0 give the one-pass numbers (the model forgets its start)."""
    ids = _text_ids(3000, seed=2)
    one = decay.window_statistics(p64, ids, window=5, segments=1, dtype=np.float64)
    many = decay.window_statistics(p64, ids, window=5, segments=4, warmup=150, dtype=np.float64)
    assert many.segments > 1 and many.positions == one.positions
    np.testing.assert_allclose(many.kappa_norm_mean, one.kappa_norm_mean, rtol=1e-6)
    np.testing.assert_allclose(many.bits_keep_last, one.bits_keep_last, rtol=1e-6)
    np.testing.assert_allclose(many.word_bits_spaces_only, one.word_bits_spaces_only, rtol=1e-6)
    np.testing.assert_allclose(many.word_bits_no_spaces, one.word_bits_no_spaces, rtol=1e-6)


def test_fit_two_rates_recovers_known_rates():
    k = np.arange(50)
    y = np.where(k < 12, np.exp(1.0 - 0.5 * k), np.exp(1.0 - 0.5 * 12 + 0.1 * 12 - 0.1 * k))
    f = decay.fit_two_rates(y)
    assert f["break_lag"] == 12
    assert f["rate_fast"] == pytest.approx(-0.5, abs=1e-9)
    assert f["rate_slow"] == pytest.approx(-0.1, abs=1e-9)
    assert f["rmse"] < 1e-9 < f["one_rate"]["rmse"]


# ------------------------------------------------------------------------------------ attribution
def test_windowed_attribution_sums_and_matches_full(p64):
    ids = _text_ids(40, seed=4)
    N = 7
    wa = attribution.windowed_attribution(p64, ids, N)
    assert wa.kappa.shape == (40, N + 1, p64.V)  # T (N + 1) V, not T^2 V
    np.testing.assert_allclose(wa.b_ro + wa.kappa.sum(1), _logits(p64, ids), atol=1e-10)
    K = kappa_ref(p64, ids)
    for t in (0, 5, 20, 39):
        for k in range(N):
            want = K[t, t - k + 1] if t - k >= 0 else 0.0
            np.testing.assert_allclose(wa.kappa[t, 1 + k], want, atol=1e-12)
        older = K[t, : max(t - N + 2, 1)].sum(0)  # h0 and every character at lag >= N
        np.testing.assert_allclose(wa.kappa[t, 0], older, atol=1e-10)


def test_attribution_checks_can_fail(p64):
    """The sum checks are real: contributions that do not sum to the target are refused."""
    ids = _text_ids(30, seed=5)
    assert attribution.windowed_attribution(p64, ids, 4).max_abs_error < 1e-9
    with pytest.raises(AttributionCheckError):
        attribution.windowed_attribution(p64, ids, 4, tol=-1.0)  # no tolerance at all
    K = kappa_ref(p64, ids)
    lg = _logits(p64, ids)
    for target in ("logit", "logprob"):
        with pytest.raises(AttributionCheckError):
            attribution.target_contributions(K * 0.9, lg, p64.b_ro, target, char=1, max_nodes=32)


@pytest.mark.parametrize("target", ["logit", "logit_diff", "logprob"])
def test_target_contributions_complete(p64, target):
    ids = _text_ids(25, seed=6)
    K = kappa_ref(p64, ids)
    lg = _logits(p64, ids)
    nxt = attribution.next_classes(ids, lg)
    ta = attribution.target_contributions(K, lg, p64.b_ro, target, char=nxt, other="e", symbols=SYMBOLS)
    rows = np.arange(len(ids))
    want = {"logit": lg[rows, nxt], "logit_diff": lg[rows, nxt] - lg[:, 5],
            "logprob": log_softmax(lg)[rows, nxt]}[target]
    np.testing.assert_allclose(ta.value, want, atol=1e-12)
    np.testing.assert_allclose(ta.base + ta.contributions.sum(1), want, atol=1e-7)
    if target == "logit":
        np.testing.assert_allclose(ta.contributions, K[rows, :, nxt], atol=1e-12)
    if target == "logprob":
        # a source that is the whole difference gets all of it (one source: exact, no quadrature error)
        one = attribution.target_contributions(K.sum(1, keepdims=True), lg, p64.b_ro, "logprob", char=nxt)
        np.testing.assert_allclose(one.contributions[:, 0], want - log_softmax(p64.b_ro)[nxt], atol=1e-7)


def test_target_errors(p64):
    K = np.zeros((2, 3, p64.V))
    lg = np.tile(p64.b_ro, (2, 1))
    with pytest.raises(IsanError):
        attribution.target_contributions(K, lg, p64.b_ro, "prob", char=0)
    with pytest.raises(IsanError):
        attribution.target_contributions(K, lg, p64.b_ro, "logit_diff", char=0)
    with pytest.raises(IsanError):
        attribution.target_contributions(K, lg, p64.b_ro, "logit", char="?", symbols=SYMBOLS)
    with pytest.raises(IsanError):
        attribution.windowed_attribution(p64, np.array([1, 2]), 0)


# ------------------------------------------------------------------------------------ Figures 2, 3, 5
def test_stack_and_counterfactual(p64):
    ids = _text_ids(15, seed=7)
    st = stack.prediction_stack(p64, ids, SYMBOLS)
    t = 14
    # removing every source leaves b_ro; the probabilities are the softmax of the logits
    np.testing.assert_allclose(stack.without_sources(st, t, range(t + 2)), p64.b_ro, atol=1e-10)
    np.testing.assert_allclose(st.probs, np.exp(log_softmax(_logits(p64, ids))), atol=1e-12)
    assert st.source_labels[0] == "h0" and st.source_labels[3] == f"2:{SYMBOLS[ids[2]].replace(' ', '_')}"
    cf = stack.counterfactual(p64, ids, SYMBOLS, t, 3, 6, chars=("a", "b"))
    # plain: the state with characters 3..6's carried biases removed, read out
    h = p64.h0.copy()
    hc = np.zeros(p64.d)
    hc[:] = p64.h0
    for s, x in enumerate(ids[: t + 1]):
        h = p64.W[x] @ h + p64.b[x]
        hc = p64.W[x] @ hc + (0.0 if 3 <= s <= 6 else p64.b[x])
    pr = np.exp(log_softmax(p64.W_ro @ hc + p64.b_ro))
    assert cf["without"]["probs"]["a"] == pytest.approx(pr[1], rel=1e-9)
    assert cf["max_abs_error"] < 1e-9


def test_word_conditioning_against_plain(p64):
    text = "ab cde f gh"
    ids = studies.encode(text, SYMBOLS)
    wc = stack.word_conditioning(p64, ids, SYMBOLS, keep=(1, 2, None))
    assert wc.words == ["ab", " cde", " f", " gh"]
    K = segment_kappa_ref(p64, ids, wc.spans)
    np.testing.assert_allclose(wc.norms, np.linalg.norm(K, axis=2))
    lg = _logits(p64, ids)
    nxt = np.append(ids[1:], lg[-1].argmax())
    np.testing.assert_allclose(wc.prob_next[2], np.exp(log_softmax(lg))[np.arange(len(ids)), nxt], rtol=1e-12)
    # keep 1 at t = 4 ('d', in the word ' cde'): b_ro and that word's kappa so far
    kc = kappa_ref(p64, ids)[4, 3:6].sum(0)  # characters 2..4 (' ', 'c', 'd')
    assert wc.prob_next[0, 4] == pytest.approx(np.exp(log_softmax(p64.b_ro + kc)[ids[5]]), rel=1e-9)


# ------------------------------------------------------------------- ICLR workshop Figure 6
def test_word_kappa_against_per_character_kappa_on_real_words(text8_valid_head):
    """kappa_word from one composed bias a word = the sum of per-character kappa (eq. 6) over the
    word's characters, with the paper's model on the frequent words of real text; at the space
    after the word and at its last character."""
    from isan.cli.analyze import load_analysed_model
    from isan.engine.analysis import embedding

    _, p, sym, _ = load_analysed_model(None)
    pairs = embedding.frequent_words(text8_valid_head, 150)
    assert pairs[0][1] >= pairs[-1][1] and all(" " not in w and w for w, _ in pairs)
    words = [w for w, _ in pairs]
    for at in (" ", None):
        fast, ref = embedding.word_kappa(p, words, sym, at), embedding.word_kappa_ref(p, words, sym, at)
        assert fast.shape == (len(words), p.V) and np.isfinite(fast).all()
        assert np.abs(fast - ref).max() <= 1e-9 * max(1.0, np.abs(ref).max())
    # the composed bias: what the word leaves in the state read from zero (states_ref from h = 0)
    p64 = p.astype(np.float64)
    ids = studies.encode(words[7], sym)
    assert np.allclose(embedding.word_bias(p, words[7:8], sym)[0], states_ref(p64, ids, np.zeros(p.d))[-1],
                       rtol=0, atol=1e-10)
    # context-free: kappa of the word's characters is the same after any earlier text
    text = "the cat sat on " + words[7] + " "
    k = kappa_ref(p64, studies.encode(text, sym), p64.h0)
    s0 = len("the cat sat on ")
    assert np.allclose(k[len(text) - 1, s0 + 1 : s0 + 1 + len(words[7])].sum(0),
                       embedding.word_kappa(p, words[7:8], sym)[0], rtol=0, atol=1e-9)


def test_word_kappa_errors(p64):
    from isan.engine.analysis import embedding

    with pytest.raises(IsanError, match="'C'"):
        embedding.word_kappa(p64, ["aCb"], SYMBOLS)
    with pytest.raises(IsanError, match="empty word"):
        embedding.word_kappa(p64, ["ab", ""], SYMBOLS)
    with pytest.raises(IsanError, match="one character"):
        embedding.word_kappa(p64, ["ab"], SYMBOLS, at="  ")
    with pytest.raises(IsanError, match="no words"):
        embedding.frequent_words("   ", 10)


def test_neighbour_purity_by_hand():
    from isan.engine.analysis import embedding

    # two tight clusters far apart: every member's 2 nearest are members
    X = np.array([[0, 0], [0, 1], [1, 0], [10, 10], [10, 11], [11, 10], [50, 50.0]])
    m = np.array([1, 1, 1, 0, 0, 0, 0], dtype=bool)
    r = embedding.neighbour_purity(X, m, k=2)
    assert r["purity"] == 1.0 and r["chance"] == pytest.approx(2 / 6) and r["lift"] == pytest.approx(3.0)
    # k = 3: the third nearest of each member is in the other cluster
    assert embedding.neighbour_purity(X, m, k=3)["purity"] == pytest.approx(2 / 3)
    # members spread evenly among the others: purity near chance
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(2000, 5))
    mask = rng.random(2000) < 0.1
    r = embedding.neighbour_purity(Y, mask, k=10)
    assert abs(r["lift"] - 1.0) < 0.25
    with pytest.raises(IsanError, match="at least 2 members"):
        embedding.neighbour_purity(X, np.eye(1, 7, dtype=bool)[0], k=2)


def test_suffix_agreement_by_hand():
    from isan.engine.analysis import embedding

    words = ["cat", "bat", "hat", "dog", "fog", "log"]
    # the -at words together, the -og words together: each word's 2 nearest share its ending
    X = np.array([[0, 0], [0, 1], [1, 0], [9, 9], [9, 10], [10, 9.0]])
    r = embedding.suffix_agreement(X, words, k=2)
    assert r["share"] == 1.0 and r["chance"] == pytest.approx(2 / 5)
    # interleaved: each word's nearest is of the other ending
    Y = np.array([[0.0, 0], [5, 0], [10, 0], [1, 0], [6, 0], [11, 0]])
    assert embedding.suffix_agreement(Y, words, k=1)["share"] == 0.0


def test_cli_word_embedding(runner, small_bundle, text8_path, tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("sklearn")
    r = runner.invoke(main, ["analyze", "word-embedding", "--model", str(small_bundle), "--data", str(text8_path),
                             "--words", "300", "--out", str(tmp_path), "--compare", "none"])  # one t-SNE is enough here
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["words"] == 300 and out["max_abs_error"] < 1e-9
    g = out["groups"]["numbers"]
    assert {"one", "two", "three"} <= set(g["members"]) and 0 <= g["kappa"]["purity"] <= 1
    assert 0 <= out["suffix"]["kappa"]["share"] <= 1 and 0 < out["suffix"]["kappa"]["chance"] < 1
    assert (tmp_path / "iclr_fig6_word_tsne.png").stat().st_size > 1000
    assert json.loads((tmp_path / "word_embedding.json").read_text())["groups"].keys() == out["groups"].keys()


# ------------------------------------------------------------------------------------ Figures 6-8
def test_readout_basis_and_bias_study(p64):
    Q, Qp = basis.readout_basis(p64.W_ro[:5])  # rank 5 < d = 12
    assert Q.shape == (12, 5) and Qp.shape == (12, 7)
    np.testing.assert_allclose(np.hstack([Q, Qp]).T @ np.hstack([Q, Qp]), np.eye(12), atol=1e-12)
    np.testing.assert_allclose(p64.W_ro[:5] @ Qp, 0, atol=1e-12)
    counts = np.arange(1, 28, dtype=float)
    bs = basis.bias_study(p64, counts, SYMBOLS)
    full, ro, co = (np.array(bs["norms"][k]) for k in ("full", "readout", "complement"))
    np.testing.assert_allclose(ro ** 2 + co ** 2, full ** 2, rtol=1e-12)
    lp = np.log(counts / counts.sum())
    assert bs["correlation"]["full"] == pytest.approx(np.corrcoef(full, lp)[0, 1])
    D = np.array(bs["cosine"]["readout"])
    assert np.allclose(np.diag(D), 0) and np.allclose(D, D.T)


def test_ngram_agreement_against_plain(p64):
    ids = _text_ids(5000, seed=8)
    uni, big = basis.unigram_bigram(ids, 27)
    assert uni.sum() == 5000 and big.sum() == 4999 and big[ids[0], ids[1]] >= 1
    ng = basis.ngram_agreement(p64, uni, big, SYMBOLS)
    np.testing.assert_allclose(ng["unigram"]["model"], np.exp(log_softmax(p64.b_ro)))
    x = 3
    np.testing.assert_allclose(ng["bigram"]["model"][x], np.exp(log_softmax(p64.W_ro @ p64.b[x] + p64.b_ro)))
    pb = big[x] / big[x].sum()
    assert ng["bigram"]["correlation"][x] == pytest.approx(np.corrcoef(ng["bigram"]["model"][x], pb)[0, 1])
    # a model whose b_ro is the log unigram agrees perfectly
    q = ISANParams(W=p64.W, b=p64.b, W_ro=p64.W_ro, b_ro=np.log(uni / uni.sum()), h0=p64.h0)
    assert basis.ngram_agreement(q, uni, big, SYMBOLS)["unigram"]["kl_bits"] == pytest.approx(0, abs=1e-12)


# ------------------------------------------------------------------------------------ Figure 1b
def test_pca_spectrum_against_numpy(p64):
    ids = _text_ids(4000, seed=9)
    sp = pca.isan_states_spectrum(p64, ids, segments=1)
    H = states_ref(p64, ids, p64.h0)
    lam = np.sort(np.linalg.eigvalsh(np.cov(H.T, bias=True)))[::-1]
    np.testing.assert_allclose(sp["ratio"], lam / lam.sum(), atol=1e-10)
    seg = pca.isan_states_spectrum(p64, ids, segments=4, warmup=200)
    np.testing.assert_allclose(seg["ratio"][:3], sp["ratio"][:3], rtol=1e-5)
    assert sp["states"] == 4000


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_pca_baseline_batch_step_matches_reference(kind):
    cfg = {"kind": kind, "K": 5, "V": 5, "d": 6, "input": "onehot"}
    rng = np.random.default_rng(0)
    bp = BaselineParams.from_tensors(cfg, {k: rng.normal(size=s) * 0.5 for k, s in baseline_shapes(cfg).items()})
    ids = rng.integers(0, 5, size=3000)
    sp = pca.baseline_states_spectrum(bp, ids, segments=1)
    H = baseline_states_ref(bp, ids, bp.initial_state())[:, : bp.d]
    lam = np.sort(np.linalg.eigvalsh(np.cov(H.T, bias=True)))[::-1]
    np.testing.assert_allclose(sp["ratio"], lam / lam.sum(), atol=1e-10)


# ------------------------------------------------------------------------------------ Section 4
def exact_parentheses_isan(seed=0, d=35, kinds=2, levels=6):
    """An ISAN that solves the counting task exactly (the delay-line solution), in a random basis."""
    n = kinds * levels
    ideal = parentheses.ideal_transitions(kinds, levels)  # (2 kinds + 1, 2n, 2n) on (readout, current)
    K = ideal.shape[0]
    Wz = np.zeros((K, d, d))
    Wz[:, : 2 * n, : 2 * n] = ideal
    Wz[:, 2 * n :, 2 * n :] = 0.5 * np.eye(d - 2 * n)  # a rest that decays and feeds nothing back
    z0 = np.zeros(d)
    for g in range(2 * kinds):
        z0[g * levels] = 1.0  # every count 0, now and delayed
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(d, d)) + 3 * np.eye(d)
    Minv = np.linalg.inv(M)
    o = rng.normal(size=d)  # and an origin shift: h = o + M z
    W = M @ Wz @ Minv
    b = o - np.einsum("kij,j->ki", W, o)  # so that h' - o = M Wz M^-1 (h - o)
    W_ro = np.eye(n, d) @ Minv
    return ISANParams(W=W, b=b, W_ro=W_ro, b_ro=-W_ro @ o, h0=o + M @ z0)


def _task_data(n, seed=0):
    from isan.train.tasks.parentheses import ParenthesesTask

    task = ParenthesesTask()
    ids = task.sample(n, seed)
    counts = task.counts(ids)
    target = np.zeros_like(counts)
    target[1:] = counts[:-1]
    return task, ids, counts, target


def test_exact_solution_is_recovered_by_the_task_basis():
    task, ids, counts, target = _task_data(3000)
    p = exact_parentheses_isan()
    r = studies.study_parentheses(p, task.alphabet.symbols, ids, target, counts, 2, 6, hold=4)
    assert r["accuracy"] == 1.0 and r["exact"] == 1.0
    assert r["same_outputs_max_abs"] < 1e-8
    for block in ("readout", "current"):
        assert r["k_hot"]["blocks"][block]["max_abs_error"] < 1e-8
    assert max(r["blocks"]["ideal_error"]) < 1e-8
    assert r["blocks"]["delay_line"] == pytest.approx([5 / 6] * 5)


def test_rotated_model_gives_the_same_outputs():
    """change_basis_affine keeps every output, for a random model and any input."""
    p = random_params(K=5, V=12, d=35, seed=11, scale=0.9).astype(np.float64)
    task, ids, counts, _ = _task_data(500, seed=3)
    tb = parentheses.task_basis(p, ids, hold=4)
    out = _logits(p, ids)
    z = states_ref(tb.params, ids, tb.params.h0)
    np.testing.assert_allclose(z @ tb.params.W_ro.T + tb.params.b_ro, out, atol=1e-9)
    np.testing.assert_allclose(z[:, :12], out, atol=1e-9)  # the readout coordinates are the outputs
    # and the current coordinates are the outputs after the noise symbol
    nxt = (states_ref(p, ids, p.h0) @ p.W[4].T + p.b[4]) @ p.W_ro.T + p.b_ro
    np.testing.assert_allclose(z[:, 12:24], nxt, atol=1e-9)
    # a perturbed model does not match: the test can fail
    q = ISANParams(W=p.W, b=p.b + 1e-3, W_ro=p.W_ro, b_ro=p.b_ro, h0=p.h0)
    assert np.abs(_logits(q, ids) - out).max() > 1e-6


def test_task_basis_errors():
    p = random_params(K=5, V=20, d=35, seed=1).astype(np.float64)
    with pytest.raises(IsanError, match="dimensions"):
        parentheses.task_basis(p, np.array([0, 1]), hold=4)
    with pytest.raises(IsanError):
        parentheses.task_basis(random_params(K=5, V=12, d=35), np.array([0]), hold=7)
    with pytest.raises(IsanError):
        parentheses.change_basis_affine(p, np.zeros((35, 35)))


def test_khot_and_shift_matrix():
    np.testing.assert_array_equal(parentheses.shift_matrix(3, 1), [[0, 0, 0], [1, 0, 0], [0, 1, 1]])
    Z = np.array([[1.0, 0.0, 0.1], [0.2, 0.9, 0.0]])
    kh = parentheses.k_hotness(Z, np.array([[1.0, 0.0], [0.0, 1.0]]))
    assert kh["rounded_exact"] == 1.0 and kh["max_abs_error"] == pytest.approx(0.2)


# ------------------------------------------------------------------------------------ CLI
@pytest.fixture()
def runner():
    return CliRunner()


def test_cli_studies_on_a_small_bundle(runner, small_bundle, tmp_path):
    pytest.importorskip("matplotlib")
    for args in (["stack", "--text", "the cat"], ["contributions", "--text", "the annual reve"],
                 ["words", "--text", "ab cd ef"]):
        r = runner.invoke(main, ["analyze", *args, "--model", str(small_bundle), "--out", str(tmp_path)])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        assert out["max_abs_error"] < 1e-9
    for f in ("fig2_stack.png", "fig3_contributions.png", "fig5_words.png", "stack.json"):
        assert (tmp_path / f).stat().st_size > 300
    r = runner.invoke(main, ["analyze", "stack", "--text", "the CAT", "--model", str(small_bundle), "--out", str(tmp_path)])
    assert r.exit_code == 2 and "Traceback" not in r.output and "'C'" in r.output


@pytest.fixture(scope="module")
def other_bundle(tmp_path_factory):
    """A second small ISAN, analysed beside ``small_bundle``."""
    from isan.alphabet import Alphabet
    from isan.engine.bundle import write_bundle

    out = tmp_path_factory.mktemp("bundles") / "other"
    write_bundle(out, random_params(seed=7).as_dict(), Alphabet.text8(), kind="isan")
    return out


def _both(out: dict, name: str, key: str) -> None:
    """``out`` has the analysed model's ``key`` and, under compare, the other model's, and they differ."""
    assert out["label"] == "small" and list(out["compare"]) == [name]
    assert key in out and key in out["compare"][name] and out[key] != out["compare"][name][key]


def test_cli_every_figure_shows_both_models(runner, small_bundle, other_bundle, text8_path, tmp_path):
    """Issue #34 item 17: every model study of `isan analyze` runs the model and the compared one, and
    draws them side by side (Figs 2-8; Fig 1b as one more ISAN spectrum; the samples of Sec 3.1)."""
    pytest.importorskip("matplotlib")
    base = ["--model", str(small_bundle), "--compare", str(other_bundle), "--out", str(tmp_path)]
    data = ["--data", str(text8_path)]
    keys = {"stack": ("top_prob", ["--text", "the cat"]), "words": ("bits_mean", ["--text", "ab cd ef"]),
            "decay": ("bits_full", [*data, "--max-chars", "3000", "--window", "8"]),
            "basis": ("correlation", data), "ngram": ("unigram", data)}
    sizes = {}
    for cmd, (key, args) in keys.items():
        r = runner.invoke(main, ["analyze", cmd, *base, *args])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        _both(out, "other", key)
        sizes[out["figure"]] = (tmp_path / out["figure"]).stat().st_size
    one = tmp_path / "one"
    r = runner.invoke(main, ["analyze", "decay", "--model", str(small_bundle), "--compare", "none", "--out", str(one),
                             *data, "--max-chars", "3000", "--window", "8"])
    assert r.exit_code == 0, r.output
    assert "compare" not in json.loads(r.output)
    assert sizes["fig4_decay.png"] > 1.3 * (one / "fig4_decay.png").stat().st_size  # two rows of panels, not one
    d = json.loads((tmp_path / "decay.json").read_text())["compare"]["other"]["word"]
    assert len(d["median_bits_spaces_only"]) == len(d["positions"]) and "spaces_only" in d["readings"]
    r = runner.invoke(main, ["analyze", "pca", *base, *data, "--baseline", str(other_bundle), "--max-chars", "2000"])
    assert r.exit_code == 0, r.output
    assert {"isan (small)", "isan (other)"} <= set(json.loads(r.output)["models"])
    r = runner.invoke(main, ["analyze", "samples", *base, "-n", "20", "--seed", "0", "--inverse-temperature", "2"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["compare"]["other"]["samples"][0]["text"] != out["samples"][0]["text"]
    assert "--model" in out["compare"]["other"]["commands"][0]


def test_compared_models_default_to_the_default_model_never_the_model_itself(small_bundle):
    from isan.cli.analyze import compare_paths
    from isan.engine.paths import DEFAULT_MODEL, default_model_path

    default = default_model_path()  # the shipped default (#45 item 6: it was text8-d216-stable, a second name)
    assert default.name == DEFAULT_MODEL and default.is_dir()
    assert [p.resolve() for p in compare_paths(None)] == [default.resolve()]  # beside the paper's model
    assert compare_paths(None, model=str(default)) == []  # not beside itself
    assert compare_paths(("none",), model=str(small_bundle)) == []
    assert compare_paths((str(small_bundle),), model=str(small_bundle)) == []


def test_word_tsne_figure_has_a_row_per_model(tmp_path):
    """The ICLR Fig 6 t-SNE with two models: one row of panels each (the study is slow; the figure is not)."""
    pytest.importorskip("matplotlib")
    from isan.engine.analysis import figures

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(60)]
    groups = {"numbers": {"members": words[:5], "kappa": {"k": 10, "purity": 0.5, "chance": 0.1}}}
    one = figures.iclr_fig6_word_tsne([("a", (rng.normal(size=(60, 2)), groups))], words, tmp_path / "one.png")
    two = figures.iclr_fig6_word_tsne([("a", (rng.normal(size=(60, 2)), groups)),
                                       ("b", (rng.normal(size=(60, 2)), groups))], words, tmp_path / "two.png")
    from PIL import Image

    (w1, h1), (w2, h2) = Image.open(one).size, Image.open(two).size
    assert w1 == w2 and h2 == 2 * h1


def test_analyze_samples_use_the_analysed_model():
    """`isan analyze samples` (and `all`) sample the model the other studies analyse, the paper's model
    (text8-d216-unconstrained), not the shipped default that `isan sample` uses alone."""
    from isan.cli.analyze import sample_models
    from isan.engine import Engine
    from isan.engine.paths import default_model_path, paper_model_path

    if not (paper_model_path() / "manifest.json").exists():
        pytest.skip("the paper's model is not installed")
    got = sample_models(None, "annual reve", 30, (1.5,), (0,), compare=("none",))
    want = Engine.load(paper_model_path()).sample("annual reve", n=30, temperature=1 / 1.5, seed=0).text
    assert got["samples"][0]["text"] == want
    assert paper_model_path().name in got["commands"][0]
    if paper_model_path() != default_model_path():
        assert want != Engine.load(default_model_path()).sample("annual reve", n=30, temperature=1 / 1.5, seed=0).text


def test_cli_attribute_window_and_target(runner, small_bundle, small_params):
    text = "the annual revenue of the company"
    r = runner.invoke(main, ["analyze", "attribute", "--text", text, "--model", str(small_bundle), "--window", "4",
                             "--target", "logit_diff", "--char", "n", "--other", "r", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    c = np.array(out["contributions"])
    assert c.shape == (len(text), 5)
    p = small_params.astype(np.float64)
    lg = _logits(p, studies.encode(text, SYMBOLS))
    np.testing.assert_allclose(np.array(out["base"]) + c.sum(1), lg[:, 14] - lg[:, 18], atol=1e-5)
    r = runner.invoke(main, ["analyze", "attribute", "--text", text, "--model", str(small_bundle),
                             "--target", "logit_diff"])
    assert r.exit_code == 2 and "--other" in r.output


def test_cli_parentheses_on_an_exact_checkpoint(runner, tmp_path):
    pytest.importorskip("matplotlib")
    from isan.params import save_tensors
    from isan.train.tasks.parentheses import ParenthesesTask

    task = ParenthesesTask()
    ck = tmp_path / "run"
    ck.mkdir()
    save_tensors(ck / "best.safetensors", exact_parentheses_isan().as_dict())
    (ck / "config.json").write_text(json.dumps({"format": "isan-checkpoint", "format_version": 1,
                                                "model": {"kind": "isan", "K": 5, "V": 12, "d": 35},
                                                "alphabet": list(task.alphabet.symbols), "task": task.config()}))
    r = runner.invoke(main, ["analyze", "parentheses", "--checkpoint", str(ck), "--out", str(tmp_path), "--chars", "1000"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["accuracy"] == 1.0 and out["k_hot"]["blocks"]["current"]["rounded_exact"] == 1.0
    assert (tmp_path / "fig9_parentheses.png").exists()


def test_sample_inverse_temperature(runner, small_bundle):
    a = runner.invoke(main, ["sample", "--model", str(small_bundle), "-n", "30", "--seed", "3", "--inverse-temperature", "2"])
    b = runner.invoke(main, ["sample", "--model", str(small_bundle), "-n", "30", "--seed", "3", "--temperature", "0.5"])
    c = runner.invoke(main, ["sample", "--model", str(small_bundle), "-n", "30", "--seed", "3"])
    assert a.exit_code == 0 and a.output == b.output and a.output != c.output
    r = runner.invoke(main, ["sample", "--model", str(small_bundle), "--temperature", "1", "--inverse-temperature", "2"])
    assert r.exit_code == 2 and "not both" in r.output
    r = runner.invoke(main, ["sample", "--model", str(small_bundle), "--inverse-temperature", "0"])
    assert r.exit_code == 2
