"""How much of its state space a model uses (paper Figure 1b): the PCA spectrum of hidden states.

The states after each character of a text (the ISAN's ``h_t``; a baseline's ``h_t``, for the LSTM
its ``h`` part, the part the readout sees) are accumulated into their covariance, whose eigenvalues,
sorted and divided by their sum, are the explained-variance ratios.

The text is read as ``segments`` pieces at once (one GEMM per symbol and step for the ISAN, one per
step for a baseline, whose recurrent matrix is shared), each piece from the initial state
``warmup`` characters before its first counted state (see :func:`plan_segments`); the first piece
starts at the start of the text, exactly, and the reported ``warmup_error`` measures how far the
second piece's state still was from the first's at the boundary.
"""

from __future__ import annotations

import numpy as np

from isan.engine.baselines.recurrent import sigmoid
from isan.params import ISANParams


def plan_segments(T: int, segments: int, warmup: int, min_len: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut positions 0..T-1 into at most ``segments`` pieces ``[starts[b], ends[b])`` of at least
    ``min_len`` positions; piece b is read from ``begin[b] = max(starts[b] - warmup, 0)``.
    Returns (begin, starts, ends)."""
    B = max(1, min(int(segments), T // max(1, min_len)))
    edges = np.linspace(0, T, B + 1).astype(np.int64)
    starts, ends = edges[:-1], edges[1:]
    return np.maximum(starts - warmup, 0), starts, ends


class CovarianceAccumulator:
    """Mean and covariance of row vectors seen block by block (float64, shifted by the first block's
    mean for accuracy)."""

    def __init__(self, dim: int):
        self.n = 0
        self.shift = None
        self.s1 = np.zeros(dim)
        self.s2 = np.zeros((dim, dim))

    def add(self, X: np.ndarray) -> None:
        X = np.asarray(X, dtype=np.float64)
        if len(X) == 0:
            return
        if self.shift is None:
            self.shift = X.mean(0)
        Y = X - self.shift
        self.n += len(Y)
        self.s1 += Y.sum(0)
        self.s2 += Y.T @ Y

    def covariance(self) -> np.ndarray:
        m = self.s1 / self.n
        return self.s2 / self.n - np.outer(m, m)


def spectrum(cov: np.ndarray) -> dict:
    """Explained-variance ratios of a covariance, largest first, and summary numbers.

    Returns:
        {"ratio": [...] (d,), "dims_for": {"0.5", "0.9", "0.99"} (components needed for that
        fraction of the variance), "participation_ratio" ((sum l)^2 / sum l^2), "total_variance"}.
    """
    lam = np.clip(np.linalg.eigvalsh(cov)[::-1], 0, None)
    ratio = lam / lam.sum()
    cum = np.cumsum(ratio)
    return {"ratio": ratio.tolist(), "dims_for": {str(f): int(min(np.searchsorted(cum, f) + 1, len(lam)))
                                                  for f in (0.5, 0.9, 0.99)},
            "participation_ratio": float(lam.sum() ** 2 / (lam ** 2).sum()), "total_variance": float(lam.sum())}


def baseline_step_batch(params, S: np.ndarray, A: np.ndarray) -> np.ndarray:
    """A step of :func:`isan.engine.baselines.recurrent.baseline_step_ref` for many rows: flat states S (B, S)
    and input terms A (B, G d) -> (B, S). Tested equal to the reference."""
    d, W_hh = params.d, params.tensors["W_hh"]
    h = S[:, :d]
    gh = h @ W_hh.T
    if params.kind == "rnn":
        return np.tanh(A + gh)
    if params.kind == "irnn":
        return np.maximum(A + gh, 0.0)
    if params.kind == "gru":
        r = sigmoid(A[:, :d] + gh[:, :d])
        z = sigmoid(A[:, d:2 * d] + gh[:, d:2 * d])
        n = np.tanh(A[:, 2 * d:] + r * (gh[:, 2 * d:] + params.tensors["b_hn"]))
        return (1.0 - z) * n + z * h
    g = A + gh  # lstm: blocks i, f, g, o
    c = sigmoid(g[:, d:2 * d]) * S[:, d:] + sigmoid(g[:, :d]) * np.tanh(g[:, 2 * d:3 * d])
    return np.concatenate([sigmoid(g[:, 3 * d:]) * np.tanh(c), c], axis=1)


def _segmented_spectrum(ids: np.ndarray, S0: np.ndarray, step, keep: int, segments: int, warmup: int) -> dict:
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    begin, starts, ends = plan_segments(T, segments, warmup, min_len=4 * warmup)
    B = len(starts)
    S = np.tile(S0, (B, 1))
    acc = CovarianceAccumulator(keep)
    L = int((ends - begin).max())
    check = starts[1] - 1 if B > 1 and begin[1] > 0 else None  # piece 0 is exact there; piece 1 was warmed up
    snap = {}
    for i in range(L):
        t = begin + i
        live = t < ends
        sel = np.nonzero(live)[0]
        S[sel] = step(S[sel], ids[t[sel]])
        if check is not None:
            for b in (0, 1):
                if t[b] == check:
                    snap[b] = S[b, :keep].copy()
        counted = sel[t[sel] >= starts[sel]]
        acc.add(S[counted, :keep])
    warm_err = None
    if len(snap) == 2:
        warm_err = float(np.abs(snap[0] - snap[1]).max()) / max(1.0, float(np.abs(snap[0]).max()))
    out = spectrum(acc.covariance())
    out.update({"states": acc.n, "segments": B, "warmup": int(warmup), "warmup_error": warm_err})
    return out


def isan_states_spectrum(p: ISANParams, ids: np.ndarray, h: np.ndarray | None = None, segments: int = 256,
                         warmup: int = 400) -> dict:
    """:func:`spectrum` of an ISAN's states after each character of ``ids`` (from h, default h0), plus
    ``states``, ``segments``, ``warmup`` and ``warmup_error``."""
    p = p.astype(np.float64)
    h = p.h0 if h is None else np.asarray(h, dtype=np.float64)
    W, b = p.W, p.b

    def step(S, x):
        out = np.empty_like(S)
        for s in np.unique(x):
            m = x == s
            out[m] = S[m] @ W[s].T + b[s]
        return out

    return _segmented_spectrum(ids, h, step, p.d, segments, warmup)


def baseline_states_spectrum(params, ids: np.ndarray, segments: int = 256, warmup: int = 400) -> dict:
    """:func:`spectrum` of a baseline's states (``isan.engine.baselines.recurrent.BaselineParams``; the ``h``
    part of the LSTM's state) after each character of ``ids``, from its initial state."""
    table = params.input_table()
    return _segmented_spectrum(ids, params.initial_state(), lambda S, x: baseline_step_batch(params, S, table[x]),
                               params.d, segments, warmup)
