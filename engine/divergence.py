"""Which repeated letters and pairs of letters make an ISAN's state diverge (``isan model check``).

An ISAN applies ``h <- W[x] h + b[x]`` per character, so a letter repeated n times multiplies
the state by ``W[x]^n``, and a pair "xy" repeated does the same with the period map
``M = W[y] W[x]`` (``c = W[y] b[x] + b[y]``). Whether such a run diverges is decided exactly by
the spectral radius: where ``rho(M) > 1`` the state grows like ``rho^n`` along the leading
eigenvector (any start state and float rounding excite it), where ``rho(M) < 1`` it converges to
the fixed point ``(I - M)^-1 c`` whatever the start. :func:`repeat_divergence` computes the
spectral radius of every letter's ``W[x]`` and of every pair's ``W[y] W[x]`` (``rho(W[y] W[x]) =
rho(W[x] W[y])``, so K(K-1)/2 products), in float64 with LAPACK's eigenvalue solver.

For every diverging run it then finds, from h0, after how many characters ``max |h_i|`` first
exceeds the engine's limit (:data:`isan.engine.guard.MAX_STATE_ABS`), the offset at which
scoring stops: all K^2 runs step together (one GEMM per symbol and step) for ``max_chars``
characters; a diverging run still in range then continues alone in jumps of
``JUMP_PERIODS`` periods (the period map composed by repeated squaring), and the first crossing
is located character by character inside the jump where it happened. A run that grows so slowly
that it stays in range for ``max_total_chars`` characters is reported with ``after_chars`` None.

Runs that converge are checked too: a transient that leaves the range within ``max_chars`` is
reported as a crossing (``spectral_radius`` < 1 says it is one), and every fixed point's
``max |h_i|`` is reported (``largest_fixed_point``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

from isan.engine.guard import MAX_STATE_ABS
from isan.params import ISANParams

DEFAULT_MAX_CHARS = 2000
DEFAULT_MAX_TOTAL_CHARS = 100_000_000
JUMP_PERIODS = 1024
CONVERGED_RTOL = 1e-12


def spectral_radii(W: np.ndarray, threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Spectral radii of every ``W[x]`` and of every product ``W[y] W[x]``.

    Args:
        W: (K, d, d) transition matrices (computed in float64).
        threads: worker threads for the eigenvalue solves (each with one BLAS thread).
    Returns:
        (letters (K,), pairs (K, K)) float64: ``pairs[x, y] = rho(W[y] W[x])`` (symmetric; the
        diagonal repeats ``letters ** 2``).
    """
    W = np.asarray(W, dtype=np.float64)
    K = len(W)
    iu = np.triu_indices(K, 1)

    def radii(mats: np.ndarray) -> np.ndarray:
        return np.abs(np.linalg.eigvals(mats)).max(axis=1) if len(mats) else np.zeros(0)

    with threadpool_limits(1, user_api="blas"):  # one BLAS thread per solve: faster for d ~ 200
        products = np.matmul(W[iu[1]], W[iu[0]])
        jobs = [W] + np.array_split(products, max(1, threads * 4))
        with ThreadPoolExecutor(max(1, threads)) as pool:
            out = list(pool.map(radii, jobs))
    letters = out[0]
    upper = np.concatenate(out[1:]) if len(out) > 1 else np.zeros(0)
    pairs = np.zeros((K, K))
    pairs[iu] = upper
    pairs[(iu[1], iu[0])] = upper
    pairs[np.diag_indices(K)] = letters ** 2
    return letters, pairs


def _period_map(p: ISANParams, x: int, y: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, c) of two characters x then y: ``h -> W[y] (W[x] h + b[x]) + b[y]``."""
    return p.W[y] @ p.W[x], p.W[y] @ p.b[x] + p.b[y]


def _crossing_by_jumps(p: ISANParams, x: int, y: int, h: np.ndarray, t: int, limit: float,
                       max_total: int) -> int | None:
    """Characters after which the run x y x y ... (from state h after t characters, t even)
    first leaves the range; None if not within ``max_total`` characters."""
    M, c = _period_map(p, x, y)
    A, a = M.copy(), c.copy()  # the map of JUMP_PERIODS periods, by repeated squaring
    for _ in range(int(np.log2(JUMP_PERIODS))):
        A, a = A @ A, A @ a + a
    while t + 2 * JUMP_PERIODS <= max_total:
        nxt = A @ h + a
        if not np.abs(nxt).max() <= limit:
            break
        h, t = nxt, t + 2 * JUMP_PERIODS
    else:
        return None
    for _ in range(JUMP_PERIODS):  # inside the jump: character by character
        for k in (x, y):
            h = p.W[k] @ h + p.b[k]
            t += 1
            if not np.abs(h).max() <= limit:
                return t
    return t  # the jump's end state was out of range; rounding put the crossing at its last step


def _step_runs(p: ISANParams, first: np.ndarray, second: np.ndarray, rho_period: np.ndarray, steps: int,
               limit: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step all K^2 runs (run i repeats ``first[i]``, ``second[i]``) together from h0 for ``steps``
    characters, one GEMM per symbol and step; a run stops once out of range, or once it has settled
    on its fixed point (a converging period map whose state no longer changes over a period).

    Returns:
        (H (n, d) float64 the runs' states, after (n,) int64 the characters after which each run first
        left the range (-1: it did not), active (n,) bool the runs still in range and unsettled).
    """
    n = len(first)
    WT = np.ascontiguousarray(p.W.transpose(0, 2, 1))  # rows @ WT[k] == (W[k] @ rows.T).T
    H = np.tile(p.h0, (n, 1))
    H_period = H.copy()
    active = np.ones(n, dtype=bool)
    after = np.full(n, -1, dtype=np.int64)
    for t in range(steps):
        idx = np.flatnonzero(active)
        if len(idx) == 0:
            break
        sym = (first if t % 2 == 0 else second)[idx]
        order = np.argsort(sym, kind="stable")
        idx, sym = idx[order], sym[order]
        cuts = np.flatnonzero(np.diff(sym)) + 1
        for rows, k in zip(np.split(idx, cuts), sym[np.concatenate([[0], cuts])]):
            H[rows] = H[rows] @ WT[k] + p.b[k]
        m = np.abs(H[idx]).max(axis=1)
        out = ~(m <= limit)  # NaN counts as out
        after[idx[out]] = t + 1
        active[idx[out]] = False
        if t % 2 == 1:
            ok = idx[~out]
            change = np.abs(H[ok] - H_period[ok]).max(axis=1) / (1.0 + np.abs(H[ok]).max(axis=1))
            done = ok[(change < CONVERGED_RTOL) & (rho_period[ok] < 1)]
            active[done] = False
            H_period[ok] = H[ok]
    return H, after, active


def _largest_fixed_point(p: ISANParams, first: np.ndarray, second: np.ndarray, rho_period: np.ndarray) -> float:
    """The largest ``max |h_i|`` over the fixed points (both phases of the period) of the converging runs."""
    fixed_max = 0.0
    for i in np.flatnonzero(rho_period < 1):  # where converging runs settle
        M, c = _period_map(p, int(first[i]), int(second[i]))
        hstar = np.linalg.solve(np.eye(p.d) - M, c)
        fixed_max = max(fixed_max, float(np.abs(hstar).max()),
                        float(np.abs(p.W[int(first[i])] @ hstar + p.b[int(first[i])]).max()))
    return fixed_max


def _leaving_runs(symbols, first: np.ndarray, second: np.ndarray, rho: np.ndarray, rho_period: np.ndarray,
                  after: np.ndarray) -> tuple[list[dict], list[dict]]:
    """(letters, pairs): the runs that leave the range, sorted by ``after_chars`` (None, beyond the
    search, last), then by symbol or pair."""
    leaves = (after > 0) | (after == -2)

    def ac(i):
        return None if after[i] == -2 else int(after[i])

    letters = [{"symbol": symbols[int(first[i])], "spectral_radius": float(rho[i]), "after_chars": ac(i)}
               for i in np.flatnonzero(leaves & (first == second))]
    pairs = [{"pair": symbols[int(first[i])] + symbols[int(second[i])], "spectral_radius": float(rho_period[i]),
              "after_chars": ac(i)} for i in np.flatnonzero(leaves & (first != second))]
    key = (lambda name: (lambda r: (r["after_chars"] is None, r["after_chars"] or 0, r[name])))
    letters.sort(key=key("symbol"))
    pairs.sort(key=key("pair"))
    return letters, pairs


def repeat_divergence(params: ISANParams, symbols, max_chars: int = DEFAULT_MAX_CHARS,
                      limit: float = MAX_STATE_ABS, max_total_chars: int = DEFAULT_MAX_TOTAL_CHARS) -> dict:
    """Decide for every symbol and every ordered pair of symbols whether its repeats diverge.

    Args:
        params: the ISAN (computed in float64).
        symbols: the alphabet's symbols (input labels) in id order (K of them).
        max_chars: characters every run is stepped from h0 before slow runs go on in jumps.
        limit: the state range (``max |h_i|``).
        max_total_chars: the longest run searched for a crossing.
    Returns:
        ``{"letters": [{"symbol", "spectral_radius", "after_chars"}], "pairs": [{"pair",
        "spectral_radius", "after_chars"}], "spectral_radius": {"letters": {symbol: rho},
        "max_letter", "max_pair"}, "n_letters_checked", "n_pairs_checked", "diverging_letters",
        "diverging_pairs", "converging", "largest_fixed_point", "max_chars", "max_total_chars",
        "limit", "method", "seconds"}``. ``letters`` and ``pairs`` list the runs that leave the
        range (spectral radius above 1, or a transient), sorted by ``after_chars``, the number of
        characters after which the state is first out of range from h0 (None: beyond
        ``max_total_chars``); pairs have two different symbols and are ordered ("xy" repeats
        xyxy...).
    """
    t0 = time.perf_counter()
    p = params.astype(np.float64)
    K = p.K
    rho_letters, rho_pairs = spectral_radii(p.W)
    first = np.repeat(np.arange(K), K)  # run i repeats (first[i], second[i])
    second = np.tile(np.arange(K), K)
    rho = np.where(first == second, rho_letters[first], np.sqrt(rho_pairs[first, second]))  # per character
    rho_period = rho_pairs[first, second]  # the period map's (two characters)
    steps = int(max_chars) + int(max_chars) % 2  # end on a whole period
    with threadpool_limits(1, user_api="blas"):
        H, after, active = _step_runs(p, first, second, rho_period, steps, limit)
        slow = np.flatnonzero(active & (rho_period > 1))
        for i in slow:  # diverging, still in range: go on in jumps
            x, y = int(first[i]), int(second[i])
            hit = _crossing_by_jumps(p, x, y, H[i].copy(), steps, limit, int(max_total_chars))
            after[i] = -2 if hit is None else hit
        fixed_max = _largest_fixed_point(p, first, second, rho_period)
    letters, pairs = _leaving_runs(symbols, first, second, rho, rho_period, after)
    off = first != second
    return {
        "letters": letters, "pairs": pairs,
        "spectral_radius": {"letters": {symbols[k]: float(rho_letters[k]) for k in range(K)},
                            "max_letter": float(rho_letters.max()),
                            "max_pair": float(rho_pairs[off.reshape(K, K)].max()) if K > 1 else None},
        "n_letters_checked": int(K), "n_pairs_checked": int(K * (K - 1)),
        "diverging_letters": int((rho_letters > 1).sum()), "diverging_pairs": int((rho_period[off] > 1).sum()),
        "converging": int((rho_period < 1).sum()), "largest_fixed_point": fixed_max,
        "max_chars": int(max_chars), "max_total_chars": int(max_total_chars), "limit": float(limit),
        "method": "spectral radius of W[x] and W[y] W[x] (float64 eigenvalues); crossings from h0 by float64 "
                  f"steps, past {int(max_chars):,} characters in jumps of {JUMP_PERIODS:,} periods",
        "seconds": round(time.perf_counter() - t0, 3)}


def adversarial_search(params: ISANParams, symbols, beam: int = 16, chars: int = 200,
                       limit: float = MAX_STATE_ABS) -> dict:
    """Look for the text that drives ``max |h_i|`` highest: a beam search over symbols from h0.

    Each step extends every kept text by every symbol and keeps the ``beam`` whose states have the
    largest ``max |h_i|`` (float64). A lower bound on the worst case, not a proof: a certificate
    (:mod:`isan.engine.certificate`) gives the upper bound.

    Returns:
        ``{"max_abs_h": the largest max |h_i| seen, "text": the text that reached it (at most 80
        characters shown, the end kept), "chars": its length, "diverged": whether it left the
        range (the search stops there), "beam", "searched_chars", "seconds"}``.
    """
    t0 = time.perf_counter()
    p = params.astype(np.float64)
    K = p.K
    WT = np.ascontiguousarray(p.W.transpose(0, 2, 1))
    H = p.h0[None, :].copy()
    texts = [[]]
    best = (float(np.abs(p.h0).max()), [])
    with threadpool_limits(1, user_api="blas"):
        for t in range(int(chars)):
            cand = np.stack([H @ WT[k] + p.b[k] for k in range(K)], axis=1)  # (B, K, d)
            m = np.abs(cand).max(axis=2)
            m = np.where(np.isfinite(m), m, np.inf)
            flat = np.argsort(-m, axis=None, kind="stable")[: int(beam)]
            bi, ki = np.unravel_index(flat, m.shape)
            H = cand[bi, ki]
            texts = [texts[i] + [int(k)] for i, k in zip(bi, ki)]
            top = float(m[bi[0], ki[0]])
            if top > best[0]:
                best = (top, texts[0])
            if not top <= limit:
                break
    text = "".join(symbols[k] for k in best[1])
    return {"max_abs_h": best[0], "text": text[-80:], "chars": len(best[1]), "diverged": not best[0] <= limit,
            "beam": int(beam), "searched_chars": int(chars), "seconds": round(time.perf_counter() - t0, 3)}
