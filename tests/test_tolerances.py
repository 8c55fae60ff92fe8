"""The derived float tolerances (tests/tolerances.py): they hold for a plain float32 computation of the
default model (and of the recurrent baselines) on real text, in two summation orders, and they fail a
computation that is less exact than float32 (matrices rounded to float16), so the tests that use them can
fail; Higham's worst case holds for a short scan in two orders and for one inner product (float32, TF32x3),
which a single TF32 product or float16 weights exceed; each character's own tolerance and a decaying scan's
relative one hold too."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tolerances import (TF32X3_U, U32, U64, F32Tolerance, baseline_float32_tolerance, float64_sums_tolerance, gamma,
                        inner_product_worst_case, isan_float32_bits_tolerances, isan_float32_relative_state_tolerance,
                        isan_float32_tolerance, isan_worst_case, lam, readout_tolerance)
from tolerances import engine_float32_tolerance, engine_ids_tolerance, next_char_tolerance

CHARS = 5_000


def _bits32(W, b, W_ro, b_ro, h0, ids, order: str) -> tuple[np.ndarray, np.ndarray]:
    """Float32 scoring, one character a step, the step's sums in BLAS's order or one term at a time."""
    h = h0.astype(np.float32)
    bits = np.empty(len(ids), np.float32)
    for t, x in enumerate(ids):
        logits = W_ro @ h + b_ro
        m = logits.max()
        bits[t] = (np.log(np.exp(logits - m).sum()) + m - logits[x]) / np.float32(math.log(2.0))
        if order == "blas":
            h = W[x] @ h + b[x]
        else:  # left to right, column after column (another machine's order)
            acc = b[x].copy()
            for j in range(len(h)):
                acc += W[x][:, j] * h[j]
            h = acc
    return bits, h


@pytest.fixture(scope="module")
def case(default_engine, text8_test):
    p = default_engine.params
    ids = default_engine.encode(text8_test[:CHARS]).astype(np.int64)
    W, b, W_ro, b_ro, h0 = (np.asarray(getattr(p, k), np.float64) for k in ("W", "b", "W_ro", "b_ro", "h0"))
    ref = default_engine.with_path("reference").score(text8_test[:CHARS], per_char=True).per_char_bits
    return (W, b, W_ro, b_ro, h0), ids, np.asarray(ref), isan_float32_tolerance(W, b, W_ro, b_ro, h0, ids)


@pytest.mark.parametrize("order", ["blas", "sequential"])
def test_float32_scoring_is_within_the_derived_tolerance(case, order):
    params, ids, ref, tol = case
    bits, _ = _bits32(*(a.astype(np.float32) for a in params), ids, order)
    assert float(np.abs(bits - ref).max()) <= tol.bits
    assert abs(float(bits.astype(np.float64).sum() - ref.sum())) <= tol.total_bits


def test_float16_matrices_exceed_it(case):
    """The tolerance is not vacuous: rounding W to float16 (about 5e-4 relative) is caught."""
    (W, b, W_ro, b_ro, h0), ids, ref, tol = case
    W16 = W.astype(np.float16).astype(np.float32)
    bits, _ = _bits32(W16, *(a.astype(np.float32) for a in (b, W_ro, b_ro, h0)), ids, "blas")
    assert float(np.abs(bits - ref).max()) > tol.bits


def test_bounds_and_their_algebra():
    assert gamma(1) == pytest.approx(U32 / (1 - U32))
    assert gamma(10) > 10 * U32
    with pytest.raises(ValueError):
        gamma(2 ** 24)
    assert lam(10) < lam(10 ** 6)  # more outputs, a larger multiplier
    assert 2 * 10 * math.exp(-lam(10) ** 2 / 2) == pytest.approx(1e-9)
    t = F32Tolerance(bits=1e-4, total_bits=1e-2, state=1e-5, chars=1_000)
    assert t.twice().bits == 2e-4 and t.twice().state == 2e-5
    assert t.total(100) == t.total_bits and t.total(4_000) == pytest.approx(2e-2)
    assert t.for_chars(10) is t
    longer = t.for_chars(100_000)
    assert longer.bits > t.bits and longer.total_bits == pytest.approx(0.1) and longer.chars == 100_000


def test_in_precision_scales_by_the_unit_roundoff():
    t = F32Tolerance(bits=1e-4, total_bits=1e-2, state=1e-5, chars=1_000)
    t64 = t.in_precision(U64)
    assert t64.bits == pytest.approx(1e-4 * U64 / U32) and t64.state == pytest.approx(1e-5 * 2.0 ** -29)
    assert t64.chars == 1_000 and t.in_precision(U32) == t


# ---- the recurrent baselines: the same two checks through their nonlinear cells ------------------------
def _baseline(kind: str, input: str = "onehot", d: int = 12, seed: int = 0):
    from isan.engine.baselines.recurrent import baseline_shapes

    cfg = {"kind": kind, "K": 27, "V": 27, "d": d, "input": input, "emb": 5}
    rng = np.random.default_rng(seed)
    return cfg, {n: (rng.normal(size=s) * 0.4).astype(np.float32) for n, s in baseline_shapes(cfg).items()}


def _baseline_bits32(cfg, tensors, ids):
    """The numpy twin run in float32 (its arithmetic follows the dtype), bits and the final flat state."""
    from isan.engine.baselines.recurrent import BaselineParams, baseline_step_ref

    p = BaselineParams.from_tensors(cfg, tensors, dtype=np.float32)
    table, s, bits = p.input_table().astype(np.float32), p.initial_state().astype(np.float32), []
    W_ro, b_ro = p.tensors["W_ro"], p.tensors["b_ro"]
    for x in ids:
        logits = W_ro @ s[:p.d] + b_ro
        m = logits.max()
        bits.append((np.log(np.exp(logits - m).sum()) + m - logits[x]) / np.float32(math.log(2.0)))
        s = baseline_step_ref(p, s, table[x])
        assert s.dtype == np.float32
    return np.array(bits, np.float64), s.astype(np.float64)


@pytest.mark.parametrize("kind, input", [("gru", "onehot"), ("lstm", "embedding"), ("rnn", "onehot")])
def test_baseline_float32_within_its_derived_tolerance_and_float16_not(text8_test, kind, input):
    from isan.alphabet import Alphabet
    from isan.engine.baselines.recurrent import BaselineParams, baseline_score_ref

    ids = Alphabet.text8().encode(text8_test[:2_000])
    cfg, t32 = _baseline(kind, input)
    p64 = BaselineParams.from_tensors(cfg, t32)
    ref, s_ref = baseline_score_ref(p64, ids, p64.initial_state())
    tol = baseline_float32_tolerance(p64, ids)
    bits, s = _baseline_bits32(cfg, t32, ids)
    assert np.abs(bits - ref).max() <= tol.bits and np.abs(s - s_ref).max() <= tol.state
    assert abs(bits.sum() - ref.sum()) <= tol.total_bits
    bits16, _ = _baseline_bits32(cfg, {k: v.astype(np.float16).astype(np.float32) for k, v in t32.items()}, ids)
    assert np.abs(bits16 - ref).max() > tol.bits


# ---- Higham's worst case on a short scan, and the readout from a state within a tolerance --------------
def test_worst_case_holds_for_a_short_float32_scan_in_two_orders(case):
    (W, b, W_ro, b_ro, h0), ids, _, _ = case
    ids = ids[:3]
    h_bound, logits_bound = isan_worst_case(W, b, W_ro, b_ro, h0, ids)
    H = [h0]
    for x in ids:
        H.append(W[x] @ H[-1] + b[x])
    exact = np.array(H[1:])
    for order in ("blas", "sequential"):
        h32 = h0.astype(np.float32)
        for t, x in enumerate(ids):
            if order == "blas":
                h32 = W[x].astype(np.float32) @ h32 + b[x].astype(np.float32)
            else:
                acc = b[x].astype(np.float32)
                for j in range(len(h32)):
                    acc = acc + W[x][:, j].astype(np.float32) * h32[j]
                h32 = acc
            assert (np.abs(h32 - exact[t]) <= h_bound[t]).all()
            logits = W_ro.astype(np.float32) @ h32 + b_ro.astype(np.float32)
            assert (np.abs(logits - (W_ro @ exact[t] + b_ro)) <= logits_bound[t]).all()
    assert (h_bound[0] < 1e-3 * np.abs(exact[0]).max()).all()  # one step: far below the values
    bound = readout_tolerance(W_ro, b_ro, exact, 1e-3)
    assert bound >= np.abs(W_ro).sum(1).max() * 1e-3 > 0


def test_float64_sums_in_any_order_within_the_bound_and_float32_sums_not(case):
    """Real per-character bits summed in float64 pairwise (numpy), left to right and right to left stay
    within float64_sums_tolerance of each other and of the exact sum; the same sum in float32 does not."""
    _, _, ref, _ = case
    exact = math.fsum(ref)
    tol = float64_sums_tolerance(len(ref), exact)
    seq, rev = 0.0, 0.0
    for x, y in zip(ref, ref[::-1]):
        seq, rev = seq + float(x), rev + float(y)
    for a, b in ((float(ref.sum()), seq), (seq, rev), (rev, exact), (float(ref.sum()), exact)):
        assert abs(a - b) <= tol
    assert tol < 1e-9 * exact  # far below the total's float32 rounding (U32 = 6e-8 of it)
    assert abs(float(ref.astype(np.float32).sum(dtype=np.float32)) - exact) > tol


# ---- one inner product, in float32 and in three TF32 products; each character's own tolerance ---------
def _tf32(a: np.ndarray) -> np.ndarray:
    """float32 truncated to TF32 (10 explicit significand bits: the low 13 bits cleared)."""
    return (np.asarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def _tf32x3_dot(A: np.ndarray, h: np.ndarray) -> np.ndarray:
    """``A @ h`` as three TF32 products (hi hi + hi lo + lo hi), each exact in float32, summed in float32."""
    A_hi, h_hi = _tf32(A), _tf32(h)
    A_lo, h_lo = _tf32(A - A_hi), _tf32(h - h_hi)
    return (A_hi @ h_hi + A_hi @ h_lo) + A_lo @ h_hi


def test_inner_product_worst_case_holds_and_a_lesser_product_exceeds_it(case):
    """The default model's step products on states of real text: float32 (BLAS and one term at a time)
    within gamma(n), a TF32x3 emulation within its bound; a single TF32 product (about 1e-3 relative)
    and float16 weights exceed the bounds; the bound stays far below the values."""
    (W, b, W_ro, b_ro, h0), ids, _, _ = case
    h = h0
    for x in ids[:50]:
        h = W[x] @ h + b[x]
    A32, h32 = W[ids[50]].astype(np.float32), h.astype(np.float32)
    A, hh = A32.astype(np.float64), h32.astype(np.float64)
    exact, mag, n = A @ hh, np.abs(A) @ np.abs(hh), len(h)
    own = inner_product_worst_case(n, u=U64) * mag  # the float64 product's own error
    seq = np.zeros(len(exact), np.float32)
    for j in range(n):
        seq += A32[:, j] * h32[j]
    for got in (A32 @ h32, seq):
        assert (np.abs(got - exact) <= inner_product_worst_case(n) * mag + own).all()
    assert (np.abs(_tf32x3_dot(A32, h32) - exact) <= inner_product_worst_case(n, "tf32x3") * mag + own).all()
    assert (np.abs(_tf32(A32) @ _tf32(h32) - exact) > inner_product_worst_case(n, "tf32x3") * mag).any()
    assert (np.abs(A32.astype(np.float16).astype(np.float32) @ h32 - exact) > inner_product_worst_case(n) * mag).any()
    assert inner_product_worst_case(n, "tf32x3") * mag.max() < 1e-2 * np.abs(exact).max()
    assert TF32X3_U > U32 and inner_product_worst_case(n, "tf32x3") > inner_product_worst_case(n)
    with pytest.raises(ValueError, match="precision"):
        inner_product_worst_case(n, "tf32")


def test_each_characters_tolerance_holds_and_its_largest_is_the_texts(case):
    (W, b, W_ro, b_ro, h0), ids, ref, _ = case
    ids = ids[:400]
    each = isan_float32_bits_tolerances(W, b, W_ro, b_ro, h0, ids, samples=4)
    assert each.shape == (len(ids),) and (each > 0).all()
    assert each.max() == isan_float32_tolerance(W, b, W_ro, b_ro, h0, ids, samples=4).bits
    bits, _ = _bits32(*(a.astype(np.float32) for a in (W, b, W_ro, b_ro, h0)), ids, "blas")
    assert (np.abs(bits - ref[: len(ids)]) <= each).all()


def test_a_decaying_scan_within_its_relative_tolerance_and_float16_not(case):
    """The correction's linear scan ``e <- W[x] e`` from ``0.01 h0`` (no bias) in float32, one character a
    step, against float64: every state within the derived relative tolerance of its largest component;
    with W rounded to float16, not."""
    (W, _, W_ro, b_ro, h0), ids, _, _ = case
    ids = ids[:300]
    rel = isan_float32_relative_state_tolerance(W, 0 * W[:, 0], W_ro, b_ro, 0.01 * h0, ids, samples=4)
    worst = {}
    for name, W32 in (("float32", W.astype(np.float32)), ("float16", W.astype(np.float16).astype(np.float32))):
        e, e32, worst[name] = 0.01 * h0, (0.01 * h0).astype(np.float32), 0.0
        for x in ids:
            e, e32 = W[x] @ e, W32[x] @ e32
            worst[name] = max(worst[name], float(np.abs(e32 - e).max() / np.abs(e).max()))
    assert worst["float32"] <= rel < worst["float16"]


def test_engine_tolerance_holds_for_the_library_and_float16_not(default_engine, text8_test, case):
    """:func:`engine_float32_tolerance` (the engine's own parameters on the text's ids): the library's float32
    scoring within it of the float64 reference, in the bits, the total and the state; W rounded to float16
    beyond it; no ids, zero. The next-character bits read out of the float32 state within
    :func:`next_char_tolerance` of the reference's."""
    text = text8_test[:CHARS]
    tol = engine_float32_tolerance(default_engine, text)
    assert tol == engine_ids_tolerance(default_engine, default_engine.prepare(text).ids)
    lib = default_engine.score(text, per_char=True)
    ref = default_engine.with_path("reference").score(text, per_char=True)
    assert float(np.abs(lib.per_char_bits - ref.per_char_bits).max()) <= tol.bits
    assert abs(lib.bits - ref.bits) <= tol.total_bits
    assert float(np.abs(lib.state.h - ref.state.h).max()) <= tol.state
    (W, b, W_ro, b_ro, h0), ids, ref_bits, _ = case
    bits16, _ = _bits32(W.astype(np.float16).astype(np.float32), *(a.astype(np.float32) for a in (b, W_ro, b_ro, h0)),
                        ids, "blas")
    assert float(np.abs(bits16 - ref_bits).max()) > tol.bits
    assert engine_ids_tolerance(default_engine, []) == F32Tolerance(0.0, 0.0, 0.0, 1)
    next_bits, next_prob = next_char_tolerance(default_engine, ref.state.h, tol.state)
    for a, w in zip(default_engine.top_k(lib.state, 5), default_engine.top_k(ref.state, 5)):
        assert a["symbol"] == w["symbol"] and abs(a["bits"] - w["bits"]) <= next_bits
        assert abs(a["prob"] - w["prob"]) <= next_prob
