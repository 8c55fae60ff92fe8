"""How far back the ISAN looks (paper Figure 4), from windowed attribution over a whole text.

One pass over the text carries, for every position, the last N characters' biases exactly and
everything older in one history source (as :func:`isan.engine.analysis.attribution.windowed_attribution`),
many segments at once with each step's segments grouped by symbol (one GEMM per symbol). From the
per-lag contributions ``kappa[t, t - k]`` (k = 0..N-1) it accumulates:

* Fig 4a: the mean over positions of ``||kappa[t, t - k]||`` (L2 over the V logits) for each lag k,
  and :func:`fit_two_rates` fits two exponential rates to it;
* Fig 4c: the cross entropy of the next character when only the last n sources are kept
  (``logits = b_ro + sum_{k < n} kappa[t, t - k]``, n = 0..N; n = 0 leaves ``softmax(b_ro)``);
* Fig 4b: the cross entropy by position in the word (letters read since the last space; 0 at the
  space itself) with all sources, with only the last space's kappa (plus ``b_ro``), and with the
  last space's kappa removed; and the same two with every space's kappa instead of the last one's.
  The paper's caption, "the green line sets all kappa_s^t apart from kappa_'_'^t to zero, while the
  blue line only sets kappa_'_'^t to zero" (ICML Figure 4), reads both ways: the space that begins
  the word, or every space read so far (issue #34 item 16). Spaces older than the window are carried
  exactly in a second history source that holds the spaces' biases only.

Each segment starts from the start state (h0) ``warmup`` + N characters before its first counted
position, so every counted position has its full window. The ISAN forgets its start state: a
perturbation shrinks below 1e-7 of its size within 111 characters (median) and 228 (worst) on the
test split (the speed guide, docs/guide/tables-and-speed.md, 'Measured facts the code relies on'),
so with the default warm-up of 400 characters the statistics equal those of one pass from the start
of the text (the tests check it against ``segments=1``). The sum identity ``b_ro + sum kappa =
logits`` is checked at every step against float64 reference states carried alongside from the same
start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isan.engine.reference import LOG2E, log_softmax
from isan.errors import AttributionCheckError, IsanError
from isan.params import ISANParams


@dataclass(frozen=True)
class DecayStats:
    """The accumulated statistics of :func:`window_statistics` (positions counted: ``positions``).

    Attributes:
        window: N.
        kappa_norm_mean: (N,) mean ||kappa[t, t - k]|| over positions, k = 0..N-1.
        history_norm_mean: mean norm of the history source (lags >= N).
        bits_keep_last: (N + 1,) mean bits of the next character keeping the last n sources, n = 0..N.
        bits_full: mean bits with every source (the model itself).
        word_positions: (P,) positions in the word 0..P-1 (0: the state after a space).
        word_bits_full, word_bits_space_only, word_bits_no_space: (P,) mean bits there.
        word_median_full, word_median_space_only, word_median_no_space: (P,) the median bits there (the
            paper's Fig 4b plots "the median cross entropy"; issue #26).
        word_bits_spaces_only, word_bits_no_spaces, word_median_spaces_only, word_median_no_spaces: (P,)
            the mean and median bits with every space's kappa (the whole text's, not only the last
            space's) kept alone (plus b_ro) and removed: the second reading of the caption (issue #34).
        word_counts: (P,) positions counted at each.
        space_outside_window: positions skipped in Fig 4b because the last space was N or more back.
        max_abs_error: max |b_ro + sum kappa - logits| (against the reference logits).
        segments: the pieces read in parallel; warmup_error: max |h| difference (relative) between the
            exact state and the warmed-up one where the second piece starts counting (None: one piece).
    """

    window: int
    positions: int
    kappa_norm_mean: np.ndarray
    history_norm_mean: float
    bits_keep_last: np.ndarray
    bits_full: float
    word_positions: np.ndarray
    word_bits_full: np.ndarray
    word_bits_space_only: np.ndarray
    word_bits_no_space: np.ndarray
    word_counts: np.ndarray
    space_outside_window: int
    max_abs_error: float
    segments: int = 1
    warmup_error: float | None = None
    word_median_full: np.ndarray | None = None
    word_median_space_only: np.ndarray | None = None
    word_median_no_space: np.ndarray | None = None
    word_bits_spaces_only: np.ndarray | None = None
    word_bits_no_spaces: np.ndarray | None = None
    word_median_spaces_only: np.ndarray | None = None
    word_median_no_spaces: np.ndarray | None = None


def window_statistics(p: ISANParams, ids: np.ndarray, window: int = 50, segments: int = 128, space_id: int | None = 0,
                      max_word_position: int = 20, dtype=np.float32, h: np.ndarray | None = None, warmup: int = 400,
                      tol: float = 1e-3) -> DecayStats:
    """Figures 4a-c over the text ``ids`` (scored from ``h``, default h0, like ``isan score``).

    Args:
        window: N, the exact sources kept per position (lags 0..N-1).
        segments: parallel segments (rows of each GEMM); the result does not depend on it (beyond
            the start state forgotten over ``warmup`` characters).
        warmup: characters each segment reads before its window starts filling.
        space_id: the word separator's id (None: no Fig 4b).
        dtype: float32 (default; twice as fast) or float64 for the carried contributions.
        tol: accepted |b_ro + sum kappa - logits| relative to max(1, max |logits|) (float32 carries).
    Raises:
        AttributionCheckError: the sum identity fails.
    """
    p64 = p.astype(np.float64)
    ids = np.asarray(ids, dtype=np.int64)
    T, d, V, N = len(ids), p.d, p.V, int(window)
    if T < 2:
        raise IsanError("window statistics need at least two characters")
    B = max(1, min(int(segments), T // max(1, 4 * (N + warmup))))
    # segment b counts positions [starts[b], ends[b]) (a position t predicts ids[t + 1]); it starts from h
    # warmup + N characters before (the first segment from the start of the text, exactly)
    edges = np.linspace(0, T - 1, B + 1).astype(np.int64)
    starts, ends = edges[:-1], edges[1:]
    begin = np.maximum(starts - N - warmup, 0)
    h = p64.h0 if h is None else np.asarray(h, dtype=np.float64)
    H0 = np.tile(h, (B, 1))
    L = int((ends - begin).max())
    W = p.W.astype(dtype)
    bias = p.b.astype(dtype)
    W_ro = p.W_ro.astype(dtype)
    b_ro = p64.b_ro
    C = np.zeros((d, B, N + 1), dtype=dtype)  # per segment: history, then lags 0..N-1
    C[:, :, 0] = H0.T
    # the biases of the spaces that have left the window, carried like the history (the start state
    # is no space): with the spaces among lags 0..N-1 they give every space's kappa
    S = np.zeros((d, B), dtype=dtype)
    state = H0.copy()  # the float64 reference states, advanced alongside
    norm_sum = np.zeros(N)
    hist_norm_sum = 0.0
    keep_sum = np.zeros(N + 1)
    full_sum = 0.0
    n_pos = 0
    P = max_word_position + 1
    w_full, w_only, w_none, w_cnt = np.zeros(P), np.zeros(P), np.zeros(P), np.zeros(P, dtype=np.int64)
    w_all_only, w_all_none = np.zeros(P), np.zeros(P)
    w_vals = {k: [[] for _ in range(P)] for k in ("full", "only", "none", "all_only", "all_none")}  # for medians
    last_space = np.full(B, -1, dtype=np.int64)  # position of the last space read, per segment
    outside = 0
    err = 0.0
    lmax = 1.0
    check = starts[1] - 1 if B > 1 and begin[1] > 0 else None  # segment 0 is exact there; 1 was warmed up
    snap = {}
    for i in range(L):
        t = begin + i
        live = t < ends  # segments still inside their range
        x = np.where(live, ids[np.minimum(t, T - 1)], 0)
        # the oldest exact source joins the history; each symbol's matrix then carries its segments'
        # history and lags 0..N-2 one step on (to history and lags 1..N-1), and lag 0 is the new bias
        C[:, :, 0] += C[:, :, N]
        if space_id is not None:  # the source leaving the window is the character N back
            gone = t - N
            S += C[:, :, N] * ((gone >= 0) & (ids[np.maximum(gone, 0)] == space_id))
        for s in np.unique(x[live]):
            sel = np.nonzero(live & (x == s))[0]
            if space_id is not None:
                S[:, sel] = W[s] @ S[:, sel]
            out = (W[s] @ C[:, sel, :N].reshape(d, -1)).reshape(d, len(sel), N)
            C[:, sel, 0] = out[:, :, 0]
            C[:, sel, 2:] = out[:, :, 1:]
            C[:, sel, 1] = bias[s][:, None]
            state[sel] = state[sel] @ p64.W[s].T + p64.b[s]
        if check is not None:
            for b in (0, 1):
                if t[b] == check:
                    snap[b] = state[b].copy()
        if space_id is not None:
            last_space = np.where(live & (x == space_id), t, last_space)
        counted = live & (t >= starts) & (t + 1 < T)
        if not counted.any():
            continue
        sel = np.nonzero(counted)[0]
        K = (W_ro @ C.reshape(d, -1)).reshape(V, B, N + 1)[:, sel].transpose(1, 2, 0).astype(np.float64)  # (n, N+1, V)
        logits = state[sel] @ p64.W_ro.T + b_ro
        lmax = max(lmax, float(np.abs(logits).max()))
        err = max(err, float(np.abs(b_ro + K.sum(1) - logits).max()))
        nxt = ids[t[sel] + 1]
        r = np.arange(len(sel))
        norms = np.linalg.norm(K, axis=2)  # (n, N + 1)
        norm_sum += norms[:, 1:].sum(0)
        hist_norm_sum += float(norms[:, 0].sum())
        # keep the last n sources: cumulative sums over lags
        cum = b_ro + np.concatenate([np.zeros((len(sel), 1, V)), np.cumsum(K[:, 1:], axis=1)], axis=1)  # (n, N+1, V)
        lp = log_softmax(cum)[r, :, nxt]  # (n, N + 1)
        keep_sum += -lp.sum(0) * LOG2E
        lp_full = log_softmax(logits)[r, nxt]
        full_sum += float(-lp_full.sum() * LOG2E)
        n_pos += len(sel)
        if space_id is not None:
            lag = t[sel] - last_space[sel]  # 0 when the space was just read
            ok = (last_space[sel] >= 0) & (lag < N) & (lag < P)
            outside += int(((last_space[sel] >= 0) & (lag >= N)).sum())
            if ok.any():
                j = np.nonzero(ok)[0]
                ks = K[j, 1 + lag[j]]  # (m, V) the last space's kappa
                m = np.arange(len(j))
                only = log_softmax(b_ro + ks)[m, nxt[j]]
                none = log_softmax(logits[j] - ks)[m, nxt[j]]
                # every space's kappa: the spaces among lags 0..N-1, and those carried beyond the window
                src = t[sel][j, None] - np.arange(N)[None, :]  # (m, N) the character at each lag
                is_sp = (src >= 0) & (ids[np.maximum(src, 0)] == space_id)
                ka = np.einsum("mkv,mk->mv", K[j, 1:], is_sp) + (W_ro @ S[:, sel[j]]).T.astype(np.float64)
                all_only = log_softmax(b_ro + ka)[m, nxt[j]]
                all_none = log_softmax(logits[j] - ka)[m, nxt[j]]
                np.add.at(w_full, lag[j], -lp_full[j] * LOG2E)
                np.add.at(w_only, lag[j], -only * LOG2E)
                np.add.at(w_none, lag[j], -none * LOG2E)
                np.add.at(w_all_only, lag[j], -all_only * LOG2E)
                np.add.at(w_all_none, lag[j], -all_none * LOG2E)
                np.add.at(w_cnt, lag[j], 1)
                for k, v in (("full", -lp_full[j] * LOG2E), ("only", -only * LOG2E), ("none", -none * LOG2E),
                             ("all_only", -all_only * LOG2E), ("all_none", -all_none * LOG2E)):
                    for q in np.unique(lag[j]):
                        w_vals[k][q].append(v[lag[j] == q].astype(np.float32))
    if err > tol * lmax:
        raise AttributionCheckError(f"b_ro + sum kappa differs from the logits by {err:.3g} (window statistics)")
    c = np.maximum(w_cnt, 1)
    warm_err = None
    if len(snap) == 2:
        warm_err = float(np.abs(snap[0] - snap[1]).max()) / max(1.0, float(np.abs(snap[0]).max()))
    med = {k: np.array([float(np.median(np.concatenate(v[q]))) if v[q] else np.nan for q in range(P)])
           for k, v in w_vals.items()}
    return DecayStats(N, n_pos, norm_sum / n_pos, hist_norm_sum / n_pos, keep_sum / n_pos, full_sum / n_pos,
                      np.arange(P), w_full / c, w_only / c, w_none / c, w_cnt, outside, err, B, warm_err,
                      med["full"], med["only"], med["none"], w_all_only / c, w_all_none / c, med["all_only"],
                      med["all_none"])


def fit_two_rates(norms: np.ndarray, min_points: int = 4) -> dict:
    """Two exponential rates for a decaying curve: the log of ``norms`` against the lag fitted by two
    straight lines meeting at a breakpoint chosen by least squares.

    Returns:
        {"break_lag", "rate_fast", "rate_slow" (per character, the slope of ln norm), "tau_fast",
        "tau_slow" (characters per factor e), "intercept_fast", "intercept_slow", "rmse" (in ln units),
        "one_rate": {"rate", "rmse"} (a single line, for comparison)}.
    """
    y = np.log(np.asarray(norms, dtype=np.float64))
    k = np.arange(len(y), dtype=np.float64)
    best = None
    A = np.vstack([k, np.ones_like(k)]).T
    one, res1, *_ = np.linalg.lstsq(A, y, rcond=None)
    for brk in range(min_points, len(y) - min_points + 1):
        a1, *_ = np.linalg.lstsq(A[:brk], y[:brk], rcond=None)
        a2, *_ = np.linalg.lstsq(A[brk:], y[brk:], rcond=None)
        r = np.concatenate([A[:brk] @ a1 - y[:brk], A[brk:] @ a2 - y[brk:]])
        sse = float(r @ r)
        if best is None or sse < best[0]:
            best = (sse, brk, a1, a2)
    sse, brk, a1, a2 = best
    return {"break_lag": int(brk), "rate_fast": float(a1[0]), "rate_slow": float(a2[0]),
            "tau_fast": float(-1 / a1[0]) if a1[0] < 0 else None, "tau_slow": float(-1 / a2[0]) if a2[0] < 0 else None,
            "intercept_fast": float(a1[1]), "intercept_slow": float(a2[1]), "rmse": float(np.sqrt(sse / len(y))),
            "one_rate": {"rate": float(one[0]), "rmse": float(np.sqrt(np.mean((A @ one - y) ** 2)))}}
