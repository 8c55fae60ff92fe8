"""Elman's grammar (isan.train.tasks.elman): generator, checkers, true next-word distribution, NNL."""

import math
from collections import Counter

import numpy as np
import pytest

from isan.train.tasks import elman as E


def test_alphabet_has_24_words_with_the_end_marker():
    assert len(E.SYMBOLS) == 24 and len(set(E.SYMBOLS)) == 24 and E.SYMBOLS[-1] == "."
    a = E.elman_alphabet()
    assert len(a) == 24 and a.encode("boy who dogs chase sees girl .").tolist() == [
        E.SYMBOLS.index(w) for w in "boy who dogs chase sees girl .".split()]


def test_generator_is_seeded_and_every_sentence_is_grammatical():
    a, b = E.generate(200, 5), E.generate(200, 5)
    assert a == b and a != E.generate(200, 6)
    for s in a:
        assert s[-1] == "." and s.count(".") == 1
        assert E.is_grammatical(s), s
        assert E.is_grammatical_plain(s), s


def test_study_sizes_match_the_paper():
    train = E.generate(2000, E.TRAIN_SEED)
    mean = np.mean([len(s) for s in train])
    assert 5.2 < mean < 5.8  # 10,000 sentences are about 55k symbols


@pytest.mark.parametrize("sentence", [
    "boy chase dog .",            # number agreement
    "boys chases dog .",
    "boy chases .",               # chase needs an object
    "boy lives dog .",            # live takes none
    "boy who dogs walk lives .",  # an object relative needs a verb that can take an object
    "boys who girl chase see .",  # the relative clause's verb agrees with its own noun
    "boys who girl chases sees .",  # the main verb agrees with the head noun, not the nearest one
    "John who sees dog walks .",  # proper nouns take no relative clause here
    "boy walks",                  # no end marker
    "boy walks . girl walks .",   # one sentence at a time
    "who walks .",
])
def test_checkers_reject_ungrammatical_sentences(sentence):
    w = sentence.split()
    assert not E.is_grammatical(w)
    assert not E.is_grammatical_plain(w)
    if w[-1] == "." and w.count(".") == 1:
        with pytest.raises(ValueError):
            E.check_grammatical(w)


@pytest.mark.parametrize("sentence", [
    "boys who girl chases see dog .", "girl who boys chase sees .", "Mary feeds cats who chase boy .",
    "dog who sees girls who hear John walks .", "cats see ."])
def test_checkers_accept_grammatical_sentences(sentence):
    assert E.is_grammatical(sentence.split()) and E.is_grammatical_plain(sentence.split())


def test_the_two_checkers_agree_on_random_word_strings():
    rng = np.random.default_rng(0)
    gen = E.generate(150, 3)
    for s in gen:  # mutate one word of grammatical sentences: both checkers must agree on each
        t = list(s)
        i = int(rng.integers(len(t) - 1))
        t[i] = E.SYMBOLS[int(rng.integers(23))]
        assert E.is_grammatical(t) == E.is_grammatical_plain(t), t


def test_true_distribution_matches_the_generators_frequencies():
    oracle = E.NextWordOracle()
    sents = E.generate(12000, 11)
    for prefix in ([], ["boys"], ["boys", "who"], ["girl", "who"]):
        nxt = Counter(s[len(prefix)] for s in sents if s[: len(prefix)] == prefix)
        n = sum(nxt.values())
        assert n > 250
        b = oracle.start()
        for w in prefix:
            b = oracle.advance(b, w)
        p = oracle.distribution(b)
        assert abs(p.sum() - 1) < 1e-12
        for i, w in enumerate(E.SYMBOLS):
            f = nxt.get(w, 0) / n
            assert abs(f - p[i]) < 4 * math.sqrt(p[i] * (1 - p[i]) / n) + 1e-9, (prefix, w, f, p[i])


def test_agreement_is_certain_where_the_grammar_fixes_it():
    P = E.true_distributions(E.encode([("boys who girl chases see dog .").split()]))
    idx = {w: i for i, w in enumerate(E.SYMBOLS)}
    row = P[4]  # before the main verb: only plural verbs
    assert row[[idx[v] for v in E.VERBS]].sum() == pytest.approx(1.0)
    row = P[3]  # before the relative clause's verb: singular and able to take an object, or "who"
    assert row[[idx[v + "s"] for v in ("chase", "feed", "see", "hear")]].sum() + row[idx["who"]] == pytest.approx(1.0)
    assert row[idx["who"]] == pytest.approx(E.ElmanConfig().p_rc)


def test_nnl_is_bits_over_log2_of_the_alphabet():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.01, 1, 500)
    bits = -np.log2(p).mean()
    assert E.nnl(p) == pytest.approx(bits / math.log2(24), rel=1e-12)
    assert E.nnl_from_bits(bits) == pytest.approx(bits / math.log2(24), rel=1e-12)
    assert E.nnl(np.full(10, 1 / 24)) == pytest.approx(1.0)  # a uniform guess over 24 words: NNL 1


def test_stream_entropy_is_the_nnl_of_the_true_distribution():
    sents = E.generate(300, 9)
    ids = E.encode(sents)
    P = E.true_distributions(ids)
    assert np.allclose(P.sum(1), 1)
    h = E.stream_entropy(ids)
    assert h["nnl"] == pytest.approx(E.nnl(P[np.arange(len(ids)), ids]))
    assert 0.3 < h["nnl"] < 0.8
    # the chain rule: the product of conditionals is the sentence's probability, at most 1
    assert np.all(P[np.arange(len(ids)), ids] > 0)
