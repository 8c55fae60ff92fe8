"""The derived float tolerances (tests/tolerances.py): they hold for a plain float32 computation of the
default model on real text, in two summation orders, and they fail a computation that is less exact
than float32 (matrices rounded to float16), so the tests that use them can fail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tolerances import U32, F32Tolerance, gamma, isan_float32_tolerance, lam

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
