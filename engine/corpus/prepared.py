"""A part's documents made ready to score: the reading side of a corpus job, apart from the scoring.

:func:`prepare_docs` does everything a document needs before the model sees it (reading a small
text file whole, normalising, mapping to ids, recording the documents that cannot be scored) and
returns a :class:`PreparedDocs`: compact numpy arrays that travel between processes cheaply (the
ids as uint8 when the alphabet has at most 256 symbols, the offsets in the input only where they
do not step by one). :meth:`DocScorer.score <isan.engine.corpus.scoring.DocScorer.score>`
is ``score_prepared(prepare_docs(...))`` in one process; with a backend that must run in one
process (a GPU), reader processes prepare and the scoring process scores
(:mod:`isan.engine.corpus.feed`), with the same rows to the last bit.

The documents of the normalisers a corpus meets (``text8``, ``none``) are normalised and mapped to
ids all at once (:mod:`isan.engine.corpus.batch_prepare`), their reports kept as columns of counts
and made into dicts when asked for (:class:`Reports`); any other goes through ``prepare`` one by
one. Either way a document gets the ids, offsets and report that ``prepare`` gives it.

A document that cannot be scored (not in the alphabet, empty after normalisation, unreadable)
gets its row here; one too long for a row of the batched kernel is kept whole (its text, or its
file's blocks) for the scorer, which scores it in blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from isan.alphabet import UNKNOWN_POLICIES
from isan.errors import IsanError
from isan.engine.corpus.batch_prepare import MAX_TEXT_CHARS, prepare_texts
from isan.engine.corpus.readers import Doc
from isan.engine.normalize import BOM, Prepared, prepare, resolve

COUNT_KEYS = ("changed", "dropped", "skipped", "replaced")


def empty_row(doc: Doc, error: str | None = None) -> dict:
    """The output row of ``doc`` with nothing scored yet, and ``error`` (or the document's own)."""
    return {"id": doc.id, "index": doc.index, "chars_read": 0, "chars_scored": 0, "bits": 0.0, "bpc": None,
            "changed": 0, "dropped": 0, "skipped": 0, "replaced": 0, "changed_fraction": None,
            "error": error or doc.error, "per_char_bits": None}


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
    get = (report or {}).get
    read, changed, dropped = int(get("chars_read", 0)), int(get("changed", 0)), int(get("dropped", 0))
    skipped, replaced = int(get("skipped", 0)), int(get("replaced", 0))
    chars, bits = int(chars), float(bits)
    row["chars_read"] = read
    row["chars_scored"] = chars
    row["bits"] = bits
    row["bpc"] = bits / chars if chars else None
    row["changed"], row["dropped"], row["skipped"], row["replaced"] = changed, dropped, skipped, replaced
    row["changed_fraction"] = changed_fraction(report or {})
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
        reports: the j-th short document's normalisation report (a dict; a sequence of them,
            :class:`Reports`, where the part was prepared together).
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
        for j, (k, n) in enumerate(zip(self.short, np.diff(self.bounds).tolist())):
            rows[k] = fill_row(empty_row(self.docs[k]), self.reports[j], n, 0.0)
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
    return Doc(doc.index, doc.id, None, doc.error, None, doc.chars, doc.file_pos)


class Reports(Sequence):
    """The normalisation reports of a part's short documents (``PreparedDocs.reports``): the j-th
    is the dict :func:`~isan.engine.normalize.prepare` reports for document ``short[j]``, made when
    asked for from columns of counts (the documents prepared together,
    :func:`~isan.engine.corpus.batch_prepare.prepare_texts`), else kept as it came.

    Args:
        batch: the documents prepared together (a :class:`TextsPrepared`), or None.
        rows: int64 (n,): the j-th report's row in ``batch``, -1 where it is kept whole.
        kept: {j: report} of the others.
    """

    def __init__(self, batch=None, rows: np.ndarray | None = None, kept: dict | None = None):
        self.kept = kept or {}
        self.rows = rows if rows is not None else np.full(len(self.kept), -1, dtype=np.int64)
        # what the reports are made of (not the batch's ids)
        self.normalizer = batch.normalizer if batch is not None else None
        self.counts = batch.counts if batch is not None else None
        self.changed_top = batch.changed_top if batch is not None else None
        self.dropped_top = batch.dropped_top if batch is not None else None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, j):
        made = self.__dict__.get("_made")
        if made is None:
            made = self._made = self._make()
        return made[j]

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_made"}

    def columns(self) -> np.ndarray:
        """(n, 5) int64: each report's counts (:data:`ROW_COUNTS`), from the columns of counts
        (no report made) and the reports kept whole."""
        out = np.zeros((len(self.rows), 5), dtype=np.int64)
        for j, r in self.kept.items():
            out[j] = [int(r.get(k, 0)) for k in ROW_COUNTS]
        mine = self.rows >= 0
        if self.counts is not None and mine.any():
            c = self.counts[self.rows[mine]]  # chars_read, chars_scored, changed, dropped
            out[mine, 0], out[mine, 1], out[mine, 2] = c[:, 0], c[:, 2], c[:, 3]
        return out

    def _make(self) -> list[dict]:
        """Every report, made at once (a Python list from each column, then a dict a report)."""
        rows = self.rows.tolist()
        made = [self.kept.get(j) for j in range(len(rows))]
        if self.counts is None:
            return made
        counts = self.counts.tolist()
        changed, dropped = _lists(self.changed_top, len(counts)), _lists(self.dropped_top, len(counts))
        norm = self.normalizer
        for j, b in enumerate(rows):
            if b >= 0:
                read, scored, ch, dr = counts[b]
                made[j] = {"normalizer": norm, "chars_read": read, "chars_scored": scored, "changed": ch, "dropped": dr,
                           "skipped": 0, "replaced": 0, "most_changed": changed[b], "most_dropped": dropped[b]}
        return made


#: the counts of a report a row carries, in the order of :func:`count_columns`
ROW_COUNTS = ("chars_read", *COUNT_KEYS)


def count_columns(reports) -> np.ndarray:
    """(n, 5) int64 each report's counts (:data:`ROW_COUNTS`; 0 where absent): a :class:`Reports`'s
    from its columns, a list of report dicts' read one by one."""
    if isinstance(reports, Reports):
        return reports.columns()
    return np.array([[int(r.get(k, 0)) for k in ROW_COUNTS] for r in reports], dtype=np.int64).reshape(-1, 5)


def _lists(top: tuple, n: int) -> list[list[dict]]:
    """Each of ``n`` texts' ``most_changed`` (or ``most_dropped``) list from (text, code point, count)."""
    out: list[list[dict]] = [[] for _ in range(n)]
    for t, c, k in zip(*(a.tolist() for a in top)):
        out[t].append({"char": chr(c), "count": k})
    return out


def _batch_plan(preparer, normalize, unknown: str) -> tuple[str, bytes] | None:
    """(the normaliser's id, the alphabet's :func:`~isan.engine.corpus.batch_prepare.id_table`)
    when ``preparer`` prepares as :func:`~isan.engine.normalize.prepare` does with a normaliser
    that :func:`~isan.engine.corpus.batch_prepare.prepare_texts` takes; else None (each document
    goes through ``preparer.prepare``)."""
    from isan.engine.corpus.batch_prepare import id_table
    from isan.engine.normalize import NONE, TEXT8_V1

    if unknown not in UNKNOWN_POLICIES:
        return None
    if not isinstance(preparer, TextPreparer):
        from isan.engine.core import Engine

        if type(preparer).prepare is not Engine.prepare:
            return None
    try:
        norm = resolve(normalize, preparer.normalizer)
    except IsanError:
        return None
    table = id_table(preparer.alphabet)
    if table is None or norm not in (TEXT8_V1, NONE):
        return None
    return norm.id, table


def prepare_docs(preparer, docs: list[Doc], normalize="auto", unknown: str = "error",
                 replacement: str | None = None, row_max_chars: int = 65_536) -> PreparedDocs:
    """Read, normalise and map to ids a part's documents (``preparer``: an Engine or a
    :class:`TextPreparer`); what cannot be scored gets its row with the reason. Raises nothing for
    a document.

    The documents of the ``text8`` and ``none`` normalisers are prepared together
    (:func:`~isan.engine.corpus.batch_prepare.prepare_texts`), any other one by one
    (``preparer.prepare``): the same ids, offsets and reports either way."""
    docs = list(docs)
    out = PreparedDocs(docs=[None] * len(docs), rows=[None] * len(docs))
    plan = _batch_plan(preparer, normalize, unknown)
    together: list[int] = []  # documents prepared together
    alone: dict[int, Prepared] = {}  # documents prepared one by one
    most = min(2 * row_max_chars + 16, MAX_TEXT_CHARS - 1) if plan is not None else -1
    for k, doc in enumerate(docs):
        text = doc.text
        if text is not None and doc.error is None and 0 < len(text) <= most and text[0] != BOM:
            together.append(k)  # the usual document, at once
            continue
        doc = docs[k] = _readable(out, k, doc, row_max_chars)
        if doc is None:
            continue
        if plan is not None and 0 < len(doc.text) < MAX_TEXT_CHARS and not doc.text.startswith(BOM):
            together.append(k)
            continue
        try:
            alone[k] = preparer.prepare(doc.text, normalize, unknown, replacement)
        except IsanError as e:
            out.docs[k], out.rows[k] = without_text(doc), empty_row(doc, error_message(e))
    batch = None
    if together:
        taken, batch = prepare_texts([docs[k].text for k in together], *plan)
        for k in np.asarray(together)[~taken]:  # left to prepare (a character outside the alphabet)
            try:
                alone[int(k)] = preparer.prepare(docs[k].text, normalize, unknown, replacement)
            except IsanError as e:
                out.docs[k], out.rows[k] = without_text(docs[k]), empty_row(docs[k], error_message(e))
        together = [k for k, t in zip(together, taken) if t]
    _assemble(out, docs, together, batch, alone, row_max_chars)
    return out


def _readable(out: PreparedDocs, k: int, doc: Doc, row_max_chars: int) -> Doc | None:
    """Document ``k`` with its text, or None where it is decided already: its row (an error) or a
    long document kept whole (in ``out``). A small file read as one document is read here."""
    if doc.error is not None:
        out.docs[k], out.rows[k] = without_text(doc), empty_row(doc)
        return None
    if doc.text is None and doc.blocks is not None and 0 <= doc.chars <= 4 * row_max_chars:
        # a small file: read it whole, so that it scores as the same text from any format
        try:
            doc = Doc(doc.index, doc.id, "".join(doc.blocks()), chars=doc.chars, file_pos=doc.file_pos)
        except (IsanError, OSError) as e:
            out.docs[k], out.rows[k] = without_text(doc), empty_row(doc, error_message(e))
            return None
    if doc.text is None or len(doc.text) > 2 * row_max_chars + 16:
        out.docs[k] = doc
        out.long.append(k)
        return None
    return doc


def _assemble(out: PreparedDocs, docs: list[Doc], together: list[int], batch, alone: dict[int, Prepared],
              row_max_chars: int) -> None:
    """Fill ``out`` with the prepared documents in their order: an empty one's row, one too long
    for a row kept whole (``long``), the others' ids, offsets and reports (``short``)."""
    lengths = batch.lengths if batch is not None else np.zeros(0, dtype=np.int64)
    row_of = dict(zip(together, range(len(together))))
    for k, prep in alone.items():
        if len(prep.ids) == 0:
            doc = docs[k]
            row = fill_row(empty_row(doc, "EmptyTextError: the document is empty" + (" after normalisation" if doc.text else "")),
                           prep.report, 0, 0.0)
            row["bpc"] = None
            out.docs[k], out.rows[k] = without_text(doc), row
    for k in sorted(row_of.keys() | alone.keys()):
        if out.rows[k] is not None:
            continue
        n = int(lengths[row_of[k]]) if k in row_of else len(alone[k].ids)
        if n > row_max_chars:
            out.docs[k] = docs[k]
            out.long.append(k)
        else:
            out.docs[k] = without_text(docs[k])
            out.short.append(k)
    out.long.sort()
    if not out.short:
        return
    if batch is not None and len(out.short) == len(together):  # every row prepared together: taken whole
        ids, bounds_len, at, steps = batch.ids, lengths, batch.steps_at, batch.steps
        out.reports = Reports(batch, np.arange(len(together), dtype=np.int64))
    else:
        ids, bounds_len, at, steps = _joined_rows(out, batch, row_of, alone)
    out.ids = ids if ids.dtype == np.uint8 else (ids.astype(np.uint8) if ids.min() >= 0 and ids.max() <= 255
                                                 else ids.astype(np.int64))
    out.bounds = np.zeros(len(bounds_len) + 1, dtype=np.int64)
    np.cumsum(bounds_len, out=out.bounds[1:])
    out.steps_at = at.astype(np.int32 if len(ids) < 2**31 else np.int64)
    out.steps = steps.astype(np.uint8) if steps.size and 0 <= steps.min() and steps.max() <= 255 else steps.astype(np.int64)


def _joined_rows(out: PreparedDocs, batch, row_of: dict, alone: dict) -> tuple:
    """(ids, lengths, step positions, steps) of the short documents in order, from those prepared
    together (``batch``, document k its row ``row_of[k]``: consecutive rows are taken as one slice)
    and one by one (``alone``); sets ``out.reports``."""
    if batch is not None:
        starts = np.zeros(len(batch.lengths) + 1, dtype=np.int64)
        np.cumsum(batch.lengths, out=starts[1:])
        at_bounds = np.searchsorted(batch.steps_at, starts)
    rows = np.array([row_of.get(k, -1) for k in out.short], dtype=np.int64)
    ids, lengths, at, steps, kept = [], [], [], [], {}
    pos, j = 0, 0
    while j < len(rows):
        if rows[j] >= 0:  # a run of consecutive rows of the batch
            e = j + 1
            while e < len(rows) and rows[e] == rows[e - 1] + 1:
                e += 1
            b0, b1 = int(rows[j]), int(rows[e - 1]) + 1
            ids.append(batch.ids[starts[b0] : starts[b1]])
            at.append(batch.steps_at[at_bounds[b0] : at_bounds[b1]] - starts[b0] + pos)
            steps.append(batch.steps[at_bounds[b0] : at_bounds[b1]])
            lengths.append(batch.lengths[b0:b1])
        else:
            prep = alone[out.short[j]]
            ids.append(prep.ids)
            s = np.diff(prep.offsets, prepend=0)
            nz = np.flatnonzero(s != 1)
            at.append(nz + pos)
            steps.append(s[nz])
            lengths.append(np.array([len(prep.ids)], dtype=np.int64))
            kept[j], e = prep.report, j + 1
        pos += len(ids[-1])
        j = e
    out.reports = Reports(batch, rows, kept)
    return (np.concatenate(ids), np.concatenate(lengths), np.concatenate(at).astype(np.int64),
            np.concatenate(steps).astype(np.int64))
