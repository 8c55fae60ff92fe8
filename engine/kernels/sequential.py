"""One stream through a composed trie table: ``seq_composed`` (compiled) and its numpy twin
``seq_composed_ref`` (same signature, same results within float32 rounding).

For each match j of entry e (a substring of k characters starting at ``pos``; docs/ARCHITECTURE.md,
'The model and its conventions'), with ``[h; 1]`` the state before the match:

* readout: the k logit vectors ``[R_i | r_i] [h; 1]`` (i < k) give the bits of characters
  ``pos .. pos + k - 1``;
* jump: ``h <- [A | c] [h; 1]``, one (d, d + 1) matrix-vector product for the whole match.

The table's matrices may be float32 or float16 (converted as they are read; products and the
state stay float32). One stream is memory-bound: each jump reads a d x (d + 1) matrix (187 KB
in float32 for d = 216) from the L3 cache, which is why float16 tables are faster (the speed
guide, docs/guide/tables-and-speed.md, 'The two limits, and the targets').
"""

from __future__ import annotations

import numpy as np

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels.twin import native_or_twin

LOG2E = 1.0 / np.log(2.0)


def _check(Ac, R, offsets, lengths, entries, ids, h):
    if Ac.dtype not in (np.float32, np.float16) or R.dtype != Ac.dtype:
        raise TypeError("Ac and R must both be float32 or both float16")
    if Ac.ndim != 3 or R.ndim != 3 or Ac.shape[2] != Ac.shape[1] + 1 or R.shape[2] != Ac.shape[2]:
        raise ValueError(f"Ac must be (n, d, d+1) and R (rows, V, d+1); got {Ac.shape} and {R.shape}")
    for name, a in (("Ac", Ac), ("R", R)):
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    if offsets.dtype != np.int64 or lengths.dtype != np.int64 or entries.dtype != np.int64:
        raise TypeError("offsets, lengths and entries must be int64")
    if ids.dtype != np.int32:
        raise TypeError("ids must be int32")
    if h.shape != (Ac.shape[1],):
        raise ValueError(f"h must have shape ({Ac.shape[1]},)")


def seq_composed_ref(Ac: np.ndarray, R: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, entries: np.ndarray,
                     ids: np.ndarray, h: np.ndarray, want_bits: bool = True, limit: float = MAX_STATE_ABS,
                     threads: int = 1) -> tuple[np.ndarray | None, np.ndarray, int]:
    """The numpy twin of :func:`seq_composed` (log-softmax in float64; ``threads`` is ignored)."""
    _check(Ac, R, offsets, lengths, entries, ids, h)
    d = Ac.shape[1]
    x = np.ones(d + 1, dtype=np.float32)
    x[:d] = h
    bits = np.empty(len(ids), dtype=np.float64) if want_bits else None
    pos, bad = 0, -1
    for j, e in enumerate(entries.tolist()):
        k, off = int(lengths[e]), int(offsets[e])
        if want_bits:
            L = (R[off : off + k].astype(np.float32) @ x).astype(np.float64)  # (k, V)
            m = L.max(axis=1)
            lse = np.log(np.exp(L - m[:, None]).sum(axis=1)) + m
            b = (lse - L[np.arange(k), ids[pos : pos + k]]) * LOG2E
            bits[pos : pos + k] = b
            if not np.all(np.isfinite(b)):
                bad = j
        x[:d] = Ac[e].astype(np.float32) @ x
        pos += k
        if not np.abs(x[:d]).max() <= limit:
            bad = j
        if bad >= 0:
            break
    return bits, x[:d].copy(), bad


@native_or_twin(seq_composed_ref)
def seq_composed(nat, Ac: np.ndarray, R: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, entries: np.ndarray,
                 ids: np.ndarray, h: np.ndarray, want_bits: bool = True, limit: float = MAX_STATE_ABS,
                 threads: int = 1) -> tuple[np.ndarray | None, np.ndarray, int]:
    """Score (or ingest) one stream along its matches (compiled; see the module docstring).

    Args:
        Ac: (n, d, d + 1) ``[A | c]`` per entry; R: (rows, V, d + 1) stacked prefix readouts;
            float32 or float16 (both the same).
        offsets, lengths: (n,) int64: entry e's readouts are ``R[offsets[e] : offsets[e] + lengths[e]]``.
        entries: (m,) int64 the matches' entries, in order; ids: (N,) int32 the text, N = the sum
            of the matches' lengths.
        h: (d,) the state before the text.
        want_bits: False to ingest only (no readout).
        limit: the largest ``|h_i|`` accepted after a jump.
        threads: threads sharing each jump (each computes a slice of every product's rows, so the
            cores draw on the caches and memory together; one barrier a match).
    Returns:
        (bits (N,) float64 or None, the final state (d,) float32, the index of the first match whose
        resulting state is out of range or whose bits are not finite, or -1). After such a match the
        stream stops: later bits are not computed.
    """
    _check(Ac, R, offsets, lengths, entries, ids, h)
    d, V = Ac.shape[1], R.shape[1]
    kd = d + 1
    hb = np.zeros(kd + 16, dtype=np.float32)
    hb[:d] = h
    bits = np.empty(len(ids), dtype=np.float64) if want_bits else np.zeros(0, dtype=np.float64)
    max_len = int(lengths.max()) if len(lengths) else 1
    bad = nat.seq_composed(Ac=Ac, R=R, f16=Ac.dtype == np.float16, offsets=offsets, lengths=lengths, entries=entries,
                           ids=ids, d=d, V=V, max_len=max_len, h=hb, bits=bits, want_bits=bool(want_bits),
                           limit=float(limit), threads=int(threads))
    return (bits if want_bits else None), hb[:d].copy(), int(bad)


class ThreadChooser:
    """Picks 1 or ``threads`` threads for the sequential kernel from the speeds it has seen.

    Two threads share every jump with a barrier, so they help on a quiet machine (both cores draw
    on the caches and memory) and hurt badly when another process holds a core (each barrier
    then waits for a time slice). The chooser keeps a running speed of each choice, uses the
    faster one, and tries the other every ``explore`` calls, so it follows the machine's load.
    Thread-safe (a lock around its few numbers).
    """

    def __init__(self, explore: int = 16, max_explore: int = 4096, min_chars: int = 400):
        import threading

        self.min_explore = self.explore = explore
        self.max_explore = max_explore
        self.min_chars = min_chars
        self.speed: dict[int, float] = {}
        self.calls = 0
        self._exploring: int | None = None
        self._lock = threading.Lock()

    def pick(self, threads: int, chars: int) -> int:
        if threads <= 1 or chars < self.min_chars:
            return 1
        with self._lock:
            self.calls += 1
            if 1 not in self.speed:
                return 1
            if threads not in self.speed:
                return threads
            best = max((1, threads), key=lambda t: self.speed[t])
            if self.calls % self.explore == 0:
                self._exploring = threads if best == 1 else 1
                return self._exploring
            return best

    def report(self, threads: int, chars: int, seconds: float) -> None:
        """Record a call's speed. An exploration that loses doubles the interval to the next one
        (up to ``max_explore`` calls), so the slower choice, or one that collapses under load, is
        rarely retried; one that wins resets it. A current choice that slows down is dropped at
        once, since ``pick`` compares the running speeds."""
        if chars < self.min_chars or seconds <= 0:
            return
        with self._lock:
            v = chars / seconds
            old = self.speed.get(threads)
            self.speed[threads] = v if old is None else 0.7 * old + 0.3 * v
            if self._exploring == threads:
                self._exploring = None
                other = 1 if threads != 1 else max(self.speed)
                if other in self.speed and v < self.speed[other]:
                    self.explore = min(self.explore * 2, self.max_explore)
                elif other in self.speed:
                    self.explore = self.min_explore
