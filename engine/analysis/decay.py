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


#: Fig 4b's readings of a position in the word: all sources, the last space's kappa only / removed,
#: every space's kappa only / removed
_WORD_READINGS = ("full", "only", "none", "all_only", "all_none")


class _Sources:
    """The sources of B segments' positions, carried one character at a time: ``C`` (d, B, N + 1),
    per segment the history (lags >= N) then lags 0..N-1 (``dtype``); ``S`` (d, B) the biases of the
    spaces that have left the window, carried like the history (the start state is no space): with
    the spaces among lags 0..N-1 they give every space's kappa; ``state`` (B, d) the float64
    reference states, advanced alongside."""

    def __init__(self, p: ISANParams, H0: np.ndarray, N: int, dtype, space_id: int | None):
        self.p64 = p.astype(np.float64)
        self.W, self.bias, self.W_ro = p.W.astype(dtype), p.b.astype(dtype), p.W_ro.astype(dtype)
        self.N, self.space_id = N, space_id
        d, B = H0.shape[1], H0.shape[0]
        self.C = np.zeros((d, B, N + 1), dtype=dtype)
        self.C[:, :, 0] = H0.T
        self.S = np.zeros((d, B), dtype=dtype)
        self.state = H0.copy()

    def step(self, ids: np.ndarray, t: np.ndarray, x: np.ndarray, live: np.ndarray) -> None:
        """Read character ``x[b]`` at position ``t[b]`` in every ``live`` segment b (one GEMM per symbol)."""
        C, S, N, d = self.C, self.S, self.N, self.C.shape[0]
        # the oldest exact source joins the history; each symbol's matrix then carries its segments'
        # history and lags 0..N-2 one step on (to history and lags 1..N-1), and lag 0 is the new bias
        C[:, :, 0] += C[:, :, N]
        if self.space_id is not None:  # the source leaving the window is the character N back
            gone = t - N
            S += C[:, :, N] * ((gone >= 0) & (ids[np.maximum(gone, 0)] == self.space_id))
        for s in np.unique(x[live]):
            sel = np.nonzero(live & (x == s))[0]
            if self.space_id is not None:
                S[:, sel] = self.W[s] @ S[:, sel]
            out = (self.W[s] @ C[:, sel, :N].reshape(d, -1)).reshape(d, len(sel), N)
            C[:, sel, 0] = out[:, :, 0]
            C[:, sel, 2:] = out[:, :, 1:]
            C[:, sel, 1] = self.bias[s][:, None]
            self.state[sel] = self.state[sel] @ self.p64.W[s].T + self.p64.b[s]

    def kappa(self, sel: np.ndarray) -> np.ndarray:
        """(n, N + 1, V) float64: segments ``sel``'s kappa of the history, then of lags 0..N-1."""
        d, B = self.S.shape
        V = self.W_ro.shape[0]
        K = (self.W_ro @ self.C.reshape(d, -1)).reshape(V, B, self.N + 1)
        return K[:, sel].transpose(1, 2, 0).astype(np.float64)

    def logits(self, sel: np.ndarray) -> np.ndarray:
        """(n, V) float64: segments ``sel``'s reference logits."""
        return self.state[sel] @ self.p64.W_ro.T + self.p64.b_ro

    def old_spaces_kappa(self, sel: np.ndarray) -> np.ndarray:
        """(n, V) float64: segments ``sel``'s kappa of the spaces older than the window."""
        return (self.W_ro @ self.S[:, sel]).T.astype(np.float64)


class _Fig4ac:
    """Figures 4a and 4c, summed over positions: each lag's ``||kappa||``, the history's, and the bits
    of the next character keeping the last n sources (n = 0..N) and all of them."""

    def __init__(self, N: int):
        self.norm_sum, self.hist_norm_sum = np.zeros(N), 0.0
        self.keep_sum, self.full_sum, self.n_pos = np.zeros(N + 1), 0.0, 0

    def add(self, K: np.ndarray, logits: np.ndarray, nxt: np.ndarray, b_ro: np.ndarray) -> np.ndarray:
        """Count positions with kappa ``K`` (n, N + 1, V), ``logits`` (n, V) and next ids ``nxt`` (n,);
        returns the log-probabilities of the next characters with all sources (n,)."""
        n, V = len(nxt), K.shape[2]
        r = np.arange(n)
        norms = np.linalg.norm(K, axis=2)  # (n, N + 1)
        self.norm_sum += norms[:, 1:].sum(0)
        self.hist_norm_sum += float(norms[:, 0].sum())
        # keep the last n sources: cumulative sums over lags
        cum = b_ro + np.concatenate([np.zeros((n, 1, V)), np.cumsum(K[:, 1:], axis=1)], axis=1)  # (n, N+1, V)
        lp = log_softmax(cum)[r, :, nxt]  # (n, N + 1)
        self.keep_sum += -lp.sum(0) * LOG2E
        lp_full = log_softmax(logits)[r, nxt]
        self.full_sum += float(-lp_full.sum() * LOG2E)
        self.n_pos += n
        return lp_full


class _Fig4b:
    """Figure 4b, by position in the word 0..P-1: the bits summed (and kept, for the medians) of each
    reading in :data:`_WORD_READINGS`, the positions counted, and those whose last space was N or more
    back (skipped)."""

    def __init__(self, P: int):
        self.P = P
        self.sums = {k: np.zeros(P) for k in _WORD_READINGS}
        self.counts = np.zeros(P, dtype=np.int64)
        self.values = {k: [[] for _ in range(P)] for k in _WORD_READINGS}  # for medians
        self.outside = 0

    def add(self, src: _Sources, ids: np.ndarray, t: np.ndarray, last_space: np.ndarray, sel: np.ndarray,
            K: np.ndarray, logits: np.ndarray, nxt: np.ndarray, lp_full: np.ndarray) -> None:
        """Count segments ``sel``'s positions ``t`` (n,) whose last space (``last_space``, (n,)) is in the window."""
        N, space_id = src.N, src.space_id
        b_ro = src.p64.b_ro
        lag = t - last_space  # 0 when the space was just read
        ok = (last_space >= 0) & (lag < N) & (lag < self.P)
        self.outside += int(((last_space >= 0) & (lag >= N)).sum())
        if not ok.any():
            return
        j = np.nonzero(ok)[0]
        ks = K[j, 1 + lag[j]]  # (m, V) the last space's kappa
        m = np.arange(len(j))
        only = log_softmax(b_ro + ks)[m, nxt[j]]
        none = log_softmax(logits[j] - ks)[m, nxt[j]]
        # every space's kappa: the spaces among lags 0..N-1, and those carried beyond the window
        srcs = t[j, None] - np.arange(N)[None, :]  # (m, N) the character at each lag
        is_sp = (srcs >= 0) & (ids[np.maximum(srcs, 0)] == space_id)
        ka = np.einsum("mkv,mk->mv", K[j, 1:], is_sp) + src.old_spaces_kappa(sel[j])
        all_only = log_softmax(b_ro + ka)[m, nxt[j]]
        all_none = log_softmax(logits[j] - ka)[m, nxt[j]]
        bits = {"full": -lp_full[j] * LOG2E, "only": -only * LOG2E, "none": -none * LOG2E,
                "all_only": -all_only * LOG2E, "all_none": -all_none * LOG2E}
        for k in _WORD_READINGS:
            np.add.at(self.sums[k], lag[j], bits[k])
        np.add.at(self.counts, lag[j], 1)
        for k in _WORD_READINGS:
            for q in np.unique(lag[j]):
                self.values[k][q].append(bits[k][lag[j] == q].astype(np.float32))

    def medians(self) -> dict[str, np.ndarray]:
        """{reading: (P,) the median bits at each position in the word (NaN where none was counted)}."""
        return {k: np.array([float(np.median(np.concatenate(v[q]))) if v[q] else np.nan for q in range(self.P)])
                for k, v in self.values.items()}


def _segments(T: int, N: int, segments: int, warmup: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(B, starts, ends, begin): segment b counts positions [starts[b], ends[b]) (a position t predicts
    ids[t + 1]); it reads from ``begin[b]``, warmup + N characters before (the first segment from the
    start of the text, exactly)."""
    B = max(1, min(int(segments), T // max(1, 4 * (N + warmup))))
    edges = np.linspace(0, T - 1, B + 1).astype(np.int64)
    starts, ends = edges[:-1], edges[1:]
    begin = np.maximum(starts - N - warmup, 0)
    return B, starts, ends, begin


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
    ids = np.asarray(ids, dtype=np.int64)
    T, N = len(ids), int(window)
    if T < 2:
        raise IsanError("window statistics need at least two characters")
    B, starts, ends, begin = _segments(T, N, segments, warmup)
    h = p.astype(np.float64).h0 if h is None else np.asarray(h, dtype=np.float64)
    src = _Sources(p, np.tile(h, (B, 1)), N, dtype, space_id)
    b_ro = src.p64.b_ro
    fig4ac, fig4b = _Fig4ac(N), _Fig4b(max_word_position + 1)
    last_space = np.full(B, -1, dtype=np.int64)  # position of the last space read, per segment
    err, lmax = 0.0, 1.0
    check = starts[1] - 1 if B > 1 and begin[1] > 0 else None  # segment 0 is exact there; 1 was warmed up
    snap = {}
    for i in range(int((ends - begin).max())):
        t = begin + i
        live = t < ends  # segments still inside their range
        x = np.where(live, ids[np.minimum(t, T - 1)], 0)
        src.step(ids, t, x, live)
        if check is not None:
            for b in (0, 1):
                if t[b] == check:
                    snap[b] = src.state[b].copy()
        if space_id is not None:
            last_space = np.where(live & (x == space_id), t, last_space)
        counted = live & (t >= starts) & (t + 1 < T)
        if not counted.any():
            continue
        sel = np.nonzero(counted)[0]
        K, logits = src.kappa(sel), src.logits(sel)
        lmax = max(lmax, float(np.abs(logits).max()))
        err = max(err, float(np.abs(b_ro + K.sum(1) - logits).max()))
        nxt = ids[t[sel] + 1]
        lp_full = fig4ac.add(K, logits, nxt, b_ro)
        if space_id is not None:
            fig4b.add(src, ids, t[sel], last_space[sel], sel, K, logits, nxt, lp_full)
    if err > tol * lmax:
        raise AttributionCheckError(f"b_ro + sum kappa differs from the logits by {err:.3g} (window statistics)")
    warm_err = None
    if len(snap) == 2:
        warm_err = float(np.abs(snap[0] - snap[1]).max()) / max(1.0, float(np.abs(snap[0]).max()))
    return _decay_stats(N, fig4ac, fig4b, err, B, warm_err)


def _decay_stats(N: int, fig4ac: _Fig4ac, fig4b: _Fig4b, err: float, B: int, warm_err: float | None) -> DecayStats:
    """The means (over the positions counted) and medians of the sums, as :class:`DecayStats`."""
    n_pos, c, w, med = fig4ac.n_pos, np.maximum(fig4b.counts, 1), fig4b.sums, fig4b.medians()
    return DecayStats(N, n_pos, fig4ac.norm_sum / n_pos, fig4ac.hist_norm_sum / n_pos, fig4ac.keep_sum / n_pos,
                      fig4ac.full_sum / n_pos, np.arange(fig4b.P), w["full"] / c, w["only"] / c, w["none"] / c,
                      fig4b.counts, fig4b.outside, err, B, warm_err, med["full"], med["only"], med["none"],
                      w["all_only"] / c, w["all_none"] / c, med["all_only"], med["all_none"])


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
