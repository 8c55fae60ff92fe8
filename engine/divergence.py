"""Which repeated letters and pairs of letters make an ISAN's state diverge (``isan model check``).

An ISAN applies ``h <- W[x] h + b[x]`` per character, so a letter repeated n times multiplies
the state by ``W[x]^n``: where ``W[x]`` has spectral radius above 1 the state grows without bound
(the shipped model's 'z' has 2.17), and a pair "xy" repeated does the same with
``W[y] W[x]``. Real text rarely repeats a letter or pair for long, but a user can send any text,
and :mod:`isan.engine.guard` refuses states beyond ``MAX_STATE_ABS``.

:func:`repeat_divergence` runs, in float64 from h0, every ordered pair of symbols (x, y)
repeated as ``xyxyxy...`` (x == y is the letter x repeated) for up to ``max_chars`` characters,
all K^2 runs as one batch grouped by symbol (one GEMM per symbol and step). A run stops when
its state leaves the range (it diverges; reported with the number of characters it took) or
when it has converged (its state after a whole period changes by less than 1e-12 relative:
it sits at the fixed point of its period map and stays there).
"""

from __future__ import annotations

import time

import numpy as np

from isan.engine.guard import MAX_STATE_ABS
from isan.params import ISANParams

DEFAULT_MAX_CHARS = 2000
CONVERGED_RTOL = 1e-12


def repeat_divergence(params: ISANParams, symbols, max_chars: int = DEFAULT_MAX_CHARS,
                      limit: float = MAX_STATE_ABS) -> dict:
    """Repeat every symbol and every ordered pair of symbols from h0; report the diverging ones.

    Args:
        params: the ISAN (computed in float64).
        symbols: the alphabet's symbols in id order (K of them).
        max_chars: characters per run (at most); runs that neither diverge nor converge by then
            are reported as ``undecided``.
        limit: the state range (``max |h_i|``).
    Returns:
        ``{"max_chars", "limit", "letters": [{"symbol", "after_chars"}], "pairs": [{"pair",
        "after_chars"}], "n_letters_checked", "n_pairs_checked", "converged", "undecided",
        "seconds"}``; ``after_chars`` is the number of characters after which the state is first
        out of range. Lists are sorted by ``after_chars``; pairs have two different symbols.
    """
    t0 = time.perf_counter()
    p = params.astype(np.float64)
    K, d = p.K, p.d
    first = np.repeat(np.arange(K), K)  # run i repeats (first[i], second[i])
    second = np.tile(np.arange(K), K)
    n = K * K
    WT = np.ascontiguousarray(p.W.transpose(0, 2, 1))  # rows @ WT[k] == (W[k] @ rows.T).T
    H = np.tile(p.h0, (n, 1))
    H_period = H.copy()  # the state at the start of the current period (two characters)
    active = np.ones(n, dtype=bool)
    after = np.full(n, -1, dtype=np.int64)
    converged = np.zeros(n, dtype=bool)
    for t in range(int(max_chars)):
        idx = np.flatnonzero(active)
        if len(idx) == 0:
            break
        sym = (first if t % 2 == 0 else second)[idx]
        order = np.argsort(sym, kind="stable")
        idx, sym = idx[order], sym[order]
        cuts = np.flatnonzero(np.diff(sym)) + 1
        for grp_rows, k in zip(np.split(idx, cuts), sym[np.concatenate([[0], cuts])] if len(idx) else []):
            H[grp_rows] = H[grp_rows] @ WT[k] + p.b[k]
        m = np.abs(H[idx]).max(axis=1)
        out = ~(m <= limit)  # NaN counts as out
        after[idx[out]] = t + 1
        active[idx[out]] = False
        if t % 2 == 1:
            ok = idx[~out]
            change = np.abs(H[ok] - H_period[ok]).max(axis=1) / (1.0 + np.abs(H[ok]).max(axis=1))
            done = ok[change < CONVERGED_RTOL]
            converged[done] = True
            active[done] = False
            H_period[ok] = H[ok]
    letters = [{"symbol": symbols[int(first[i])], "after_chars": int(after[i])}
               for i in np.flatnonzero((after > 0) & (first == second))]
    pairs = [{"pair": symbols[int(first[i])] + symbols[int(second[i])], "after_chars": int(after[i])}
             for i in np.flatnonzero((after > 0) & (first != second))]
    letters.sort(key=lambda r: (r["after_chars"], r["symbol"]))
    pairs.sort(key=lambda r: (r["after_chars"], r["pair"]))
    return {"max_chars": int(max_chars), "limit": float(limit), "letters": letters, "pairs": pairs,
            "n_letters_checked": int(K), "n_pairs_checked": int(K * (K - 1)),
            "converged": int(converged.sum()), "undecided": int((active & (after < 0)).sum()),
            "seconds": round(time.perf_counter() - t0, 3)}
