"""The torch backend's float64 results are the same bytes whatever torch's thread count, the
machine's load and the other documents of a batch: its products are exact (the error-free
splitting of :mod:`isan.engine.kernels.torch.ozaki`), so no GEMM's order of summation shows.

A BLAS GEMM (MKL in torch's x86 builds) rounds a row differently in a call of 3 rows and one of 4,
at another alignment, or with another number of threads; before the exact products, the same
documents scored with 1 and 2 torch threads differed in the last bits of many characters' bits.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from isan.engine.kernels.torch import ozaki  # noqa: E402

EPS64 = np.finfo(np.float64).eps


@pytest.fixture(scope="module")
def weights(default_engine):
    """(WT of one symbol (217, 217), RoT (217, 27)) of the shipped model, float64 (widened float32)."""
    m = default_engine.stream_model()
    d, V = m.d, m.V
    return (torch.from_numpy(m.WT[3, : d + 1, : d + 1].astype(np.float64)),
            torch.from_numpy(m.RoT[: d + 1, :V].astype(np.float64)))


@pytest.fixture(scope="module")
def states(default_engine, text8_valid_head):
    """(64, 217) float64: the model's states [h, 1] along real text (each row a character's),
    with a row of zeros, one of tiny values and one of large ones, as the runner's error rows have."""
    from isan.engine.reference import score_ref

    eng = default_engine
    p = eng.params.astype(np.float64)
    ids = eng.encode(text8_valid_head[:2000]).astype(np.int64)
    hs = []
    h = p.h0.copy()
    for x in ids[:61]:
        hs.append(h.copy())
        h = score_ref(p, np.array([x]), h)[1]
    hs = np.array(hs)
    rows = np.concatenate([hs, np.zeros((1, eng.d)), 1e-30 * hs[:1], 1e3 * hs[1:2]])
    one = np.ones((64, 1))
    one[61:63] = 0.0  # error rows (the correction pass's) have 0 there
    return torch.from_numpy(np.concatenate([rows, one], axis=1))


def _threads(n: int):
    """A context that runs torch with ``n`` intra-op threads and restores the count after."""
    class _T:
        def __enter__(self):
            self.was = torch.get_num_threads()
            torch.set_num_threads(n)

        def __exit__(self, *exc):
            torch.set_num_threads(self.was)

    return _T()


def test_pieces_are_whole_units_and_sum_back(states, weights):
    """Each piece of a row is a whole number of its unit, 2^(e - i s) (max |row| < 2^e), of at most
    2^s units; the row minus its pieces is under half a unit of the last; the same for columns."""
    s, t = ozaki.piece_bits(217)
    assert s + t + math.ceil(math.log2(217)) <= 53
    for x, dim, n, bits in ((states, 1, ozaki.LEFT_PIECES, s), (weights[0], 0, ozaki.RIGHT_PIECES, t)):
        pieces = [p.numpy() for p in ozaki._split(x, dim, n, bits).unbind(dim)]
        xn = x.numpy()
        e = np.maximum(np.frexp(np.abs(xn).max(axis=dim, keepdims=True))[1], -900)  # max |x| < 2^e
        for i, piece in enumerate(pieces, 1):
            units = np.ldexp(piece, i * bits - e)
            assert np.array_equal(units, np.round(units)) and np.abs(units).max() <= 2.0 ** bits
        rest = xn - sum(pieces)
        assert (np.abs(rest) <= np.ldexp(0.5, e - n * bits)).all()


def test_product_is_exact_a_product_of_pieces(states, weights):
    """Every entry equals the exact sum (fractions) of the products of the pieces, then the six
    exact partial products added smallest first: nothing a GEMM rounded."""
    W = weights[0]
    a = states[:5]
    P = ozaki.split_left(a).view(-1, a.shape[1]) @ ozaki.split_right(W)
    n = W.shape[1]
    L, R = ozaki._split(a, 1, ozaki.LEFT_PIECES, ozaki.piece_bits(217)[0]), \
        ozaki._split(W, 0, ozaki.RIGHT_PIECES, ozaki.piece_bits(217)[1])
    for r in range(5):
        for c in (0, 7, 100, 216):
            for i in range(ozaki.LEFT_PIECES):
                for j in range(ozaki.RIGHT_PIECES):
                    exact = sum(Fraction(float(u)) * Fraction(float(v)) for u, v in zip(L[r, i], R[j, :, c]))
                    assert Fraction(float(P[r * ozaki.LEFT_PIECES + i, j * n + c])) == exact


def test_product_within_float64_rounding_of_the_true_product(states, weights):
    """``matmul`` is within its bound of the exact product (fractions): the pieces' remainders,
    2^-3s of a row's largest magnitude times the column's sum of magnitudes and 2^-2t of a column's
    largest times the row's, plus the six additions' rounding, 8 eps of the sum of |terms|."""
    s, t = ozaki.piece_bits(217)
    for W in weights:
        got = ozaki.matmul(states, ozaki.split_right(W))
        for r in (0, 30, 60, 61, 62, 63):
            a = states[r]
            for c in (0, 5, W.shape[1] - 1):
                terms = [Fraction(float(u)) * Fraction(float(v)) for u, v in zip(a, W[:, c])]
                exact = sum(terms)
                bound = (2.0 ** (-3 * s) * float(a.abs().max()) * float(W[:, c].abs().sum())
                         + 2.0 ** (-2 * t) * float(W[:, c].abs().max()) * float(a.abs().sum())
                         + 8 * EPS64 * float(sum(abs(x) for x in terms)))
                assert abs(float(Fraction(float(got[r, c])) - exact)) <= bound


@pytest.mark.parametrize("which", [0, 1], ids=["step", "readout"])
def test_rows_same_bytes_in_any_call_and_thread_count(states, weights, which):
    """A row's product is the same bytes in calls of any number of rows, at any offset, with 1 or
    2 threads (a BLAS GEMM's rounding changes with each of these)."""
    Ws = ozaki.split_right(weights[which])
    big = states.repeat(4, 1)  # 256 rows
    with _threads(1):
        ref = ozaki.matmul(big, Ws)
    for threads in (1, 2):
        with _threads(threads):
            for rows in (1, 3, 4, 17, 64, 255):
                for off in (0, 1, 3):
                    got = ozaki.matmul(big[off : off + rows].clone(), Ws)
                    assert torch.equal(got, ref[off : off + rows]), (threads, rows, off)


def test_nonfinite_row_stays_nonfinite_alone(states, weights):
    Ws = ozaki.split_right(weights[1])
    a = states[:6].clone()
    a[2, 5] = float("nan")
    a[4, 0] = float("inf")
    got = ozaki.matmul(a, Ws)
    assert not bool(torch.isfinite(got[2]).any()) and not bool(torch.isfinite(got[4]).all())
    keep = [0, 1, 3, 5]
    assert torch.equal(got[keep], ozaki.matmul(a[keep], Ws))


# ---- the runner: documents of real text, scored in float64 on torch's CPU device


@pytest.fixture(scope="module")
def engine64():
    from isan.engine import Engine, default_model_path

    return Engine.load(default_model_path(), progress_bar=False, device="cpu", dtype="float64")


@pytest.fixture(scope="module")
def docs(engine64, text8_valid_head):
    """Ids of 7 documents of text8 (40 to 2,700 characters: the longest cut in two chunks, so the
    correction pass runs too)."""
    text = text8_valid_head
    cuts = np.cumsum([0, 2700, 40, 700, 90, 1300, 333, 61])
    return [engine64.encode(text[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def _score(eng, docs, order=None, batches=1, threads=1):
    """Each document's bits, scored in ``batches`` batches in ``order``, with ``threads`` torch
    threads; each document cut by its own length alone (as a corpus job cuts it)."""
    order = list(range(len(docs))) if order is None else order
    out = [None] * len(docs)
    with _threads(threads):
        for part in np.array_split(np.array(order), batches):
            ids = [docs[i] for i in part]
            h0 = np.tile(eng.params.h0, (len(ids), 1))
            chunks = [max(1, len(x) // eng.min_chunk()) for x in ids]
            bits, _, _ = eng.score_ids(ids, h0, chunks=chunks)
            for i, b in zip(part, bits):
                out[i] = np.array(b, dtype=np.float64)
    return out


def test_float64_documents_same_bytes_whatever_threads_and_batch(engine64, docs):
    """The same documents give the same bytes (each character's float64 bits, and the JSON of the
    totals a corpus job writes) with 1 or 2 torch threads, in one batch or three, in any order."""
    assert max(len(x) // engine64.min_chunk() for x in docs) >= 2  # chunks and corrections ran
    ref = _score(engine64, docs)
    runs = {"2 threads": _score(engine64, docs, threads=2),
            "3 batches, reversed, 2 threads": _score(engine64, docs, order=list(range(len(docs)))[::-1], batches=3,
                                                     threads=2),
            "1 thread again": _score(engine64, docs)}
    for name, got in runs.items():
        for i, (a, b) in enumerate(zip(ref, got)):
            assert np.array_equal(a.view(np.int64), b.view(np.int64)), f"{name}: document {i}"
        assert json.dumps([float(b.sum()) for b in got]) == json.dumps([float(b.sum()) for b in ref])


def test_float64_totals_same_bytes_whatever_threads_and_batch(engine64, text8_valid_head):
    """Each document's total bits reduced by the runner itself (``want_bits="totals"``: one row a
    document, its bits added step by step) are the same bytes in any batch, order and thread count."""
    lens = np.random.default_rng(7).integers(1, 200, 30)
    cuts = np.cumsum(np.r_[0, lens])
    docs = [engine64.encode(text8_valid_head[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]

    def totals(order, batches, threads):
        out = [None] * len(docs)
        with _threads(threads):
            for part in np.array_split(np.array(order), batches):
                ids = [docs[i] for i in part]
                vals, _, _ = engine64.score_ids(ids, np.tile(engine64.params.h0, (len(ids), 1)), chunks="none",
                                                want_bits="totals")
                for i, v in zip(part, vals):
                    out[i] = float(v)
        return json.dumps(out)

    order = list(range(len(docs)))
    ref = totals(order, 1, 1)
    assert totals(order, 1, 2) == ref
    assert totals(order[::-1], 4, 1) == ref
