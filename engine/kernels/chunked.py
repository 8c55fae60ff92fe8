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
chunks that fell back. ``runner=run_streams_ref`` runs the same algorithm on the numpy twin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels.streams import StreamModel, StreamsResult, run_streams
from isan.params import ISANParams

#: Defaults (docs/guide/tables-and-speed.md, 'Measured facts the code relies on', and measurements
#: on 2.5M characters, 2 threads): a chunk much longer than the ~110 characters its correction runs
#: (a pair of rows each, so ~9% extra work at 1,024 chunks, ~4.5% at 512), and enough rows per
#: thread to keep the grouped GEMMs busy. With the rows moving in step, 256 rows a thread was best
#: (1.06M chars/s against 0.90M at 512: more correction, no faster GEMMs); with the queued schedule
#: (streams.py, issue 22) a matrix serves twice the rows and 512 a thread is best (one thread: 1.06M
#: chars/s at 512, 0.97M at 256; two: 2.06M against 1.94M; 768 no faster).
DEFAULT_RTOL = 1e-6
DEFAULT_MARGIN = 4.0
MIN_CHUNK = 1024
ROWS_PER_THREAD = 512
CHECK_EVERY = 16


@dataclass
class BatchResult:
    """One batch of documents' results (:meth:`Backend.batches`; one row a document, none cut).

    Attributes:
        values: (B,) float64 each document's total bits (``"totals"``), a list of B (n_i,) float64
            arrays of each character's bits (``"bits"``), or None (``"none"``).
        finals: (B, d) each document's final state (the runner's state dtype).
        diverged: (B,) int64: -1, or the step at which the document's state left the range (its
            values are then not meaningful: the caller locates it with the float64 reference).
    """

    values: object
    finals: np.ndarray
    diverged: np.ndarray


def score_batches_in_turn(runner: "Runner", model: StreamModel, batches, want: str = "totals",
                          threads: int = 1, limit: float = MAX_STATE_ABS):
    """Each batch of documents through :func:`score_texts_chunked` (one row a document), one after
    the other: what a backend without an overlapped pipeline does (:meth:`Backend.batches`)."""
    wants = {"totals": "totals", "bits": True, "none": False}
    if want not in wants:
        raise ValueError(f"want must be one of {', '.join(wants)}; got {want!r}")
    for texts, hs in batches:
        values, finals, _, div = score_texts_chunked(model, texts, hs, chunks=[1] * len(texts), threads=threads,
                                                     limit=limit, want_bits=wants[want], runner=runner)
        diverged = np.full(len(texts), -1, dtype=np.int64)
        for i, _off, _h, t in div:
            diverged[i] = t
        yield BatchResult(values if want != "none" else None, finals, diverged)


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
    """

    state_dtype: np.dtype

    def __call__(self, model, ids: np.ndarray, start: np.ndarray, length: np.ndarray, H: np.ndarray,
                 bits: np.ndarray | None = None, pairs: bool = False, stop_ratio: float = 0.0,
                 check_every: int = 16, limit: float = MAX_STATE_ABS, threads: int = 1) -> StreamsResult: ...


def score_texts_chunked(model: StreamModel, texts: Sequence[np.ndarray], h_init: np.ndarray, *,
                        chunks: Sequence[int] | None = None, guess: np.ndarray | None = None,
                        rtol: float = DEFAULT_RTOL, margin: float = DEFAULT_MARGIN, check_every: int = CHECK_EVERY,
                        threads: int = 1, limit: float = MAX_STATE_ABS, want_bits: bool | str = True,
                        runner: Runner = run_streams, fallback: "Float64Fallback | None" = None,
                        path: str = "chunked", empty_bits=None, row_totals: bool = False,
                        ) -> tuple[list[np.ndarray] | np.ndarray, np.ndarray, ChunkedReport, list]:
    """Score B texts exactly, each cut into chunks, all chunks in one batch.

    Args:
        model: the weights (:meth:`StreamModel.from_params`).
        texts: B int id arrays (each non-empty).
        h_init: (B, d) the state before each text.
        chunks: chunks per text (default :func:`plan_chunks`); 1 means no cut.
        guess: (d,) the start state guessed for chunks after the first (default: ``h_init[0]``).
        rtol, margin, check_every: the correction's stopping rule (module docstring).
        threads: threads for the kernel.
        want_bits: True (each character's bits), ``"totals"`` (each text's total bits only) or
            False (no readout; final states only).
        runner: :func:`run_streams`, its numpy twin :func:`run_streams_ref`, or another runner with
            their signature (:class:`Runner`); the state rows are float32, or the runner's
            ``state_dtype`` where it has one (the float64 torch runner keeps chunk starts in float64).
        fallback: how chunks whose errors do not die out are redone (default: float64 reference
            recurrence of the model, :class:`Float64Fallback`, built from ``model``'s weights).
        path: the name the report gives the kernel (``"chunked"``, ``"jumps"``).
        empty_bits: ``n -> (n,) float64`` where the runner writes bits (default ``np.empty``; the torch
            runner's page-locked memory on a GPU: :meth:`TorchStreams.empty_bits`).
        row_totals: the runner reduces each row's bits itself (its ``totals`` keyword): with
            ``want_bits="totals"`` and texts not cut, no character's bits are made on the host.
    Returns:
        (bits per text (n_i,) float64 (empty arrays if not want_bits; with ``want_bits="totals"`` one
        (B,) float64 array, each text's total bits), final states (B, d) float32
        (float64 for a runner whose ``state_dtype`` is float64),
        report, divergences). ``divergences`` is empty, or holds one ``(text index, offset of the
        chunk in its text, the chunk's exact start state (d,), step t)``: the state before the
        chunk's character t is out of range (or its bits are not finite); the caller locates it
        exactly with :func:`isan.engine.guard.raise_diverged` from that start.
    """
    B = len(texts)
    d, dp = model.d, model.dp
    fallback = fallback or Float64Fallback(model)
    lens = [len(t) for t in texts]
    if any(n == 0 for n in lens):
        raise ValueError("every text must have at least one character")
    chunks = list(chunks) if chunks is not None else plan_chunks(lens, target_rows=ROWS_PER_THREAD * max(1, threads))
    ids = concat_ids(texts)
    base = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    # chunk table: text, start (global), length
    if max(chunks, default=1) <= 1:  # one row a text (documents): no cut, built at once
        c_text = np.arange(B, dtype=np.int64)
        c_start = base[:-1].copy()
        c_len = np.asarray(lens, dtype=np.int64)
    else:
        c_text, c_start, c_len = [], [], []
        for i, (n, P) in enumerate(zip(lens, chunks)):
            if P <= 1:
                c_text.append(i)
                c_start.append(base[i])
                c_len.append(n)
                continue
            cuts = np.linspace(0, n, P + 1).round().astype(np.int64)
            for a, b in zip(cuts[:-1], cuts[1:]):
                if b > a:
                    c_text.append(i)
                    c_start.append(base[i] + a)
                    c_len.append(b - a)
        c_text = np.asarray(c_text, dtype=np.int64)
        c_start = np.asarray(c_start, dtype=np.int64)
        c_len = np.asarray(c_len, dtype=np.int64)
    C = len(c_len)
    first = np.ones(C, dtype=bool)
    first[1:] = c_text[1:] != c_text[:-1]
    h_init = np.asarray(h_init).reshape(B, d)  # read in its own dtype (float32 or float64) where it is copied
    g = np.asarray(guess if guess is not None else h_init[0], dtype=np.float64).reshape(d)
    if want_bits not in (True, False, "totals"):
        raise ValueError(f"want_bits must be True, False or 'totals'; got {want_bits!r}")
    totals = None
    if want_bits == "totals" and row_totals and C == B:  # one row a text: the runner sums each text's bits
        totals = np.zeros(B, dtype=np.float64)
    bits = (empty_bits or _empty_bits)(len(ids)) if want_bits and totals is None else None
    report = ChunkedReport(chunks=C, chars=len(ids), rtol=rtol, margin=margin, path=path)
    sdt = np.dtype(runner.state_dtype)  # the dtype of the state rows
    stop = rtol / margin

    # 1. guess pass
    H = np.empty((C, dp), dtype=sdt)
    H[:, d + 1 :] = 0.0
    if C == B:  # one chunk a text, in order: every row starts from its text's state
        H[:, :d] = h_init
    else:
        H[:, :d] = g
        H[first, :d] = h_init[c_text[first]]
    H[:, d] = 1.0
    r1 = runner(model, ids, c_start, c_len, H, bits, threads=threads, limit=limit,
                **({"totals": totals} if totals is not None else {}))
    report.steps, report.jumps = int(r1.total_steps), int(r1.jumps)
    F = H[:, :d].copy()  # final state of each chunk in the guess pass
    div1 = np.asarray(r1.diverged)

    # 2. correction pass: chunks after the first of their text, each from F[p - 1]
    corr = np.flatnonzero(~first)
    converged = np.ones(C, dtype=bool)  # the correction died out inside the chunk
    Fx = F.copy()  # final state of chunk p given the start its correction used
    div2 = np.full(C, -1, dtype=np.int64)
    if len(corr):
        P2 = len(corr)
        H2 = np.zeros((2 * P2, dp), dtype=sdt)
        H2[:P2, :d] = F[corr - 1]
        H2[:P2, d] = 1.0
        H2[P2:, :d] = F[corr - 1] - g.astype(sdt)
        r2 = runner(model, ids, c_start[corr], c_len[corr], H2, bits, pairs=True, stop_ratio=stop,
                    check_every=check_every, threads=threads, limit=limit)
        report.extra_steps += 2 * int(r2.total_steps)
        report.steps += int(r2.total_steps)
        report.jumps += int(r2.jumps)
        conv, res = _converged(H2, P2, np.asarray(r2.steps_done), c_len[corr], np.asarray(r2.residual), stop)
        report.corrections = np.asarray(r2.steps_done).tolist()
        converged[corr] = conv
        Fx[corr[~conv]] = H2[:P2][~conv, :d]
        div2[corr] = r2.diverged
        if conv.any():
            report.residual = float(res[conv].max())

    # 3. in order along each text: keep the work done from exact starts, redo the rest
    finals = np.empty((B, d), dtype=sdt)
    divergences: list[tuple[int, int, np.ndarray, int]] = []
    uncut = bool(first.all() and (div1 < 0).all())  # one row a text, none left the range
    if uncut:  # each text's final is its row's (one row a text, in order): nothing to keep or redo below
        finals[:] = F
    exact_prev = None  # exact final state of the previous chunk
    prev_matches = True  # F[p - 1] (the start chunk p's correction used) equals exact_prev
    for p in range(0 if uncut else C):
        off = int(c_start[p] - base[c_text[p]])
        if first[p]:
            if div1[p] >= 0:
                divergences.append((int(c_text[p]), off, np.asarray(h_init[c_text[p]], dtype=np.float64).astype(sdt),
                                    int(div1[p])))
                break
            exact_prev, prev_matches = F[p], True
            redo = False
        elif prev_matches and div1[p] < 0:
            if div2[p] >= 0:
                divergences.append((int(c_text[p]), off, F[p - 1], int(div2[p])))
                break
            # exact start: keep the correction; if its error did not die out, the chunk is redone in
            # float64 (float32 rounding errors do not die out on such text either)
            redo = not converged[p]
            if not redo:
                exact_prev, prev_matches = F[p], True
        else:
            # the start was not exact: correct again from the exact start, unless the guess pass
            # left the range (then its later bits are unusable)
            redo = div1[p] >= 0
            if not redo:
                Hp = np.zeros((2, dp), dtype=sdt)
                Hp[0, :d] = exact_prev
                Hp[0, d] = 1.0
                Hp[1, :d] = exact_prev - g.astype(sdt)
                rp = runner(model, ids, c_start[p : p + 1], c_len[p : p + 1], Hp, bits, pairs=True,
                            stop_ratio=stop, check_every=check_every, threads=1, limit=limit)
                report.extra_steps += 2 * int(rp.total_steps)
                conv, res = _converged(Hp, 1, rp.steps_done, c_len[p : p + 1], rp.residual, stop)
                if rp.diverged[0] >= 0:
                    divergences.append((int(c_text[p]), off, np.asarray(exact_prev), int(rp.diverged[0])))
                    break
                if conv[0]:
                    report.residual = max(report.residual, float(res[0]))
                    exact_prev, prev_matches = F[p], True
                else:
                    redo = True
        if redo:  # sequential scoring of the chunk from its exact start, in float64
            report.fallback_chunks += 1
            report.extra_steps += int(c_len[p])
            seg = ids[c_start[p] : c_start[p] + c_len[p]]
            t_bad = _first_bad(fallback, seg, exact_prev, limit)
            if t_bad is not None:
                divergences.append((int(c_text[p]), off, np.asarray(exact_prev), t_bad))
                break
            b64, h64 = fallback(seg, exact_prev)
            if bits is not None:
                bits[c_start[p] : c_start[p] + c_len[p]] = b64
            exact_prev, prev_matches = h64.astype(sdt), False
        if p == C - 1 or c_text[p + 1] != c_text[p]:
            finals[c_text[p]] = exact_prev
    if want_bits == "totals":
        return (totals if totals is not None else np.add.reduceat(bits, base[:-1])), finals, report, divergences
    bl = base.tolist()
    out_bits = [bits[bl[i] : bl[i + 1]] for i in range(B)] if want_bits else [np.zeros(0)] * B
    return out_bits, finals, report, divergences


def _empty_bits(n: int) -> np.ndarray:
    """Where a runner writes the bits of ``n`` characters, unless the plan says otherwise."""
    return np.empty(n, dtype=np.float64)


def concat_ids(texts: Sequence[np.ndarray]) -> np.ndarray:
    """The texts' ids end to end, int32 (one copy; texts may be arrays of any integer dtype or lists)."""
    if not len(texts):
        return np.zeros(0, np.int32)
    if all(isinstance(t, np.ndarray) for t in texts):
        return np.concatenate(texts, dtype=np.int32, casting="unsafe")
    return np.concatenate([np.asarray(t, dtype=np.int32) for t in texts])


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
