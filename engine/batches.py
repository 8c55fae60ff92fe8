"""Batches of texts, one after another, as fast as the backend allows: :func:`score_batches`, the
one way a batch is scored.

Every batched client goes through it: the corpus job (its batches of documents,
:class:`~isan.engine.corpus.scoring.DocScorer`), :meth:`Engine.score_batch
<isan.engine.Engine.score_batch>`, :meth:`Engine.score_ids <isan.engine.Engine.score_ids>` (one
batch: a text's chunk-parallel run) and the server's rounds
(:class:`~isan.engine.serve.scheduler.KernelRounds`). A batch is a
:class:`~isan.engine.packed.Packed` (every text's ids in one array, made once by whoever read them)
and the states before its texts; its plan (kernel, chunks) is the engine's
(:meth:`Engine.plan <isan.engine.Engine.plan>`), and the backend scores it
(:meth:`Backend.submit <isan.engine.kernels.backends.Backend.submit>`): on the CPU's kernels at
once, one batch after the other; on a GPU a batch that cuts no text is queued on the device and
the host builds batch k + 1 while the device works on batch k
(:func:`isan.engine.kernels.torch.pipeline.submit`), each text's total reduced on the device
unless each character's bits are asked for. A text whose state leaves the range is located
exactly here, by the float64 reference, and raised as the rest of the engine raises it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from isan.engine.guard import raise_diverged
from isan.engine.kernels.plan import Kernel
from isan.engine.packed import Packed
from isan.errors import IsanError, StateDivergedError

if TYPE_CHECKING:
    from isan.engine.kernels.chunked import BatchResult

#: A batch as :func:`score_batches` takes it: its texts (a Packed, or int id arrays) and the states
#: before them ((B, d), (d,) for every text, or None: the model's h0)
Batch = "tuple[Packed | Sequence[np.ndarray], np.ndarray | None]"


def score_batches(engine, batches: Iterable, want: str = "totals", *,
                  chunks: "str | Sequence[int] | None" = "none", kernel: "Kernel | str" = Kernel.AUTO,
                  threads: int | None = None, where: str | None = None, finals: bool = True) -> "Iterator[BatchResult]":
    """Score each batch on ``engine``'s backend; yields each one's
    :class:`~isan.engine.kernels.chunked.BatchResult`, in order, one batch in flight.

    Args:
        engine: an :class:`~isan.engine.core.Engine` (any backend).
        batches: ``(texts, hs)`` pairs (:data:`Batch`): B non-empty texts of symbol ids (output
            ids) as a :class:`~isan.engine.packed.Packed` (or B int arrays, joined once), and the
            states before them: (B, d), (d,) for every text, or None for the model's ``h0``.
        want: ``"totals"`` (values: (B,) float64, each text's bits), ``"bits"`` (values: a
            :class:`~isan.engine.packed.PackedBits`, each character's bits, eq. 2-3 of Foerster et
            al. 2017 in bits) or ``"none"`` (values: None; final states only).
        chunks: ``"none"`` (one row a text), ``"own"`` (each text cut by its own length alone into
            ``max(1, n // Engine.min_chunk())`` chunks, so that its bits do not depend on its
            batch: the corpus's rows), ``"auto"`` (cut by the backend's plan over the batch) or
            each text's count, for every batch.
        kernel: the plan's kernel (:meth:`Engine.plan`).
        threads: kernel threads (default: the engine's).
        where: the path an error names (default: the plan's kernel).
        finals: False where the caller does not read the final states: a device's pipeline then
            leaves them there (the result's ``finals`` may be None).
    Yields:
        :class:`~isan.engine.kernels.chunked.BatchResult` (values, finals (B, d) in the backend's
        state dtype, report).
    Raises:
        StateDivergedError: a text's state leaves the range: located exactly by the float64
            reference, naming the offset in its text, with ``text_index`` the text in its batch
            and ``batch_index`` the batch.
        IsanError: a batch that cannot be planned or scored, with ``batch_index`` the batch.
        ValueError: an empty text or batch, ids out of range, states of the wrong shape.
    """
    threads = threads or engine.threads
    in_flight = None
    for k, (texts, hs) in enumerate(batches):
        packed = Packed.of(texts)
        hs = engine.params.h0 if hs is None else np.asarray(hs)
        try:
            counts = _chunks(engine, packed, chunks)
            plan = engine.plan(packed.length, threads, cut=isinstance(chunks, str) and chunks == "auto",
                               kernel=kernel, chunks=counts)
            nxt = (k, packed, plan, engine.kernels.submit(plan, packed, hs, want, threads=threads, finals=finals))
        except IsanError as e:  # named by its batch (batch k - 1 may be in flight still, uncollected)
            e.batch_index = k
            raise
        if in_flight is not None:
            yield _collected(engine, in_flight, where)
        in_flight = nxt
    if in_flight is not None:
        yield _collected(engine, in_flight, where)


def _chunks(engine, packed: Packed, chunks) -> "Sequence[int] | None":
    """Each text's chunk count for :meth:`Engine.plan` (None: one row a text, ``"none"``, or the
    backend's cut, ``"auto"``)."""
    if isinstance(chunks, str):
        if chunks == "none":
            return None
        if chunks == "own":
            return np.maximum(packed.length // engine.min_chunk(), 1)
        if chunks == "auto":
            return None
        raise ValueError(f"chunks must be 'none', 'own', 'auto' or counts; got {chunks!r}")
    return chunks


def _collected(engine, in_flight: tuple, where: str | None) -> "BatchResult":
    """The result of a submitted batch, or its divergence located exactly and raised."""
    k, packed, plan, pending = in_flight
    res = pending.result()
    if res.divergence is not None:
        i, off, h_start, t = res.divergence
        try:
            raise_diverged(engine.params.W, engine.params.b, packed.text(i)[off:], np.asarray(h_start, np.float64),
                           where or plan.kernel.value, detected_at=t, base_offset=off, symbols=engine.alphabet.symbols)
        except StateDivergedError as e:
            e.text_index, e.batch_index = i, k
            raise
    return res
