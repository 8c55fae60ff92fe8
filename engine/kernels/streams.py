"""Many state rows advanced together, grouped by symbol: ``run_streams`` (compiled) and its numpy twin
``run_streams_ref`` (same signature, same results within float32 rounding).

A *row* is one stream of characters: ``ids[start[s] : start[s] + length[s]]`` read from the
state row ``H[s]``. Each round t, every active row

1. is checked (``max |h| <= limit``, see :mod:`isan.engine.guard`) and, if ``bits`` is given,
   read out: ``bits[start[s] + t] = -log2 softmax(W_ro h + b_ro)[ids[start[s] + t]]``
   (docs/ARCHITECTURE.md, 'The model and its conventions': the prediction for a character comes
   from the state before it);
2. steps: ``h <- W[x] h + b[x]`` with ``x = ids[start[s] + t]`` (paper eq. 1).

Rows are grouped by their symbol, so one symbol's matrix serves all its rows in one GEMM
(docs/guide/tables-and-speed.md, 'Measured facts the code relies on': batched steps are
compute-bound once rows share a matrix). The compiled kernel need not move the rows in step (they
are independent): each row waits in the queue of the symbol it reads next, and a round takes the
queues at least ``frac`` of the longest (issue 22: about twice the rows a matrix is read for).
Which group a row is stepped in never changes its arithmetic, so the results are those of the
in-step schedule (this twin's), bit for bit. Below, "round t" is the row's own step t.

With ``pairs=True`` there are 2P rows: rows ``P + s`` are *error rows* that follow row s through
the same symbols without the bias (``e <- W[x] e``) and without readout; every ``check_every``
rounds a pair stops once ``max|e| <= stop_ratio * max(1, max|h|)``. This is the correction pass of
chunk-parallel scoring (:mod:`isan.engine.kernels.chunked`).

Layout (row-vector, homogeneous coordinate): a row is ``[h_0 .. h_{d-1}, 1, 0 ...]`` of ``dp``
float32 (an error row has 0 in place of the 1); :class:`StreamModel` holds ``WT[x]`` =
``[[W[x], b[x]], [0, 1]]^T`` (K, dp, dp) and ``RoT`` = ``[W_ro | b_ro]^T`` (dp, Vp).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels.twin import native_or_twin
from isan.params import ISANParams

LOG2E = 1.0 / np.log(2.0)

#: The compiled kernels' schedule (split by rows): a round takes every symbol queue at least this
#: share of the longest one; 1 takes the longest alone (the most rows a matrix read). Measured on
#: text8, 2.5M characters, one thread, medians of 5 in one process (development runs): 1.0 at
#: 1.06M chars/s with 512 rows against 1.02M at 0.5; in step (0) 0.76M with 256 rows
#: (docs/guide/tables-and-speed.md).
SCHED_FRAC = 1.0

#: ``split="auto"`` splits rows: each thread runs its own block alone, with no barrier (with fewer
#: rows than threads, fewer threads run). Splitting the columns of every GEMM (a barrier every round)
#: is as fast on a quiet machine but collapses when another process holds a core: each barrier then
#: waits for a time slice (measured: one 2,000-character row at 2k chars/s instead of 200k).


def padded(n: int, to: int = 16) -> int:
    return (n + to - 1) // to * to


def pack_panels(B: np.ndarray) -> np.ndarray:
    """(..., kd, n) -> (..., n / 16, kd, 16) C-contiguous: column panels of 16, each read as one stream."""
    *lead, kd, n = B.shape
    P = np.ascontiguousarray(B.reshape(*lead, kd, n // 16, 16).swapaxes(-3, -2), dtype=np.float32)
    P.setflags(write=False)
    return P


@dataclass(frozen=True)
class StreamModel:
    """The ISAN's weights in the kernels' padded float32 layout (see the module docstring).

    Attributes:
        WT: (K, dp, dp) float32; RoT: (dp, Vp) float32; d, V, dp = roundup(d + 1, 16),
        Vp = roundup(V, 16).
    """

    WT: np.ndarray
    RoT: np.ndarray
    d: int
    V: int
    WT_panels: np.ndarray = field(repr=False)  # (K, dp / 16, d + 1, 16): the compiled kernel's layout
    RoT_panels: np.ndarray = field(repr=False)  # (Vp / 16, d + 1, 16)

    @property
    def K(self) -> int:
        return self.WT.shape[0]

    @property
    def dp(self) -> int:
        return self.WT.shape[1]

    @property
    def Vp(self) -> int:
        return self.RoT.shape[1]

    @classmethod
    def from_params(cls, params: ISANParams) -> "StreamModel":
        K, V, d = params.K, params.V, params.d
        dp, Vp = padded(d + 1), padded(V)
        p = params.astype(np.float64)
        WT = np.zeros((K, dp, dp), dtype=np.float32)
        WT[:, :d, :d] = p.W.transpose(0, 2, 1)  # WT[x][i, j] = W[x][j, i]
        WT[:, d, :d] = p.b
        WT[:, d, d] = 1.0
        RoT = np.zeros((dp, Vp), dtype=np.float32)
        RoT[:d, :V] = p.W_ro.T
        RoT[d, :V] = p.b_ro
        for a in (WT, RoT):
            a.setflags(write=False)
        return cls(WT, RoT, d, V, pack_panels(WT[:, : d + 1]), pack_panels(RoT[: d + 1]))

    def params(self) -> ISANParams:
        """The float32 weights back from the padded layout."""
        d, V = self.d, self.V
        return ISANParams(W=self.WT[:, :d, :d].transpose(0, 2, 1), b=self.WT[:, d, :d], W_ro=self.RoT[:d, :V].T,
                          b_ro=self.RoT[d, :V], h0=np.zeros(d, dtype=np.float32))

    def rows(self, h: np.ndarray, bias: float = 1.0) -> np.ndarray:
        """State rows (n, dp) float32 from states h (n, d) (homogeneous coordinate ``bias``)."""
        h = np.atleast_2d(h)
        H = np.zeros((len(h), self.dp), dtype=np.float32)
        H[:, : self.d] = h
        H[:, self.d] = bias
        return H


@dataclass
class StreamsResult:
    """What :func:`run_streams` reports besides the rows and bits it writes.

    Attributes:
        total_steps: row-steps run by the true rows (the work done).
        steps_done: (P,) int64 steps each true row ran (with pairs: where it stopped).
        residual: (P,) float32 last checked ``max|e| / max|h|`` of each pair (inf if never checked).
        diverged: (P,) int64 the step t at which row s's state (before character t) left the range
            or its bits were not finite; -1 where it did not.
        jumps: row-jumps run by the true rows (:func:`~isan.engine.kernels.jumps.run_jumps`; equal
            to ``total_steps`` one character a step).
    """

    total_steps: int
    steps_done: np.ndarray
    residual: np.ndarray
    diverged: np.ndarray
    jumps: int = -1

    def __post_init__(self):
        if self.jumps < 0:
            self.jumps = self.total_steps


def check_rows_arguments(model: StreamModel, ids, start, length, H, bits, pairs, state_dtype=np.float32,
                         ids_dtypes: tuple = (np.int32,)):
    """The number of rows P of a streams call, after checking its arrays' dtypes and shapes (TypeError,
    ValueError); ``ids_dtypes``: the dtypes of ids the runner reads (the compiled kernels: int32)."""
    if ids.dtype not in ids_dtypes or start.dtype != np.int64 or length.dtype != np.int64:
        names = " or ".join(np.dtype(t).name for t in ids_dtypes)
        raise TypeError(f"ids must be {names}, start and length int64")
    if H.dtype != state_dtype or H.ndim != 2 or H.shape[1] != model.dp or not H.flags.c_contiguous:
        raise TypeError(f"H must be a C-contiguous {np.dtype(state_dtype).name} array (rows, {model.dp})")
    P = len(start)
    if len(length) != P or len(H) != (2 * P if pairs else P):
        raise ValueError("start, length and H disagree on the number of rows")
    if bits is not None and (bits.dtype != np.float64 or not bits.flags.c_contiguous):
        raise TypeError("bits must be a C-contiguous float64 array")
    return P


def check_frac(frac: float) -> float:
    """``frac`` as a float in [0, 1], else ValueError (the schedule's share of the longest queue)."""
    frac = float(frac)
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"frac must be in [0, 1]; got {frac}")
    return frac


def run_streams_ref(model: StreamModel, ids: np.ndarray, start: np.ndarray, length: np.ndarray, H: np.ndarray,
                    bits: np.ndarray | None = None, pairs: bool = False, stop_ratio: float = 0.0,
                    check_every: int = 16, limit: float = MAX_STATE_ABS, threads: int = 1,
                    split: str = "auto", frac: float = SCHED_FRAC) -> StreamsResult:
    """The numpy twin of :func:`run_streams`: the same steps, bits and stops, every row every round
    (``threads``, ``split`` and ``frac`` are ignored: the schedule does not change the results).

    The readout's log-softmax is float64 here (float32 exponentials in the compiled kernel).
    """
    P = check_rows_arguments(model, ids, start, length, H, bits, pairs)
    check_frac(frac)  # ignored, but checked as the compiled kernel checks it
    d, V = model.d, model.V
    steps_done = np.zeros(P, dtype=np.int64)
    residual = np.full(P, np.inf, dtype=np.float32)
    diverged = np.full(P, -1, dtype=np.int64)
    active = np.arange(P)
    ids64 = ids.astype(np.int64)
    total, t = 0, 0
    RoT = model.RoT[:, :V]
    while True:
        # between rounds: drop diverged, finished and (pairs) converged rows
        keep = np.ones(len(active), dtype=bool)
        gone = diverged[active] >= 0
        steps_done[active[gone]] = t
        keep &= ~gone
        fin = keep & (t >= length[active])
        steps_done[active[fin]] = length[active[fin]]
        keep &= ~fin
        if pairs and t > 0 and t % check_every == 0:
            a = active[keep]
            mh = np.abs(H[a]).max(axis=1)  # whole rows: the homogeneous 1 floors max|h| at 1
            me = np.abs(H[a + P]).max(axis=1)
            r = (me / mh).astype(np.float32)
            residual[a] = r
            conv = r <= np.float32(stop_ratio)
            steps_done[a[conv]] = t
            idx = np.flatnonzero(keep)
            keep[idx[conv]] = False
        active = active[keep]
        if len(active) == 0:
            break
        pos = start[active] + t
        m = np.abs(H[active, :d]).max(axis=1)
        bad = ~(m <= limit)
        diverged[active[bad]] = t
        if bits is not None:
            L = (H[active] @ RoT).astype(np.float64)
            mx = L.max(axis=1, keepdims=True)
            lse = np.log(np.exp(L - mx).sum(axis=1)) + mx[:, 0]
            b = (lse - L[np.arange(len(active)), ids64[pos]]) * LOG2E
            bits[pos] = b
            diverged[active[~np.isfinite(b) & (diverged[active] < 0)]] = t
        rows = np.concatenate([active, active + P]) if pairs else active
        sym = ids64[np.concatenate([pos, pos]) if pairs else pos]
        Hn = np.empty((len(rows), model.dp), dtype=np.float32)
        order = np.argsort(sym, kind="stable")
        cuts = np.flatnonzero(np.diff(sym[order])) + 1
        for grp in np.split(order, cuts):
            Hn[grp] = H[rows[grp]] @ model.WT[sym[grp[0]]]
        H[rows] = Hn
        total += len(active)
        t += 1
    final = H[:P, :d]
    m = np.abs(final).max(axis=1)
    bad = (diverged < 0) & ~(m <= limit)
    diverged[bad] = steps_done[bad]
    return StreamsResult(total, steps_done, residual, diverged)


@native_or_twin(run_streams_ref)
def run_streams(nat, model: StreamModel, ids: np.ndarray, start: np.ndarray, length: np.ndarray,
                H: np.ndarray, bits: np.ndarray | None = None, pairs: bool = False, stop_ratio: float = 0.0,
                check_every: int = 16, limit: float = MAX_STATE_ABS, threads: int = 1,
                split: str = "auto", frac: float = SCHED_FRAC) -> StreamsResult:
    """Advance every row through its characters (compiled; see the module docstring).

    Args:
        model: the weights (:meth:`StreamModel.from_params`).
        ids: (N,) int32 symbol ids; start, length: (P,) int64: row s reads
            ``ids[start[s] : start[s] + length[s]]``.
        H: (P, dp) float32 (2P with ``pairs``) state rows, updated in place to the final states.
        bits: (N,) float64 or None: where the bits of each character are written.
        pairs, stop_ratio, check_every: the correction mode (see the module docstring).
        limit: the largest ``|h_i|`` accepted.
        threads: threads sharing the work.
        split: ``"cols"`` (every thread computes a slice of the columns of every symbol group, one
            barrier a round), ``"rows"`` (each thread runs its own block of rows alone) or
            ``"auto"`` (rows: see the note above ``run_streams``).
        frac: split by rows, a round steps the symbol queues at least this share of the longest,
            in [0, 1] (0: every row every round; split by columns always so). Results do not
            depend on it.
    Returns:
        StreamsResult.
    Raises:
        TypeError, ValueError: arrays of the wrong dtype, shape or range.
    """
    P = check_rows_arguments(model, ids, start, length, H, bits, pairs)
    frac = check_frac(frac)
    if split == "auto":
        split = "rows"
    if split not in ("cols", "rows"):
        raise ValueError(f"split must be 'cols', 'rows' or 'auto'; got {split!r}")
    steps_done = np.zeros(P, dtype=np.int64)
    residual = np.zeros(P, dtype=np.float32)
    diverged = np.zeros(P, dtype=np.int64)
    Hb = H.copy()  # the homogeneous coordinate and the padding: the kernel computes only the first d columns
    want = bits is not None
    out_bits = bits if want else np.zeros(0, dtype=np.float64)
    total = nat.run_streams(WT=model.WT_panels, split_cols=split == "cols", RoT=model.RoT_panels, nsym=model.K,
                            V=model.V, Vp=model.Vp, d=model.d, dp=model.dp, ids=ids, start=start, length=length, H=H,
                            Hb=Hb, bits=out_bits, P=P, pairs=bool(pairs), stop_ratio=float(stop_ratio),
                            limit=float(limit), check_every=int(check_every), steps_done=steps_done,
                            residual=residual, diverged=diverged, threads=int(threads), want_bits=want, frac=frac)
    return StreamsResult(int(total), steps_done, residual, diverged)


# the Runner contract (isan.engine.kernels.chunked.Runner): the state rows these advance are float32
run_streams_ref.state_dtype = np.dtype(np.float32)
run_streams.state_dtype = np.dtype(np.float32)
