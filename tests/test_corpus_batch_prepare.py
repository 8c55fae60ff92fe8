"""A part's documents prepared together (engine/corpus/batch_prepare.py, prepare_docs) give what
one ``prepare`` call a document gives: the same ids, offsets in the input and reports, to the last
bit, for text8 and none, every unknown policy, digits, squeezed spaces, text past U+00FF, a
byte-order mark, empty and long documents; JSON lines read by orjson as the standard library reads
them; a part through shared memory and back."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from isan.alphabet import Alphabet
from isan.engine.corpus import batch_prepare
from isan.engine.corpus.prepared import PreparedDocs, TextPreparer, empty_row, error_message, fill_row, prepare_docs
from isan.engine.corpus.readers import Doc
from isan.engine.normalize import NONE, TEXT8_V1, prepare
from isan.errors import IsanError

#: characters the random texts are drawn from: spaces and breaks to squeeze, digits to spell out,
#: capitals, punctuation, a "?" (what a character past U+00FF is encoded as), Latin-1 and wider
CHARS = list(" \n\t  abcXYZ0123456789.,?\u00e9\u00ff\u2013\u4e16\U0001F600\ufeff")


def random_texts(rng, n: int, longest: int = 40) -> list[str]:
    return ["".join(rng.choice(CHARS, int(rng.integers(1, longest)))) for _ in range(n)]


def steps_of(batch, j: int) -> np.ndarray:
    """Text j's offsets' steps (the first from 0), dense, from the batch's sparse ones."""
    start, n = int(batch.lengths[:j].sum()), int(batch.lengths[j])
    step = np.ones(n, dtype=np.int64)
    k = (batch.steps_at >= start) & (batch.steps_at < start + n)
    step[batch.steps_at[k] - start] = batch.steps[k]
    return step


def tops(top: tuple, j: int) -> list[dict]:
    t, c, n = top
    return [{"char": chr(int(cc)), "count": int(nn)} for tt, cc, nn in zip(t, c, n) if tt == j]


def check_texts(texts: list[str], normalizer, alphabet) -> np.ndarray:
    """prepare_texts against prepare, text by text; returns which texts it took."""
    taken, batch = batch_prepare.prepare_texts(texts, normalizer.id, batch_prepare.id_table(alphabet))
    done = 0
    for i in np.flatnonzero(taken):
        want = prepare(texts[i], alphabet, normalizer)
        n = int(batch.lengths[done])
        start = int(batch.lengths[:done].sum())
        np.testing.assert_array_equal(batch.ids[start : start + n], want.ids)
        np.testing.assert_array_equal(steps_of(batch, done), np.diff(want.offsets, prepend=0))
        r = want.report
        assert batch.counts[done].tolist() == [r["chars_read"], r["chars_scored"], r["changed"], r["dropped"]]
        assert tops(batch.changed_top, done) == r["most_changed"] and tops(batch.dropped_top, done) == r["most_dropped"]
        assert batch.normalizer == r["normalizer"] and r["skipped"] == r["replaced"] == 0
        done += 1
    assert batch is None or done == len(batch.lengths) == len(batch.counts)
    return taken


@pytest.mark.parametrize("pass_chars", [1 << 19, 40])
def test_texts_prepared_together_are_prepared_one_by_one(monkeypatch, pass_chars):
    """text8 and none, in one pass and in many (a text never cut): ids, steps, counts and the
    most changed and dropped characters of each text as ``prepare`` gives them."""
    monkeypatch.setattr(batch_prepare, "PASS_CHARS", pass_chars)
    rng = np.random.default_rng(7)
    text8, letters = Alphabet.text8(), Alphabet(tuple(" abcdefghijklmnopqrstuvwxyz.,"))
    for _ in range(60):
        texts = random_texts(rng, int(rng.integers(1, 30)))
        texts = [t.lstrip("\ufeff") or "a" for t in texts]  # a text that starts with a BOM is prepare's
        assert check_texts(texts, TEXT8_V1, text8).all()
        taken = check_texts(texts, NONE, letters)
        assert taken.tolist() == [t.isascii() and set(t) <= set(letters.symbols) for t in texts]
    edge = ["1", " ", "  ", "a", " 1 ", "11", "1 1", " a", "a ", "9 ", " \n\t 7", "x" * 3000 + "  " * 700]
    assert check_texts(edge, TEXT8_V1, text8).all()


def test_an_alphabet_without_text8_is_left_to_prepare():
    """text8 into an alphabet that lacks some of its characters, or a token alphabet: nothing taken."""
    taken, batch = batch_prepare.prepare_texts(["abc"], "text8-v1", batch_prepare.id_table(Alphabet(tuple("abc "))))
    assert not taken.any() and batch is None
    assert batch_prepare.id_table(Alphabet(tuple(chr(0x100 + i) for i in range(300)))) is None


def one_by_one(preparer, docs: list[Doc], normalize="auto", unknown="error", replacement=None, row_max_chars=65_536):
    """What prepare_docs gave before it prepared documents together: one prepare call a document."""
    out = PreparedDocs(docs=[None] * len(docs), rows=[None] * len(docs))
    ids, steps = [], []
    for k, doc in enumerate(docs):
        bare = Doc(doc.index, doc.id, error=doc.error, chars=doc.chars, file_pos=doc.file_pos)
        if doc.error is not None or doc.text is None or len(doc.text) > 2 * row_max_chars + 16:
            out.docs[k], out.rows[k] = (bare, empty_row(doc)) if doc.error is not None else (doc, None)
            out.long += [] if doc.error is not None else [k]
            continue
        try:
            p = preparer.prepare(doc.text, normalize, unknown, replacement)
        except IsanError as e:
            out.docs[k], out.rows[k] = bare, empty_row(doc, error_message(e))
            continue
        if len(p.ids) == 0:
            row = fill_row(empty_row(doc, "EmptyTextError: the document is empty" + (" after normalisation" if doc.text
                                                                                     else "")), p.report, 0, 0.0)
            row["bpc"] = None
            out.docs[k], out.rows[k] = bare, row
        elif len(p.ids) > row_max_chars:
            out.docs[k] = doc
            out.long.append(k)
        else:
            out.docs[k] = bare
            out.short.append(k)
            ids.append(p.ids)
            steps.append(np.diff(p.offsets, prepend=0))
            out.reports.append(p.report)
    if ids:
        c, s = np.concatenate(ids), np.concatenate(steps)
        out.ids = c.astype(np.uint8) if c.min() >= 0 and c.max() <= 255 else c
        at = np.flatnonzero(s != 1)
        out.steps_at, st = at.astype(np.int32), s[at]
        out.steps = st.astype(np.uint8) if st.size and 0 <= st.min() and st.max() <= 255 else st.astype(np.int64)
    out.bounds = np.cumsum([0] + [len(x) for x in ids], dtype=np.int64)
    return out


def assert_same(got: PreparedDocs, want: PreparedDocs) -> None:
    assert got.docs == want.docs and got.rows == want.rows and got.long == want.long and got.short == want.short
    for f in ("ids", "bounds", "steps_at", "steps"):
        g, w = getattr(got, f), getattr(want, f)
        assert g.dtype == w.dtype and np.array_equal(g, w), f
    assert len(got.reports) == len(want.reports) and list(got.reports) == list(want.reports)
    assert got.rows_without_bits() == want.rows_without_bits()


@pytest.fixture(scope="module")
def preparer():
    from isan.engine.corpus.parts import load_corpus_engine

    return TextPreparer.of(load_corpus_engine(None))


@pytest.mark.parametrize("normalize", ["auto", "none"])
@pytest.mark.parametrize("unknown", ["error", "skip", "replace"])
def test_a_part_prepared_together_is_prepared_one_by_one(preparer, text8_test, normalize, unknown):
    """Errors, a document too long to read as a row, one too long after its digits are spelled out,
    empty ones, a byte-order mark, text past Latin-1 and short ones, mixed: the same part, to the
    dtypes of its arrays, and the same after pickling (as it travels)."""
    rng = np.random.default_rng(11)
    docs = [Doc(0, "a", text8_test[:5000]), Doc(1, "bad", error="ValueError: not JSON"),
            Doc(2, "long", text8_test[:140_000]), Doc(3, "e", ""), Doc(4, "m", "Hello World 12 \u00e9t\u00e9"),
            Doc(5, "bom", "\ufeffHi there 7"), Doc(6, "digits", "12 " * 30_000), Doc(7, "x", text8_test[7000:7100]),
            Doc(8, "spaces", "   "), Doc(9, "ones", "1" * 70_000)]
    docs += [Doc(10 + i, f"r{i}", t) for i, t in enumerate(random_texts(rng, 40, 300))]
    replacement = " " if unknown == "replace" else None
    want = one_by_one(preparer, docs, normalize, unknown, replacement)
    got = prepare_docs(preparer, docs, normalize, unknown, replacement)
    assert_same(got, want)
    assert_same(pickle.loads(pickle.dumps(got, protocol=5)), want)
    if normalize == "auto":
        assert got.long == [2, 6, 9] and got.ids.dtype == np.uint8


def test_orjson_reads_lines_as_the_standard_library(tmp_path):
    """Lines orjson reads otherwise than json (integers past 64 bits, NaN, lone surrogates, deep
    nesting, bad UTF-8, a BOM) come out as json reads them: the same documents and errors."""
    from isan.engine.corpus import readers

    lines = [b'{"id": 1, "text": "plain"}', b'{"id": 123456789012345678901234567890, "text": "big id"}',
             b'{"id": -9223372036854775809, "text": "x"}', b'{"id": 18446744073709551615, "text": "u64"}',
             b'{"id": 1e20, "text": "float id"}', b'{"id": 0.5, "text": "half", "score": 1e400}',
             b'{"id": NaN, "text": "nan"}', b'{"text": "\\ud800 lone"}', b'{"text": "\\ud83d\\ude00 pair"}',
             b'{"text": "bad \xff utf8"}', b'\xef\xbb\xbf{"text": "bom"}', b'{"text": "a\x01b"}', b'[1, 2]',
             b'{"meta": ' + b"[" * 150 + b"]" * 150 + b', "text": "deep"}', b'{"a": 1, "a": 2, "text": "dup"}',
             b'{"id": -0.0, "text": "neg zero"}', b'{"id": ' + b"9" * 5000 + b', "text": "digits"}',
             b'{"text": 5}', b'{"id": {"x": [1, 2.5, null, true]}, "text": "nested id"}', b'{"txt": "no field"}']
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    got = list(readers.read_jsonl(str(path)))
    fast, readers.orjson = readers.orjson, None  # the standard library alone
    try:
        want = list(readers.read_jsonl(str(path)))
    finally:
        readers.orjson = fast
    assert fast is not None and got == want
    assert [d.id for d in got[:5]] == ["1", "123456789012345678901234567890", "-9223372036854775809",
                                       "18446744073709551615", "1e+20"]
    assert json.loads(lines[0])["text"] == got[0].text


def test_a_part_through_shared_memory(preparer, text8_test):
    """put then take: the same part, its arrays writable; the block is gone after, and
    remove_blocks removes a job's blocks that nobody took."""
    from isan.engine.corpus import shared_parts

    docs = [Doc(i, f"d{i}", text8_test[i * 500 : i * 500 + 400 + i]) for i in range(30)] + [Doc(30, "m", "Mixed 42 caf\u00e9")]
    part = prepare_docs(preparer, docs)
    prefix = shared_parts.job_prefix()
    size = shared_parts.put(("p.parquet", part, None), prefix + "1")
    assert size >= part.ids.nbytes and shared_parts.count_blocks(prefix) == 1
    path, back, file_error = shared_parts.take(prefix + "1")
    assert path == "p.parquet" and file_error is None and shared_parts.count_blocks(prefix) == 0
    assert_same(back, part)
    assert back.ids.flags.writeable and back.bounds.flags.writeable
    for k in range(3):
        shared_parts.put(part, f"{prefix}{k + 2}")
    assert shared_parts.remove_blocks(prefix) == 3 and shared_parts.count_blocks(prefix) == 0
    with pytest.raises(FileNotFoundError):
        shared_parts.take(prefix + "2")
