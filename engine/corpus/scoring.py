"""Scoring documents: many at once through the engine's batched kernel, long ones in blocks.

A document's bits are a function of the document alone, whichever executor, batch, order, worker or
thread count scored it, so that the local and the Ray executor, and a resumed run, write the same
numbers to the last bit:

- documents of at most ``row_max_chars`` scored characters are scored together, chunk-parallel
  (:func:`isan.engine.kernels.chunked.score_texts_chunked`, the kernel of :meth:`Engine.score_batch`),
  each cut into ``max(1, n // c)`` chunks by its own length alone (``c``: :meth:`Engine.min_chunk`,
  1,024 characters, or more where the model's certificate needs more to prove that its chunks correct
  themselves; score_batch plans the cuts over the whole batch, which would make a document's last bits
  depend on its neighbours); the kernel is fixed by the model (:func:`corpus_path`: composed jumps
  when it has a trie table), and a row's arithmetic does not depend on the other rows, so a document
  under ``2 c`` characters is one
  row and equals ``Engine.score(text, path=corpus_path(engine))`` exactly;
- a longer one is scored in blocks of a million characters with the state carried across them
  (:func:`isan.engine.blocks.score_blocks`) on the chunk-parallel path, whose chunk plan is fixed
  by ``LONG_DOC_THREADS`` rather than by the worker's cores.

A document that cannot be scored (not in the alphabet, empty after normalisation, a diverging
state, unreadable) gets its reason in ``error`` and zero counts; nothing raises for it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from isan.errors import EmptyTextError, IsanError, StateDivergedError
from isan.engine.corpus.readers import Doc
# the rows' helpers live with the preparation (a reader process makes the rows of documents that cannot be scored)
from isan.engine.corpus.prepared import PreparedDocs, empty_row, error_message, fill_row, prepare_docs

log = logging.getLogger(__name__)

#: documents up to this many scored characters are one row of the batched kernel
ROW_MAX_CHARS = 65_536
#: the chunk plan of longer documents (and the threads that score them), the same on every worker
LONG_DOC_THREADS = 2
#: characters of a block when a long document is scored block by block
BLOCK_CHARS = 1_000_000
#: characters a batch of rows holds on the CPU (bounds memory: ~40 bytes a character); the job's default
#: is the backend's (``Backend.batch_chars``: this on the CPU, more on a GPU)
DEFAULT_BATCH_CHARS = 2_000_000


def corpus_path(engine) -> str:
    """The chunk-parallel kernel of every corpus row and long document: composed jumps when the
    engine has a trie table (``"jumps"``), else one character a step (``"chunked"``); on the torch
    backend its runner, named with the device's type and the dtype (``"torch-cuda-float32"``:
    float32 on a GPU and on the CPU round differently). Fixed by the model and the device alone,
    never by the batch: a row's jumps are its own greedy segmentation whatever the other rows, so a
    document's bits do not depend on its batch, worker or shard (on the CPU's kernels; the torch
    backend's GEMM libraries choose kernels by shape, so there a job is scored in one process, its
    batches cut the same way every run)."""
    k = engine.kernels
    if k.rounding is not None:  # its GEMMs choose their kernels by shape: one job runs in one process there
        return k.rounding
    return "jumps" if engine.table is not None else "chunked"


def corpus_engine(engine, threads: int | None = None):
    """The engine a corpus job scores with: the same model on the chunk-parallel path
    (:func:`corpus_path`; never the table's sequential jumps), its chunk plan fixed
    (``LONG_DOC_THREADS``), with ``engine``'s own kernel backend object (its options, such as the
    torch backend's ``step`` and ``precision``, and its runners' caches) and what ``engine``
    computed on first use (the certificate, the kernel layouts): :meth:`Engine.with_path`.

    Raises:
        IsanError: ``engine`` is not an ISAN :class:`~isan.engine.core.Engine`.
    """
    from isan.engine.core import Engine

    if not isinstance(engine, Engine):
        raise IsanError(f"corpus scoring runs ISAN engines (isan.engine.Engine); got {type(engine).__name__}")
    # the torch backend has no table paths: its engine path is chunked (its runner, one character a step)
    path = corpus_path(engine) if engine.kernels.runs_tables else "chunked"
    return engine.with_path(path, threads=LONG_DOC_THREADS)


@dataclass
class ScoreOptions:
    normalize: str = "auto"
    unknown: str = "error"
    replacement: str | None = None
    batch_chars: int | None = None  # characters a call holds (None: the backend's, ``Backend.batch_chars``)
    row_max_chars: int = ROW_MAX_CHARS
    per_char_max: int = 0  # keep per-character bits of documents of at most this many scored characters
    threads: int | None = None  # threads of the row kernel (default: all the CPUs this process may use)


class DocScorer:
    """Scores lists of :class:`Doc` into output rows (dicts; see :mod:`isan.engine.corpus.writers`):
    :func:`~isan.engine.corpus.prepared.prepare_docs` then :meth:`score_prepared`, which a reader
    process and the scoring process may share between them (:mod:`isan.engine.corpus.feed`)."""

    def __init__(self, engine, options: ScoreOptions | None = None):
        self.engine = corpus_engine(engine)
        self.opt = options or ScoreOptions()
        #: characters a call of the batched kernel holds: the option, else the backend's
        #: (``Backend.batch_chars``: 2M on the CPU, 32M on a GPU); rows do not depend on it on
        #: the CPU's kernels
        if self.opt.batch_chars is not None and self.opt.batch_chars < 1:
            raise IsanError(f"batch_chars must be at least 1; got {self.opt.batch_chars}")
        self.batch_chars = int(self.opt.batch_chars or self.engine.kernels.batch_chars)
        from isan.engine.kernels import default_threads

        #: threads of the batched kernel (results do not depend on them)
        self.threads = int(self.opt.threads or default_threads())
        self.seconds = 0.0

    def prepare(self, docs: list[Doc]) -> PreparedDocs:
        """``docs`` read, normalised and mapped to ids in this process (:func:`prepare_docs`)."""
        o = self.opt
        return prepare_docs(self.engine, docs, o.normalize, o.unknown, o.replacement, o.row_max_chars)

    def score(self, docs: list[Doc]) -> list[dict]:
        t0 = time.perf_counter()
        prepared = self.prepare(docs)
        self.seconds += time.perf_counter() - t0
        return self.score_prepared(prepared)

    def score_prepared(self, p: PreparedDocs) -> list[dict]:
        """The rows of a part's prepared documents, in its order: long documents in blocks, the
        others longest first in batches of about ``batch_chars`` characters (rows of like length
        finish together)."""
        t0 = time.perf_counter()
        rows = list(p.rows)
        for k in p.long:
            rows[k] = self._score_long(p.docs[k])
        ids = p.ids  # uint8 where the alphabet allows: the kernels take ids of any integer type
        b = p.bounds
        order = sorted(range(len(p.short)), key=lambda j: -int(b[j + 1] - b[j]))
        batch: list[int] = []
        size = 0
        for j in order:
            batch.append(j)
            size += int(b[j + 1] - b[j])
            if size >= self.batch_chars:
                self._score_rows(p, ids, batch, rows)
                batch, size = [], 0
        if batch:
            self._score_rows(p, ids, batch, rows)
        self.seconds += time.perf_counter() - t0
        return rows  # type: ignore[return-value]

    def _bits(self, ids_list: list) -> list:
        """Bits of each text, all texts' chunks as rows of one chunk-parallel batch
        (:meth:`Engine.score_ids`, by the kernel of the corpus engine's route). Each text is cut by its
        own length alone (:meth:`Engine.min_chunk` a chunk), so its bits do not depend on the batch.
        Raises StateDivergedError with ``text_index``."""
        eng = self.engine
        c = eng.min_chunk()
        plan = [max(1, len(x) // c) for x in ids_list]
        h0 = np.tile(eng.params.h0, (len(ids_list), 1))
        bits, _, _ = eng.score_ids(ids_list, h0, chunks=plan, threads=self.threads, kernel=eng.route(0).kernel)
        return bits

    def _score_rows(self, p: PreparedDocs, ids: np.ndarray, batch: list[int], rows: list) -> None:
        """Score the short documents ``batch`` (positions in ``p.short``) as one batch into ``rows``."""
        from isan.engine.results import in_input_terms

        o = self.opt
        b = p.bounds
        todo = list(batch)
        while todo:
            try:
                res = self._bits([ids[b[j] : b[j + 1]] for j in todo])
            except StateDivergedError as e:  # that document is recorded; the others are scored again
                i = getattr(e, "text_index", None)
                if i is None or not 0 <= i < len(todo):
                    for j in todo:
                        rows[p.short[j]] = empty_row(p.docs[p.short[j]], error_message(e))
                    return
                j = todo.pop(i)
                k = p.short[j]
                prep = p.prepared(j, ids[b[j] : b[j + 1]])
                msg = str(in_input_terms(e, prep, self.engine.alphabet.symbols))
                rows[k] = fill_row(empty_row(p.docs[k], f"StateDivergedError: {msg}"), prep.report, 0, 0.0)
                rows[k]["bpc"] = None
                continue
            except IsanError as e:
                for j in todo:
                    rows[p.short[j]] = empty_row(p.docs[p.short[j]], error_message(e))
                return
            for j, bits in zip(todo, res):
                k = p.short[j]
                row = fill_row(empty_row(p.docs[k]), p.reports[j], len(bits), float(bits.sum()))
                if o.per_char_max and len(bits) <= o.per_char_max:
                    row["per_char_bits"] = np.asarray(bits, dtype=np.float64)
                rows[k] = row
            return

    def _score_long(self, doc: Doc) -> dict:
        """A document scored in blocks, the state carried across them (bounded memory)."""
        from isan.engine.blocks import score_blocks

        o = self.opt
        if doc.blocks is not None:
            blocks: Iterable[str] = doc.blocks()
        else:
            text = doc.text or ""
            blocks = (text[s : s + BLOCK_CHARS] for s in range(0, len(text), BLOCK_CHARS))
        try:
            per_char = None
            if doc.text is not None and o.per_char_max and len(doc.text) <= BLOCK_CHARS:
                r = self.engine.score(doc.text, per_char=True, unknown=o.unknown, replacement=o.replacement,
                                      normalize=o.normalize)
                per_char = r.per_char_bits if r.chars <= o.per_char_max else None
            else:
                r = score_blocks(self.engine, blocks, unknown=o.unknown, replacement=o.replacement,
                                 normalize=o.normalize)
        except EmptyTextError:
            return empty_row(doc, "EmptyTextError: the document is empty" + (" after normalisation" if doc.size else ""))
        except IsanError as e:
            return empty_row(doc, error_message(e))
        except OSError as e:  # the file went away or broke while it was read
            return empty_row(doc, f"{type(e).__name__}: cannot read the document ({e})")
        row = fill_row(empty_row(doc), r.normalization, r.chars, r.bits)
        if per_char is not None:
            row["per_char_bits"] = np.asarray(per_char, dtype=np.float64)
        return row
