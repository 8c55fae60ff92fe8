"""Attribution targets and windowed attribution (numpy only, any ISAN).

The ISAN's logits are an exact sum over sources (paper eqs. 4-6):
``logits[t] = b_ro + sum_s kappa[t, s]`` with ``kappa[t, s] = W_ro W[x_t] ... W[x_{s+1}] b[x_s]``.
This module adds what users of Captum and TransformerLens ask of an attribution:

* **a chosen target** (:func:`target_contributions`): one character's logit, the difference of two
  logits (both exact: a linear function of the logits), or a character's log-probability. The
  log-probability is not linear in the logits, so its contributions are integrated gradients along
  the straight path from the logits of no source (``b_ro``) to the full logits: every source s gets
  ``kappa[t, s] . integral_0^1 (e_c - softmax(b_ro + a (logits[t] - b_ro))) da``, and these sum to
  ``log p_c(logits[t]) - log p_c(b_ro)`` exactly (completeness); the integral is computed by
  Gauss-Legendre quadrature refined until that identity holds to ``tol``.
* **windowed attribution** (:func:`windowed_attribution`): for a long text, the last ``window``
  sources of each position exactly, everything older (the initial state included) summed into one
  ``history`` source, so memory grows as T N V instead of T^2 V, and the sum identity is still
  checked against independently computed logits.

Positions: ``t = 0..T-1`` is the state after character t (its logits predict character t + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isan.engine.reference import LOG2E, log_softmax
from isan.errors import AttributionCheckError, IsanError
from isan.params import ISANParams

TARGETS = ("logit", "logprob", "logit_diff")


@dataclass(frozen=True)
class TargetAttribution:
    """Contributions of each source to one scalar target per position.

    Attributes:
        target: ``"logit"``, ``"logprob"`` (natural log) or ``"logit_diff"``.
        classes: (T,) the class id of the target at each position; ``others`` (T,) the subtracted
            class for ``logit_diff`` (else None).
        contributions: (T, S) float64; ``base + contributions.sum(1) == value`` (checked).
        base: (T,) the target with no source kept: its value at ``logits = b_ro``.
        value: (T,) the target at the full logits.
        max_abs_error: max |base + sum_s contributions - value|.
        nodes: quadrature nodes used (``logprob`` only; else 0).
    """

    target: str
    classes: np.ndarray
    others: np.ndarray | None
    contributions: np.ndarray
    base: np.ndarray
    value: np.ndarray
    max_abs_error: float
    nodes: int = 0


def _class_ids(spec, T: int, V: int, symbols=None, name: str = "char") -> np.ndarray:
    """A target class per position from a symbol, an id, or a (T,) array of ids."""
    if isinstance(spec, str):
        if symbols is None or spec not in symbols:
            raise IsanError(f"{name} {spec!r} is not a symbol of the model's alphabet")
        spec = list(symbols).index(spec)
    ids = np.broadcast_to(np.asarray(spec, dtype=np.int64), (T,)).copy()
    if ids.min(initial=0) < 0 or ids.max(initial=0) >= V:
        raise IsanError(f"{name} ids must be in [0, {V}); got {spec!r}")
    return ids


def _gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(n)
    return 0.5 * (x + 1.0), 0.5 * w  # on [0, 1]


def logprob_path_gradient(logits: np.ndarray, b_ro: np.ndarray, classes: np.ndarray, nodes: int) -> np.ndarray:
    """``integral_0^1 (e_c - softmax(b_ro + a (logits - b_ro))) da`` for each row: (T, V) -> (T, V)."""
    a, w = _gauss_legendre(nodes)
    delta = logits - b_ro  # (T, V)
    g = np.zeros_like(logits)
    for ai, wi in zip(a, w):
        g -= wi * np.exp(log_softmax(b_ro + ai * delta))
    g[np.arange(len(classes)), classes] += 1.0
    return g


def target_contributions(kappa: np.ndarray, logits: np.ndarray, b_ro: np.ndarray, target: str = "logit",
                         char=None, other=None, symbols=None, tol: float = 1e-8,
                         max_nodes: int = 1024) -> TargetAttribution:
    """Attribute one scalar target per position to the sources of ``kappa``.

    Args:
        kappa: (T, S, V) contributions with ``b_ro + kappa.sum(1) == logits``.
        logits: (T, V); b_ro: (V,).
        target: ``"logit"`` (the logit of ``char``), ``"logprob"`` (the natural-log probability of
            ``char``, integrated gradients from ``b_ro``), ``"logit_diff"`` (logit of ``char`` minus
            logit of ``other``).
        char, other: a symbol (with ``symbols``), a class id, or (T,) ids (e.g. the next characters).
        tol: the largest accepted |base + sum - value|; for ``logprob`` the quadrature is refined
            (doubling its nodes up to ``max_nodes``) until it holds.
    Returns:
        :class:`TargetAttribution`.
    Raises:
        AttributionCheckError: the sum identity fails (never expected for the linear targets).
        IsanError: an unknown target or class.
    """
    if target not in TARGETS:
        raise IsanError(f"target must be one of {', '.join(TARGETS)}; got {target!r}")
    kappa = np.asarray(kappa, dtype=np.float64)
    logits = np.asarray(logits, dtype=np.float64)
    b_ro = np.asarray(b_ro, dtype=np.float64)
    T, _, V = kappa.shape
    if char is None:
        raise IsanError("give the target character (char)")
    c = _class_ids(char, T, V, symbols)
    rows = np.arange(T)
    o = None
    nodes = 0
    scale = max(1.0, float(np.abs(logits).max(initial=0.0)))
    if target == "logit":
        contrib = kappa[rows, :, c]
        base = b_ro[c]
        value = logits[rows, c]
    elif target == "logit_diff":
        if other is None:
            raise IsanError("target logit_diff needs the other character (other)")
        o = _class_ids(other, T, V, symbols, "other")
        contrib = kappa[rows, :, c] - kappa[rows, :, o]
        base = b_ro[c] - b_ro[o]
        value = logits[rows, c] - logits[rows, o]
    else:
        base = log_softmax(b_ro)[c]
        value = log_softmax(logits)[rows, c]
        nodes = 16
        while True:
            g = logprob_path_gradient(logits, b_ro, c, nodes)
            contrib = np.einsum("tsv,tv->ts", kappa, g)
            err = float(np.abs(base + contrib.sum(1) - value).max(initial=0.0))
            if err <= tol * scale or nodes >= max_nodes:
                break
            nodes *= 2
    err = float(np.abs(base + contrib.sum(1) - value).max(initial=0.0))
    if err > max(tol, 1e-6) * scale:
        raise AttributionCheckError(f"the {target} contributions differ from the target by {err:.3g} "
                                    f"(after {nodes} quadrature nodes)" if nodes else
                                    f"the {target} contributions differ from the target by {err:.3g}")
    return TargetAttribution(target, c, o, contrib, np.asarray(base, dtype=np.float64), value, err, nodes)


@dataclass(frozen=True)
class WindowedAttribution:
    """Windowed attribution of a long text (T positions, window N).

    Attributes:
        kappa: (T, N + 1, V): ``kappa[t, 0]`` is the history (the start state and every character
            at lag >= N, summed), ``kappa[t, 1 + k]`` the character at position ``t - k`` (lag k;
            zero where ``t - k < 0``). With a ``target``, None (see ``contributions``).
        contributions: with a target, (T, N + 1) of that target (same layout); else None.
        logits: (T, V) from the reference states, computed independently.
        max_abs_error: max |b_ro + sum_s kappa[t, s] - logits[t]| (checked against ``tol``).
        target: the :class:`TargetAttribution` when a target was asked for, else None.
    """

    window: int
    kappa: np.ndarray | None
    contributions: np.ndarray | None
    logits: np.ndarray
    b_ro: np.ndarray
    max_abs_error: float
    target: TargetAttribution | None = None


def windowed_attribution(p: ISANParams, ids: np.ndarray, window: int, h: np.ndarray | None = None,
                         target: str | None = None, char=None, other=None, symbols=None, tol: float = 1e-6,
                         block: int = 4096) -> WindowedAttribution:
    """Attribution of every position of ``ids`` to its last ``window`` characters and one history source.

    Memory: T (N + 1) V floats (T (N + 1) with a target), against T^2 V for the full attribution.
    Work: T (N + 1) (d^2 + V d).

    Args:
        p: the ISAN (float64 is used); ids (T,); h: the state before ids[0] (default h0).
        window: N >= 1 exact sources per position.
        target, char, other: as :func:`target_contributions` (``char="next"`` is not special here:
            pass the ids); with a target only its (T, N + 1) contributions are kept.
        tol: accepted |b_ro + sum kappa - logits| relative to max(1, max |logits|).
    Raises:
        AttributionCheckError: the sum identity fails.
    """
    if window < 1:
        raise IsanError(f"window must be >= 1; got {window}")
    p = p.astype(np.float64)
    ids = np.asarray(ids, dtype=np.int64)
    T, d, V, N = len(ids), p.d, p.V, int(window)
    h = p.h0 if h is None else np.asarray(h, dtype=np.float64)
    C = np.zeros((d, N + 1))  # column 0: history; column 1 + k: the character at lag k, carried
    C[:, 0] = h
    state = h.copy()
    keep_full = target is None
    out = np.zeros((T, N + 1, V)) if keep_full else np.zeros((T, N + 1))
    logits = np.empty((T, V))
    err = 0.0
    tgt_parts = []
    for s0 in range(0, T, block):
        x = ids[s0 : s0 + block]
        K = np.empty((len(x), N + 1, V))
        for i, xi in enumerate(x):
            C[:, 0] += C[:, N]  # the oldest exact source joins the history
            C[:, 2:] = C[:, 1:N]
            C[:, 1] = 0.0
            C = p.W[xi] @ C
            C[:, 1] = p.b[xi]
            state = p.W[xi] @ state + p.b[xi]  # the reference state, computed on its own
            K[i] = (p.W_ro @ C).T
            logits[s0 + i] = p.W_ro @ state + p.b_ro
        n = len(x)  # (lags before the start hold zeros: their columns were never filled)
        lg = logits[s0 : s0 + n]
        err = max(err, float(np.abs(p.b_ro + K.sum(1) - lg).max(initial=0.0)))
        if keep_full:
            out[s0 : s0 + n] = K
        else:
            ta = target_contributions(K, lg, p.b_ro, target, _slice(char, s0, n), _slice(other, s0, n),
                                      symbols, tol=1e-8)
            out[s0 : s0 + n] = ta.contributions
            tgt_parts.append(ta)
    if err > tol * max(1.0, float(np.abs(logits).max(initial=0.0))):
        raise AttributionCheckError(f"b_ro + sum kappa differs from the logits by {err:.3g}")
    ta = None
    if tgt_parts:
        ta = TargetAttribution(target, np.concatenate([t.classes for t in tgt_parts]),
                               None if tgt_parts[0].others is None else np.concatenate([t.others for t in tgt_parts]),
                               out, np.concatenate([t.base for t in tgt_parts]),
                               np.concatenate([t.value for t in tgt_parts]),
                               max(t.max_abs_error for t in tgt_parts), max(t.nodes for t in tgt_parts))
    return WindowedAttribution(N, out if keep_full else None, None if keep_full else out, logits, p.b_ro.copy(), err, ta)


def _slice(spec, s0: int, n: int):
    """The part of a per-position class spec that covers positions [s0, s0 + n)."""
    if spec is None or isinstance(spec, (str, int, np.integer)):
        return spec
    a = np.asarray(spec)
    return a if a.ndim == 0 else a[s0 : s0 + n]


def next_classes(ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """The class each position's logits predict in the text: the next character, and for the last
    position the most likely one. (T,) int64."""
    ids = np.asarray(ids, dtype=np.int64)
    return np.append(ids[1:], int(np.argmax(logits[-1]))) if len(ids) else ids


def bits_of(logits: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """-log2 softmax(logits)[class] per row: (T, V), (T,) -> (T,)."""
    return -log_softmax(logits)[np.arange(len(classes)), classes] * LOG2E
