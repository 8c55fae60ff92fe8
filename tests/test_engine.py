"""Engine API: scoring, streaming (chunk invariance), distribution, sampling, attribution."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isan.alphabet import Alphabet
from isan.engine import Engine
from isan.engine.reference import kappa_ref, segment_kappa_ref, states_ref
from isan.errors import AlphabetError, EmptyTextError, TextTooLongError

from conftest import random_params
from tolerances import U64, gamma, isan_float32_tolerance, readout_tolerance

ENGINE = Engine(random_params(d=16, seed=5), Alphabet.text8())
TEXT8_CHARS = st.text(alphabet=" abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=300)


def test_score_units_and_totals():
    r = ENGINE.score("the quick brown fox", per_char=True)
    assert r.chars == 19 and r.per_char_bits.shape == (19,)
    assert np.isclose(r.bits, r.per_char_bits.sum()) and np.isclose(r.bpc, r.bits / 19)
    assert r.state.chars == 19 and np.isclose(r.state.bits, r.bits)
    # bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]: the first character comes from h0
    p = ENGINE.params
    lg = p.W_ro @ p.h0 + p.b_ro
    first = -(lg[Alphabet.text8().id("t")] - np.log(np.exp(lg).sum())) / np.log(2)
    assert np.isclose(r.per_char_bits[0], first)


@settings(max_examples=60, deadline=None)
@given(text=TEXT8_CHARS, cuts=st.lists(st.integers(0, 300), max_size=8))
def test_chunked_scoring_equals_whole(text, cuts):
    whole = ENGINE.score(text, per_char=True)
    bounds = sorted({c for c in cuts if 0 < c < len(text)})
    state, bits = None, []
    for a, b in zip([0] + bounds, bounds + [len(text)]):
        r = ENGINE.score(text[a:b], state=state, per_char=True)
        state = r.state
        bits.append(r.per_char_bits)
    np.testing.assert_allclose(np.concatenate(bits), whole.per_char_bits, atol=1e-9)
    assert state.chars == whole.chars and np.isclose(state.bits, whole.bits, rtol=1e-12)
    np.testing.assert_allclose(state.h, whole.state.h, atol=1e-12)


def test_state_is_an_immutable_value():
    s0 = ENGINE.initial_state()
    h_before = s0.h.copy()
    ENGINE.score("abc", state=s0)
    np.testing.assert_array_equal(s0.h, h_before)
    with pytest.raises(ValueError):
        s0.h[0] = 1.0
    s1 = ENGINE.advance("abc", s0)
    assert s1.chars == 0 and not np.allclose(s1.h, s0.h)
    np.testing.assert_allclose(s1.h, ENGINE.score("abc").state.h)


def test_bad_text():
    with pytest.raises(EmptyTextError):
        ENGINE.score("")
    with pytest.raises(EmptyTextError):
        ENGINE.score("ABC", unknown="skip")
    with pytest.raises(AlphabetError) as e:
        ENGINE.score("abc!def")
    assert e.value.offset == 3
    assert ENGINE.score("ab!c", unknown="skip").chars == 3
    assert np.isclose(ENGINE.score("ab!c", unknown="replace", replacement=" ").bits, ENGINE.score("ab c").bits)


def test_distribution_and_top_k():
    s = ENGINE.advance("the ")
    p = ENGINE.distribution(s)
    assert p.shape == (27,) and np.isclose(p.sum(), 1.0) and (p > 0).all()
    top = ENGINE.top_k(s, 5)
    assert [t["prob"] for t in top] == sorted((t["prob"] for t in top), reverse=True)
    assert np.isclose(top[0]["prob"], p.max()) and np.isclose(top[0]["bits"], -np.log2(p.max()))
    # the distribution's bits agree with scoring that character
    ch = top[0]["symbol"]
    assert np.isclose(ENGINE.score(ch, state=s).bits, top[0]["bits"])
    hot = ENGINE.distribution(s, temperature=0.5)
    assert hot.max() > p.max()


def test_sampling_is_deterministic_per_seed():
    a = ENGINE.sample("annual reve", n=50, seed=7)
    b = ENGINE.sample("annual reve", n=50, seed=7)
    c = ENGINE.sample("annual reve", n=50, seed=8)
    assert a.text == b.text and len(a.text) == 50 and a.text != c.text
    assert set(a.text) <= set(Alphabet.text8().symbols)
    # the reported bits are the model's bits of the generated text after the prompt
    assert np.isclose(a.bits, ENGINE.score(a.text, state=ENGINE.advance("annual reve")).bits)
    greedy = ENGINE.sample("the", n=20, top_k=1, seed=1)
    assert greedy.text == ENGINE.sample("the", n=20, top_k=1, seed=99).text


@pytest.mark.parametrize("by", ["char", "word"])
def test_attribution_sums_to_logits(by):
    text = "the cat sat on the mat"
    a = ENGINE.attribute(text, by=by)
    p, ids = ENGINE.params.astype(np.float64), ENGINE.encode(text)
    H = states_ref(p, ids, p.h0)
    logits = H @ p.W_ro.T + p.b_ro
    # both in float64: the derived tolerance of the scan in float64 (tests/tolerances.py), its readout, and
    # Higham's worst case for the attribution's sum of len(ids) + 1 sources, for each of the two
    state = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, ids).in_precision(U64).state
    one = readout_tolerance(p.W_ro, p.b_ro, H, state, u=U64) + gamma(len(ids) + 1, U64) * np.abs(a.kappa).sum(1).max()
    np.testing.assert_allclose(p.b_ro + a.kappa.sum(axis=1), logits, rtol=0, atol=2 * one)
    assert a.max_abs_error < 1e-9
    assert a.sources[0] == "<h0>"
    if by == "word":
        assert a.sources[1:] == ["the", " ", "cat", " ", "sat", " ", "on", " ", "the", " ", "mat"]


def test_kappa_is_eq4_to_6(small_params):
    """kappa[t, s] = W_ro (W[x_t] ... W[x_{s+1}]) b[x_s], written out as explicit products."""
    p = small_params.astype(np.float64)
    ids = np.array([5, 1, 0, 9, 13])
    K = kappa_ref(p, ids)
    for t in range(1, len(ids) + 1):
        for s in range(0, t + 1):
            v = p.h0 if s == 0 else p.b[ids[s - 1]]
            for j in range(s + 1, t + 1):
                v = p.W[ids[j - 1]] @ v
            np.testing.assert_allclose(K[t - 1, s], p.W_ro @ v, atol=1e-12)
        assert np.all(K[t - 1, t + 1 :] == 0)


@settings(max_examples=30, deadline=None)
@given(text=st.text(alphabet="ab ", min_size=1, max_size=60))
def test_word_kappa_equals_summed_char_kappa(text):
    import re

    p = ENGINE.params
    ids = ENGINE.encode(text)
    spans = [m.span() for m in re.finditer(r"[^ ]+| +", text)]
    Kc = kappa_ref(p, ids)
    Kw = segment_kappa_ref(p, ids, spans)
    np.testing.assert_allclose(Kw[:, 0], Kc[:, 0], atol=1e-9)
    for k, (i, j) in enumerate(spans):
        np.testing.assert_allclose(Kw[:, k + 1], Kc[:, i + 1 : j + 1].sum(axis=1), atol=1e-9)


def test_attribution_limits():
    with pytest.raises(EmptyTextError):
        ENGINE.attribute("")
    with pytest.raises(TextTooLongError):
        ENGINE.attribute("a" * 2001)


def test_default_model_on_real_text(default_engine, text8_valid_head):
    """The shipped model predicts English far better than chance (log2 27 = 4.75 bits)."""
    r = default_engine.score(text8_valid_head[:5000])
    assert r.bpc < 2.3
    a = default_engine.attribute(text8_valid_head[:200], by="word")
    assert a.max_abs_error < 1e-6
    s = default_engine.sample("annual reve", n=40, seed=0)
    assert len(s.text) == 40
    assert default_engine.top_k(default_engine.advance("annual reve"), 1)[0]["symbol"] == "n"
