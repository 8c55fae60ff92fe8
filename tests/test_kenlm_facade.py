"""isan.kenlm (issue #25): code written for the `kenlm` module runs unchanged on an ISAN.

The same user code runs against the real kenlm module (over a word-level n-gram that isan counts
and writes as ARPA) and against isan.kenlm over the shipped model; both must satisfy KenLM's own
identities, and isan.kenlm's numbers must be the engine's bits of the spelled-out text."""

from __future__ import annotations

import math

import numpy as np
import pytest

import isan.kenlm as isan_kenlm
from isan.engine import Engine
from tolerances import U32, gamma, isan_float32_tolerance

LOG10_2 = math.log10(2.0)
SENTENCES = ["this is a sentence", "The cat sat on the mat .", "in 1984 the city grew", "a"]


def kenlm_user_code(kenlm, model, sentence: str) -> dict:
    """What a KenLM user writes (python/example.py of kenlm, and the calls around it)."""
    out = {"score": model.score(sentence, bos=True, eos=True),
           "score_nobos": model.score(sentence, bos=False, eos=True),
           "score_noeos": model.score(sentence, bos=True, eos=False),
           "perplexity": model.perplexity(sentence),
           "full": list(model.full_scores(sentence)),
           "full_noeos": list(model.full_scores(sentence, bos=True, eos=False))}
    state, state2 = kenlm.State(), kenlm.State()
    model.BeginSentenceWrite(state)
    accum = 0.0
    for w in sentence.split():
        accum += model.BaseScore(state, w, state2)
        state, state2 = state2, state
    accum += model.BaseScore(state, "</s>", state2)
    out["chain"] = accum
    a, b = kenlm.State(), kenlm.State()
    model.NullContextWrite(a)
    model.NullContextWrite(b)
    out["null_states_equal"] = (a == b) and hash(a) == hash(b)
    r = model.BaseFullScore(a, sentence.split()[0], b)
    out["full_return"] = (r.log_prob, r.ngram_length, r.oov)
    out["contains"] = sentence.split()[0] in model
    return out


def check_kenlm_identities(out: dict, sentence: str) -> None:
    n = len(sentence.split())
    assert len(out["full"]) == n + 1 and len(out["full_noeos"]) == n
    for prob, length, oov in out["full"]:
        assert isinstance(prob, float) and isinstance(length, int) and isinstance(oov, bool)
    # KenLM sums float32 log10 probabilities: two sums of n + 1 terms in any order, each within Higham's
    # gamma(n + 1) of the magnitudes' sum; the perplexity's exponent carries it times ln 10, its power 4 u
    tol = 2 * gamma(n + 1) * sum(abs(p) for p, _, _ in out["full"])
    assert abs(out["score"] - sum(p for p, _, _ in out["full"])) <= tol
    assert abs(out["score_noeos"] - sum(p for p, _, _ in out["full_noeos"])) <= tol
    assert abs(out["chain"] - out["score"]) <= tol
    rel = math.log(10) * tol / (n + 1) + 4 * U32
    assert out["perplexity"] == pytest.approx(10.0 ** (-out["score"] / (n + 1)), rel=rel)
    assert out["null_states_equal"]
    assert out["score"] <= 0 and out["score_noeos"] <= 0


@pytest.fixture(scope="module")
def word_arpa(tmp_path_factory, text8_path):
    """A word trigram of 200,000 characters of text8, written as ARPA by isan (kenlm loads order 3)."""
    from isan.train.ngram import fit
    from isan.export.arpa import write_arpa
    from isan.tokens import WordAlphabet

    words = text8_path.read_text()[:200_000].split()
    alphabet = WordAlphabet(tuple(sorted(set(words))))
    ids = np.array(alphabet.as_ids(" ".join(words)), dtype=np.int64)
    path = tmp_path_factory.mktemp("arpa") / "words3.arpa"
    write_arpa(fit(ids, len(alphabet), 3), alphabet, path)
    return path


@pytest.fixture(scope="module")
def facade():
    return isan_kenlm.Model()


@pytest.mark.parametrize("sentence", SENTENCES)
def test_the_same_user_code_runs_on_kenlm_and_on_isan(word_arpa, facade, sentence):
    kenlm = pytest.importorskip("kenlm")
    real = kenlm_user_code(kenlm, kenlm.Model(str(word_arpa)), sentence)
    ours = kenlm_user_code(isan_kenlm, facade, sentence)
    check_kenlm_identities(real, sentence)
    check_kenlm_identities(ours, sentence)
    assert set(real) == set(ours)


@pytest.mark.parametrize("sentence", SENTENCES)
def test_the_facade_gives_the_engines_bits(facade, sentence):
    eng = Engine.default()
    words = [eng.prepare(w).text.strip(" ") for w in sentence.split()]
    text = " ".join(w for w in words if w)
    with_eos = eng.score(text + " ").bits
    p = eng.params.astype(np.float64)  # two float32 computations: twice the derived tolerance (tests/tolerances.py)
    tol = LOG10_2 * max(isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, eng.encode(t)).twice().total_bits
                        for t in (text + " ", " " + text + " "))  # from h0, and from the state after a space
    assert abs(facade.score(sentence) + with_eos * LOG10_2) <= tol
    assert abs(facade.score(sentence, eos=False) + eng.score(text).bits * LOG10_2) <= tol
    null = eng.advance(" ", normalize="none")
    nobos = eng.score(text + " ", state=null, normalize="none").bits
    assert abs(facade.score(sentence, bos=False) + nobos * LOG10_2) <= tol


def test_oov_words_and_ngram_lengths(facade):
    full = list(facade.full_scores("the . cat"))
    assert [oov for _, _, oov in full] == [False, True, False, False]
    assert full[1][0] == 0.0
    assert [n for _, n, _ in full] == [2, 3, 3, 4]  # <s> counts as a word; an oov word adds no context
    assert "cat" in facade and "." not in facade and "Cat" in facade
    assert isan_kenlm.Model.order is None
    with pytest.raises(TypeError):
        facade.score(12)
    assert facade.score(b"the cat") == facade.score("the cat")
