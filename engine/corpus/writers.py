"""The output of a corpus job: Parquet parts, a completion record per input file, ``summary.json``.

Layout of ``--out DIR``::

    DIR/job.json                          what was asked (model hash, options); a re-run must match it
    DIR/shards/KEY.part-00000.parquet     the rows of an input file's documents, in file order
    DIR/shards/KEY.done.json              written last: the file is complete (parts, totals, file error)
    DIR/summary.json                      totals over every completed input file, and this run's speed

``KEY`` is the input's file name and a hash of its path (the path resolved to one spelling by
:func:`~isan.engine.corpus.readers.resolve_input`, as the ``source`` column holds it). Every file
is written to a temporary sibling and renamed when complete (:mod:`isan.atomic`), so a killed job
leaves complete files or none; a re-run skips the parts and files already there and writes the
same bytes as an uninterrupted run would have.

Columns of a part (one row a document): ``id`` (string), ``source`` (the input path), ``index``
(position in the file; -1 for a row that records a file error), ``chars_read``, ``chars_scored``
(int64), ``bits``, ``bpc`` (float64; bpc null when nothing was scored), ``changed``, ``dropped``,
``skipped``, ``replaced`` (int64, the normaliser's counts), ``changed_fraction`` (float64: the share
of the document's characters that did not reach the model as they were, ``(changed + dropped +
skipped + replaced) / chars_read`` at most 1; null when nothing was read), ``error`` (string, null
when scored), and ``per_char_bits`` (list<float64>, null unless asked for and the document is short
enough). A job started before ``changed_fraction`` existed (its ``job.json`` lists no ``columns``)
goes on writing the columns it was started with (:data:`COLUMNS_V1`), so that its parts keep one
schema.
"""

from __future__ import annotations

import hashlib
import re

from isan.atomic import atomic_path

COLUMNS = ("id", "source", "index", "chars_read", "chars_scored", "bits", "bpc", "changed", "dropped", "skipped",
           "replaced", "changed_fraction", "error", "per_char_bits")
#: the columns of the jobs started before ``changed_fraction`` (their job.json lists none)
COLUMNS_V1 = tuple(c for c in COLUMNS if c != "changed_fraction")


def schema(columns=COLUMNS):
    """The parts' Arrow schema, of ``columns`` (default: every column, :data:`COLUMNS`)."""
    import pyarrow as pa

    i64, f64, s = pa.int64(), pa.float64(), pa.string()
    full = pa.schema([("id", s), ("source", s), ("index", i64), ("chars_read", i64), ("chars_scored", i64),
                      ("bits", f64), ("bpc", f64), ("changed", i64), ("dropped", i64), ("skipped", i64),
                      ("replaced", i64), ("changed_fraction", f64), ("error", s), ("per_char_bits", pa.list_(f64))])
    return full if tuple(columns) == COLUMNS else pa.schema([full.field(c) for c in columns])


def shard_key(path: str) -> str:
    """A stable, file-system-safe name for an input: its file name and 10 hex digits of its path."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.rstrip("/").rsplit("/", 1)[-1])[:80] or "input"
    return f"{name}-{hashlib.sha256(path.encode('utf-8')).hexdigest()[:10]}"


def part_name(key: str, part: int) -> str:
    return f"{key}.part-{part:05d}.parquet"


def write_part(path, rows: list[dict], source: str, columns=COLUMNS) -> None:
    """Write rows as one Parquet file of ``columns``, atomically (deterministic bytes for the same rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {c: [] for c in columns}
    for r in rows:
        for c in columns:
            v = source if c == "source" else r.get(c)
            if c == "per_char_bits" and v is not None:
                v = [float(x) for x in v]
            cols[c].append(v)
    table = pa.table(cols, schema=schema(columns))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", write_statistics=False)


def part_totals(path) -> dict:
    """Totals of a part already written (a resumed run counts it without scoring it again)."""
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["chars_read", "chars_scored", "bits", "error", "index"])
    err = t.column("error").to_pylist()
    idx = t.column("index").to_pylist()
    return {"documents": sum(1 for i in idx if i >= 0), "chars_read": int(sum(t.column("chars_read").to_pylist())),
            "chars_scored": int(sum(t.column("chars_scored").to_pylist())),
            "bits": float(sum(t.column("bits").to_pylist())), "errors": sum(1 for e, i in zip(err, idx) if e and i >= 0)}


def rows_totals(rows: list[dict]) -> dict:
    docs = [r for r in rows if r["index"] >= 0]
    return {"documents": len(docs), "chars_read": int(sum(r["chars_read"] for r in rows)),
            "chars_scored": int(sum(r["chars_scored"] for r in rows)), "bits": float(sum(r["bits"] for r in rows)),
            "errors": sum(1 for r in docs if r["error"])}


def read_output(out_dir, columns=None):
    """Every part of a job's output as one pyarrow Table: parts in the order of their names (input
    key, then part number), documents in file order within a part."""
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted((Path(out_dir) / "shards").glob("*.part-*.parquet"))
    if not parts:
        return pa.table({c: [] for c in (columns or COLUMNS)}, schema=_subset(schema(), columns))
    return pa.concat_tables([pq.read_table(p, columns=list(columns) if columns else None) for p in parts])


def _subset(s, columns):
    import pyarrow as pa

    return s if not columns else pa.schema([s.field(c) for c in columns])
