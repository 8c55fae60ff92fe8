"""Many state rows advanced together by composed jumps, grouped by table entry: ``run_jumps``
(compiled) and its numpy twin ``run_jumps_ref`` (same signature, same results within float32
rounding). Issue 22; Foerster et al. 2017 (ICML), section 5: "ISAN is unique in its ability to
precompute affine transformations corresponding to input strings", which "can therefore achieve
very large speedups on input processing, at the cost of increased memory use, by accumulating
large lookup tables ... corresponding to common input sequences. Of course, practical
implementations will have to incorporate complexities of memory management, batching, etc." This
module is that batching; what the memory costs is measured in the speed guide.

:func:`~isan.engine.kernels.streams.run_streams` advances every row one character a round, so a
character costs ``2 (d (d + 1) + (d + 1) V)`` FLOPs (105 kFLOP at d = 216): the state update
dominates. Here each round every row takes one *jump*: the longest key of a :class:`JumpTable`
that its text continues with (greedy longest match, never past the row's end; every single
symbol is a key). For a key ``s`` of ``k`` characters read from state ``h`` (docs/ARCHITECTURE.md,
'The model and its conventions'):

* the k predictions inside the jump: ``logits_i = W_ro (A_{s[:i]} h + c_{s[:i]}) + b_ro`` for
  i < k, from precomposed readouts ``[W_ro A_{s[:i]} | W_ro c_{s[:i]} + b_ro]`` (``i = 0`` is the
  plain readout ``[W_ro | b_ro]``, shared by every key);
* the state after it: ``h <- A_s h + c_s``, one d x (d + 1) product for k characters.

A character then costs about ``2 (d (d + 1) / L + (d + 1) V)``, L the average jump. Each row waits
in the queue of the key it takes next (its greedy longest match from where it is, known when it
joins the queue), and a round takes the longest queue (those at least ``frac`` of it): each key's
matrix is read once for all the rows of its queue, and the product is a GEMM, compute-bound when
queues are long (many rows a thread, few keys). A row's jumps are its greedy segmentation, so they
and its bits do not depend on the other rows, the schedule or the threads.

With ``pairs=True`` the error rows (``P + s``) follow row s through the same jumps without bias
(``e <- A_s e``, the homogeneous coordinate is 0) and without readout: the correction pass of
:mod:`~isan.engine.kernels.chunked` runs unchanged on jumps (affine maps compose). The
convergence check runs every ``check_every`` rounds (jumps), and positions, ``steps_done`` and
``diverged`` count characters, as in ``run_streams``. The range check (:mod:`isan.engine.guard`)
sees the state at jump boundaries; bits that are not finite anywhere inside a jump are caught
at their character.

Layout: :class:`JumpTable` holds, per key e of k characters, ``M_e`` = ``[WT_e | Ro_{e,1} | ...
| Ro_{e,k-1}]`` of shape (d + 1, dp + (k - 1) Vp), ``WT_e`` the transposed homogeneous
``[[A_s, c_s], [0, 1]]`` (as :class:`~isan.engine.kernels.streams.StreamModel`'s WT) and
``Ro_{e,i}`` the transposed readout of prefix i padded to Vp columns; the compiled kernel reads
them in panels of 16 columns (:func:`~isan.engine.kernels.streams.pack_panels`), concatenated.
Precision: the keys' maps are composed in float64 and stored in float32; states are float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels.twin import native_or_twin
from isan.engine.kernels.streams import LOG2E, SCHED_FRAC, StreamModel, StreamsResult, check_frac, check_rows_arguments, pack_panels
from isan.params import ISANParams

#: The rows a thread runs when a long text is cut into chunks for this kernel, and the fewest at
#: which the engine chooses it over the per-symbol kernel (``Engine.plan``). Queues by key need many rows: with the default table's 97 keys, 2.5M
#: characters of text8 in 2,048 chunks (1,024 rows a thread) ran at 2.54M chars/s, 2,441 chunks
#: 2.62M, the per-symbol kernel 2.38M in the same process; batches of 2,000-character texts, 2
#: threads: 512 texts 2.01M against 2.15M per symbol, 1,024 texts 2.41M against 2.31M, 4,096 texts
#: 2.84M against 2.24M (development runs, /tmp harness; ``isan bench engine`` gives the committed
#: numbers).
ROWS_PER_THREAD = 2048
MIN_ROWS_PER_THREAD = 512


@dataclass(frozen=True)
class JumpTable:
    """Composed jumps for the batched kernels (see the module docstring); immutable.

    Attributes:
        stream: the per-symbol weights (:class:`StreamModel`): ``RoT``, ``d``, ``V``, ``dp``, ``Vp``.
        keys: (E,) tuple of the keys' symbol ids (tuples); keys 0..K-1 are the single symbols.
        klen: (E,) int32 characters of each key.
        M: list of E float32 arrays (d + 1, dp + (k_e - 1) Vp): the numpy twin's layout.
        M_panels: every ``M_e`` in panels of 16 columns, concatenated (float32 or float16, flat).
        m_off: (E,) int64 where each ``M_e`` starts in ``M_panels`` (elements).
        children: (nodes, K) int32 the keys' trie (node 0 the root; -1: no child);
        entry_of: (nodes,) int32 the key ending at each node, or -1.
    """

    stream: StreamModel
    keys: tuple
    klen: np.ndarray
    M: list = field(repr=False)
    M_panels: np.ndarray = field(repr=False)
    m_off: np.ndarray = field(repr=False)
    children: np.ndarray = field(repr=False)
    entry_of: np.ndarray = field(repr=False)

    # what chunked.py and Float64Fallback read from a model
    @property
    def d(self) -> int:
        return self.stream.d

    @property
    def dp(self) -> int:
        return self.stream.dp

    @property
    def V(self) -> int:
        return self.stream.V

    @property
    def K(self) -> int:
        return self.stream.K

    @property
    def n_entries(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        """Bytes of the composed matrices (what the kernel reads)."""
        return int(self.M_panels.nbytes)

    def params(self) -> ISANParams:
        return self.stream.params()

    @property
    def dtype(self) -> str:
        """``"float32"`` (exact: the default) or ``"float16"`` (half the bytes; not exact)."""
        return str(self.M_panels.dtype)

    @classmethod
    def build(cls, params: ISANParams, keys: Sequence[Sequence[int]], stream: StreamModel | None = None,
              dtype: str = "float32") -> "JumpTable":
        """Compose the keys' maps (float64, one d x d product per trie node) into a table.

        Args:
            params: the model.
            keys: symbol-id sequences (length >= 2; duplicates and single symbols are ignored:
                every single symbol is always a key).
            stream: the model's :class:`StreamModel` if already made.
            dtype: ``"float32"`` or ``"float16"``: how the composed matrices are stored (float16
                matrices are read as halves and multiplied in float32; the readout before each jump,
                ``[W_ro | b_ro]``, stays float32).
        Raises:
            ValueError: a key with an id outside the alphabet, or another dtype.
        """
        from threadpoolctl import threadpool_limits

        if dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be float32 or float16; got {dtype!r}")
        with threadpool_limits(1, user_api="blas"):  # small float64 products: one BLAS thread is faster
            return cls._build(params, keys, stream, np.dtype(dtype))

    @classmethod
    def _build(cls, params: ISANParams, keys: Sequence[Sequence[int]], stream: StreamModel | None,
               dtype=np.dtype(np.float32)) -> "JumpTable":
        from isan.trie_tables.compose import compose_entries

        K, d, V = params.K, params.d, params.V
        seen = set()
        multi = []
        for key in keys:
            kt = tuple(int(x) for x in key)
            if any(x < 0 or x >= K for x in kt):
                raise ValueError(f"a key has a symbol id outside 0..{K - 1}: {kt}")
            if len(kt) >= 2 and kt not in seen:
                seen.add(kt)
                multi.append(kt)
        all_keys = [(x,) for x in range(K)] + sorted(multi)
        lengths = np.array([len(k) for k in all_keys], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        Ac = np.empty((len(all_keys), d, d + 1))  # float64: the trie table's composition, kept in float64
        R = np.empty((int(lengths.sum()), V, d + 1))
        compose_entries(params, [np.asarray(k) for k in all_keys], Ac, R, offsets)
        return cls.from_composed(stream or StreamModel.from_params(params), all_keys, Ac, R, offsets, dtype)

    @classmethod
    def from_composed(cls, stream: StreamModel, keys: Sequence[Sequence[int]], Ac: np.ndarray, R: np.ndarray,
                      offsets: np.ndarray, dtype=np.dtype(np.float32)) -> "JumpTable":
        """Pack composed maps into the kernel's layout: a trie table's arrays as they are
        (:func:`~isan.trie_tables.compose.compose_entries`: ``Ac[e] = [A | c]``, ``R[offsets[e] + i]``
        the readout of key e's prefix of i symbols), no composition again.

        Args:
            stream: the model's :class:`StreamModel`.
            keys: entry e's symbol ids; every single symbol must be among them.
            Ac: (n, d, d + 1); R: (rows, V, d + 1); offsets: (n,) int64.
            dtype: how the packed matrices are stored (float32 or float16).
        Raises:
            ValueError: a single symbol that is not a key.
        """
        K, d, V, dp, Vp = stream.K, stream.d, stream.V, stream.dp, stream.Vp
        keys = [tuple(int(x) for x in k) for k in keys]
        index = {k: e for e, k in enumerate(keys)}
        missing = [x for x in range(K) if (x,) not in index]
        if missing:
            raise ValueError(f"the single symbols {missing} are not keys of the table")
        # singles first (ids 0..K-1), then the longer keys in their order
        order = [index[(x,)] for x in range(K)] + [e for e, k in enumerate(keys) if len(k) > 1]
        all_keys = [keys[e] for e in order]
        children = [[-1] * K]
        entry_of = [-1]
        for j, key in enumerate(all_keys):
            node = 0
            for x in key:
                if children[node][x] < 0:
                    children[node][x] = len(entry_of)
                    children.append([-1] * K)
                    entry_of.append(-1)
                node = children[node][x]
            entry_of[node] = j
        M, panels, offs = [], [], []
        off = 0
        # a float32 table is packed in float32 (the same values as through float64, without the copies:
        # the jump table is packed on an engine's first long text, so this is start-up time)
        work = np.float32 if Ac.dtype == np.float32 and R.dtype == np.float32 else np.float64
        for e in order:
            k = len(keys[e])
            Me = np.zeros((d + 1, dp + (k - 1) * Vp), dtype=work)
            Me[:d, :d] = Ac[e][:, :d].T
            Me[d, :d] = Ac[e][:, d]
            Me[d, d] = 1.0
            for i in range(1, k):  # the readout of the key's prefix of i symbols
                Ri = R[offsets[e] + i]
                c0 = dp + (i - 1) * Vp
                Me[:d, c0 : c0 + V] = Ri[:, :d].T
                Me[d, c0 : c0 + V] = Ri[:, d]
            # what the kernel multiplies with (float16 values, exactly)
            M32 = Me if work == np.float32 and dtype == np.float32 else Me.astype(dtype).astype(np.float32)
            M32.setflags(write=False)
            M.append(M32)
            pan = pack_panels(M32).reshape(-1)
            panels.append(pan if dtype == np.float32 else pan.astype(dtype))
            offs.append(off)
            off += len(pan)
        M_panels = np.concatenate(panels)
        arrays = dict(klen=np.array([len(k) for k in all_keys], dtype=np.int32),
                      m_off=np.array(offs, dtype=np.int64), children=np.array(children, dtype=np.int32),
                      entry_of=np.array(entry_of, dtype=np.int32))
        for a in (M_panels, *arrays.values()):
            a.setflags(write=False)
        return cls(stream=stream, keys=tuple(all_keys), M=M, M_panels=M_panels, **arrays)


def segment_ref(table: JumpTable, ids: np.ndarray) -> np.ndarray:
    """The numpy twin of :func:`segment`."""
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    out, i, N = [], 0, len(ids)
    ch, en = table.children, table.entry_of
    while i < N:
        node, best, blen, j = 0, -1, 0, i
        while j < N:
            node = ch[node, ids[j]]
            if node < 0:
                break
            j += 1
            if en[node] >= 0:
                best, blen = int(en[node]), j - i
        out.append(best)
        i += blen
    return np.asarray(out, dtype=np.int64)


@native_or_twin(segment_ref)
def segment(nat, table: JumpTable, ids: np.ndarray) -> np.ndarray:
    """The entries of one row's jumps (greedy longest match along the trie), (m,) int64."""
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    starts = np.empty(len(ids), dtype=np.int64)
    ents = np.empty(len(ids), dtype=np.int64)
    n = nat.trie_segment(children=table.children, entry_of=table.entry_of, K=table.K, ids=ids, starts=starts,
                         entries=ents)
    return ents[:n]


def _lse_bits(L: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Bits of ``targets`` under logits ``L`` (n, V), by a float64 log-sum-exp."""
    L = L.astype(np.float64)
    mx = L.max(axis=1, keepdims=True)
    lse = np.log(np.exp(L - mx).sum(axis=1)) + mx[:, 0]
    return (lse - L[np.arange(len(L)), targets]) * LOG2E


class _JumpRows:
    """The rows of :func:`run_jumps_ref` between rounds: where each is, what it takes next, and the
    results the kernel returns (one thread's schedule of the compiled kernel, step for step)."""

    def __init__(self, model: JumpTable, ids, start, length, H, bits, pairs, stop_ratio, check_every, limit, frac):
        sm = model.stream
        self.P = check_rows_arguments(sm, ids, start, length, H, bits, pairs)
        self.model, self.ids64, self.start, self.length = model, ids.astype(np.int64), start, length
        self.H, self.bits = H, bits
        self.pairs, self.stop_ratio, self.check_every, self.limit = pairs, stop_ratio, check_every, limit
        self.frac = check_frac(frac)
        self.d, self.V, self.dp, self.Vp, self.RoT = sm.d, sm.V, sm.dp, sm.Vp, sm.RoT[:, : sm.V]
        P = self.P
        self.steps_done = np.zeros(P, dtype=np.int64)
        self.residual = np.full(P, np.inf, dtype=np.float32)
        self.diverged = np.full(P, -1, dtype=np.int64)
        self.pos = np.zeros(P, dtype=np.int64)
        self.nj = np.zeros(P, dtype=np.int64)  # jumps each row has taken
        self.ent = np.full(P, -1, dtype=np.int64)  # the key a waiting row takes next
        self.waiting = np.zeros(P, dtype=bool)  # in a key's queue
        self.max_k = int(model.klen.max())
        self.total, self.n_jumps = 0, 0

    def longest(self, s: int) -> int:
        """The greedy longest match from row s's position, not past its end."""
        p0, avail = int(self.start[s] + self.pos[s]), int(self.length[s] - self.pos[s])
        ch, en = self.model.children, self.model.entry_of
        node, best = 0, -1
        for j in range(min(avail, self.max_k)):
            node = ch[node, self.ids64[p0 + j]]
            if node < 0:
                break
            if en[node] >= 0:
                best = int(en[node])
        return best

    def stop_or_queue(self, active: np.ndarray) -> None:
        """Last round's rows that diverged, finished or (pairs, every check_every jumps) converged
        stop; the others join the queue of the key they take next."""
        pos, length, P = self.pos, self.length, self.P
        gone = (self.diverged[active] >= 0) | (pos[active] >= length[active])
        self.steps_done[active[gone]] = np.minimum(pos[active[gone]], length[active[gone]])
        keep = ~gone
        if self.pairs:
            chk = keep & (self.nj[active] > 0) & (self.nj[active] % self.check_every == 0)
            a = active[chk]
            r = (np.abs(self.H[a + P]).max(axis=1) / np.abs(self.H[a]).max(axis=1)).astype(np.float32)
            self.residual[a] = r
            conv = r <= np.float32(self.stop_ratio)
            self.steps_done[a[conv]] = pos[a[conv]]
            keep[np.flatnonzero(chk)[conv]] = False
        for s in active[keep].tolist():
            self.ent[s] = self.longest(s)
        self.waiting[active[keep]] = True

    def take_round(self, queued: np.ndarray) -> np.ndarray:
        """This round's rows: the queues at least ``frac`` of the longest."""
        cnt = np.bincount(self.ent[queued], minlength=len(self.model.klen))
        thr = max(1, int(np.float32(self.frac) * np.float32(cnt.max())))
        active = queued[cnt[self.ent[queued]] >= thr]
        self.waiting[active] = False
        return active

    def read_out(self, active: np.ndarray) -> None:
        """The readout before each row's jump, and the range check of its state."""
        p = self.start[active] + self.pos[active]
        bad = ~(np.abs(self.H[active, : self.d]).max(axis=1) <= self.limit)
        if self.bits is not None:
            b = _lse_bits(self.H[active] @ self.RoT, self.ids64[p])
            self.bits[p] = b
            bad |= ~np.isfinite(b)
        newly = bad & (self.diverged[active] < 0)
        self.diverged[active[newly]] = self.pos[active[newly]]

    def jump(self, active: np.ndarray) -> None:
        """Every row of the round takes its key's jump (grouped by key), with the readouts inside it."""
        H, d, P, klen = self.H, self.d, self.P, self.model.klen
        ent_a = self.ent[active]
        order = np.argsort(ent_a, kind="stable")
        Hn = H.copy()
        for grp in np.split(order, np.flatnonzero(np.diff(ent_a[order])) + 1):
            e = int(ent_a[grp[0]])
            Me, rows = self.model.M[e], active[grp]
            Hn[rows, : d + 1] = H[rows, : d + 1] @ Me[:, : d + 1]
            if self.pairs:
                Hn[rows + P, : d + 1] = H[rows + P, : d + 1] @ Me[:, : d + 1]
            if self.bits is not None and klen[e] > 1:
                self.read_inside(rows, H[rows, : d + 1] @ Me[:, self.dp :], int(klen[e]))
        H[:] = Hn
        self.total += int(klen[ent_a].sum())
        self.n_jumps += len(active)
        self.pos[active] += klen[ent_a]
        self.nj[active] += 1

    def read_inside(self, rows: np.ndarray, L: np.ndarray, k: int) -> None:
        """The bits of the characters a jump of ``k`` passes, from its readouts ``L`` (n, (k-1) Vp)."""
        for c in range(1, k):
            pc = self.start[rows] + self.pos[rows] + c
            bc = _lse_bits(L[:, (c - 1) * self.Vp : (c - 1) * self.Vp + self.V], self.ids64[pc])
            self.bits[pc] = bc
            nf = ~np.isfinite(bc) & (self.diverged[rows] < 0)
            self.diverged[rows[nf]] = self.pos[rows[nf]] + c

    def result(self) -> StreamsResult:
        """The results; a final state out of range is a divergence at the row's end."""
        m = np.abs(self.H[: self.P, : self.d]).max(axis=1)
        bad = (self.diverged < 0) & ~(m <= self.limit)
        self.diverged[bad] = self.steps_done[bad]
        return StreamsResult(self.total, self.steps_done, self.residual, self.diverged, self.n_jumps)


def run_jumps_ref(model: JumpTable, ids: np.ndarray, start: np.ndarray, length: np.ndarray, H: np.ndarray,
                  bits: np.ndarray | None = None, pairs: bool = False, stop_ratio: float = 0.0,
                  check_every: int = 16, limit: float = MAX_STATE_ABS, threads: int = 1,
                  split: str = "auto", frac: float = SCHED_FRAC) -> StreamsResult:
    """The numpy twin of :func:`run_jumps`: the same schedule (one thread's: ``threads`` and
    ``split`` are ignored), so the same rounds, jumps and stops; the bits agree within float32
    rounding (the log-softmax is float64 here)."""
    rows = _JumpRows(model, ids, start, length, H, bits, pairs, stop_ratio, check_every, limit, frac)
    active = np.arange(rows.P)  # the rows stepped last round (at first: every row, to be queued or stopped)
    while True:
        rows.stop_or_queue(active)
        queued = np.flatnonzero(rows.waiting)
        if len(queued) == 0:
            return rows.result()
        active = rows.take_round(queued)
        rows.read_out(active)
        rows.jump(active)


@native_or_twin(run_jumps_ref)
def run_jumps(nat, model: JumpTable, ids: np.ndarray, start: np.ndarray, length: np.ndarray,
              H: np.ndarray, bits: np.ndarray | None = None, pairs: bool = False, stop_ratio: float = 0.0,
              check_every: int = 16, limit: float = MAX_STATE_ABS, threads: int = 1,
              split: str = "auto", frac: float = SCHED_FRAC) -> StreamsResult:
    """Advance every row through its characters by composed jumps (compiled; module docstring).

    The signature and results are :func:`~isan.engine.kernels.streams.run_streams`'s (``split`` is
    accepted for that and ignored: rows are split between threads, each runs its block alone).

    Args:
        model: the :class:`JumpTable`.
        ids: (N,) int32 symbol ids; start, length: (P,) int64: row s reads
            ``ids[start[s] : start[s] + length[s]]``.
        H: (P, dp) float32 (2P with ``pairs``) state rows, updated in place to the final states.
        bits: (N,) float64 or None: where the bits of each character are written.
        pairs, stop_ratio, check_every: the correction mode (checked every ``check_every`` jumps).
        limit: the largest ``|h_i|`` accepted (checked at jump boundaries).
        threads: threads sharing the rows.
        frac: the schedule of :func:`~isan.engine.kernels.streams.run_streams`, by key instead of
            symbol: rows wait in the queue of the key they take next, and a round takes the
            queues at least this share of the longest (0: every row every round).
    Returns:
        StreamsResult (steps in characters; ``jumps`` the jumps taken).
    Raises:
        TypeError, ValueError: arrays of the wrong dtype, shape or range.
    """
    sm = model.stream
    P = check_rows_arguments(sm, ids, start, length, H, bits, pairs)
    frac = check_frac(frac)
    steps_done = np.zeros(P, dtype=np.int64)
    residual = np.zeros(P, dtype=np.float32)
    diverged = np.zeros(P, dtype=np.int64)
    Hb = H.copy()
    want = bits is not None
    out_bits = bits if want else np.zeros(0, dtype=np.float64)
    total, jumps = nat.run_jumps(M=model.M_panels, f16=model.M_panels.dtype == np.float16, m_off=model.m_off,
                                 klen=model.klen, children=model.children, entry_of=model.entry_of,
                                 RoT=sm.RoT_panels, nsym=sm.K, V=sm.V, Vp=sm.Vp, d=sm.d, dp=sm.dp, ids=ids,
                                 start=start, length=length, H=H, Hb=Hb, bits=out_bits, P=P, pairs=bool(pairs),
                                 stop_ratio=float(stop_ratio), limit=float(limit), check_every=int(check_every),
                                 steps_done=steps_done, residual=residual, diverged=diverged, threads=int(threads),
                                 want_bits=want, frac=frac)
    return StreamsResult(int(total), steps_done, residual, diverged, int(jumps))


# the Runner contract (isan.engine.kernels.chunked.Runner): the state rows these advance are float32
run_jumps_ref.state_dtype = np.dtype(np.float32)
run_jumps.state_dtype = np.dtype(np.float32)
