"""Packed batches (engine/packed.py) and the one pipeline (engine/batches.py): a batch's texts in one
array reach the kernels without a join, a selection of texts over the same ids scores as the texts
themselves, chunk cuts made for every text at once equal the cuts of ``np.linspace`` text by text,
and results come back as one flat array whose views are each text's bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isan.engine.batches import score_batches
from isan.engine.corpus.scoring import DocScorer
from isan.engine.kernels.chunked import ChunkRows, score_texts_chunked
from isan.engine.packed import Packed, PackedBits, narrow_ids
from tolerances import default_model_tolerance as tol


def linspace_cuts(lens, chunks):
    """The cuts of each text as ChunkRows made them one text at a time (the reference)."""
    base = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    text, start, length = [], [], []
    for i, (n, P) in enumerate(zip(lens, chunks)):
        cuts = np.linspace(0, n, max(P, 1) + 1).round().astype(np.int64)
        for a, b in zip(cuts[:-1], cuts[1:]):
            if b > a:
                text.append(i)
                start.append(base[i] + a)
                length.append(b - a)
    return np.array(text, np.int64), np.array(start, np.int64), np.array(length, np.int64)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 100_000), st.integers(1, 300)), min_size=1, max_size=20))
def test_chunk_cuts_for_every_text_at_once_equal_linspace_text_by_text(texts):
    lens, chunks = [n for n, _ in texts], [p for _, p in texts]
    rows = ChunkRows.cut(Packed.from_lengths(np.zeros(sum(lens), np.uint8), lens), chunks)
    text, start, length = linspace_cuts(lens, chunks)
    np.testing.assert_array_equal(rows.text, text)
    np.testing.assert_array_equal(rows.start, start)
    np.testing.assert_array_equal(rows.length, length)
    assert rows.first.sum() == len(lens)


def test_a_packed_batch_keeps_its_texts_and_a_selection_shares_the_ids():
    texts = [np.array([1, 2, 3]), np.array([4]), np.array([5, 6])]
    p = Packed.of(texts)
    assert p.ids.dtype == np.uint8 and p.chars == 6 and p.is_dense()
    assert [t.tolist() for t in p.texts()] == [[1, 2, 3], [4], [5, 6]]
    sel = p.take([2, 0])
    assert sel.ids is p.ids and not sel.is_dense()
    d = sel.dense(np.int32)
    assert d.ids.dtype == np.int32 and d.ids.tolist() == [5, 6, 1, 2, 3] and d.is_dense()
    assert narrow_ids(np.array([0, 300])).dtype == np.int32
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        p.check_ids(4)
    bits = PackedBits(np.arange(6.0), p.start, p.length)
    assert len(bits) == 3 and bits[2].tolist() == [4.0, 5.0] and bits[-1].tolist() == [4.0, 5.0]
    assert bits.totals().tolist() == [3.0, 3.0, 9.0]
    with pytest.raises(IndexError):
        bits[3]


def test_a_selection_of_texts_scores_as_the_texts_themselves(default_engine, text8_test):
    """The corpus's batches: documents picked out of a part's ids (no copy) score as the same
    documents given one by one, bit for bit (the same rows of the same kernel), per character and
    in total."""
    eng = default_engine
    ids = eng.encode(text8_test[:40_000])
    lens = [300, 3000, 17, 5000, 1200]
    part = Packed.from_lengths(ids[: sum(lens)], lens)
    pick = [3, 0, 4]
    texts = [part.text(j).astype(np.int64) for j in pick]
    plan = eng.plan([len(t) for t in texts], chunks=[max(1, len(t) // eng.min_chunk()) for t in texts])
    want, fin_want, _, _ = score_texts_chunked(plan, texts, eng.params.h0)
    got, fin_got, _, _ = score_texts_chunked(plan, part.take(pick), eng.params.h0)
    assert isinstance(got, PackedBits)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(fin_got, fin_want)
    (res,) = score_batches(eng, [(part.take(pick), None)], "totals", chunks="own", kernel=eng.route(0).kernel)
    per_char = [float(w.sum()) for w in want]
    np.testing.assert_allclose(res.values, per_char, rtol=1e-12)  # summed in another order


def batches_one_at_a_time(lengths, batch_chars):
    """The corpus's batches as they were cut one document at a time (the reference)."""
    order = sorted(range(len(lengths)), key=lambda j: -int(lengths[j]))
    out, batch, size = [], [], 0
    for j in order:
        batch.append(j)
        size += int(lengths[j])
        if size >= batch_chars:
            out.append(batch)
            batch, size = [], 0
    if batch:
        out.append(batch)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=60), st.integers(1, 20_000))
def test_the_corpus_batches_equal_cutting_one_document_at_a_time(lengths, batch_chars):
    scorer = DocScorer.__new__(DocScorer)
    scorer.batch_chars = batch_chars
    got = [b.tolist() for b in scorer.batches_of(np.array(lengths, dtype=np.int64))]
    assert got == batches_one_at_a_time(lengths, batch_chars)


def test_rows_made_from_columns_equal_fill_row(default_engine, text8_test):
    """A part's rows, made from columns of report counts, are the rows fill_row makes of each
    document's report: the same keys in the same order, the same values and types."""
    from isan.engine.corpus.prepared import empty_row, fill_row
    from isan.engine.corpus.readers import Doc

    texts = ["The Cat sat, in 1984!", "  plain text8 here ", "Ελλάδα café\tx", text8_test[:3000], "é" * 40,
             "A" + text8_test[5000:7100]]
    docs = [Doc(i, f"d{i}", t) for i, t in enumerate(texts)]
    scorer = DocScorer(default_engine)
    p = scorer.prepare(docs)
    rows = scorer.score_prepared(p)
    for j, k in enumerate(p.short):
        want = fill_row(empty_row(p.docs[k]), p.reports[j], rows[k]["chars_scored"], rows[k]["bits"])
        assert list(rows[k].items()) == list(want.items())
        assert all(type(rows[k][x]) is type(want[x]) for x in want)
    assert len(p.short) == len(texts)


def test_overlapping_texts_each_get_their_own_bits(default_engine, text8_test):
    """Texts of one batch that share characters (overlapping windows of one array, one text twice
    from two states) each get their own bits, as each scored alone: the same bytes on the CPU
    kernels (a row's arithmetic is its own), within twice the derived float32 tolerance on the torch
    pipeline (its products are grouped by symbol over the batch's rows, two float32 computations)."""
    ids = default_engine.encode(text8_test[:400]).astype(np.uint8)
    win = Packed(ids, np.array([0, 50, 50]), np.array([300, 300, 120]))
    h = np.stack([default_engine.params.h0] * 2 + [default_engine.params.h0 * 0.5])
    torch_eng = pytest.importorskip("torch") and type(default_engine).load(
        default_engine.source, progress_bar=False, kernels="torch", step="mm")
    for eng in (default_engine, torch_eng):
        (res,) = score_batches(eng, [(win, h)], "bits")
        atol = 0 if eng is default_engine else tol().twice().bits
        for i in range(3):
            alone, _, _ = eng.score_ids([win.text(i)], h[i][None], chunks="none")
            np.testing.assert_allclose(res.values[i], alone[0], rtol=0, atol=atol)


def test_a_corpus_total_is_engine_scores_with_or_without_per_character_bits(default_engine, text8_test):
    """A document under two chunks scores in a corpus exactly as Engine.score on the corpus path
    scores it (numpy's sum of its bits), whether its per-character bits are kept or not."""
    from isan.engine.corpus.readers import Doc
    from isan.engine.corpus.scoring import ScoreOptions, corpus_path

    texts = [text8_test[s : s + n] for s, n in ((0, 700), (900, 1500), (3000, 40), (5000, 2000))]
    docs = [Doc(i, f"d{i}", t) for i, t in enumerate(texts)]
    plain = DocScorer(default_engine)
    kept = DocScorer(default_engine, ScoreOptions(per_char_max=10_000))
    a, b = plain.score(docs), kept.score(docs)
    for t, ra, rb in zip(texts, a, b):
        want = default_engine.score(t, path=corpus_path(default_engine)).bits
        assert ra["bits"] == rb["bits"] == want


def test_bad_arguments_are_clear_errors(default_engine):
    ids = [default_engine.encode("the cat "), default_engine.encode("sat ")]
    with pytest.raises(ValueError, match="want_bits"):
        default_engine.score_ids(ids, np.tile(default_engine.params.h0, (2, 1)), want_bits="x")
    with pytest.raises(ValueError, match=r"hs must be \(2, 216\) or \(216,\)"):
        default_engine.score_ids(ids, np.tile(default_engine.params.h0, (1, 1)))
    (res,) = score_batches(default_engine, [((t for t in ids), None)])  # texts as any iterable
    assert res.values.shape == (2,)
