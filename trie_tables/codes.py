"""Exact integer codes of substrings and greedy longest-match segmentation (vectorized numpy).

A substring of ids ``x_0 .. x_{k-1}`` (each < K) has the code ``sum_j (x_j + 1) << (bits * j)``
with ``bits = ceil(log2(K + 1))``. Codes are exact (no hashing): two substrings have the same
code only if they are equal, provided ``bits * k <= 63``; that bounds the table's max length
(12 characters for text8's 27 symbols). Codes of different lengths never collide because
every symbol contributes at least 1 in its slot.
"""

from __future__ import annotations

import numpy as np


def bits_per_symbol(K: int) -> int:
    return int(np.ceil(np.log2(K + 1)))


def max_code_length(K: int) -> int:
    """Longest substring whose code fits in 63 bits for an alphabet of K symbols."""
    return 63 // bits_per_symbol(K)


def code_of(ids, K: int) -> int:
    """The code of one substring (sequence of ids)."""
    b = bits_per_symbol(K)
    c = 0
    for j, x in enumerate(ids):
        c |= (int(x) + 1) << (b * j)
    return c


def decode_code(code: int, K: int) -> list[int]:
    b = bits_per_symbol(K)
    mask = (1 << b) - 1
    out = []
    while code:
        out.append((code & mask) - 1)
        code >>= b
    return out


def substring_codes(ids: np.ndarray, K: int, k: int, prev: np.ndarray | None = None) -> np.ndarray:
    """Codes of all substrings of length k: uint64 (N - k + 1,). ``prev`` = codes of length k-1 speeds it up."""
    b = bits_per_symbol(K)
    ids = np.asarray(ids, dtype=np.uint64)
    n = len(ids) - k + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    if prev is None:
        c = np.zeros(n, dtype=np.uint64)
        for j in range(k):
            c |= (ids[j : j + n] + np.uint64(1)) << np.uint64(b * j)
        return c
    return prev[:n] | ((ids[k - 1 : k - 1 + n] + np.uint64(1)) << np.uint64(b * (k - 1)))


def longest_matches(ids: np.ndarray, K: int, sorted_codes: np.ndarray, max_len: int) -> np.ndarray:
    """Length of the longest table entry starting at each position (1 if none: the per-character path).

    Args:
        ids: (N,) int64 text; sorted_codes: uint64 codes of the entries, sorted ascending.
    Returns:
        (N,) int64 in [1, max_len].
    """
    N = len(ids)
    M = np.ones(N, dtype=np.int64)
    if N == 0 or len(sorted_codes) == 0:
        return M
    c = None
    for k in range(1, min(max_len, N) + 1):
        c = substring_codes(ids, K, k, c)
        pos = np.searchsorted(sorted_codes, c)
        pos[pos == len(sorted_codes)] = 0
        hit = sorted_codes[pos] == c
        if k > 1:
            M[: len(c)][hit] = k
    return M


def greedy_segment(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy left-to-right segmentation: from position i take the longest match M[i].

    Returns (starts (n,), lengths (n,)) int64; lengths sum to len(M).
    """
    N = len(M)
    starts = []
    i = 0
    Ml = M.tolist()
    append = starts.append
    while i < N:
        append(i)
        i += Ml[i]
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.diff(np.append(starts, N))
    return starts, lengths


def match_codes(ids: np.ndarray, K: int, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Codes of the matched substrings ``ids[s : s + l]``: uint64 (n,)."""
    b = bits_per_symbol(K)
    ids = np.asarray(ids, dtype=np.uint64)
    codes = np.zeros(len(starts), dtype=np.uint64)
    maxl = int(lengths.max()) if len(lengths) else 0
    for j in range(maxl):
        m = lengths > j
        codes[m] |= (ids[starts[m] + j] + np.uint64(1)) << np.uint64(b * j)
    return codes
