"""Float tolerances derived from the computation, never tuned on one machine.

Two models of rounding, each with its source; a test picks the one that fits its computation.

**Worst case** (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed. 2002, Lemma 3.1 and
section 3.1): each ``+`` and ``*`` in precision ``u`` has a relative error of at most ``u``, so a
polynomial evaluated in *any* order of operations, whatever the machine's summation order, equals the
exact polynomial with each monomial scaled by ``(1 + theta)``, ``|theta| <= gamma(n) = n u / (1 - n u)``,
where n bounds the roundings along one monomial's path. Hence

    |computed - exact| <= gamma(n) * (the same computation evaluated on absolute values).

It fits computations of bounded depth made only of sums and products (a scan of a dozen steps and its
gradient): :func:`gamma` and :func:`depth_scan`.

**Probabilistic** (Higham and Mary, *A New Approach to Probabilistic Rounding Error Analysis*, SIAM J.
Sci. Comput. 41(5), 2019): rounding errors modelled as independent, zero-mean and bounded by ``u``.
An inner product of n terms then errs by about ``sqrt(n) u`` times the sum of its terms' magnitudes, and
an output that depends linearly (to first order) on many such errors ``delta_i`` is, by Azuma's (Hoeffding's)
inequality, within ``lam * sqrt(sum_i c_i^2)`` of exact with probability at least
``1 - 2 exp(-lam^2 / 2)``. The worst-case bound explodes over a long recurrence (a product of
thousands of |W|), so the long ISAN scans use this model: :func:`isan_float32_tolerance` injects errors of
that magnitude with random signs at every inner product of the float64 reference path on the real
text and propagates them exactly through the model (the samples' root mean square estimates
``sqrt(sum_i c_i^2)``), then takes ``lam`` for a failure probability of ``EPS`` over all the outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: unit roundoffs (round to nearest): float32 2^-24, float64 2^-53
U32 = 2.0 ** -24
U64 = 2.0 ** -53
#: the probability a derived probabilistic tolerance may fail a correct computation, over all its outputs
EPS = 1e-9


def gamma(n: int, u: float = U32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)`` (Lemma 3.1): the relative error of n roundings.

    Raises:
        ValueError: ``n u >= 1`` (no bound).
    """
    if n * u >= 1:
        raise ValueError(f"n u = {n * u} >= 1: no worst-case bound for {n} roundings at u = {u}")
    return n * u / (1.0 - n * u)


def depth_scan(T: int, per_step: int, batch: int = 1, gradient: bool = False) -> int:
    """Roundings along the deepest path of a T-step linear scan whose step costs ``per_step`` roundings
    (an inner product of n terms plus a bias: n + 1); with ``gradient``, the backward scan doubles the
    depth and a parameter's gradient sums over the T steps and ``batch`` streams (one rounding each)."""
    n = T * per_step
    return 2 * n + T * batch if gradient else n


def lam(outputs: int, eps: float = EPS) -> float:
    """Azuma's multiplier for ``outputs`` bounds that must all hold with probability ``1 - eps``:
    ``2 outputs exp(-lam^2 / 2) <= eps``."""
    return math.sqrt(2.0 * math.log(2.0 * max(outputs, 1) / eps))


@dataclass(frozen=True)
class F32Tolerance:
    """Float32 tolerances of an ISAN scoring path against the float64 reference, on one text.

    Attributes:
        bits: bits per character (absolute), any character.
        total_bits: the total bits of any prefix of the text (absolute).
        state: any state on the way, absolute, any component.
        chars: the text's length.
    """

    bits: float
    total_bits: float
    state: float
    chars: int

    def total(self, chars: int) -> float:
        """The tolerance of a total of ``chars`` characters' bits (absolute): ``total_bits`` up to the
        derivation's length, growing as ``sqrt(chars)`` (independent errors) beyond it."""
        return self.total_bits * math.sqrt(max(chars, self.chars) / self.chars)

    def for_chars(self, chars: int) -> "F32Tolerance":
        """These tolerances carried to a longer text of the same kind (the same model, English): the
        union bound over ``chars`` outputs (``lam`` grows as ``sqrt(log chars)``), the total as
        ``sqrt(chars)``. An extrapolation of the derivation on ``self.chars`` characters."""
        if chars <= self.chars:
            return self
        k = lam(chars) / lam(self.chars)
        return F32Tolerance(k * self.bits, self.total(chars), k * self.state, chars)

    def twice(self) -> "F32Tolerance":
        """The tolerances between two float32 computations (each within these of the exact result)."""
        return F32Tolerance(2 * self.bits, 2 * self.total_bits, 2 * self.state, self.chars)


def _bits_of(logits: np.ndarray, x: int) -> np.ndarray:
    """-log2 softmax(logits)[x] for each column of ``logits`` (V, k)."""
    m = logits.max(0)
    return (np.log(np.exp(logits - m).sum(0)) + m - logits[x]) / math.log(2.0)


def isan_float32_tolerance(W, b, W_ro, b_ro, h0, ids, samples: int = 8, seed: int = 0,
                           eps: float = EPS) -> F32Tolerance:
    """Derived float32 tolerances of scoring ``ids`` from ``h0`` (the probabilistic model above).

    Every inner product of the path rounds: the step ``W[x] h + b[x]`` (d + 1 terms a component), the
    readout ``W_ro h + b_ro`` (d + 1), the log-softmax (V + 1 terms, a float32 exponential and logarithm
    each). Each gets an error of ``sqrt(n) u32`` times its terms' magnitudes with random signs,
    ``samples`` times, carried exactly (float64) to the bits and the state; the tolerance is ``lam`` (for
    ``eps`` over all the outputs) times the largest root mean square over the samples (each character's
    bits, the running total, each state component).

    Args:
        W (K, d, d), b (K, d), W_ro (V, d), b_ro (V,), h0 (d,): the model (any float dtype).
        ids (T,) int: the text.

    Returns:
        F32Tolerance, bits.
    """
    W, b, W_ro, b_ro, h = (np.asarray(a, np.float64) for a in (W, b, W_ro, b_ro, h0))
    d, V, T = W.shape[1], W_ro.shape[0], len(ids)
    rng = np.random.default_rng(seed)
    g_step, g_out, g_sm = (math.sqrt(n) * U32 for n in (d + 1, d + 1, 2 * V + 2))
    absW, absWro = np.abs(W), np.abs(W_ro)
    E = np.zeros((d, samples))  # the samples' state errors
    rms_bits, rms_total, dev_total, rms_state = np.zeros(T), np.zeros(T), np.zeros(samples), 0.0
    for t, x in enumerate(np.asarray(ids, np.int64)):
        logits = W_ro @ h + b_ro
        mag = absWro @ np.abs(h) + np.abs(b_ro)
        L = logits[:, None] + W_ro @ E + g_out * mag[:, None] * rng.choice([-1.0, 1.0], (V, samples))
        lse = np.abs(logits).max() + math.log(V)
        dev = _bits_of(L, x) - _bits_of(logits[:, None], x)[0] + g_sm * lse / math.log(2.0) * rng.choice(
            [-1.0, 1.0], samples)
        rms_bits[t] = math.sqrt(float(np.mean(dev ** 2)))
        dev_total += dev
        rms_total[t] = math.sqrt(float(np.mean(dev_total ** 2)))
        step = absW[x] @ np.abs(h) + np.abs(b[x])
        E = W[x] @ E + g_step * step[:, None] * rng.choice([-1.0, 1.0], (d, samples))
        h = W[x] @ h + b[x]
        rms_state = max(rms_state, float(np.sqrt(np.mean(E ** 2, axis=1)).max()))
    return F32Tolerance(bits=lam(T, eps) * float(rms_bits.max()), total_bits=lam(T, eps) * float(rms_total.max()),
                        state=lam(T * d, eps) * rms_state, chars=T)


@lru_cache(maxsize=8)
def default_model_tolerance(chars: int = 60_000) -> F32Tolerance:
    """:func:`isan_float32_tolerance` of the shipped default model on the first ``chars`` characters of
    the text8-10M test split (the text the kernel tests score), cached for the session."""
    from conftest import TEXT8, need
    from isan.data import read_text8_split
    from isan.engine import Engine

    eng = Engine.default()
    p = eng.params
    ids = eng.encode(read_text8_split(need(TEXT8), "test")[:chars]).astype(np.int64)
    return isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, ids)
