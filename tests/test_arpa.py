"""The n-gram model exported as ARPA (the format KenLM and SRILM read) gives the model's own
probabilities under a backoff reader: our plain-Python reader always, and KenLM's where its
Python module is installed (the dev extra installs it)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from isan.alphabet import Alphabet
from isan.train.ngram import fit, save_ngram
from isan.export.arpa import arpa_bits, arpa_words, read_arpa, symbol_words, write_arpa
from tolerances import U32, gamma

#: ARPA writes log10 p and log10 backoff with 7 decimals: each within half a unit of the 7th decimal
DIGITS = 0.5e-7


def tolerance(order: int, table: dict, float32: bool = False) -> float:
    """Bits of a character read through a backoff chain of at most ``order`` written terms (a probability and
    the backoff weights of the contexts left): each term's 7 decimals; with ``float32`` (KenLM), each term
    also stored as a float32 (u32) and the chain summed in float32 (Higham's gamma(order)), relative to the
    largest term's magnitude M among the symbols' n-grams."""
    tol = order * DIGITS
    if float32:
        M = max(max(abs(lp), abs(bo)) for g, (lp, bo) in table.items() if not any(w.startswith("<") for w in g))
        tol += order * M * (U32 + gamma(order))
    return tol * float(np.log2(10.0))


@pytest.fixture(scope="module")
def model(text8_path):
    from isan.data import read_text8_split

    a = Alphabet.text8()
    train = read_text8_split(text8_path, "train")[:400_000]
    return fit(a.encode(train), 27, 5), a


@pytest.fixture(scope="module")
def arpa_file(model, tmp_path_factory):
    m, a = model
    path = tmp_path_factory.mktemp("arpa") / "m.arpa"
    info = write_arpa(m, a, path)
    assert info["order"] == 5 and info["ngrams"][0] == 27 + 3  # every symbol, plus <s> </s> <unk>
    return path


def test_arpa_backoff_equals_model(model, arpa_file, text8_test):
    m, a = model
    text = text8_test[:4000]
    order, table = read_arpa(arpa_file)
    assert order == 5
    got = arpa_bits(order, table, arpa_words(text))
    np.testing.assert_allclose(got, m.bits(a.encode(text)), atol=tolerance(order, table), rtol=0)


def test_arpa_lists_every_context(arpa_file):
    """A backoff reader finds each listed n-gram's context one order down (KenLM needs it)."""
    order, table = read_arpa(arpa_file)
    for gram in table:
        if len(gram) > 1:
            assert gram[:-1] in table, gram


def test_arpa_text_that_needs_backoff(model, arpa_file):
    """Unseen contexts back off through the weights: 'qqqq' and 'zxzx' are not in the counts."""
    m, a = model
    text = "the qqqq zxzx jjj"
    order, table = read_arpa(arpa_file)
    np.testing.assert_allclose(arpa_bits(order, table, arpa_words(text)), m.bits(a.encode(text)),
                               atol=tolerance(order, table), rtol=0)


def test_kenlm_reads_our_arpa(model, arpa_file, text8_test):
    kenlm = pytest.importorskip("kenlm")
    m, a = model
    lm = kenlm.Model(str(arpa_file))
    text = text8_test[4000:8000]
    s, s2 = kenlm.State(), kenlm.State()
    lm.NullContextWrite(s)
    got = []
    for w in arpa_words(text):
        got.append(-lm.BaseScore(s, w, s2) * np.log2(10.0))
        s, s2 = s2, s
    np.testing.assert_allclose(got, m.bits(a.encode(text)), atol=tolerance(*read_arpa(arpa_file), float32=True), rtol=0)


def test_symbol_words_rejects_ambiguous_alphabets():
    from isan.errors import IsanError

    assert symbol_words(" ab") == ["_", "a", "b"]
    with pytest.raises(IsanError):
        symbol_words(" _a")
    with pytest.raises(IsanError):
        symbol_words("\ta")


def test_cli_export_arpa(model, tmp_path):
    m, a = model
    bundle = save_ngram(m, tmp_path / "ngram", a)
    out = tmp_path / "model.arpa"
    r = subprocess.run([sys.executable, "-m", "isan.cli", "export", str(bundle), str(out), "--arpa"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["order"] == 5 and out.is_file() and info["bytes"] == out.stat().st_size
    again = subprocess.run([sys.executable, "-m", "isan.cli", "export", str(bundle), str(out), "--arpa"],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "--overwrite" in again.stderr
