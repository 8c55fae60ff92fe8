"""The prediction stack of a short text and counterfactuals on it (paper Figures 2, 3 and 5).

Everything here is exact: the logits after each character are ``b_ro + sum_s kappa[t, s]``
(eqs. 4-6), so removing a source's kappa gives the logits the model would compute if that source
had contributed nothing, and removing its carried bias from the state continues the text from
there (:func:`decode_without`).

Positions: ``t = 0..T-1`` is the state after character t; source 0 is the start state, source
``s >= 1`` is character ``s - 1`` (labelled ``"s-1:c"``, its position and its character).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from isan.engine.reference import LOG2E, kappa_ref, log_softmax, segment_kappa_ref, states_ref
from isan.errors import AttributionCheckError, IsanError
from isan.params import ISANParams


def _show(c: str) -> str:
    return "_" if c == " " else c


@dataclass(frozen=True)
class PredictionStack:
    """Figure 2: ``kappa`` (T, S, V) with ``S = T + 1`` sources, ``b_ro`` (V,), ``logits`` (T, V),
    ``probs`` (T, V), ``source_labels`` (``"h0"``, ``"0:_"``, ``"1:a"``, ...), ``top`` (T,) the most
    likely next symbol at each position and ``max_abs_error`` of the sum identity."""

    text: str
    symbols: tuple[str, ...]
    kappa: np.ndarray
    b_ro: np.ndarray
    logits: np.ndarray
    probs: np.ndarray
    source_labels: list[str]
    top: list[str]
    max_abs_error: float


def prediction_stack(p: ISANParams, ids: np.ndarray, symbols, h: np.ndarray | None = None,
                     tol: float = 1e-9) -> PredictionStack:
    """Every source's kappa, ``b_ro``, the logits and the softmax after each character of ``ids``."""
    p = p.astype(np.float64)
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) == 0:
        raise IsanError("the text is empty")
    h = p.h0 if h is None else np.asarray(h, dtype=np.float64)
    kappa = kappa_ref(p, ids, h)
    logits = states_ref(p, ids, h) @ p.W_ro.T + p.b_ro
    err = float(np.abs(p.b_ro + kappa.sum(1) - logits).max())
    if err > tol * max(1.0, float(np.abs(logits).max())):
        raise AttributionCheckError(f"b_ro + sum kappa differs from the logits by {err:.3g}")
    text = "".join(symbols[i] for i in ids)
    probs = np.exp(log_softmax(logits))
    labels = ["h0"] + [f"{i}:{_show(c)}" for i, c in enumerate(text)]
    top = [symbols[int(i)] for i in probs.argmax(1)]
    return PredictionStack(text, tuple(symbols), kappa, p.b_ro.copy(), logits, probs, labels, top, err)


def without_sources(stack: PredictionStack, t: int, sources) -> np.ndarray:
    """The logits (V,) after character t with the kappa of ``sources`` (indices into the stack's
    sources) removed: exact, since the logits are their sum."""
    return stack.logits[t] - stack.kappa[t, list(sources)].sum(0)


def carried_bias(p: ISANParams, ids: np.ndarray, first: int, last: int, upto: int,
                 h: np.ndarray | None = None) -> np.ndarray:
    """The part of the state after character ``upto`` that characters ``first..last`` (inclusive) put
    there: ``sum_{s=first..last} W[x_upto] ... W[x_{s+1}] b[x_s]`` (d,). ``first = -1`` includes the
    start state ``h`` (default h0)."""
    p = p.astype(np.float64)
    v = np.zeros(p.d)
    if first < 0:
        v = (p.h0 if h is None else np.asarray(h, dtype=np.float64)).copy()
    for s in range(0, upto + 1):
        v = p.W[ids[s]] @ v
        if max(first, 0) <= s <= last:
            v = v + p.b[ids[s]]
    return v


def greedy_decode(p: ISANParams, h: np.ndarray, n: int, symbols) -> str:
    """The n most likely next characters, each fed back (MAP decoding, one character at a time)."""
    p = p.astype(np.float64)
    out = []
    h = np.asarray(h, dtype=np.float64)
    for _ in range(n):
        x = int(np.argmax(p.W_ro @ h + p.b_ro))
        out.append(symbols[x])
        h = p.W[x] @ h + p.b[x]
    return "".join(out)


def counterfactual(p: ISANParams, ids: np.ndarray, symbols, t: int, first: int, last: int, chars=("n", "r"),
                   decode: int = 8, h: np.ndarray | None = None) -> dict:
    """Figure 3: the prediction after character t with and without the sources ``first..last``.

    Returns a dict with, for the full model and with those characters' kappa removed (the state
    minus their carried bias), the probabilities of ``chars``, the most likely next character, the
    greedy continuation of ``decode`` characters, and each source's contribution to each of the
    ``chars``' logits.
    """
    p64 = p.astype(np.float64)
    ids = np.asarray(ids, dtype=np.int64)
    st = prediction_stack(p64, ids[: t + 1], symbols, h)
    H = states_ref(p64, ids[: t + 1], p64.h0 if h is None else h)
    removed = carried_bias(p64, ids, first, last, t, h)
    h_cf = H[t] - removed
    logits_cf = p64.W_ro @ h_cf + p64.b_ro
    # the same logits from the stack: the kappa of sources first+1..last+1 removed
    direct = without_sources(st, t, range(first + 1, last + 2))
    err = float(np.abs(direct - logits_cf).max())
    ci = [list(symbols).index(c) for c in chars]

    def side(logits, h_):
        pr = np.exp(log_softmax(logits))
        return {"probs": {c: float(pr[i]) for c, i in zip(chars, ci)},
                "top": symbols[int(pr.argmax())], "top_prob": float(pr.max()),
                "greedy": greedy_decode(p64, h_, decode, symbols),
                "bits_of": {c: float(-np.log(pr[i]) * LOG2E) for c, i in zip(chars, ci)}}

    return {
        "text": st.text, "position": t, "removed": st.text[first : last + 1], "removed_sources": [first, last],
        "full": side(st.logits[t], H[t]), "without": side(logits_cf, h_cf),
        "contributions": {c: [float(v) for v in st.kappa[t, :, i]] for c, i in zip(chars, ci)},
        "b_ro": {c: float(p64.b_ro[i]) for c, i in zip(chars, ci)},
        "source_labels": st.source_labels, "max_abs_error": max(st.max_abs_error, err), "stack": st,
    }


def word_spans(text: str) -> list[tuple[int, int]]:
    """Words with the spaces before them (``" annual"``), as (start, end) character ranges covering
    the text: the paper's word sources ('_annual')."""
    spans = [m.span() for m in re.finditer(r" *[^ ]+| +$", text)]
    if not spans or spans[0][0] != 0 or spans[-1][1] != len(text):
        raise IsanError("could not cut the text into words")
    return spans


@dataclass(frozen=True)
class WordConditioning:
    """Figure 5 for a sentence.

    Attributes:
        words: the word sources (each with the spaces before it); spans their character ranges.
        norms: (T, W + 1) ||kappa[t, word]|| (L2 over the logits); column 0 is the start state.
        keep: the numbers of most recent words kept, e.g. (1, 2, 3, 4, None): None keeps every source.
        prob_next: (len(keep), T) probability of the actual next character (for the last position,
            of the full model's most likely one) when only the last k words' kappa (the current,
            unfinished word counts as one) and ``b_ro`` are kept.
        bits_mean: (len(keep),) mean bits of the next character over the positions.
    """

    text: str
    words: list[str]
    spans: list[tuple[int, int]]
    norms: np.ndarray
    keep: tuple
    prob_next: np.ndarray
    bits_mean: np.ndarray
    max_abs_error: float


def word_conditioning(p: ISANParams, ids: np.ndarray, symbols, keep=(1, 2, 3, 4, None),
                      h: np.ndarray | None = None) -> WordConditioning:
    """Word-level kappa over a sentence and the next-character probabilities given fewer and fewer words."""
    p64 = p.astype(np.float64)
    ids = np.asarray(ids, dtype=np.int64)
    text = "".join(symbols[i] for i in ids)
    spans = word_spans(text)
    h = p64.h0 if h is None else np.asarray(h, dtype=np.float64)
    kappa = segment_kappa_ref(p64, ids, spans, h)  # (T, W + 1, V)
    logits = states_ref(p64, ids, h) @ p64.W_ro.T + p64.b_ro
    err = float(np.abs(p64.b_ro + kappa.sum(1) - logits).max())
    T = len(ids)
    word_of = np.empty(T, dtype=np.int64)
    for k, (i, j) in enumerate(spans):
        word_of[i:j] = k
    nxt = np.append(ids[1:], int(np.argmax(logits[-1])))
    probs = np.empty((len(keep), T))
    for a, k in enumerate(keep):
        for t in range(T):
            if k is None:
                lg = logits[t]
            else:
                w = word_of[t]
                lo = max(0, w - k + 1)
                lg = p64.b_ro + kappa[t, 1 + lo : 2 + w].sum(0)
            probs[a, t] = np.exp(log_softmax(lg)[nxt[t]])
    return WordConditioning(text, [text[i:j] for i, j in spans], spans, np.linalg.norm(kappa, axis=2), tuple(keep),
                            probs, -np.log2(probs).mean(1), err)
