"""A part's documents made ready to score: the reading side of a corpus job, apart from the scoring.

:func:`prepare_docs` does everything a document needs before the model sees it (reading a small
text file whole, normalising, mapping to ids, recording the documents that cannot be scored) and
returns a :class:`PreparedDocs`: compact numpy arrays that travel between processes cheaply (the
ids as uint8 when the alphabet has at most 256 symbols, the offsets in the input only where they
do not step by one). :meth:`DocScorer.score <isan.engine.corpus.scoring.DocScorer.score>`
is ``score_prepared(prepare_docs(...))`` in one process; with a backend that must run in one
process (a GPU), reader processes prepare and the scoring process scores
(:mod:`isan.engine.corpus.feed`), with the same rows to the last bit.

A document that cannot be scored (not in the alphabet, empty after normalisation, unreadable)
gets its row here; one too long for a row of the batched kernel is kept whole (its text, or its
file's blocks) for the scorer, which scores it in blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from isan.errors import IsanError
from isan.engine.corpus.readers import Doc
from isan.engine.normalize import Prepared, prepare, resolve

COUNT_KEYS = ("changed", "dropped", "skipped", "replaced")


def empty_row(doc: Doc, error: str | None = None) -> dict:
    """The output row of ``doc`` with nothing scored yet, and ``error`` (or the document's own)."""
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


def fill_row(row: dict, report: dict | None, chars: int, bits: float) -> dict:
    """``row`` with its counts from the normalisation ``report`` and ``chars`` scored for ``bits``; returns it."""
    report = report or {}
    row["chars_read"] = int(report.get("chars_read", 0))
    row["chars_scored"] = int(chars)
    row["bits"] = float(bits)
    row["bpc"] = float(bits) / chars if chars else None
    for k in COUNT_KEYS:
        row[k] = int(report.get(k, 0))
    row["changed_fraction"] = changed_fraction(report)
    return row


def error_message(e: Exception) -> str:
    """A row's error text of ``e``: ``"TypeName: message"``."""
    msg = str(e).strip() or type(e).__name__
    return f"{type(e).__name__}: {msg}"


class TextPreparer:
    """What :meth:`Engine.prepare <isan.engine.Engine.prepare>` does, from the model's alphabet and
    normaliser alone: a reader process prepares texts with it, without loading the model."""

    def __init__(self, alphabet, normalizer):
        self.alphabet, self.normalizer = alphabet, normalizer

    @classmethod
    def of(cls, engine) -> "TextPreparer":
        return cls(engine.alphabet, engine.normalizer)

    def prepare(self, text: str, normalize="auto", unknown: str = "error", replacement: str | None = None) -> Prepared:
        return prepare(text, self.alphabet, resolve(normalize, self.normalizer), unknown, replacement, context="")


@dataclass
class PreparedDocs:
    """A part's documents ready to score (:func:`prepare_docs`).

    Attributes:
        docs: each document (its index, id and ``file_pos``; the text or blocks only where ``long``).
        rows: each document's row where it is decided already (an error), else None.
        long: positions of documents scored in blocks by the scorer (too long for a row).
        short: positions of documents scored as rows of the batched kernel, in document order.
        ids: their ids, concatenated (uint8 when the alphabet has at most 256 symbols, else int64).
        bounds: int64 (len(short) + 1,): the j-th short document's ids are ``ids[bounds[j]:bounds[j + 1]]``.
        reports: the j-th short document's normalisation report.
        steps_at, steps: the offsets in the input of the short documents' characters, which a
            diverging state names, as the steps between them (the first from 0) concatenated as
            ``ids`` are, kept only where a step is not 1 (a character dropped or spelled out): their
            positions in ``ids`` (int32) and the steps (uint8 where they fit). About 6% of an
            English web text's steps are not 1.
    """

    docs: list
    rows: list
    long: list = field(default_factory=list)
    short: list = field(default_factory=list)
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    bounds: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    reports: list = field(default_factory=list)
    steps_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def chars(self) -> int:
        """Characters to score as rows (the short documents' ids)."""
        return int(self.bounds[-1])

    def lengths(self) -> np.ndarray:
        return np.diff(self.bounds)

    def rows_without_bits(self) -> list[dict]:
        """The rows with each document's counts and no bits (0): what a benchmark of the reading
        side alone writes (``isan.bench.corpus.bench_readers``); long documents count nothing."""
        rows = [r if r is not None else empty_row(d) for r, d in zip(self.rows, self.docs)]
        for j, k in enumerate(self.short):
            rows[k] = fill_row(empty_row(self.docs[k]), self.reports[j], int(self.bounds[j + 1] - self.bounds[j]), 0.0)
        return rows

    def prepared(self, j: int, ids: np.ndarray) -> Prepared:
        """The j-th short document as a :class:`Prepared` (its ids from ``ids``, its offsets
        rebuilt; no text): what names a diverging state's offset in the input."""
        a, b = int(self.bounds[j]), int(self.bounds[j + 1])
        step = np.ones(b - a, np.int64)
        lo, hi = np.searchsorted(self.steps_at, [a, b])
        step[self.steps_at[lo:hi].astype(np.int64) - a] = self.steps[lo:hi]
        offsets = np.cumsum(step)
        return Prepared(ids=ids, offsets=offsets, text="", report=self.reports[j])


def without_text(doc: Doc) -> Doc:
    """The document without its text: what the scorer needs of a document scored as a row."""
    return Doc(doc.index, doc.id, error=doc.error, chars=doc.chars, file_pos=doc.file_pos)


def prepare_docs(preparer, docs: list[Doc], normalize="auto", unknown: str = "error",
                 replacement: str | None = None, row_max_chars: int = 65_536) -> PreparedDocs:
    """Read, normalise and map to ids a part's documents (``preparer``: an Engine or a
    :class:`TextPreparer`); what cannot be scored gets its row with the reason. Raises nothing for
    a document."""
    docs = list(docs)
    out = PreparedDocs(docs=[None] * len(docs), rows=[None] * len(docs))
    ids, steps, lengths = [], [], [0]
    for k, doc in enumerate(docs):
        if doc.error is not None:
            out.docs[k], out.rows[k] = without_text(doc), empty_row(doc)
            continue
        if doc.text is None and doc.blocks is not None and 0 <= doc.chars <= 4 * row_max_chars:
            # a small file: read it whole, so that it scores as the same text from any format
            try:
                doc = Doc(doc.index, doc.id, "".join(doc.blocks()), chars=doc.chars, file_pos=doc.file_pos)
            except (IsanError, OSError) as e:
                out.docs[k], out.rows[k] = without_text(doc), empty_row(doc, error_message(e))
                continue
        if doc.text is None or len(doc.text) > 2 * row_max_chars + 16:
            out.docs[k] = doc
            out.long.append(k)
            continue
        try:
            prep = preparer.prepare(doc.text, normalize, unknown, replacement)
        except IsanError as e:
            out.docs[k], out.rows[k] = without_text(doc), empty_row(doc, error_message(e))
            continue
        if len(prep.ids) == 0:
            row = fill_row(empty_row(doc, "EmptyTextError: the document is empty" + (" after normalisation" if doc.text else "")),
                        prep.report, 0, 0.0)
            row["bpc"] = None
            out.docs[k], out.rows[k] = without_text(doc), row
            continue
        if len(prep.ids) > row_max_chars:
            out.docs[k] = doc
            out.long.append(k)
            continue
        out.docs[k] = without_text(doc)
        out.short.append(k)
        ids.append(prep.ids)
        steps.append(np.diff(prep.offsets, prepend=0))
        lengths.append(len(prep.ids))
        out.reports.append(prep.report)
    if ids:
        c = np.concatenate(ids)
        out.ids = c.astype(np.uint8) if c.min() >= 0 and c.max() <= 255 else c.astype(np.int64)
        s = np.concatenate(steps)
        at = np.flatnonzero(s != 1)
        out.steps_at = at.astype(np.int32 if len(s) < 2**31 else np.int64)
        st = s[at]
        out.steps = st.astype(np.uint8) if st.size and 0 <= st.min() and st.max() <= 255 else st.astype(np.int64)
    out.bounds = np.cumsum(lengths, dtype=np.int64)
    return out
