"""Scoring documents: every document a row (or its chunks) of the one pipeline,
:func:`isan.engine.batches.score_batches`, in batches of about ``batch_chars`` characters.

A document's bits are a function of the document alone, whichever executor, batch, order, worker or
thread count scored it, so that the local and the Ray executor, and a resumed run, write the same
numbers to the last bit:

- on the CPU's kernels each document is cut into ``max(1, n // c)`` chunks by its own length alone
  (``c``: :meth:`Engine.min_chunk`, 1,024 characters, or more where the model's certificate needs
  more to prove that its chunks correct themselves; score_batch plans the cuts over the whole batch,
  which would make a document's last bits depend on its neighbours) and scored chunk-parallel
  (:func:`isan.engine.kernels.chunked.score_texts_chunked`); the kernel is fixed by the model
  (:func:`corpus_path`: composed jumps when it has a trie table), and a row's arithmetic does not
  depend on the other rows, so a document under ``2 c`` characters is one row and equals
  ``Engine.score(text, path=corpus_path(engine))`` exactly (its total is numpy's sum of its bits, as
  there, whether its per-character bits are kept or not);
- on a device's pipeline (the torch backend) a document of at most ``row_max_chars`` scored
  characters is one row, batches queued one ahead of the host (their totals reduced on the device),
  and a longer one is cut by its own length as on the CPU;
- long documents (over ``row_max_chars``, or whose raw text is over twice it) are prepared in the
  scoring process and scored in batches of their own, cut by their own length; a document read
  from its file in blocks (too big to hold), or of over ``BATCHED_LONG_MAX_CHARS`` characters, is
  scored block by block with the state carried across them (:func:`isan.engine.blocks.score_blocks`,
  chunk plan fixed by ``LONG_DOC_THREADS``: bounded memory).

A document that cannot be scored (not in the alphabet, empty after normalisation, a diverging
state, unreadable) gets its reason in ``error`` and zero counts; nothing raises for it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from isan.engine.batches import score_batches
from isan.engine.packed import Packed
from isan.engine.results import in_input_terms
from isan.errors import EmptyTextError, IsanError, StateDivergedError
from isan.engine.corpus.readers import Doc
# the rows' helpers live with the preparation (a reader process makes the rows of documents that cannot be scored)
from isan.engine.corpus.prepared import PreparedDocs, count_columns, empty_row, error_message, fill_row, prepare_docs

log = logging.getLogger(__name__)

#: documents up to this many scored characters are one row of the batched kernel
ROW_MAX_CHARS = 65_536
#: the chunk plan of longer documents (and the threads that score them), the same on every worker
LONG_DOC_THREADS = 2
#: characters a batch of rows holds on the CPU (bounds memory: ~40 bytes a character); the job's default
#: is the backend's (``Backend.batch_chars``: this on the CPU, more on a GPU)
DEFAULT_BATCH_CHARS = 2_000_000
#: the longest document held in memory that is scored as rows of a batch (its ids, and each
#: character's bits where a chunk's correction rewrites them: about 13 bytes a character); a longer
#: one is scored block by block, the state carried across blocks (bounded memory)
BATCHED_LONG_MAX_CHARS = 4_000_000
#: characters of a block when a document is scored block by block
BLOCK_CHARS = 1_000_000


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


@dataclass
class RowGroup:
    """Documents scored as rows: their ids (``packed``), each one's row in the part (``where``),
    its normalisation report, and ``prepared(j, ids)``: document j as a
    :class:`~isan.engine.normalize.Prepared` (what names a diverging state's offset in the input)."""

    packed: Packed
    where: list
    reports: list
    prepared: Callable

    def columns(self) -> np.ndarray:
        """(n, 5) int64 each document's report counts (:func:`~isan.engine.corpus.prepared.count_columns`), made once."""
        cols = self.__dict__.get("_columns")
        if cols is None:
            cols = self._columns = count_columns(self.reports)
        return cols


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
        #: what a batch returns: each document's total, or each character's bits where some are kept
        self.want = "bits" if self.opt.per_char_max else "totals"
        #: the corpus engine's kernel (:func:`corpus_path`)
        self.kernel = self.engine.route(0).kernel
        #: how a document of at most ``row_max_chars`` is cut: by its own length on the CPU's kernels
        #: (as a long one is), one row on a device's pipeline (queued, its total reduced there)
        self.short_chunks = "own" if self.engine.kernels.runs_tables else "none"

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
        """The rows of a part's prepared documents, in its order: every document a row (or its
        chunks) of the one pipeline (:func:`~isan.engine.batches.score_batches`), longest first in
        batches of about ``batch_chars`` characters (rows of like length finish together); long
        documents prepared here, in batches of their own; a document read from a file in blocks
        (:attr:`Doc.blocks`, too big to hold) block by block."""
        t0 = time.perf_counter()
        rows = list(p.rows)
        short = RowGroup(Packed.from_bounds(p.ids, p.bounds), list(p.short), p.reports, p.prepared)
        self._score_group(short, p.docs, rows, self.short_chunks)
        self._score_group(self._long_group(p, rows), p.docs, rows, "own")
        self.seconds += time.perf_counter() - t0
        return rows  # type: ignore[return-value]

    def _long_group(self, p: PreparedDocs, rows: list) -> "RowGroup":
        """The long documents held in memory, prepared here, as a group of rows; a document that
        cannot be scored gets its row, and one read in blocks is scored so (:meth:`_score_long`)."""
        o = self.opt
        ids, where, reports, preps = [], [], [], []
        for k in p.long:
            doc = p.docs[k]
            if doc.text is None or len(doc.text) > BATCHED_LONG_MAX_CHARS:
                rows[k] = self._score_long(doc)
                continue
            try:
                prep = self.engine.prepare(doc.text, o.normalize, o.unknown, o.replacement)
            except IsanError as e:
                rows[k] = empty_row(doc, error_message(e))
                continue
            if len(prep.ids) == 0:
                rows[k] = empty_row(doc, "EmptyTextError: the document is empty" + (" after normalisation" if doc.size else ""))
                continue
            ids.append(prep.ids)
            where.append(k)
            reports.append(prep.report)
            preps.append(prep)
        return RowGroup(Packed.of(ids), where, reports, lambda j, _ids: preps[j])

    def _score_group(self, g: "RowGroup", docs: list, rows: list, chunks: str) -> None:
        """Score a group's documents into ``rows`` by the one pipeline, batch by batch; a document
        whose state leaves the range gets its error and the rest of its batch is scored again."""
        todo = deque(self.batches_of(g.packed.length))
        while todo:
            batches = ((g.packed.take(js), None) for js in list(todo))
            done = 0  # batches of this run collected (each one's rows filled)
            try:
                for res in score_batches(self.engine, batches, self.want, chunks=chunks, kernel=self.kernel,
                                         threads=self.threads, finals=False):
                    self._fill(g, todo.popleft(), res.values, docs, rows)
                    done += 1
            except IsanError as e:  # the failing batch: the error names it (the next may fail before)
                at = min(max(getattr(e, "batch_index", done) - done, 0), len(todo) - 1)
                js = todo[at]
                del todo[at]
                i = getattr(e, "text_index", None) if isinstance(e, StateDivergedError) else None
                if i is None or not 0 <= i < len(js):
                    self._fail(g, js, docs, rows, error_message(e))
                    continue
                j = int(js[i])
                prep = g.prepared(j, g.packed.text(j))
                msg = str(in_input_terms(e, prep, self.engine.alphabet.symbols))
                k = g.where[j]
                rows[k] = fill_row(empty_row(docs[k], f"StateDivergedError: {msg}"), prep.report, 0, 0.0)
                rows[k]["bpc"] = None
                if len(js) > 1:
                    todo.insert(at, np.delete(js, i))

    def batches_of(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Documents of these ``lengths`` (int64 (n,)) longest first (ties in order), cut into
        batches that each end at the first document that brings them to ``batch_chars``
        characters: each batch the documents' positions, int64."""
        order = np.argsort(-lengths, kind="stable")
        ends = np.cumsum(lengths[order])
        out, i, base = [], 0, 0
        while i < len(order):
            j = int(np.searchsorted(ends, base + self.batch_chars, side="left"))
            j = min(j, len(order) - 1)
            out.append(order[i : j + 1])
            i, base = j + 1, int(ends[j])
        return out

    def _fill(self, g: "RowGroup", js: np.ndarray, values, docs: list, rows: list) -> None:
        """The rows of a batch's documents from its values (totals, or each character's bits):
        :func:`~isan.engine.corpus.prepared.fill_row`'s rows, made from columns (a row a dict literal)."""
        n = g.packed.length[js]
        if self.want == "bits":
            totals = values.totals().tolist()
        else:
            totals = np.asarray(values, dtype=np.float64).tolist()
        c = g.columns()[js]
        read = c[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.minimum(1.0, c[:, 1:].sum(axis=1) / read)
        fracs = [f if r > 0 else None for f, r in zip(frac.tolist(), read.tolist())]
        where = g.where
        for j, n_j, t, r, ch, dr, sk, rp, f in zip(js.tolist(), n.tolist(), totals, *c.T.tolist(), fracs):
            doc = docs[where[j]]
            rows[where[j]] = {"id": doc.id, "index": doc.index, "chars_read": r, "chars_scored": n_j, "bits": t,
                              "bpc": t / n_j, "changed": ch, "dropped": dr, "skipped": sk, "replaced": rp,
                              "changed_fraction": f, "error": doc.error, "per_char_bits": None}
        if self.want == "bits":
            for b, (j, n_j) in enumerate(zip(js.tolist(), n.tolist())):
                if n_j <= self.opt.per_char_max:
                    rows[where[j]]["per_char_bits"] = np.asarray(values[b], dtype=np.float64)

    @staticmethod
    def _fail(g: "RowGroup", js: np.ndarray, docs: list, rows: list, message: str) -> None:
        for j in js.tolist():
            rows[g.where[j]] = empty_row(docs[g.where[j]], message)

    def _score_long(self, doc: Doc) -> dict:
        """A document read from its file in blocks (too big to hold), or longer than
        :data:`BATCHED_LONG_MAX_CHARS`, scored block by block with the state carried across them
        (bounded memory: :func:`~isan.engine.blocks.score_blocks`)."""
        from isan.engine.blocks import score_blocks

        o = self.opt
        if doc.text is not None:
            blocks: Iterable[str] = (doc.text[s : s + BLOCK_CHARS] for s in range(0, len(doc.text), BLOCK_CHARS))
        else:
            blocks = doc.blocks()
        try:
            r = score_blocks(self.engine, blocks, unknown=o.unknown, replacement=o.replacement,
                             normalize=o.normalize)
        except EmptyTextError:
            return empty_row(doc, "EmptyTextError: the document is empty" + (" after normalisation" if doc.size else ""))
        except IsanError as e:
            return empty_row(doc, error_message(e))
        except OSError as e:  # the file went away or broke while it was read
            return empty_row(doc, f"{type(e).__name__}: cannot read the document ({e})")
        return fill_row(empty_row(doc), r.normalization, r.chars, r.bits)
