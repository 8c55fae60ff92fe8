"""Many batches of documents, one after another, as fast as the backend allows: :func:`score_batches`.

A corpus, or any stream of documents, is scored batch by batch; each batch is one row a document
(none cut), all rows advanced together. On the CPU's kernels the batches run one after the other;
on a GPU the host builds and submits batch k + 1 while the device works on batch k
(:func:`isan.engine.kernels.torch.pipeline.overlapped`), and each document's total is
reduced on the device unless each character's bits are asked for. The backend decides
(:meth:`~isan.engine.kernels.backends.Backend.batches`); this module only feeds it and turns a row
that left the range into the exact error the rest of the engine raises.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from isan.engine.guard import raise_diverged
from isan.errors import StateDivergedError

if TYPE_CHECKING:
    from isan.engine.core import Engine


def score_batches(engine: "Engine", batches: Iterable[tuple[Sequence[np.ndarray], np.ndarray]],
                  want: str = "totals", where: str | None = None) -> Iterator[tuple[object, np.ndarray]]:
    """Score each batch of documents on ``engine``'s backend; yields ``(values, finals)`` per batch,
    in order.

    Args:
        engine: an :class:`~isan.engine.core.Engine` (any backend).
        batches: ``(texts, hs)`` pairs: B non-empty int arrays of symbol ids (output ids) and their
            states before them, (B, d) (``np.tile(engine.params.h0, (B, 1))`` from the start).
        want: ``"totals"`` (values: (B,) float64, each document's bits), ``"bits"`` (values: B
            (n_i,) float64 arrays, each character's bits, eq. 2-3 of Foerster et al. 2017 in bits)
            or ``"none"`` (values: None; final states only).
        where: the path an error names (default: the backend, as its ``describe()`` names it).
    Yields:
        (values, finals (B, d) in the backend's state dtype), one pair a batch.
    Raises:
        StateDivergedError: a document's state leaves the range: located exactly by the float64
            reference, with ``text_index`` the document in its batch and ``batch_index`` the batch.
        ValueError: an empty document or batch, ids out of range, states of the wrong shape.
    """
    kept: deque = deque()

    def feed():
        for texts, hs in batches:
            texts = [np.asarray(t) for t in texts]
            hs = np.asarray(hs)
            kept.append((texts, hs))
            yield texts, hs

    results = engine.kernels.batches(engine.stream_model(), feed(), want, threads=engine.threads)
    for k, res in enumerate(results):
        texts, hs = kept.popleft()
        bad = np.flatnonzero(res.diverged >= 0)
        if len(bad):
            i = int(bad[0])
            place = where or engine.kernels.describe()["backend"]
            try:
                raise_diverged(engine.params.W, engine.params.b, texts[i], np.asarray(hs[i], dtype=np.float64),
                               place, detected_at=int(res.diverged[i]), base_offset=0, symbols=engine.alphabet.symbols)
            except StateDivergedError as e:
                e.text_index, e.batch_index = i, k
                raise
        yield res.values, res.finals
