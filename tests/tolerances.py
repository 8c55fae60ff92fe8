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


#: the relative error of one product of two float32 values made of three TF32 tensor-core products
#: (``tf32x3``): each float32 ``a`` splits into ``a_hi = tf32(a)`` (10 explicit significand bits: within
#: 2^-10 |a|, truncated or rounded) and ``a_lo = tf32(a - a_hi)`` (within 2^-10 |a - a_hi|), leaving
#: ``|a - a_hi - a_lo| <= 2^-20 |a|``; ``a_hi b_hi + a_hi b_lo + a_lo b_hi`` misses ``a_lo b_lo`` and the
#: two leftovers' products, each at most 2^-20 |a b| (1 + 2^-10): below ``2^-18 |a b|`` in all. The TF32
#: products are exact in float32 (11 by 11 significand bits) and summed in float32 (``U32`` per addition).
TF32X3_U = 2.0 ** -18


def inner_product_worst_case(n: int, precision: str = "ieee", u: float = U32) -> float:
    """Higham's worst-case bound on an inner product of ``n`` terms in any order of summation, relative to
    the sum of the terms' magnitudes ``sum_i |a_i b_i|``: ``gamma(n)`` (section 3.1, ``n`` roundings along
    a term's path, the product's included); ``"tf32x3"`` (float32 only): ``3 n`` products summed,
    ``gamma(3 n) + TF32X3_U (1 + gamma(3 n))``.

    Raises:
        ValueError: an unknown precision.
    """
    if precision == "ieee":
        return gamma(n, u)
    if precision == "tf32x3":
        return gamma(3 * n, U32) + TF32X3_U * (1.0 + gamma(3 * n, U32))
    raise ValueError(f"precision must be 'ieee' or 'tf32x3'; got {precision!r}")


def float64_sums_tolerance(n: int, total: float) -> float:
    """The largest difference between two float64 sums of the same ``n`` nonnegative terms (per-character
    bits) added in any two orders: each is within ``gamma(n - 1, U64)`` times the sum of the terms'
    magnitudes of the exact sum (Higham, section 4.2), that sum is the total, so they are
    ``2 gamma(n) |total|`` apart at most (``gamma(n)`` absorbs the total's own rounding)."""
    return 2.0 * gamma(max(n, 1), U64) * abs(total)


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

    def in_precision(self, u: float) -> "F32Tolerance":
        """These tolerances for the same computation rounded at unit roundoff ``u`` (``U64``: float64): the
        probabilistic model injects errors proportional to the unit roundoff and carries them linearly, so
        every tolerance scales by ``u / U32``."""
        k = u / U32
        return F32Tolerance(k * self.bits, k * self.total_bits, k * self.state, self.chars)


def _bits_of(logits: np.ndarray, x: int) -> np.ndarray:
    """-log2 softmax(logits)[x] for each column of ``logits`` (V, k)."""
    m = logits.max(0)
    return (np.log(np.exp(logits - m).sum(0)) + m - logits[x]) / math.log(2.0)


def isan_float32_tolerance(W, b, W_ro, b_ro, h0, ids, samples: int = 8, seed: int = 0,
                           eps: float = EPS, inputs=None) -> F32Tolerance:
    """Derived float32 tolerances of scoring ``ids`` from ``h0`` (the probabilistic model above).

    Every inner product of the path rounds: the step ``W[x] h + b[x]`` (d + 1 terms a component), the
    readout ``W_ro h + b_ro`` (d + 1), the log-softmax (V + 1 terms, a float32 exponential and logarithm
    each). Each gets an error of ``sqrt(n) u32`` times its terms' magnitudes with random signs,
    ``samples`` times, carried exactly (float64) to the bits and the state; the tolerance is ``lam`` (for
    ``eps`` over all the outputs) times the largest root mean square over the samples (each character's
    bits, the running total, each state component).

    Args:
        W (K, d, d), b (K, d), W_ro (V, d), b_ro (V,), h0 (d,): the model (any float dtype).
        ids (T,) int: the text (the outputs whose bits are scored).
        inputs (T,) int: the rows of W and b each character reads; default ``ids`` (a token alphabet's
            ``input_map[ids]`` otherwise).

    Returns:
        F32Tolerance, bits.
    """
    rms_bits, rms_total, rms_state, _, d = _isan_deviations(W, b, W_ro, b_ro, h0, ids, samples, seed, inputs)
    T = len(ids)
    return F32Tolerance(bits=lam(T, eps) * float(rms_bits.max()), total_bits=lam(T, eps) * float(rms_total.max()),
                        state=lam(T * d, eps) * rms_state, chars=T)


def isan_float32_bits_tolerances(W, b, W_ro, b_ro, h0, ids, samples: int = 8, seed: int = 0,
                                 eps: float = EPS, inputs=None) -> np.ndarray:
    """Each character's own derived float32 tolerance (bits, absolute), shape (T,): the derivation of
    :func:`isan_float32_tolerance` (same arguments) without the maximum over the text. For a state that
    grows by orders of magnitude along the text (a model diverging), where the largest tolerance would
    say nothing about the early characters."""
    rms_bits = _isan_deviations(W, b, W_ro, b_ro, h0, ids, samples, seed, inputs)[0]
    return lam(len(ids), eps) * rms_bits


def isan_float32_relative_state_tolerance(W, b, W_ro, b_ro, h0, ids, samples: int = 8, seed: int = 0,
                                          eps: float = EPS, inputs=None) -> float:
    """The derived float32 tolerance of every state on the way relative to its own largest component,
    ``max_i |h_t[i] - exact| <= tol * max_i |exact h_t[i]|`` for every t (the derivation of
    :func:`isan_float32_tolerance`, same arguments). For a state that decays by orders of magnitude (the
    linear scan ``e <- W[x] e`` of the chunk-parallel correction, ``b = 0``), where an absolute tolerance
    taken at its start would say nothing about its end."""
    _, _, _, rms_rel, d = _isan_deviations(W, b, W_ro, b_ro, h0, ids, samples, seed, inputs)
    return lam(len(ids) * d, eps) * rms_rel


def _isan_deviations(W, b, W_ro, b_ro, h0, ids, samples, seed, inputs):
    """The sampled root mean square deviations of :func:`isan_float32_tolerance`: (each character's
    bits (T,), each prefix's total (T,), the largest of any state component, the largest relative to
    the state's largest component, d)."""
    W, b, W_ro, b_ro, h = (np.asarray(a, np.float64) for a in (W, b, W_ro, b_ro, h0))
    d, V, T = W.shape[1], W_ro.shape[0], len(ids)
    rng = np.random.default_rng(seed)
    g_step, g_out, g_sm = (math.sqrt(n) * U32 for n in (d + 1, d + 1, 2 * V + 2))
    absW, absWro = np.abs(W), np.abs(W_ro)
    E = np.zeros((d, samples))  # the samples' state errors
    rms_bits, rms_total, dev_total, rms_state, rms_rel = np.zeros(T), np.zeros(T), np.zeros(samples), 0.0, 0.0
    reads = np.asarray(ids if inputs is None else inputs, np.int64)
    for t, (x, xi) in enumerate(zip(np.asarray(ids, np.int64), reads)):
        logits = W_ro @ h + b_ro
        mag = absWro @ np.abs(h) + np.abs(b_ro)
        L = logits[:, None] + W_ro @ E + g_out * mag[:, None] * rng.choice([-1.0, 1.0], (V, samples))
        lse = np.abs(logits).max() + math.log(V)
        dev = _bits_of(L, x) - _bits_of(logits[:, None], x)[0] + g_sm * lse / math.log(2.0) * rng.choice(
            [-1.0, 1.0], samples)
        rms_bits[t] = math.sqrt(float(np.mean(dev ** 2)))
        dev_total += dev
        rms_total[t] = math.sqrt(float(np.mean(dev_total ** 2)))
        step = absW[xi] @ np.abs(h) + np.abs(b[xi])
        E = W[xi] @ E + g_step * step[:, None] * rng.choice([-1.0, 1.0], (d, samples))
        h = W[xi] @ h + b[xi]
        rms = float(np.sqrt(np.mean(E ** 2, axis=1)).max())
        rms_state, rms_rel = max(rms_state, rms), max(rms_rel, rms / float(np.abs(h).max()))
    return rms_bits, rms_total, rms_state, rms_rel, d


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


def readout_tolerance(W_ro, b_ro, states, state_tol: float, u: float = U32) -> float:
    """Tolerance of logits ``W_ro h + b_ro`` (absolute, any component) read out in precision ``u`` from
    states within ``state_tol`` of exact: the state's error carried by the readout
    (``max_v sum_j |W_ro[v, j]|`` times it) plus Higham's worst case for the readout's own d + 1
    roundings, ``gamma(d + 1)`` times ``|W_ro| |h| + |b_ro|`` at the largest of ``states`` (..., d).

    A distribution ``softmax(logits)`` is then within ``2 (e^t - 1) <= 2.01 t`` of exact in every
    probability (t below 5e-3), since each log-probability moves by at most twice the logits' error."""
    W_ro, b_ro = np.abs(np.asarray(W_ro, np.float64)), np.abs(np.asarray(b_ro, np.float64))
    S = np.abs(np.asarray(states, np.float64)).reshape(-1, W_ro.shape[1])
    own = gamma(W_ro.shape[1] + 1, u) * float((S @ W_ro.T + b_ro).max())
    return float(W_ro.sum(1).max()) * state_tol + own


def isan_worst_case(W, b, W_ro, b_ro, h0, ids, u: float = U32) -> tuple[np.ndarray, np.ndarray]:
    """Higham's worst-case bounds (module docstring) on a short ISAN scan in precision ``u``, any order
    of summation: the state after t characters rounds ``t (d + 1)`` times along a path, its readout
    ``d + 1`` more, so

        |H_t - exact| <= gamma(t (d + 1)) |H|_t,
        |logits_t - exact| <= gamma((t + 1)(d + 1)) (|W_ro| |H|_t + |b_ro|)

    with ``|H|`` the scan run on absolute values (``|W[x]| |h| + |b[x]|`` from ``|h0|``). Useful while
    the bound stays a few times below the values compared (a dozen steps); a product of many ``|W|``
    grows past any use, where :func:`isan_float32_tolerance` applies. Adding the sum of a (T + 1)-term
    attribution is covered by adding T + 1 to the depth (the caller's ``gamma``).

    Args:
        W (K, d, d), b (K, d), W_ro (V, d), b_ro (V,), h0 (d,): the model; ids (T,) int.

    Returns:
        (state bounds (T, d), logits bounds (T, V)) float64, the logits read out after each character.

    Raises:
        ValueError: the depth reaches ``1 / u`` (no bound).
    """
    W, b, W_ro, b_ro, h = (np.abs(np.asarray(a, np.float64)) for a in (W, b, W_ro, b_ro, h0))
    d = W.shape[1]
    H = np.empty((len(ids), d))
    for t, x in enumerate(np.asarray(ids, np.int64)):
        h = W[x] @ h + b[x]
        H[t] = h
    steps = np.arange(1, len(ids) + 1)[:, None]
    g_state = np.array([gamma(int(n) * (d + 1), u) for n in steps[:, 0]])[:, None]
    g_logits = np.array([gamma((int(n) + 1) * (d + 1), u) for n in steps[:, 0]])[:, None]
    return g_state * H, g_logits * (H @ W_ro.T + b_ro)


#: float32 roundings along one element's path through a cell's elementwise part (the products, sums and
#: transcendental functions after its inner products), a transcendental function counted as 4 (libm's
#: tanhf, expf and logf are within 2 ulp, 4 u): rnn tanh; irnn relu (exact) and nothing; gru two
#: sigmoids (3 operations and a tanh each), r * (.), a_n + (.), tanh, (1 - z), two products and a sum;
#: lstm three sigmoids, two tanh, three products and a sum
CELL_ROUNDINGS = {"rnn": 4, "irnn": 1, "gru": 24, "lstm": 33}


def _signs(rng, shape) -> np.ndarray:
    return rng.choice([-1.0, 1.0], shape)


def baseline_float32_tolerance(p, ids, state0=None, samples: int = 8, seed: int = 0,
                               eps: float = EPS) -> F32Tolerance:
    """Derived float32 tolerances of a recurrent baseline (rnn, irnn, gru, lstm; a
    :class:`isan.engine.baselines.recurrent.BaselineParams`) scoring ``ids`` from ``state0``, against its
    float64 reference, by the probabilistic model of this module (Higham and Mary 2019) sampled through the
    nonlinear cell: at each step the input term (``E[x]``, or ``W_ih emb[x] + b_ih``: e + 1 terms) and the
    recurrent inner products (``W_hh h``, d terms, plus ``b_hn``) round to a pre-activation error of
    ``sqrt(d + e + 2) u32`` times their terms' magnitudes, with random signs; the cell's elementwise part to
    ``sqrt(CELL_ROUNDINGS[kind]) u32`` of the new state, random signs; the readout and log-softmax as in
    :func:`isan_float32_tolerance`. ``samples`` perturbed float64 runs; each tolerance is ``lam`` (for
    ``eps`` over the outputs) times the largest root mean square deviation from the exact run.

    Args:
        p: the baseline's float64 parameters; ids (T,) int; state0 (S,): default ``p.initial_state()``.

    Returns:
        F32Tolerance, bits; ``state`` covers the flat state (h, and c for the LSTM).
    """
    from isan.engine.baselines.recurrent import baseline_step_ref

    t_ = p.tensors
    d, V, T = p.d, p.V, len(ids)
    rng = np.random.default_rng(seed)
    table = p.input_table()
    if "E" in t_:
        mag_in, e = np.abs(t_["E"]), 0
    else:
        mag_in, e = np.abs(t_["emb"]) @ np.abs(t_["W_ih"]).T + np.abs(t_["b_ih"]), t_["emb"].shape[1]
    absW = np.abs(t_["W_hh"])
    b_hn = np.concatenate([np.zeros(2 * d), np.abs(t_["b_hn"])]) if p.kind == "gru" else 0.0
    g_pre, g_cell = math.sqrt(d + e + 2) * U32, math.sqrt(CELL_ROUNDINGS[p.kind]) * U32
    g_out, g_sm = math.sqrt(d + 1) * U32, math.sqrt(2 * V + 2) * U32
    W_ro, b_ro = t_["W_ro"], t_["b_ro"]
    s = np.asarray(p.initial_state() if state0 is None else state0, np.float64)
    S = np.repeat(s[None], samples, 0)
    rms_bits, dev_total, rms_total, rms_state = np.zeros(T), np.zeros(samples), np.zeros(T), 0.0
    for t, x in enumerate(np.asarray(ids, np.int64)):
        logits = W_ro @ s[:d] + b_ro
        L = S[:, :d] @ W_ro.T + b_ro + g_out * (np.abs(S[:, :d]) @ np.abs(W_ro).T + np.abs(b_ro)) * _signs(
            rng, (samples, V))
        lse = np.abs(logits).max() + math.log(V)
        dev = _bits_of(L.T, x) - _bits_of(logits[:, None], x)[0] + g_sm * lse / math.log(2.0) * _signs(rng, samples)
        rms_bits[t] = math.sqrt(float(np.mean(dev ** 2)))
        dev_total += dev
        rms_total[t] = math.sqrt(float(np.mean(dev_total ** 2)))
        s = baseline_step_ref(p, s, table[x])
        for k in range(samples):
            mag = mag_in[x] + absW @ np.abs(S[k, :d]) + b_hn
            new = baseline_step_ref(p, S[k], table[x] + g_pre * mag * _signs(rng, mag.shape))
            S[k] = new * (1.0 + g_cell * _signs(rng, new.shape))
        rms_state = max(rms_state, float(np.sqrt(np.mean((S - s) ** 2, axis=0)).max()))
    return F32Tolerance(bits=lam(T, eps) * float(rms_bits.max()), total_bits=lam(T, eps) * float(rms_total.max()),
                        state=lam(T * len(s), eps) * rms_state, chars=T)


_bundle_tolerances: dict = {}


def bundle_float32_tolerance(bundle, ids, state0=None) -> tuple[F32Tolerance, np.ndarray, np.ndarray]:
    """(the derived float32 tolerance of scoring ``ids`` from ``state0`` (default the model's initial state)
    with the ISAN or recurrent baseline of a bundle directory, its W_ro (V, d), its b_ro (V,)), four samples
    (:func:`isan_float32_tolerance`, :func:`baseline_float32_tolerance`), cached per bundle, text and state."""
    from isan.engine.baselines.recurrent import load_baseline_bundle
    from isan.engine.bundle import read_manifest

    ids = np.asarray(ids)
    key = (str(bundle), ids.tobytes(), None if state0 is None else np.asarray(state0).tobytes())
    if key not in _bundle_tolerances:
        if read_manifest(bundle)["kind"] == "isan":
            from isan.engine import Engine

            p = Engine.load(bundle, path_mode="reference").params.astype(np.float64)
            h0 = p.h0 if state0 is None else np.asarray(state0, np.float64)
            tol = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, h0, ids, samples=4)
            _bundle_tolerances[key] = (tol, p.W_ro, p.b_ro)
        else:
            _, p, _ = load_baseline_bundle(bundle)
            tol = baseline_float32_tolerance(p, ids, state0, samples=4)
            _bundle_tolerances[key] = (tol, p.tensors["W_ro"], p.tensors["b_ro"])
    return _bundle_tolerances[key]


_engine_tolerances: dict = {}
_float64_params: dict = {}
#: the longest text an engine's tolerance is derived on (about 2 s at four samples for the shipped model);
#: a longer one is carried on by :meth:`F32Tolerance.for_chars`
ENGINE_DERIVATION_CHARS = 20_000


def engine_ids_tolerance(engine, ids, h0=None) -> F32Tolerance:
    """The derived float32 tolerance of an ISAN ``engine`` (an :class:`isan.engine.Engine`) scoring the ids
    ``ids`` (T,) int from the state ``h0`` (d,) (default the model's): :func:`isan_float32_tolerance` with
    four samples on the engine's own parameters (float64), its first :data:`ENGINE_DERIVATION_CHARS`
    ids carried to the whole by :meth:`F32Tolerance.for_chars`; cached per model, ids and state. A
    server batching a text with others scores it in other rows than the library does: two float32
    computations, ``.twice()`` of this. No ids, nothing rounded: zero."""
    ids = np.asarray(ids, np.int64)
    if len(ids) == 0:
        return F32Tolerance(0.0, 0.0, 0.0, 1)
    h = None if h0 is None else np.asarray(h0, np.float64)
    key = (engine.params_sha256, ids.tobytes(), None if h is None else h.tobytes())
    if key not in _engine_tolerances:
        if engine.params_sha256 not in _float64_params:
            _float64_params[engine.params_sha256] = engine.params.astype(np.float64)
        p = _float64_params[engine.params_sha256]
        tol = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0 if h is None else h,
                                     ids[:ENGINE_DERIVATION_CHARS], samples=4)
        _engine_tolerances[key] = tol.for_chars(max(len(ids), 1))
    return _engine_tolerances[key]


def engine_float32_tolerance(engine, text: str, state=None) -> F32Tolerance:
    """:func:`engine_ids_tolerance` of ``text`` normalised as ``Engine.score`` does (the model's own
    normaliser, ``Engine.prepare``) from ``state`` (an engine ``State``; default the model's).

    Raises:
        isan.errors.IsanError: the text has characters outside the engine's alphabet after normalisation.
    """
    return engine_ids_tolerance(engine, engine.prepare(text).ids, None if state is None else state.h)


def next_char_tolerance(engine, h, state_tol: float) -> tuple[float, float]:
    """(bits, probability) tolerances, absolute, of any symbol in the next-character distribution read out
    from the state ``h`` (d,) by two float32 computations whose states are each within ``state_tol`` of
    exact: each one's logits are within ``t = readout_tolerance(...)`` (:func:`readout_tolerance`), so a
    log-probability of either is within ``2 t`` of exact (the log-sum-exp moves by at most ``t`` too),
    the two within ``4 t`` (in bits, ``/ ln 2``), a probability ``p <= 1`` within ``expm1(4 t)``."""
    p = engine.params
    t = readout_tolerance(p.W_ro, p.b_ro, np.asarray(h)[None], state_tol)
    return 4.0 * t / math.log(2.0), math.expm1(4.0 * t)


def serve_bench_tolerance(engine, data, load: dict) -> float:
    """Twice the derived float32 tolerance (bits, absolute) of the total of the text that an ``isan bench
    serve`` load (its result ``load``) found furthest from offline scoring: the server and the library are
    two float32 computations of it (rows batched with other requests, cut into chunks). The text is the
    load's ``worst_span`` (``["valid", start, end]``) of the text8 split of ``data``; 0.0 when no answer
    was compared."""
    from isan.data import read_text8_split

    if load.get("worst_span") is None:
        return 0.0
    split, start, end = load["worst_span"]
    text = read_text8_split(data, split)[start:end]
    return engine_float32_tolerance(engine, text).twice().total_bits
