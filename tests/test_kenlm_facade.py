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
    assert out["score"] == pytest.approx(sum(p for p, _, _ in out["full"]), abs=1e-4)
    assert out["score_noeos"] == pytest.approx(sum(p for p, _, _ in out["full_noeos"]), abs=1e-4)
    assert out["chain"] == pytest.approx(out["score"], abs=1e-4)
    assert out["perplexity"] == pytest.approx(10.0 ** (-out["score"] / (n + 1)), rel=1e-5)
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
    assert facade.score(sentence) == pytest.approx(-with_eos * LOG10_2, rel=1e-6)
    assert facade.score(sentence, eos=False) == pytest.approx(-eng.score(text).bits * LOG10_2, rel=1e-6)
    null = eng.advance(" ", normalize="none")
    nobos = eng.score(text + " ", state=null, normalize="none").bits
    assert facade.score(sentence, bos=False) == pytest.approx(-nobos * LOG10_2, rel=1e-6)


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
