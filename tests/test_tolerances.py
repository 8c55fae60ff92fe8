"""The derived float tolerances (tests/tolerances.py): they hold for a plain float32 computation of the
default model (and of the recurrent baselines) on real text, in two summation orders, and they fail a
computation that is less exact than float32 (matrices rounded to float16), so the tests that use them can
fail; Higham's worst case holds for a short scan in two orders."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tolerances import (U32, U64, F32Tolerance, baseline_float32_tolerance, float64_sums_tolerance, gamma,
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
