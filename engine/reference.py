"""The reference path: plain, obviously correct numpy, one character at a time, float64.

Every fast path in isan (composed tables, batching, ONNX) is tested against these
functions on real text. Notation of Foerster et al. 2017 and docs/ARCHITECTURE.md,
'The model and its conventions':

* ``h_t = W[x_t] @ h_{t-1} + b[x_t]`` (eq. 1)
* ``logits_t = W_ro @ h_t + b_ro`` (eqs. 2-3)
* ``bits_t = -log2 softmax(W_ro @ h_{t-1} + b_ro)[x_t]``: the prediction for ``x_t`` comes
  from the state before it.
* ``kappa[t, s] = W_ro (W[x_t] ... W[x_{s+1}]) b[x_s]``, ``b[x_0] := h0`` (eqs. 4-6), so that
  ``logits_t = b_ro + sum_{s=0..t} kappa[t, s]``.
"""

from __future__ import annotations

import numpy as np

from isan.params import ISANParams

LOG2E = 1.0 / np.log(2.0)


def step_ref(p: ISANParams, h: np.ndarray, x: int) -> np.ndarray:
    """One step of eq. 1. h: (d,) -> (d,)."""
    return p.W[x] @ h + p.b[x]


def states_ref(p: ISANParams, ids: np.ndarray, h: np.ndarray) -> np.ndarray:
    """States after each character. ids: (T,) int; h: (d,) state before ids[0]. Returns (T, d)."""
    H = np.empty((len(ids), p.d), dtype=np.result_type(p.W.dtype, h.dtype))
    for t, x in enumerate(ids):
        h = step_ref(p, h, x)
        H[t] = h
    return H


def logits_ref(p: ISANParams, H: np.ndarray) -> np.ndarray:
    """Readout of eqs. 2-3 for states H (..., d): logits (..., V)."""
    return H @ p.W_ro.T + p.b_ro


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log softmax over the last axis."""
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def score_ref(p: ISANParams, ids: np.ndarray, h: np.ndarray, block: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Bits of each character and the final state.

    Returns (bits (T,) float64, h_final (d,)), ``bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]``.
    Works through the text in blocks of ``block`` characters so memory stays O(block d).
    """
    ids = np.asarray(ids)
    bits = np.zeros(len(ids))
    for s in range(0, len(ids), block):
        x = ids[s : s + block]
        H = states_ref(p, x, h)
        S = np.vstack([h[None, :], H[:-1]])  # states before each character
        lp = log_softmax(logits_ref(p, S))
        bits[s : s + block] = -lp[np.arange(len(x)), x] * LOG2E
        h = H[-1]
    return bits, h


def kappa_ref(p: ISANParams, ids: np.ndarray, h0: np.ndarray | None = None) -> np.ndarray:
    """Per-character attribution kappa (paper eqs. 4-6).

    Args:
        ids: (T,) the characters x_1..x_T.
        h0: the state before x_1 (default the model's h0); it plays ``b[x_0]``.
    Returns:
        kappa: (T, T + 1, V) float64; ``kappa[t-1, s]`` is the contribution of source s
        (s = 0: h0, s >= 1: character x_s) to ``logits_t``; zero for s > t.
    """
    h0 = p.h0 if h0 is None else h0
    T = len(ids)
    kappa = np.zeros((T, T + 1, p.V))
    C = np.zeros((p.d, T + 1))  # column s: (W[x_t] ... W[x_{s+1}]) b[x_s] in state space
    C[:, 0] = h0
    for t, x in enumerate(ids, start=1):
        C[:, :t] = p.W[x] @ C[:, :t]
        C[:, t] = p.b[x]
        kappa[t - 1, : t + 1] = (p.W_ro @ C[:, : t + 1]).T
    return kappa


def segment_kappa_ref(p: ISANParams, ids: np.ndarray, bounds: list[tuple[int, int]], h0: np.ndarray | None = None) -> np.ndarray:
    """Attribution to segments (words) from composed biases carried forward (paper section 3.4).

    A segment covering characters [i, j) has the composed bias ``c = sum_{s in [i,j)}
    (W[x_{j-1}] ... W[x_{s+1}]) b[x_s]``; its contribution to ``logits_t`` (t >= j) is
    ``W_ro (W[x_t] ... W[x_j]) c``, and inside the segment the readout of the partial bias.

    Args:
        bounds: consecutive (start, end) character ranges covering 0..T exactly.
    Returns:
        (T, len(bounds) + 1, V): source 0 is h0, source k+1 is segment k. Equals the sum of
        :func:`kappa_ref` over each segment's characters.
    """
    h0 = p.h0 if h0 is None else h0
    T = len(ids)
    seg_of = np.empty(T, dtype=np.int64)
    for k, (i, j) in enumerate(bounds):
        seg_of[i:j] = k
    S = len(bounds)
    kappa = np.zeros((T, S + 1, p.V))
    C = np.zeros((p.d, S + 1))  # column 0: h0 carried; column k+1: segment k's bias carried
    C[:, 0] = h0
    for t, x in enumerate(ids):
        k = seg_of[t] + 1
        C[:, :k] = p.W[x] @ C[:, :k]
        C[:, k] = p.W[x] @ C[:, k] + p.b[x]  # the partial composed bias of the open segment
        kappa[t, : k + 1] = (p.W_ro @ C[:, : k + 1]).T
    return kappa
