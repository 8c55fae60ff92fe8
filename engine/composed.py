"""The composed path: greedy longest match in a trie table, one state jump per match.

For a match of entry e (substring s of length k) at state h (docs/ARCHITECTURE.md, 'The model
and its conventions'): ``h_after = A_s h + c_s`` (one (d, d+1) product with ``[h; 1]``), and the
k logit vectors inside the match are ``[R_i | r_i] [h; 1]`` for i = 0..k-1. The state jumps are
sequential; the readouts are grouped by entry after all jumps, one GEMM per entry used, so each
stored readout block is read once per text rather than once per match.

Precision: tables hold float32 (composed in float64; float16 on request), the state is carried
in float32, and the log-softmax is taken in float64 (the max and the sum of exponentials in
float32 in the compiled kernel). Tests hold per-character bits within 1e-4 of the float64
reference path and total bits within a relative 1e-6 (float16 tables: 0.02 bits and 1e-3).

The jumps and readouts run in the compiled kernel :func:`~isan.engine.kernels.sequential.seq_composed`
(no Python per match); :meth:`ComposedPath.score_ref` keeps the numpy implementation as its
twin. Batches grouped by symbol run in :func:`~isan.engine.kernels.streams.run_streams`.
"""

from __future__ import annotations

import numpy as np

from isan.engine.guard import raise_diverged
from isan.params import ISANParams
from isan.trie_tables.codes import greedy_segment, longest_matches, match_codes
from isan.trie_tables.format import Table

LOG2E = 1.0 / np.log(2.0)


class ComposedPath:
    """Scoring and ingestion with a :class:`~isan.trie_tables.format.Table` (immutable, thread-safe).

    Without a table only batched scoring grouped by symbol is available.
    """

    def __init__(self, table: Table | None, params: ISANParams, symbols=None):
        self.table = table
        self.K, self.V, self.d = params.K, params.V, params.d
        self.params64 = params.astype(np.float64)
        self.symbols = symbols
        from isan.engine.kernels.sequential import ThreadChooser

        self.chooser = ThreadChooser()
        self._trie = None
        if table is not None:
            self.Ac = table.Ac.view(np.ndarray) if isinstance(table.Ac, np.memmap) else table.Ac
            self.R = table.R.view(np.ndarray) if isinstance(table.R, np.memmap) else table.R
            # what the compiled kernel reads: the stored arrays (float16 stays float16: half the bytes a jump)
            self.Ac_k, self.R_k = self.Ac, self.R
            if table.header.get("dtype") == "float16":
                self.Ac_k = np.load(table.path / "Ac.npy", mmap_mode="r").view(np.ndarray)
                self.R_k = np.load(table.path / "R.npy", mmap_mode="r").view(np.ndarray)
        p = params.astype(np.float32)
        W_aug = np.concatenate([p.W, p.b[:, :, None]], axis=2)  # (K, d, d+1): per-symbol [W | b]
        # (K, d+1, d) C-contiguous: OpenBLAS runs `rows @ W_augT[k]` 2-4x faster than `rows @ W_aug[k].T`
        self.W_augT = np.ascontiguousarray(W_aug.transpose(0, 2, 1))
        self.Ro_aug = np.concatenate([p.W_ro, p.b_ro[:, None]], axis=1)  # (V, d+1)

    # ---- segmentation -------------------------------------------------------------------
    def _trie_arrays(self):
        """The table's keys as an array trie for the compiled walk: children (nodes, K) int32 and
        entry_of (nodes,) int32 (-1 where a node is not an entry); built once, on first use."""
        if self._trie is None:
            from isan.trie_tables.codes import decode_code

            t = self.table
            children = [[-1] * self.K]
            entry_of = [-1]
            for code, e in zip(t.sorted_codes.tolist(), t.entry_of_sorted.tolist()):
                node = 0
                for x in decode_code(int(code), self.K):
                    nxt = children[node][x]
                    if nxt < 0:
                        nxt = len(entry_of)
                        children[node][x] = nxt
                        children.append([-1] * self.K)
                        entry_of.append(-1)
                    node = nxt
                entry_of[node] = e
            self._trie = (np.asarray(children, dtype=np.int32), np.asarray(entry_of, dtype=np.int32))
        return self._trie

    def segment(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Greedy longest-match segmentation: (starts, lengths, entry ids), each (n_matches,) int64.

        Compiled: one walk down a trie of the keys from each match start. The numpy twin
        (:meth:`segment_ref`) computes every position's longest match with exact integer codes."""
        from isan.engine.kernels import native

        nat = native()
        if nat is None:
            return self.segment_ref(ids)
        children, entry_of = self._trie_arrays()
        x = np.asarray(ids, dtype=np.int32)
        starts = np.empty(len(x), dtype=np.int64)
        entries = np.empty(len(x), dtype=np.int64)
        n = nat.trie_segment(children=children, entry_of=entry_of, K=self.K, ids=x, starts=starts, entries=entries)
        starts, entries = starts[:n], entries[:n]
        return starts, self.table.lengths[entries], entries

    def segment_ref(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The numpy twin of :meth:`segment`."""
        from isan.engine.kernels import native

        t = self.table
        M = longest_matches(ids, self.K, t.sorted_codes, t.max_len)
        nat = native()
        if nat is not None:  # the pointer walk in C (no Python per match)
            starts = np.empty(len(M), dtype=np.int64)
            starts = starts[: nat.greedy_segment(M=M, starts=starts)]
            lengths = np.diff(np.append(starts, len(M)))
        else:
            starts, lengths = greedy_segment(M)
        entries = t.entries_of(match_codes(ids, self.K, starts, lengths))
        return starts, lengths, entries

    # ---- single stream --------------------------------------------------------------------
    def score(self, ids: np.ndarray, h: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Bits of each character (float64 (N,)) and the final state ((d,) float32), compiled.

        Args:
            threads: at most this many threads share each jump (a :class:`ThreadChooser` picks
                1 or ``threads`` from the speeds seen, following the machine's load).
        Raises:
            StateDivergedError: a state leaves the range (located by the float64 reference).
        """
        return self._run(ids, h, True, threads)

    def advance(self, ids: np.ndarray, h: np.ndarray, threads: int = 1) -> np.ndarray:
        """The state after ``ids`` (no readout): (d,) float32, compiled."""
        return self._run(ids, h, False, threads)[1]

    def _run(self, ids, h, want_bits: bool, threads: int):
        import time

        from isan.engine.kernels.sequential import seq_composed

        starts, lengths, entries = self.segment(ids)
        t = self.chooser.pick(threads, len(ids))
        t0 = time.perf_counter()
        bits, hf, bad = seq_composed(self.Ac_k, self.R_k, self.table.offsets, self.table.lengths, entries,
                                     np.asarray(ids, dtype=np.int32), np.asarray(h, dtype=np.float32),
                                     want_bits=want_bits, threads=t)
        self.chooser.report(t, len(ids), time.perf_counter() - t0)
        if bad >= 0:
            self._diverged(ids, h, int(starts[bad] + lengths[bad] - 1))
        return bits, hf

    def _diverged(self, ids: np.ndarray, h: np.ndarray, detected_at: int) -> None:
        p = self.params64
        raise_diverged(p.W, p.b, np.asarray(ids), np.asarray(h, dtype=np.float64), "composed",
                       detected_at=detected_at, symbols=self.symbols)

    def jumps(self, entries: np.ndarray, h: np.ndarray) -> np.ndarray:
        """States before each match and after the last: (n_matches + 1, d + 1) float32, last column 1
        (numpy: the twin's jumps, and the benchmark's breakdown of where the time goes)."""
        d = self.d
        H = np.empty((len(entries) + 1, d + 1), dtype=np.float32)
        H[:, d] = 1.0
        H[0, :d] = h
        Ac, dot = self.Ac, np.dot
        for j, e in enumerate(entries.tolist()):
            dot(Ac[e], H[j], out=H[j + 1, :d])
        return H

    def score_ref(self, ids: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The numpy twin of :meth:`score` (jumps one by one, readouts grouped by entry); no range check."""
        starts, lengths, entries = self.segment(ids)
        H = self.jumps(entries, h)
        bits = self.readout_bits(ids, starts, entries, H[:-1])
        return bits, H[-1, : self.d].copy()

    def readout_bits(self, ids: np.ndarray, starts: np.ndarray, entries: np.ndarray, H: np.ndarray,
                     rows: np.ndarray | None = None) -> np.ndarray:
        """Bits of every character from the states before each match, grouped by entry.

        Args:
            ids: (N,) text; starts, entries: (n,) the matches; H: states ``[h; 1]`` (.., d+1)
                before them: row ``rows[j]`` of H for match j (default ``rows = arange(n)``).
        """
        V, d = self.V, self.d
        t = self.table
        bits = np.empty(len(ids), dtype=np.float64)
        order = np.argsort(entries, kind="stable")
        se = entries[order]
        cuts = np.flatnonzero(np.diff(se)) + 1
        for grp in np.split(order, cuts):
            e = int(entries[grp[0]])
            k, off = int(t.lengths[e]), int(t.offsets[e])
            Rk = self.R[off : off + k].reshape(k * V, d + 1)
            L = (H[grp if rows is None else rows[grp]] @ Rk.T).reshape(len(grp), k, V).astype(np.float64)
            pos = starts[grp][:, None] + np.arange(k)
            m = L.max(axis=-1, keepdims=True)
            lse = np.log(np.exp(L - m).sum(axis=-1)) + m[..., 0]
            tgt = np.take_along_axis(L, ids[pos][..., None], axis=-1)[..., 0]
            bits[pos] = (lse - tgt) * LOG2E
        return bits

    # ---- many streams ---------------------------------------------------------------------
    def score_batch(self, texts: list[np.ndarray], hs: np.ndarray, group: str = "entry") -> tuple[list[np.ndarray], np.ndarray]:
        """Score independent texts together; work is grouped by table entry (or by symbol).

        Args:
            texts: B id arrays; hs: (B, d) initial states.
            group: ``"entry"`` (composed jumps, streams that need the same entry share one GEMM)
                or ``"symbol"`` (per-character steps grouped by symbol: the batched reference).
        Returns:
            (list of per-character bits (len(text),) float64, final states (B, d) float32).
        """
        B, d = len(texts), self.d
        if group == "symbol":
            segs = [(np.arange(len(x), dtype=np.int64), np.ones(len(x), dtype=np.int64), np.asarray(x, dtype=np.int64)) for x in texts]
            mats = None
        elif group == "entry":
            segs = [self.segment(x) for x in texts]
            mats = self.Ac
        else:
            raise ValueError(f"group must be 'entry' or 'symbol'; got {group!r}")
        n = np.array([len(s[0]) for s in segs])
        by_len = np.argsort(-n, kind="stable")  # active streams at round r are a prefix of by_len
        n_sorted = n[by_len]
        R = int(n.max()) if B else 0
        E = np.full((B, R), -1, dtype=np.int64)
        for row, j in enumerate(by_len):
            E[row, : n[j]] = segs[j][2]
        Hs = np.empty((B, R + 1, d + 1), dtype=np.float32)  # states before each match, per stream
        Hs[:, :, d] = 1.0
        Hs[:, 0, :d] = np.asarray(hs, dtype=np.float32)[by_len]
        for r in range(R):
            m = int(np.searchsorted(-n_sorted, -r, side="left"))  # streams with more than r matches
            ents = E[:m, r]
            order = np.argsort(ents, kind="stable")
            se = ents[order]
            bounds = [0, *(np.flatnonzero(se[1:] != se[:-1]) + 1).tolist(), m]
            cur = Hs[order, r]  # (m, d+1), grouped so that each entry's streams are contiguous
            out = np.empty((m, d), dtype=np.float32)
            se_list = se.tolist()
            for a, b in zip(bounds[:-1], bounds[1:]):
                e = se_list[a]
                if mats is None:  # by symbol: [W | b]^T stored transposed
                    np.dot(cur[a:b], self.W_augT[e], out=out[a:b])
                elif b - a == 1:
                    np.dot(mats[e], cur[a], out=out[a])
                else:
                    out[a:b] = np.dot(mats[e], cur[a:b].T).T
            Hs[order, r + 1, :d] = out
        out_bits: list[np.ndarray] = [None] * B  # type: ignore[list-item]
        finals = np.empty((B, d), dtype=np.float32)
        for row, j in enumerate(by_len):
            finals[j] = Hs[row, n[j], :d]
        if group == "symbol":
            for row, j in enumerate(by_len):  # one (n_j, d+1) x (d+1, V) product per stream
                x = np.asarray(texts[j], dtype=np.int64)
                L = (Hs[row, : n[j]] @ self.Ro_aug.T).astype(np.float64)
                mx = L.max(axis=1, keepdims=True)
                lse = np.log(np.exp(L - mx).sum(axis=1)) + mx[:, 0]
                out_bits[j] = (lse - L[np.arange(len(x)), x]) * LOG2E
            return out_bits, finals
        # by entry: readouts for all streams at once, one GEMM per entry, states read in place
        all_ids = np.concatenate([np.asarray(texts[j], dtype=np.int64) for j in by_len])
        base = np.concatenate([[0], np.cumsum([len(texts[j]) for j in by_len])])
        starts = np.concatenate([segs[j][0] + base[row] for row, j in enumerate(by_len)])
        ents = np.concatenate([segs[j][2] for j in by_len])
        hrows = np.concatenate([row * (R + 1) + np.arange(n[j]) for row, j in enumerate(by_len)])
        bits = self.readout_bits(all_ids, starts, ents, Hs.reshape(B * (R + 1), d + 1), rows=hrows)
        for row, j in enumerate(by_len):
            out_bits[j] = bits[base[row] : base[row + 1]]
        return out_bits, finals
