"""Text normalisation: hand-checked examples of the text8-v1 mapping (wikifil.pl), offsets, reports,
chunking invariance, the manifest declaration, and every entry point applying it."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isan.alphabet import Alphabet
from isan.engine import Engine
from isan.engine.bundle import read_manifest, write_bundle
from isan.engine.normalize import (NONE, TEXT8_V1, NormalizerError, choices, from_manifest, get_normalizer, prepare,
                                   resolve)
from isan.errors import AlphabetError, BundleFormatError, EmptyTextError

from conftest import random_params
from tolerances import isan_float32_tolerance

A8 = Alphabet.text8()
TEXT8_MANIFEST = {"normalizer": {"name": "text8", "version": 1}}
ENGINE = Engine(random_params(d=16, seed=5), A8, manifest=TEXT8_MANIFEST)
RAW = Engine(random_params(d=16, seed=5), A8)


def norm(text, context=""):
    return prepare(text, A8, TEXT8_V1, context=context)


# ---- the mapping, checked by hand ------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("The cat sat on the mat.\n", "the cat sat on the mat "),
    ("hello world", "hello world"),                          # already text8: unchanged
    ("Hello,  World!!", "hello world "),                     # punctuation to spaces, runs squeezed
    ("In 1984 there", "in one nine eight four there"),       # each digit a word with spaces around it
    ("a1b", "a one b"),
    ("0", " zero "),
    ("route 66.", "route six six "),
    ("café au lait", "caf au lait"),                         # accented letters become spaces (wikifil.pl: bytes)
    ("naïve", "na ve"),
    ("Ελλάδα", " "),                                         # no letter outside a-z survives
    ("\u212a", " "),                                         # KELVIN SIGN: str.lower() would give 'k'; tr/A-Z/ does not
    ("İstanbul", " stanbul"),                                # str.lower() would give 'i̇stanbul'
    ("tab\there\r\nnext", "tab here next"),
    ("  leading and trailing  ", " leading and trailing "),
    ("ABCXYZ", "abcxyz"),
    ("@[]^_`{|}~", " "),                                      # ASCII neighbours of the letter ranges
    ("", ""),
])
def test_text8_mapping(text, expected):
    p = norm(text)
    assert p.text == expected
    assert A8.decode(p.ids) == expected
    assert len(p.offsets) == len(expected)


def test_offsets_map_back_to_the_input():
    text = "In 1984, a Café.\n"
    p = norm(text)
    assert p.text == "in one nine eight four a caf "
    # each output character comes from the input character at its offset
    for ch, off in zip(p.text, p.offsets.tolist()):
        src = text[off]
        if src.isdigit():
            assert ch in " " + "onenineeightfour"
        elif "a" <= src.lower() <= "z" and src.isascii():
            assert ch == src.lower()
        else:
            assert ch == " "
    assert p.offsets.tolist()[:3] == [0, 1, 2]             # 'i', 'n', ' '
    assert set(p.offsets.tolist()[3:7]) == {3}              # "one " all from '1'
    assert np.all(np.diff(p.offsets) >= 0)                  # offsets never go back


def test_report_counts():
    r = norm("The cat sat on the mat.\n").report
    assert r == {"normalizer": "text8-v1", "chars_read": 24, "chars_scored": 23, "changed": 2, "dropped": 1,
                 "skipped": 0, "replaced": 0, "most_changed": [{"char": ".", "count": 1}, {"char": "T", "count": 1}],
                 "most_dropped": [{"char": "\n", "count": 1}]}
    r = norm("AB  12").report
    # A, B lower-cased; one of the two spaces dropped; digits spelled ("ab one two ")
    assert (r["chars_read"], r["chars_scored"], r["changed"], r["dropped"]) == (6, 11, 4, 1)
    r = norm("plain text").report
    assert (r["changed"], r["dropped"], r["most_changed"], r["most_dropped"]) == (0, 0, [], [])


def test_none_and_unknown_policies_report_their_counts():
    p = prepare("Hello, world", A8, NONE, unknown="skip")
    assert p.text == "ello world" and p.report["skipped"] == 2 and p.report["normalizer"] == "none-v1"
    assert p.offsets.tolist()[:2] == [1, 2]
    p = prepare("Hello, world", A8, NONE, unknown="replace", replacement=" ")
    assert p.text == " ello  world" and p.report["replaced"] == 2 and p.report["chars_scored"] == 12
    with pytest.raises(AlphabetError) as e:
        prepare("ab!", A8, NONE)
    assert e.value.offset == 2 and "'!'" in str(e.value)
    # after text8 nothing is left outside the alphabet
    assert prepare("Hello, World", A8, TEXT8_V1, unknown="error").text == "hello world"


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("aZ 09.\n\té") + [chr(0x3b1)]), max_size=80),
       cut=st.integers(0, 80), prev_space=st.booleans())
def test_normalising_in_two_pieces_equals_the_whole(text, cut, prev_space):
    ctx = " " if prev_space else "a"
    whole = norm(text, ctx)
    cut = min(cut, len(text))
    a = norm(text[:cut], ctx)
    b = norm(text[cut:], a.last_symbol or ctx)
    assert a.text + b.text == whole.text
    assert np.concatenate([a.offsets, b.offsets + cut]).tolist() == whole.offsets.tolist()
    for k in ("chars_read", "chars_scored", "changed", "dropped"):
        assert a.report[k] + b.report[k] == whole.report[k]


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_any_text_normalises_into_the_alphabet(text):
    p = norm(text)
    assert set(p.text) <= set(" abcdefghijklmnopqrstuvwxyz")
    assert "  " not in p.text
    assert len(p.offsets) == len(p.text) and (len(text) == 0 or p.offsets.max(initial=0) < len(text))
    r = p.report
    assert r["chars_read"] == len(text) and r["changed"] + r["dropped"] <= len(text)


# ---- the registry and the manifest -------------------------------------------------------------------
def test_registry():
    assert get_normalizer("text8") is TEXT8_V1 and get_normalizer("text8-v1") is TEXT8_V1
    assert get_normalizer("text8", 1) is TEXT8_V1 and get_normalizer("none") is NONE
    assert resolve("auto", TEXT8_V1) is TEXT8_V1 and resolve(None, NONE) is NONE and resolve("none", TEXT8_V1) is NONE
    assert {"auto", "none", "text8", "text8-v1"} <= set(choices())
    with pytest.raises(NormalizerError, match="unknown normaliser"):
        get_normalizer("nfkc")
    with pytest.raises(NormalizerError, match="no version 7"):
        get_normalizer("text8", 7)


def test_manifest_declaration():
    assert from_manifest({}) is NONE  # version-1 bundles declare nothing: raw text
    assert from_manifest({"normalizer": {"name": "text8", "version": 1}, "alphabet": list(" abcdefghijklmnopqrstuvwxyz")}) \
        is TEXT8_V1
    for bad in ("text8", {"name": "text8"}, {"name": "text8", "version": "1"}, {"name": "text8", "version": 2},
                {"name": 5, "version": 1}, {"name": "text8", "version": 1, "x": 0}):
        with pytest.raises(BundleFormatError, match="normali"):
            from_manifest({"normalizer": bad})
    with pytest.raises(BundleFormatError, match="lacks"):
        from_manifest({"normalizer": {"name": "text8", "version": 1}, "alphabet": list("abc")})


def test_write_bundle_declares_the_normaliser(tmp_path, small_params):
    b = write_bundle(tmp_path / "b", small_params.as_dict(), A8, normalizer="text8")
    assert read_manifest(b)["normalizer"] == {"name": "text8", "version": 1}
    eng = Engine.load(b)
    assert eng.normalizer is TEXT8_V1 and eng.describe()["normalizer"] == "text8-v1"
    assert eng.score("The Cat.").chars == len("the cat ")
    with pytest.raises(BundleFormatError, match="lacks"):
        write_bundle(tmp_path / "c", small_params.as_dict(), Alphabet(tuple("abcdefghijklmnopqrstuvwxyz.")),
                     normalizer="text8")


def test_shipped_model_declares_text8(default_engine):
    assert default_engine.normalizer is TEXT8_V1
    assert read_manifest(default_engine.source)["normalizer"] == {"name": "text8", "version": 1}


def test_export_of_a_text8_run_declares_text8():
    from isan.export.checkpoint import normalizer_for

    assert normalizer_for({"corpus": "text8-10M", "train": {"dataset": "text8"}}, A8) == "text8"
    assert normalizer_for({"corpus": "input.txt", "train": {"dataset": "text"}}, A8) == "none"
    assert normalizer_for({"corpus": "text8-10M"}, Alphabet(tuple("abc"))) == "none"


# ---- every entry point applies it -------------------------------------------------------------------
def test_score_normalises_by_default_and_reports():
    r = ENGINE.score("The cat sat on the mat.\n", per_char=True)
    assert r.chars == 23 and r.text == "the cat sat on the mat "
    assert r.normalization["changed"] == 2 and r.normalization["dropped"] == 1
    assert r.per_char_offsets.tolist() == list(range(23))
    assert np.isclose(r.bits, RAW.score("the cat sat on the mat ").bits, rtol=1e-12)
    j = r.to_json(per_char=True)
    assert j["normalization"]["normalizer"] == "text8-v1" and len(j["per_char_offsets"]) == 23
    with pytest.raises(AlphabetError, match="'T'"):
        ENGINE.score("The cat", normalize="none")
    assert ENGINE.score("the cat", normalize="none").normalization["normalizer"] == "none-v1"
    assert RAW.score("The cat", normalize="text8").text is None  # per_char off: no text kept
    assert RAW.score("The cat", normalize="text8").chars == 7


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab z.\n 7A")), min_size=1, max_size=120),
       cuts=st.lists(st.integers(0, 120), max_size=6))
def test_chunked_normalised_scoring_equals_whole(text, cuts):
    """Streaming raw text in chunks (state carried) never changes the bits, even when a chunk
    boundary falls inside a run of spaces that normalisation squeezes."""
    try:
        whole = ENGINE.score(text, per_char=True)
    except EmptyTextError:
        return
    bounds = sorted({c for c in cuts if 0 < c < len(text)})
    state, bits, offs = ENGINE.initial_state(), [], []
    for a, b in zip([0] + bounds, bounds + [len(text)]):
        r = ENGINE.score(text[a:b], state=state, per_char=True)
        state = r.state
        bits.append(r.per_char_bits)
        offs.append(r.per_char_offsets + a)
    np.testing.assert_allclose(np.concatenate(bits), whole.per_char_bits, atol=1e-9)
    assert np.concatenate(offs).tolist() == whole.per_char_offsets.tolist()
    assert state.chars == whole.chars and np.isclose(state.bits, whole.bits, rtol=1e-12)


def test_a_chunk_that_normalises_to_nothing():
    s = ENGINE.score("the ").state
    r = ENGINE.score("\n\n", state=s)                 # squeezed into the space before: nothing to score
    assert r.chars == 0 and r.bits == 0.0 and r.to_json()["bpc"] is None
    assert r.state.chars == s.chars and r.state.last_symbol == " "
    with pytest.raises(EmptyTextError):
        ENGINE.score("", state=s)                     # an empty chunk is still an error
    with pytest.raises(EmptyTextError):
        RAW.score("ABC", unknown="skip")              # without a state nothing to score is an error


def test_advance_batch_sample_attribute_normalise():
    s1 = ENGINE.advance("The Cat ")
    s2 = RAW.advance("the cat ")
    np.testing.assert_allclose(s1.h, s2.h)
    assert s1.last_symbol == " "
    # the state's last symbol squeezes a leading space of the next chunk
    assert np.isclose(ENGINE.score(" sat", state=s1).bits, RAW.score("sat", state=s2).bits)
    batch = ENGINE.score_batch(["The cat.", "A DOG"], per_char=True)
    assert [b.text for b in batch] == ["the cat ", "a dog"]
    p = RAW.params.astype(np.float64)  # two float32 computations: twice the derived tolerance (tests/tolerances.py)
    tol = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, RAW.encode("a dog")).twice().total_bits
    assert abs(batch[1].bits - RAW.score("a dog").bits) <= tol
    smp = ENGINE.sample("The Cat", n=10, seed=1)
    assert smp.prompt == "The Cat" and smp.prompt_normalized == "the cat" and smp.normalization["changed"] == 2
    assert smp.text == RAW.sample("the cat", n=10, seed=1).text
    a = ENGINE.attribute("The Cat sat.", by="word")
    assert a.text == "the cat sat " and a.sources == ["<h0>", "the", " ", "cat", " ", "sat", " "]
    assert a.input_offsets.tolist() == list(range(12)) and a.normalization["changed"] == 3
    assert json.loads(json.dumps(a.to_json()))["normalization"]["normalizer"] == "text8-v1"


def test_ids_are_never_normalised():
    ids = A8.encode("the cat")
    r = ENGINE.score(ids)
    assert r.chars == 7 and r.normalization["normalizer"] == "ids"
