"""Scoring documents: many at once through the engine's batched kernel, long ones in blocks.

A document's bits are a function of the document alone, whichever runner, batch, order, worker or
thread count scored it, so that the local and the Ray runner, and a resumed run, write the same
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
import re
import time
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from isan.errors import EmptyTextError, IsanError, StateDivergedError
from isan.engine.corpus.readers import Doc

log = logging.getLogger(__name__)

#: documents up to this many scored characters are one row of the batched kernel
ROW_MAX_CHARS = 65_536
#: the chunk plan of longer documents (and the threads that score them), the same on every worker
LONG_DOC_THREADS = 2
#: characters of a block when a long document is scored block by block
BLOCK_CHARS = 1_000_000
#: characters a batch of rows holds (bounds memory: ~40 bytes a character)
DEFAULT_BATCH_CHARS = 2_000_000
COUNT_KEYS = ("changed", "dropped", "skipped", "replaced")


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
    (``LONG_DOC_THREADS``)."""
    from isan.engine.core import Engine

    if not isinstance(engine, Engine):
        raise IsanError(f"corpus scoring runs ISAN engines (isan.engine.Engine); got {type(engine).__name__}")
    path = corpus_path(engine)
    if not engine.kernels.runs_tables:
        path = "chunked"  # the engine path of the torch backend (its runner, one character a step)
    if engine.path == path and engine.threads == LONG_DOC_THREADS:
        return engine  # already one (keeps what it computed on first use: the certificate, the kernel layout)
    k = engine.kernels
    return Engine(engine.input_params, engine.alphabet, engine.manifest, engine.source, engine.table,
                  path=path, threads=LONG_DOC_THREADS, device=k.device, dtype=k.dtype, kernels=k.name)


@dataclass
class ScoreOptions:
    normalize: str = "auto"
    unknown: str = "error"
    replacement: str | None = None
    batch_chars: int = DEFAULT_BATCH_CHARS
    row_max_chars: int = ROW_MAX_CHARS
    per_char_max: int = 0  # keep per-character bits of documents of at most this many scored characters
    threads: int | None = None  # threads of the row kernel (default: all the CPUs this process may use)


def _row(doc: Doc, error: str | None = None) -> dict:
    return {"id": doc.id, "index": doc.index, "chars_read": 0, "chars_scored": 0, "bits": 0.0, "bpc": None,
            **{k: 0 for k in COUNT_KEYS}, "changed_fraction": None, "error": error or doc.error, "per_char_bits": None}


def changed_fraction(report: dict) -> float | None:
    """The share of a text's characters that did not reach the model as they were, from a
    normalisation report (``Prepared.report``): ``(changed + dropped + skipped + replaced) /
    chars_read``, at most 1 (a spelled-out digit skipped by the alphabet would count twice); None
    when nothing was read. 1.0 for text in another script (it scores as a space), 0.0 for text
    already in the model's alphabet."""
    read = int(report.get("chars_read", 0))
    if read <= 0:
        return None
    return min(1.0, sum(int(report.get(k, 0)) for k in COUNT_KEYS) / read)


def _fill(row: dict, report: dict | None, chars: int, bits: float) -> dict:
    report = report or {}
    row["chars_read"] = int(report.get("chars_read", 0))
    row["chars_scored"] = int(chars)
    row["bits"] = float(bits)
    row["bpc"] = float(bits) / chars if chars else None
    for k in COUNT_KEYS:
        row[k] = int(report.get(k, 0))
    row["changed_fraction"] = changed_fraction(report)
    return row


def _message(e: Exception) -> str:
    msg = str(e).strip() or type(e).__name__
    return f"{type(e).__name__}: {msg}"


class DocScorer:
    """Scores lists of :class:`Doc` into output rows (dicts; see :mod:`isan.engine.corpus.writers`)."""

    def __init__(self, engine, options: ScoreOptions | None = None):
        self.engine = corpus_engine(engine)
        self.opt = options or ScoreOptions()
        if self.opt.batch_chars < 1:
            raise IsanError(f"batch_chars must be at least 1; got {self.opt.batch_chars}")
        from isan.engine.kernels import default_threads

        #: threads of the batched kernel (results do not depend on them)
        self.threads = int(self.opt.threads or default_threads())
        self.seconds = 0.0

    def score(self, docs: list[Doc]) -> list[dict]:
        t0 = time.perf_counter()
        docs = list(docs)
        rows: list[dict | None] = [None] * len(docs)
        short: list[tuple[int, object]] = []  # (position, Prepared)
        o = self.opt
        for k, doc in enumerate(docs):
            if doc.error is not None:
                rows[k] = _row(doc)
                continue
            if doc.text is None and doc.blocks is not None and 0 <= doc.chars <= 4 * o.row_max_chars:
                # a small file: read it whole, so that it scores as the same text from any format
                try:
                    doc = docs[k] = Doc(doc.index, doc.id, "".join(doc.blocks()), chars=doc.chars)
                except (IsanError, OSError) as e:
                    rows[k] = _row(doc, _message(e))
                    continue
            if doc.text is None or len(doc.text) > 2 * o.row_max_chars + 16:
                rows[k] = self._score_long(doc)
                continue
            try:
                prep = self.engine.prepare(doc.text, o.normalize, o.unknown, o.replacement)
            except IsanError as e:
                rows[k] = _row(doc, _message(e))
                continue
            if len(prep.ids) == 0:
                rows[k] = _fill(_row(doc, "EmptyTextError: the document is empty" + (
                    " after normalisation" if doc.text else "")), prep.report, 0, 0.0)
                rows[k]["bpc"] = None
                continue
            if len(prep.ids) > o.row_max_chars:
                rows[k] = self._score_long(doc)
                continue
            short.append((k, prep))
        # longest first, batches of about batch_chars characters: rows of like length finish together
        short.sort(key=lambda kp: -len(kp[1].ids))
        batch: list[tuple[int, object]] = []
        size = 0
        for item in short:
            batch.append(item)
            size += len(item[1].ids)
            if size >= o.batch_chars:
                self._score_rows(docs, batch, rows)
                batch, size = [], 0
        if batch:
            self._score_rows(docs, batch, rows)
        self.seconds += time.perf_counter() - t0
        return rows  # type: ignore[return-value]

    def _bits(self, ids_list: list) -> list:
        """Bits of each text, all texts' chunks as rows of one chunk-parallel batch
        (:meth:`Engine.score_ids`, by the kernel :func:`corpus_path` names). Each text is cut by its
        own length alone (:meth:`Engine.min_chunk` a chunk), so its bits do not depend on the batch.
        Raises StateDivergedError with ``text_index``."""
        eng = self.engine
        kernel = corpus_path(eng)
        c = eng.min_chunk()
        plan = [max(1, len(x) // c) for x in ids_list]
        h0 = np.tile(eng.params.h0, (len(ids_list), 1))
        bits, _, _ = eng.score_ids(ids_list, h0, chunks=plan, threads=self.threads,
                                   kernel=kernel if eng.kernels.runs_tables else "chunked")
        return bits

    def _score_rows(self, docs: list[Doc], batch: list, rows: list) -> None:
        from isan.engine.results import in_input_terms

        o = self.opt
        todo = list(batch)
        while todo:
            try:
                res = self._bits([p.ids for _, p in todo])
            except StateDivergedError as e:  # that document is recorded; the others are scored again
                i = getattr(e, "text_index", None)
                if i is None or not 0 <= i < len(todo):
                    for k, _ in todo:
                        rows[k] = _row(docs[k], _message(e))
                    return
                k, prep = todo.pop(i)
                msg = str(in_input_terms(e, prep, self.engine.alphabet.symbols))
                rows[k] = _fill(_row(docs[k], f"StateDivergedError: {msg}"), prep.report, 0, 0.0)
                rows[k]["bpc"] = None
                continue
            except IsanError as e:
                for k, _ in todo:
                    rows[k] = _row(docs[k], _message(e))
                return
            for (k, prep), b in zip(todo, res):
                row = _fill(_row(docs[k]), prep.report, len(b), float(b.sum()))
                if o.per_char_max and len(b) <= o.per_char_max:
                    row["per_char_bits"] = np.asarray(b, dtype=np.float64)
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
            return _row(doc, "EmptyTextError: the document is empty" + (" after normalisation" if doc.size else ""))
        except IsanError as e:
            return _row(doc, _message(e))
        except OSError as e:  # the file went away or broke while it was read
            return _row(doc, f"{type(e).__name__}: cannot read the document ({e})")
        row = _fill(_row(doc), r.normalization, r.chars, r.bits)
        if per_char is not None:
            row["per_char_bits"] = np.asarray(per_char, dtype=np.float64)
        return row
