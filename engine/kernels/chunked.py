"""Exact chunk-parallel scoring of long texts (and batches of texts) with :func:`run_streams`.

The ISAN is affine and forgets its start state fast (docs/guide/tables-and-speed.md, 'Measured facts
the code relies on': a perturbation shrinks below 1e-7 of the state within about 111 characters, 228
at worst, on the text8-10M test split).
So a text is cut into P chunks that are scored together as one batch:

1. **Guess pass.** Chunk 0 starts from the true initial state; every other chunk from a guess
   ``g`` (the model's ``h0``). All chunks run as rows of one :func:`run_streams` call, which
   writes every character's bits and each chunk's final state ``F[p]``.
2. **Correction pass.** Chunk p's true start is ``F[p - 1]`` (exact once chunk p - 1's own
   correction has died out, see 3). The dynamics are affine, so the true states of chunk p are
   the guess states plus the start error ``e = F[p - 1] - g`` carried by the matrices alone
   (``e <- W[x] e``, no bias). Each chunk runs a pair of rows (its true state and its error)
   from its start until ``max|e| <= rtol / margin * max(1, max|h|)`` (checked every 16
   characters), rewriting the bits of the characters it passes; beyond that point the guess
   pass's bits and final state are within the tolerance. ``margin`` (default 4) allows for the
   growth of products of W before they shrink (docs/guide/tables-and-speed.md, 'Measured facts the
   code relies on': about 4x over a few characters).
3. **Fallback.** A chunk whose error has not died out by its end (the model does not forget on
   that text, e.g. long runs of 'h') leaves the next chunk's start inexact. Such chunks are
   redone one after another from exact starts: the next chunk's correction is run again from its
   exact start, and a chunk whose error does not die out is scored sequentially in float64 (on
   such text float32 rounding errors do not die out either). A state that leaves the range
   (:mod:`isan.engine.guard`) is reported, and the engine raises
   :class:`~isan.errors.StateDivergedError` naming the character.

The result reports the chunk count, the extra work, the largest residual reached, and the
chunks that fell back. A :class:`~isan.engine.kernels.plan.Plan` whose runner is ``run_streams_ref`` runs the
same algorithm on the numpy twin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.packed import Packed, PackedBits
from isan.engine.kernels.plan import DEFAULT_MARGIN, DEFAULT_RTOL, Kernel, Plan
from isan.engine.kernels.streams import StreamModel, StreamsResult
from isan.params import ISANParams

#: Defaults (docs/guide/tables-and-speed.md, 'Measured facts the code relies on', and measurements
#: on 2.5M characters, 2 threads): a chunk much longer than the ~110 characters its correction runs
#: (a pair of rows each, so ~9% extra work at 1,024 chunks, ~4.5% at 512), and enough rows per
#: thread to keep the grouped GEMMs busy. With the rows moving in step, 256 rows a thread was best
#: (1.06M chars/s against 0.90M at 512: more correction, no faster GEMMs); with the queued schedule
#: (streams.py, issue 22) a matrix serves twice the rows and 512 a thread is best (one thread: 1.06M
#: chars/s at 512, 0.97M at 256; two: 2.06M against 1.94M; 768 no faster).
MIN_CHUNK = 1024
ROWS_PER_THREAD = 512


#: what a batch's results hold (:func:`score_packed`): each text's total bits, each character's, or
#: none (final states only); and the ``want_bits`` of :func:`score_texts_chunked` of each
WANTS = {"totals": "totals", "bits": True, "none": False}


@dataclass
class BatchResult:
    """One batch of texts' results (:meth:`Backend.submit`, :func:`isan.engine.batches.score_batches`).

    Attributes:
        values: (B,) float64 each text's total bits (``"totals"``), a
            :class:`~isan.engine.packed.PackedBits` of each character's bits (``"bits"``), or None
            (``"none"``).
        finals: (B, d) each text's final state (the runner's state dtype), or None where the caller
            left them on the device (``finals=False`` on a device's pipeline).
        divergence: None, or ``(text index, offset in the text, start state (d,), step)``: a
            state left the range at that step after that start (the values are then not
            meaningful); the caller locates it exactly with :func:`isan.engine.guard.raise_diverged`.
        report: how the batch was scored (:class:`ChunkedReport`).
    """

    values: object
    finals: np.ndarray
    divergence: tuple | None = None
    report: "ChunkedReport | None" = None

    def result(self) -> "BatchResult":
        """Itself: a batch scored at once is its own submitted batch (``Backend.submit``'s result)."""
        return self


def score_packed(plan: "Plan", packed: "Packed", hs: np.ndarray, want: str = "totals", threads: int = 1,
                 limit: float = MAX_STATE_ABS) -> BatchResult:
    """One batch through :func:`score_texts_chunked` now: what :meth:`Backend.submit` does on a
    backend without an overlapped pipeline (``hs``: (B, d) or (d,) the states before the texts).

    Raises:
        ValueError: an unknown ``want``, an empty text.
    """
    if want not in WANTS:
        raise ValueError(f"want must be one of {', '.join(WANTS)}; got {want!r}")
    values, finals, report, div = score_texts_chunked(plan, packed, hs, threads=threads, limit=limit,
                                                      want_bits=WANTS[want])
    return BatchResult(values if want != "none" else None, finals, div[0] if div else None, report)


@dataclass
class ChunkedReport:
    """How chunk-parallel scoring went (see the module docstring).

    Attributes:
        chunks: chunks scored together (over all texts).
        chars: characters scored.
        extra_steps: row-steps beyond one per character (correction pairs and fallbacks).
        extra_fraction: ``extra_steps / chars``.
        residual: the largest ``max|e| / max(1, max|h|)`` at which a correction stopped.
        rtol, margin: the tolerance asked for (a correction stops at ``rtol / margin``).
        fallback_chunks: chunks redone one after another because an error had not died out.
        path: ``"chunked"`` (one character a step) or ``"jumps"`` (composed jumps,
            :func:`~isan.engine.kernels.jumps.run_jumps`).
        steps, jumps: row-steps (characters) and row-jumps of the kernel's passes (equal on the
            chunked path); ``steps / jumps`` is the average jump.
    """

    chunks: int
    chars: int
    extra_steps: int = 0
    residual: float = 0.0
    rtol: float = DEFAULT_RTOL
    margin: float = DEFAULT_MARGIN
    fallback_chunks: int = 0
    corrections: list[int] = field(default_factory=list, repr=False)
    path: str = "chunked"
    steps: int = 0
    jumps: int = 0

    @property
    def extra_fraction(self) -> float:
        return self.extra_steps / self.chars if self.chars else 0.0

    def to_json(self) -> dict:
        out = {"path": self.path, "chunks": self.chunks, "extra_fraction": round(self.extra_fraction, 6),
               "residual": float(self.residual), "rtol": self.rtol, "margin": self.margin,
               "fallback_chunks": self.fallback_chunks}
        if self.path.startswith("jumps"):
            out["chars_per_jump"] = round(self.steps / self.jumps, 4) if self.jumps else 0.0
        return out


def certified_min_chunk(forget_chars: int | None, base: int = MIN_CHUNK) -> int:
    """The shortest chunk to cut for a model whose certificate proves forgetting within ``forget_chars``
    characters (``Engine.forget_bound_chars``; None: no certificate): ``base``, or that many characters
    rounded up to a multiple of 256 where it is more, so that every chunk provably corrects itself."""
    if forget_chars is not None and forget_chars > base:
        return -(-int(forget_chars) // 256) * 256
    return base


def plan_chunks(lengths: Sequence[int], target_rows: int = 2 * ROWS_PER_THREAD, min_chunk: int = MIN_CHUNK) -> list[int]:
    """How many chunks to cut each text into: about ``target_rows`` rows in all for the batched
    kernel (ROWS_PER_THREAD a thread), chunks no shorter than ``min_chunk`` characters (so the
    correction of each stays a small share)."""
    lengths = [int(n) for n in lengths]
    total = sum(lengths)
    if total == 0:
        return [1] * len(lengths)
    if len(lengths) >= target_rows:
        return [1] * len(lengths)
    want = target_rows - len(lengths)  # extra rows to create by cutting long texts
    out = []
    for n in lengths:
        extra = int(want * n / total)
        out.append(max(1, min(1 + extra, n // min_chunk)))
    return out


@runtime_checkable
class Runner(Protocol):
    """The contract of every kernel that advances state rows (a *runner*): the compiled
    :func:`~isan.engine.kernels.streams.run_streams` and :func:`~isan.engine.kernels.jumps.run_jumps`,
    their numpy twins ``run_streams_ref`` / ``run_jumps_ref``, and the torch backend's
    :class:`~isan.engine.kernels.torch.TorchStreams` (any device).

    Row s reads ``ids[start[s] : start[s] + length[s]]`` from the state row ``H[s]`` (float32, or
    the runner's ``state_dtype`` where it declares one), writes each character's bits into
    ``bits`` (float64) and leaves its final state in ``H``; with ``pairs`` the rows ``P + s`` are
    error rows of the correction pass (:mod:`isan.engine.kernels.streams` says exactly what each
    argument means). ``model`` is the runner's weights: a
    :class:`~isan.engine.kernels.streams.StreamModel` (one character a step) or a
    :class:`~isan.engine.kernels.jumps.JumpTable` (composed jumps). A runner may take more
    keywords; these are the ones chunk-parallel scoring passes.

    Attributes:
        state_dtype: the dtype of the state rows ``H`` it advances (the CPU kernels and their twins:
            float32; the torch runner: its dtype, float32 or float64).
        ids_dtypes: optional, the dtypes of ``ids`` it reads (without it: int32, as the compiled
            kernels; the torch runner also reads uint8 as it is).
    """

    state_dtype: np.dtype

    def __call__(self, model, ids: np.ndarray, start: np.ndarray, length: np.ndarray, H: np.ndarray,
                 bits: np.ndarray | None = None, pairs: bool = False, stop_ratio: float = 0.0,
                 check_every: int = 16, limit: float = MAX_STATE_ABS, threads: int = 1) -> StreamsResult: ...


@dataclass
class ChunkRows:
    """The rows of a chunk-parallel batch: chunk c of text ``text[c]`` reads
    ``ids[start[c] : start[c] + length[c]]``; ``first[c]``: it starts its text; ``base``: where each
    text starts in ``ids`` (B,)."""

    text: np.ndarray
    start: np.ndarray
    length: np.ndarray
    first: np.ndarray
    base: np.ndarray

    @classmethod
    def cut(cls, packed: Packed, chunks: Sequence[int]) -> "ChunkRows":
        """Each text of ``packed`` cut into its count of ``chunks``: even cuts in order, chunk k of
        a text of n characters in P from ``round(k n / P)`` (``np.linspace(0, n, P + 1).round()``'s
        cuts, computed for every text at once); an empty chunk (P > n) is left out."""
        base, lens = packed.start, packed.length
        B = len(lens)
        P = np.maximum(np.asarray(chunks, dtype=np.int64).reshape(B), 1) if B else np.zeros(0, np.int64)
        if not B or P.max() <= 1:  # one row a text (documents): no cut
            text, start, length = np.arange(B, dtype=np.int64), base.copy(), lens.copy()
        else:
            text = np.repeat(np.arange(B, dtype=np.int64), P)
            k = np.arange(len(text), dtype=np.int64) - np.repeat(np.cumsum(P) - P, P)
            n, p = lens[text].astype(np.float64), P[text]
            step = n / p
            a = np.round(k * step)
            b = np.where(k + 1 == p, n, np.round((k + 1) * step))
            keep = b > a
            text, a, b = text[keep], a[keep].astype(np.int64), b[keep].astype(np.int64)
            start, length = base[text] + a, b - a
        first = np.ones(len(length), dtype=bool)
        first[1:] = text[1:] != text[:-1]
        return cls(text, start, length, first, base)

    def __len__(self) -> int:
        return len(self.length)

    def offset(self, c: int) -> int:
        """Where chunk c starts in its text."""
        return int(self.start[c] - self.base[self.text[c]])


def score_texts_chunked(plan: "Plan", texts: "Packed | Sequence[np.ndarray]", h_init: np.ndarray, *,
                        want_bits: bool | str = True, threads: int = 1, limit: float = MAX_STATE_ABS,
                        guess: np.ndarray | None = None,
                        ) -> tuple[list[np.ndarray] | np.ndarray, np.ndarray, ChunkedReport, list]:
    """Score B texts exactly, each cut into the plan's chunks, all chunks in one batch: the guess
    pass, the correction pass, then each text in order, keeping what started exactly and redoing the
    rest (the module docstring).

    Args:
        plan: the batch's :class:`~isan.engine.kernels.plan.Plan` (kernel, weights, chunks per text,
            runner, fallback, stopping rule, buffers): ``Engine.plan``, or
            :meth:`Plan.one_row_a_text` for texts not cut.
        texts: a :class:`~isan.engine.packed.Packed` batch of B texts, or B int id arrays (joined
            once), each non-empty; B = ``len(plan.chunks)``.
        h_init: (B, d) the state before each text, or (d,) the state before every one (float32,
            or the runner's ``state_dtype``).
        want_bits: True (each character's bits), ``"totals"`` (each text's total bits only) or
            False (no readout; final states only).
        threads: threads for the kernel.
        limit: the largest ``|h|`` a state may reach (:mod:`isan.engine.guard`).
        guess: (d,) the start state guessed for chunks after the first (default: ``h_init[0]``).
    Returns:
        (bits per text: a :class:`~isan.engine.packed.PackedBits`, B (n_i,) float64 views of one
        array (empty arrays if not want_bits; with ``want_bits="totals"`` one (B,) float64 array,
        each text's total bits), final states (B, d) in the runner's state dtype,
        report, divergences). ``divergences`` is empty, or holds one ``(text index, offset of the
        chunk in its text, the chunk's exact start state (d,), step t)``: the state before the
        chunk's character t is out of range (or its bits are not finite); the caller locates it
        exactly with :func:`isan.engine.guard.raise_diverged` from that start.
    Raises:
        ValueError: an empty text, chunk counts that do not match the texts, or an unknown ``want_bits``.
    """
    packed = Packed.of(texts)
    B = len(packed)
    if B and packed.length.min() < 1:
        raise ValueError("every text must have at least one character")
    if len(plan.chunks) != B:
        raise ValueError(f"the plan has chunk counts for {len(plan.chunks)} texts; got {B} texts")
    if want_bits not in (True, False, "totals"):
        raise ValueError(f"want_bits must be True, False or 'totals'; got {want_bits!r}")
    d = plan.model.d
    reads = getattr(plan.runner, "ids_dtypes", (np.int32,))  # the ids the runner reads (compiled kernels: int32)
    if _writes_bits(plan, want_bits) or packed.ids.dtype not in reads:
        # each character's bits go to the ids' own places; ids the runner reads
        packed = packed.dense(packed.ids.dtype if packed.ids.dtype in reads else reads[0])
    rows = ChunkRows.cut(packed, plan.chunks)
    h_init = np.asarray(h_init)
    if h_init.shape != (B, d) and h_init.shape != (d,):
        raise ValueError(f"hs must be ({B}, {d}) or ({d},); got {h_init.shape}")
    h_init = np.broadcast_to(h_init, (B, d))  # read in its own dtype where it is copied
    g = np.asarray(guess if guess is not None else h_init[0], dtype=np.float64).reshape(d)
    batch = _Batch(plan, packed.ids, rows, g, threads, limit,
                   ChunkedReport(chunks=len(rows), chars=packed.chars, rtol=plan.rtol, margin=plan.margin,
                                 path=plan.path))
    totals, bits = batch.buffers(want_bits, B)
    F, div1 = batch.guess_pass(h_init, bits, totals)
    converged, div2 = batch.correction_pass(F, bits)
    finals, divergences = batch.settle_in_order(F, h_init, div1, div2, converged, bits)
    if want_bits == "totals":
        sums = totals if totals is not None else PackedBits(bits, packed.start, packed.length).totals()
        return sums, finals, batch.report, divergences
    if not want_bits:
        return PackedBits(np.zeros(0), np.zeros(B, np.int64), np.zeros(B, np.int64)), finals, batch.report, divergences
    return PackedBits(bits, packed.start, packed.length), finals, batch.report, divergences


def _writes_bits(plan: "Plan", want_bits) -> bool:
    """Whether a batch writes each character's bits (asked for, or summed from them where the
    runner cannot sum each text's itself: a text cut into chunks, or no ``row_totals``)."""
    if want_bits is True:
        return True
    return want_bits == "totals" and not (plan.row_totals and not plan.cuts)


class _Batch:
    """The phases of :func:`score_texts_chunked` on one batch, sharing its plan, ids, rows and report."""

    def __init__(self, plan: "Plan", ids: np.ndarray, rows: ChunkRows, guess: np.ndarray, threads: int, limit: float,
                 report: ChunkedReport):
        self.plan, self.ids, self.rows, self.g = plan, ids, rows, guess
        self.threads, self.limit, self.report = threads, limit, report
        self.sdt = np.dtype(plan.runner.state_dtype)  # the dtype of the state rows
        self.d, self.dp = plan.model.d, plan.model.dp
        self.stop = plan.rtol / plan.margin
        self.fallback = plan.fallback if plan.fallback is not None else Float64Fallback(plan.model)

    def buffers(self, want_bits, B: int):
        """(totals (B,) float64 where the runner sums each text's bits itself, else None; where the
        runner writes each character's bits, or None)."""
        totals = None
        if want_bits == "totals" and self.plan.row_totals and len(self.rows) == B:
            totals = np.zeros(B, dtype=np.float64)  # one row a text: the runner sums each text's bits
        bits = self.plan.empty_bits(len(self.ids)) if want_bits and totals is None else None  # ids: dense here
        return totals, bits

    def rows_of(self, starts: np.ndarray) -> np.ndarray:
        """State rows for ``starts`` (n, d): the homogeneous coordinate 1, padding 0."""
        H = np.zeros((len(starts), self.dp), dtype=self.sdt)
        H[:, : self.d] = starts
        H[:, self.d] = 1.0
        return H

    def pairs_of(self, starts: np.ndarray) -> np.ndarray:
        """A correction's rows (2n, dp): the true starts, then their errors from the guess (no bias)."""
        H = np.zeros((2 * len(starts), self.dp), dtype=self.sdt)
        H[: len(starts)] = self.rows_of(starts)
        H[len(starts) :, : self.d] = starts - self.g.astype(self.sdt)
        return H

    def guess_pass(self, h_init: np.ndarray, bits, totals) -> tuple[np.ndarray, np.ndarray]:
        """1. Every chunk from its text's state (the first) or the guess: (final states (C, d), diverged (C,))."""
        rows, B = self.rows, len(h_init)
        if len(rows) == B:  # one chunk a text, in order: every row starts from its text's state
            starts = h_init
        else:
            starts = np.broadcast_to(self.g, (len(rows), self.d)).astype(self.sdt)
            starts[rows.first] = h_init[rows.text[rows.first]]
        H = self.rows_of(starts)
        r = self.plan.runner(self.plan.model, self.ids, rows.start, rows.length, H, bits, threads=self.threads,
                             limit=self.limit, **({"totals": totals} if totals is not None else {}))
        self.report.steps, self.report.jumps = int(r.total_steps), int(r.jumps)
        return H[:, : self.d].copy(), np.asarray(r.diverged)

    def correct(self, chunks: np.ndarray, starts: np.ndarray, bits, threads: int):
        """Run the correction pairs of ``chunks`` from ``starts``: (converged, residual, diverged) each (n,)."""
        rows, plan = self.rows, self.plan
        H = self.pairs_of(starts)
        r = plan.runner(plan.model, self.ids, rows.start[chunks], rows.length[chunks], H, bits, pairs=True,
                        stop_ratio=self.stop, check_every=plan.check_every, threads=threads, limit=self.limit)
        self.report.extra_steps += 2 * int(r.total_steps)
        conv, res = _converged(H, len(chunks), np.asarray(r.steps_done), rows.length[chunks], np.asarray(r.residual),
                               self.stop)
        return conv, res, r

    def correction_pass(self, F: np.ndarray, bits) -> tuple[np.ndarray, np.ndarray]:
        """2. Chunks after the first of their text, each from ``F[p - 1]``: (converged (C,), diverged (C,))."""
        C = len(self.rows)
        corr = np.flatnonzero(~self.rows.first)
        converged = np.ones(C, dtype=bool)  # the correction died out inside the chunk
        div2 = np.full(C, -1, dtype=np.int64)
        if len(corr):
            conv, res, r = self.correct(corr, F[corr - 1], bits, self.threads)
            self.report.steps += int(r.total_steps)
            self.report.jumps += int(r.jumps)
            self.report.corrections = np.asarray(r.steps_done).tolist()
            converged[corr] = conv
            div2[corr] = r.diverged
            if conv.any():
                self.report.residual = float(res[conv].max())
        return converged, div2

    def settle_in_order(self, F, h_init, div1, div2, converged, bits) -> tuple[np.ndarray, list]:
        """3. Along each text in order: keep the work done from exact starts, redo the rest;
        (final states (B, d), divergences: empty or one)."""
        rows = self.rows
        finals = np.empty((len(h_init), self.d), dtype=self.sdt)
        if rows.first.all() and (div1 < 0).all():  # one row a text, none left the range: nothing to keep or redo
            finals[:] = F
            return finals, []
        exact, matches = None, True  # the previous chunk's exact final state; whether F[p - 1] equals it
        for p in range(len(rows)):
            exact, matches, diverged = self.settle_chunk(p, F, h_init, div1, div2, converged, exact, matches, bits)
            if diverged is not None:
                return finals, [diverged]
            if p == len(rows) - 1 or rows.text[p + 1] != rows.text[p]:
                finals[rows.text[p]] = exact
        return finals, []

    def settle_chunk(self, p: int, F, h_init, div1, div2, converged, exact, matches, bits):
        """Chunk p given the exact final state of the one before (``exact``) and whether its
        correction started from it (``matches``): (its exact final state, whether ``F[p]`` is it,
        a divergence or None)."""
        rows = self.rows
        where = (int(rows.text[p]), rows.offset(p))
        if rows.first[p]:
            if div1[p] >= 0:
                return exact, matches, (*where, np.asarray(h_init[rows.text[p]], dtype=np.float64).astype(self.sdt),
                                        int(div1[p]))
            return F[p], True, None
        if matches and div1[p] < 0:
            if div2[p] >= 0:
                return exact, matches, (*where, F[p - 1], int(div2[p]))
            if converged[p]:  # an exact start and a correction that died out: kept
                return F[p], True, None
        elif div1[p] < 0:  # the start was not exact: correct again from the exact start
            conv, res, r = self.correct(np.array([p]), exact[None], bits, threads=1)
            if r.diverged[0] >= 0:
                return exact, matches, (*where, np.asarray(exact), int(r.diverged[0]))
            if conv[0]:
                self.report.residual = max(self.report.residual, float(res[0]))
                return F[p], True, None
        return self.redo_in_float64(p, where, exact, bits)

    def redo_in_float64(self, p: int, where: tuple, exact, bits):
        """The fallback: chunk p scored one character at a time from its exact start (float32
        rounding errors do not die out on such text either), as :meth:`settle_chunk` returns."""
        rows = self.rows
        self.report.fallback_chunks += 1
        self.report.extra_steps += int(rows.length[p])
        a, b = int(rows.start[p]), int(rows.start[p] + rows.length[p])
        t_bad = _first_bad(self.fallback, self.ids[a:b], exact, self.limit)
        if t_bad is not None:
            return exact, False, (*where, np.asarray(exact), t_bad)
        b64, h64 = self.fallback(self.ids[a:b], exact)
        if bits is not None:
            bits[a:b] = b64
        return h64.astype(self.sdt), False, None


def _first_bad(fallback, seg, h, limit):
    """Where the float64 fallback's state first leaves the range (its ``first_bad`` hook), or None."""
    fn = getattr(fallback, "first_bad", None)
    return fn(seg, h, limit) if fn is not None else None


class Float64Fallback:
    """Sequential float64 scoring of a chunk (the reference recurrence, :func:`~isan.engine.reference.score_ref`).

    Built from an :class:`~isan.params.ISANParams` or a :class:`StreamModel`; the float64 weights
    are made on first use (most texts never need the fallback).
    """

    def __init__(self, source):
        self._source = source
        self._params = None

    @property
    def params(self):
        if self._params is None:
            src = self._source
            self._params = (src if isinstance(src, ISANParams) else src.params()).astype(np.float64)
        return self._params

    def __call__(self, ids: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from isan.engine.reference import score_ref

        return score_ref(self.params, np.asarray(ids, dtype=np.int64), np.asarray(h, dtype=np.float64))

    def first_bad(self, ids: np.ndarray, h: np.ndarray, limit: float) -> int | None:
        """The first t whose state before character t is out of range (kernel convention), or None."""
        from isan.engine.guard import first_out_of_range

        p = self.params
        t = first_out_of_range(p.W, p.b, np.asarray(ids), h, limit)
        return None if t is None else t + 1


def _converged(Hpairs: np.ndarray, P: int, steps_done: np.ndarray, length: np.ndarray, residual: np.ndarray,
               stop: float) -> tuple[np.ndarray, np.ndarray]:
    """Which pairs' errors died out inside their chunk, and the residual where each stopped.

    A pair that ran to its chunk's end is checked once more on its final rows."""
    conv = steps_done < length
    res = np.asarray(residual, dtype=np.float64).copy()
    end = ~conv
    if end.any():
        mh = np.abs(Hpairs[:P][end]).max(axis=1)  # whole rows: the homogeneous 1 floors it at 1
        me = np.abs(Hpairs[P:][end]).max(axis=1)
        res[end] = me / mh
        conv[end] = res[end] <= stop
    return conv, res
