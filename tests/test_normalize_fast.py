"""The text preparation's fast paths against their references: text8-v1 on bytes
(``TEXT8_V1.apply``) equals its twin on code points (``text8_v1_reference``) on any Unicode text
(digits, spaces, byte-order marks, lone surrogates) and on the shared corpora; the report's
``most_changed``/``most_dropped`` equal a plain count; ``Alphabet.raw_ids`` equals a per-character
lookup; and ``Prepared.text`` is decoded only when it is read."""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isan.alphabet import Alphabet, validated_ids
from isan.engine.normalize import BOM, NONE, TEXT8_V1, Prepared, prepare, text8_v1_reference
from isan.errors import AlphabetError
from isan.tokens import ByteAlphabet

from conftest import DATA, need

A8 = Alphabet.text8()

#: characters that matter to text8-v1 (letters at the range ends, digits, spaces, '?', which stands for
#: every character beyond ASCII on the fast path, a byte-order mark, a lone surrogate, an astral character)
SPECIAL = list("aAzZ@[`{09 \t\n?.-é") + [BOM, "\ud800", "\udfff", "\U0001F600", "\u212a"]
CHARS = st.one_of(st.sampled_from(SPECIAL), st.characters(exclude_categories=()),
                  st.characters(categories=["Cs"]))
TEXTS = st.text(CHARS, max_size=60)
CONTEXTS = st.sampled_from(["", " ", "a"])

CORPORA = [("wikitext2", "test.txt"), ("tinyshakespeare", "input.txt"), ("text8_head", "text8_head.txt")]


def corpus(folder: str, name: str, chars: int = 300_000) -> str:
    with open(need(DATA / folder / name), encoding="utf-8") as f:
        return f.read(chars)


def first_difference(a, b) -> str:
    """Where two strings or arrays first differ (a short failure message for texts of any length)."""
    a, b = (np.asarray(list(x)) if isinstance(x, str) else np.asarray(x) for x in (a, b))
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    k = int(diff[0]) if len(diff) else n
    return f"lengths {len(a)} and {len(b)}; first difference at {k}: {a[k:k + 8]!r} vs {b[k:k + 8]!r}"


def check_equal(got, want, what: str) -> None:
    same = (got == want) if isinstance(want, str) else (got.dtype == want.dtype and np.array_equal(got, want))
    assert same, f"{what}: {first_difference(got, want)} (dtypes {getattr(got, 'dtype', '')} {getattr(want, 'dtype', '')})"


def assert_same_apply(text: str, context: str) -> None:
    fast, ref = TEXT8_V1.apply(text, context), text8_v1_reference(text, context)
    check_equal(fast[0], ref[0], "text")
    check_equal(fast[1], ref[1], "offsets")
    assert ref[1].dtype == np.int64
    for got, want, what in zip(fast[2:], ref[2:], ("changed", "dropped")):
        assert (got is None) == (want is None), what
        if want is not None:
            check_equal(got, want, what)
            assert want.dtype == bool


def top_chars(text: str, mask: np.ndarray, top: int = 5) -> list[dict]:
    """The five most frequent characters where ``mask`` is set (ties by code point), by plain counting."""
    counts = Counter(c for c, m in zip(text, mask.tolist()) if m)
    order = sorted(counts.items(), key=lambda kv: (-kv[1], ord(kv[0])))[:top]
    return [{"char": c, "count": k} for c, k in order]


def assert_same_prepare(text: str, context: str) -> None:
    """prepare() against the reference normaliser, its masks counted by hand (a leading BOM of a text
    that starts is dropped first, as prepare does)."""
    p = prepare(text, A8, TEXT8_V1, context=context)
    bom = text.startswith(BOM) and not context
    norm, offsets, changed, dropped = text8_v1_reference(text[1:] if bom else text, context)
    if changed is None:
        changed, dropped = np.zeros(len(text) - bom, bool), np.zeros(len(text) - bom, bool)
    if bom:
        offsets = offsets + 1
        changed, dropped = np.concatenate([[False], changed]), np.concatenate([[True], dropped])
    check_equal(p.text, norm, "text")
    check_equal(p.ids, A8.encode(norm), "ids")
    check_equal(p.offsets, offsets, "offsets")
    assert p.report["changed"] == int(changed.sum()) and p.report["dropped"] == int(dropped.sum())
    assert p.report["most_changed"] == top_chars(text, changed)
    assert p.report["most_dropped"] == top_chars(text, dropped)
    assert p.report["chars_read"] == len(text) and p.report["chars_scored"] == len(norm)


# ---- text8-v1: the bytes path equals the code-point reference ---------------------------------------
@settings(max_examples=600, deadline=None)
@given(TEXTS, CONTEXTS)
def test_text8_fast_equals_reference_on_any_text(text, context):
    assert_same_apply(text, context)


@settings(max_examples=300, deadline=None)
@given(TEXTS, CONTEXTS)
def test_prepare_report_equals_plain_counts(text, context):
    assert_same_prepare(text, context)


@pytest.mark.parametrize("text", ["", " ", "  ", "?", "??", "a?b", "1", "0 0", " 1 ", "12", "x1", "1x", "A1 b",
                                  "é9", "9é", "\ud800", "\ud8009", BOM, BOM + " a", BOM + "1", "hello world",
                                  "hello  world", " hello", "already text8 "])
@pytest.mark.parametrize("context", ["", " ", "a"])
def test_text8_fast_equals_reference_on_edges(text, context):
    assert_same_apply(text, context)
    assert_same_prepare(text, context)


@pytest.mark.parametrize("folder, name", CORPORA)
@pytest.mark.parametrize("context", ["", " "])
def test_text8_fast_equals_reference_on_the_corpora(folder, name, context):
    text = corpus(folder, name)
    assert_same_apply(text, context)
    assert_same_prepare(text, context)
    for k in range(0, 200_000, 40_000):  # documents cut anywhere
        assert_same_apply(text[k:k + 4096 + k // 1000], context)


def test_many_characters_beyond_ascii_are_counted_by_code_point():
    text = "Ελλάδα 42 " * 400 + "?? ¿" + "日本語" * 300  # over a thousand changed characters beyond ASCII
    assert_same_prepare(text, "")
    assert_same_prepare(text, " ")


# ---- Alphabet.raw_ids and validated_ids ---------------------------------------------------------------
def lookup_ids(alphabet: Alphabet, text: str) -> np.ndarray:
    return np.array([alphabet.symbols.index(c) if c in alphabet else -1 for c in text], dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_raw_ids_equals_a_lookup(text):
    for alphabet in (A8, Alphabet(tuple(chr(c) for c in range(200))), Alphabet(tuple("ab\u0100"))):
        got = alphabet.raw_ids(text)
        assert got.dtype == np.int64 and np.array_equal(got, lookup_ids(alphabet, text))


def test_validated_ids_rejects_out_of_range_in_one_pass():
    assert validated_ids(np.array([0, 26]), 27).dtype == np.int64
    assert len(validated_ids([], 27)) == 0
    for bad in ([-1], [27], np.array([0, -(2 ** 62)]), np.array([2 ** 63 - 1]), [[0, 1]]):
        with pytest.raises(AlphabetError):
            validated_ids(bad, 27)


# ---- Prepared: the text is decoded when read, once ---------------------------------------------------
class CountingAlphabet(Alphabet):
    """The text8 alphabet, counting its decode calls."""

    calls = []

    def decode(self, ids):
        CountingAlphabet.calls.append(len(ids))
        return super().decode(ids)


def test_prepared_ids_are_not_decoded_unless_the_text_is_read():
    alphabet = CountingAlphabet(A8.symbols)
    CountingAlphabet.calls.clear()
    ids = A8.encode("the cat sat on the mat")
    p = prepare(ids, alphabet)
    assert CountingAlphabet.calls == []
    assert p.last_symbol == "t" and CountingAlphabet.calls == []  # the last id alone
    assert p.text == "the cat sat on the mat" and CountingAlphabet.calls == [len(ids)]
    assert p.text == "the cat sat on the mat" and CountingAlphabet.calls == [len(ids)]  # kept
    assert p.last_symbol == "t"
    assert prepare(np.zeros(0, np.int64), alphabet).last_symbol == ""
    assert p.report["normalizer"] == "ids"
    assert p.offsets.dtype == np.int64 and np.array_equal(p.offsets, np.arange(len(ids)))  # made when read
    assert p.offsets is p.offsets


def test_unknown_policies_decode_when_read():
    alphabet = CountingAlphabet(tuple(" abc"))
    CountingAlphabet.calls.clear()
    skipped = prepare("ab!c", alphabet, NONE, unknown="skip")
    replaced = prepare("ab!c", alphabet, NONE, unknown="replace", replacement=" ")
    assert CountingAlphabet.calls == []
    assert (skipped.last_symbol, replaced.last_symbol) == ("c", "c")
    assert (skipped.text, replaced.text) == ("abc", "ab c")
    assert (skipped.report["skipped"], replaced.report["replaced"]) == (1, 1)


def test_a_token_alphabet_decodes_its_whole_text_for_the_last_symbol():
    bytes_alphabet = ByteAlphabet.from_data("héllo wörld".encode())
    ids = np.frombuffer("wörld é".encode(), np.uint8).astype(np.int64)
    p = prepare(ids, bytes_alphabet)
    assert p.last_symbol == "é" and p.text == "wörld é"


def test_prepared_is_immutable_and_keeps_a_given_text():
    p = Prepared(ids=np.array([1, 2]), offsets=np.array([0, 1]), text="", report={"chars_read": 2})
    assert p.text == "" and p.last_symbol == ""  # as given (a corpus row rebuilt without its text)
    for name in ("text", "ids", "offsets", "report"):
        with pytest.raises(FrozenInstanceError):
            setattr(p, name, None)
    with pytest.raises(AttributeError):
        del p.ids
    with pytest.raises(TypeError):
        Prepared(np.array([1]), np.array([0]), None, {})
    q = Prepared(np.array([1, 2]), np.array([0, 1]), "ab", {})
    assert q.text == "ab" and q.last_symbol == "b" and "text='ab'" in repr(q)


def test_prepared_pickles_without_decoding():
    p = prepare(A8.encode("abc"), A8)
    q = pickle.loads(pickle.dumps(p))
    assert np.array_equal(q.ids, p.ids) and q.text == "abc" and q.last_symbol == "c" and q.report == p.report
    r = pickle.loads(pickle.dumps(prepare("Abc 1", A8, TEXT8_V1)))
    assert r.text == "abc one " and r.report["changed"] == 2
