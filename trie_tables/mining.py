"""Choosing table entries: frequent substrings ranked by the work they save under greedy
longest-match segmentation, within a memory budget.

Work model (docs/ARCHITECTURE.md, 'The model and its conventions'): the per-character path costs
``d^2`` multiply-adds per character for the state update; a match of length k costs ``d^2``
once. An entry of length k used u times saves ``u (k - 1) d^2``. Its storage is
``(d (d + 1) + k V (d + 1)) * itemsize`` bytes (the composed map and the stacked prefix
readouts).

Selection: rank candidates by estimated saving per byte (count x (k - 1)), take the best
within the budget, then simulate greedy longest-match segmentation on the corpus to measure
what each entry really saves (longer entries shadow shorter ones), drop the weakest and
refill, for a few rounds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from isan.errors import BudgetError
from isan.trie_tables.codes import greedy_segment, longest_matches, max_code_length, substring_codes

log = logging.getLogger(__name__)


def entry_bytes(k: int, d: int, V: int, itemsize: int = 4) -> int:
    """Bytes of one entry of length k: [A | c] (d, d+1) and k stacked readouts [R_i | r_i] (V, d+1)."""
    return (d * (d + 1) + k * V * (d + 1)) * itemsize


def singles_bytes(K: int, d: int, V: int, itemsize: int = 4) -> int:
    """Bytes of the K single-symbol entries every table holds (the least a budget must allow)."""
    return K * entry_bytes(1, d, V, itemsize)


def parse_bytes(s: str | int) -> int:
    """'512MB' -> 536870912 (binary units: KB = 1024 bytes, MB, GB); plain integers are bytes."""
    if isinstance(s, int):
        return s
    t = s.strip().upper().replace("IB", "B")
    for unit, mult in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10), ("B", 1)):
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * mult)
    return int(float(t))


def count_substrings(ids: np.ndarray, K: int, max_len: int, min_count: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Codes and counts of substrings of length 2..max_len occurring at least min_count times.

    A substring can only be frequent if its prefix is, so each length only counts extensions of
    frequent shorter substrings. Returns {k: (codes sorted uint64, counts int64)}.
    """
    if max_len > max_code_length(K):
        raise BudgetError(f"a table's longest entry is at most {max_code_length(K)} symbols for an alphabet of {K}; "
                          f"got {max_len}: lower --table-max-len")
    out = {}
    c = substring_codes(ids, K, 1)
    frequent_prev = None
    for k in range(1, max_len + 1):
        if k > 1:
            c = substring_codes(ids, K, k, c)
        cand = c
        if frequent_prev is not None:
            prefix = c & np.uint64((1 << (int(np.ceil(np.log2(K + 1))) * (k - 1))) - 1)
            keep = np.isin(prefix, frequent_prev, assume_unique=False)
            cand = c[keep]
        codes, counts = np.unique(cand, return_counts=True)
        m = counts >= min_count
        codes, counts = codes[m], counts[m]
        if k > 1:
            out[k] = (codes, counts)
        frequent_prev = codes
        if len(codes) == 0:
            break
    return out


@dataclass
class Selection:
    codes: np.ndarray  # uint64 codes of the chosen entries (length >= 2), plus all K single symbols
    lengths: np.ndarray
    bytes: int
    avg_match_length: float  # on the corpus used for selection (or the held-out text if given)
    n_candidates: int


def simulate(ids: np.ndarray, K: int, codes: np.ndarray, max_len: int):
    """Greedy longest-match segmentation of ids with the given entry codes: (starts, lengths, codes used)."""
    from isan.trie_tables.codes import match_codes

    order = np.sort(codes)
    M = longest_matches(ids, K, order, max_len)
    starts, lengths = greedy_segment(M)
    return starts, lengths, match_codes(ids, K, starts, lengths)


def select_entries(ids: np.ndarray, K: int, V: int, d: int, budget_bytes: int, max_len: int = 12,
                   min_count: int = 20, itemsize: int = 4, rounds: int = 3, sample_chars: int = 3_000_000,
                   heldout: np.ndarray | None = None) -> Selection:
    """Choose entries within ``budget_bytes`` (the K single symbols are always included).

    Args:
        ids: corpus (int64), usually the model's training split.
        heldout: text on which to report the expected average match length (default: the sample).
    """
    sample = ids[:sample_chars]
    singles = np.array([k + 1 for k in range(K)], dtype=np.uint64)  # code of a single symbol x is x + 1
    budget = budget_bytes - singles_bytes(K, d, V, itemsize)
    if budget < 0:
        raise BudgetError(f"a budget of {budget_bytes:,} bytes does not hold the {K} single-symbol entries "
                          f"({singles_bytes(K, d, V, itemsize):,} bytes): raise --table-budget")
    counted = count_substrings(ids, K, max_len, min_count)
    cand_codes = np.concatenate([c for c, _ in counted.values()]) if counted else np.zeros(0, np.uint64)
    cand_len = np.concatenate([np.full(len(c), k) for k, (c, _) in counted.items()]) if counted else np.zeros(0, int)
    cand_count = np.concatenate([n for _, n in counted.values()]) if counted else np.zeros(0, int)
    cost = np.array([entry_bytes(int(k), d, V, itemsize) for k in cand_len], dtype=np.float64)
    est = cand_count * (cand_len - 1) / cost  # estimated saving per byte
    banned = np.zeros(len(cand_codes), dtype=bool)
    chosen = np.zeros(len(cand_codes), dtype=bool)

    def fill():
        order = np.argsort(-np.where(banned | chosen, -np.inf, est), kind="stable")
        used = float(cost[chosen].sum())
        for i in order:
            if banned[i] or chosen[i]:
                continue
            if used + cost[i] > budget:
                continue
            chosen[i] = True
            used += cost[i]
            if used > budget - entry_bytes(2, d, V, itemsize):
                break

    fill()
    scale = len(ids) / max(len(sample), 1)
    for r in range(rounds):
        codes = np.concatenate([singles, cand_codes[chosen]])
        _, lengths, used = simulate(sample, K, codes, max_len)
        uniq, uses = np.unique(used, return_counts=True)
        idx = np.flatnonzero(chosen)
        pos = np.searchsorted(uniq, cand_codes[idx])
        pos[pos == len(uniq)] = 0
        real_uses = np.where(uniq[pos] == cand_codes[idx], uses[pos], 0) * scale
        real = real_uses * (cand_len[idx] - 1) / cost[idx]
        est[idx] = real  # what they really save now
        log.info("selection round %d: %d entries, avg match %.3f", r, len(idx), len(sample) / max(len(lengths), 1))
        if r == rounds - 1:
            break
        weakest = idx[np.argsort(real)[: max(1, len(idx) // 5)]]
        chosen[weakest] = False
        banned[weakest[real[np.argsort(real)[: len(weakest)]] <= 0]] = True
        est[weakest] *= 0.5  # they may come back, but ranked by what they really did
        fill()
    codes = np.concatenate([singles, cand_codes[chosen]])
    lengths = np.concatenate([np.ones(K, dtype=np.int64), cand_len[chosen]])
    text = heldout if heldout is not None else sample
    _, seg_len, _ = simulate(text, K, codes, max_len)
    total = int(sum(entry_bytes(int(k), d, V, itemsize) for k in lengths))
    return Selection(codes, lengths, total, len(text) / max(len(seg_len), 1), len(cand_codes))
