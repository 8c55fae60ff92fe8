"""One input file of a corpus job cut into parts, each scored and written atomically: the job's
configuration (:class:`JobConfig`), the model it scores with, :class:`FileParts` and :func:`process_file`.

The local executor (:mod:`isan.engine.corpus.job`), its worker processes
(:mod:`isan.engine.corpus.workers`) and the Ray actors (:mod:`isan.engine.corpus.ray_runner`) all
go through this module, so they write the same files; it imports none of them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from isan.atomic import write_json_atomic
from isan.engine.corpus.lines import MAX_LINE_BYTES
from isan.engine.corpus.readers import InputFileError, read_docs
from isan.engine.corpus.scoring import ROW_MAX_CHARS, DocScorer, ScoreOptions
from isan.engine.corpus.writers import COLUMNS, part_name, part_totals, rows_totals, shard_key, write_part


@dataclass
class JobConfig:
    """What decides the output; a re-run into the same directory must ask for the same."""

    model: str | None = None  # bundle directory; None: the shipped model
    params_sha256: str = ""
    fmt: str = "auto"
    text_field: str = "text"
    id_field: str | None = "id"
    per_line: bool = False
    normalize: str = "auto"
    unknown: str = "error"
    replacement: str | None = None
    per_char_max: int = 0
    part_docs: int = 10_000
    part_chars: int = 32_000_000
    row_max_chars: int = ROW_MAX_CHARS
    #: the longest line read (bytes); a longer one is its document's error
    max_line_bytes: int = MAX_LINE_BYTES
    #: how the inputs are named (parts, ``source``): "resolved" (absolute, symbolic links resolved:
    #: the same however a path is spelled); a job started before that keeps "as-given"
    input_paths: str = "resolved"
    #: the batched kernel (``corpus_path``): "jumps" with the model's trie table, else "chunked";
    #: the two agree within 1e-7, not to the last bit, so a job's parts must not mix them
    kernel: str = "chunked"
    #: the parts' columns (writers.COLUMNS); a job started before changed_fraction keeps COLUMNS_V1
    columns: list = field(default_factory=lambda: list(COLUMNS))
    # not part of the output's identity (the kernel records what the device and dtype change)
    #: characters a call of the batched kernel holds (None: the backend's, ``Backend.batch_chars``)
    batch_chars: int | None = field(default=None, compare=False)
    device: str = field(default="cpu", compare=False)
    dtype: str = field(default="float32", compare=False)

    def identity(self) -> dict:
        d = asdict(self)
        for k in ("batch_chars", "device", "dtype"):
            d.pop(k)
        return d

    def options(self, threads: int | None = None) -> ScoreOptions:
        return ScoreOptions(normalize=self.normalize, unknown=self.unknown, replacement=self.replacement,
                            batch_chars=self.batch_chars, row_max_chars=self.row_max_chars,
                            per_char_max=self.per_char_max, threads=threads)


def load_corpus_engine(model: str | None, device: str = "cpu", dtype: str = "float32"):
    """The model a job scores with, chunk-parallel (:func:`~isan.engine.corpus.scoring.corpus_path`:
    by composed jumps when the bundle has a trie table or a table recipe, else one character a step;
    on a GPU, or in float64, the torch backend's runner: :meth:`Engine.load`'s ``device`` and ``dtype``)."""
    from isan.engine.core import Engine, default_model_path

    from isan.engine.corpus.scoring import corpus_engine

    return corpus_engine(Engine.load(model or default_model_path(), progress_bar=False, device=device, dtype=dtype))


def file_error_row(message: str) -> dict:
    """The output row of an input file that cannot be read (``InputFileError: message``), no document's."""
    from isan.engine.corpus.prepared import COUNT_KEYS

    return {"id": None, "index": -1, "chars_read": 0, "chars_scored": 0, "bits": 0.0, "bpc": None,
            **{k: 0 for k in COUNT_KEYS}, "changed_fraction": None, "error": f"InputFileError: {message}",
            "per_char_bits": None}


class FileParts:
    """One input file as the job cuts it: its parts in order (``part_docs`` documents or
    ``part_chars`` characters each), each written atomically once scored, then its done record.
    The local executor, its worker processes and the Ray actors all go through it, so they write the
    same files.

    Args:
        cfg: the job; path: the input; shards: the output's ``shards/`` folder.
        on_part: called with each part's ``{"path", "documents", "chars_read", "new", "file_pos"}``
            (bytes of the file read, -1 when unknown), and once more with ``"done": True``.
    """

    def __init__(self, cfg: JobConfig, path: str, shards: Path, on_part: Callable[[dict], None] | None = None):
        self.cfg, self.path, self.shards, self.on_part = cfg, path, shards, on_part
        self.key = shard_key(path)
        self.done_path = shards / f"{self.key}.done.json"
        self.totals = {"documents": 0, "chars_read": 0, "chars_scored": 0, "bits": 0.0, "errors": 0}
        self.new = {"new_documents": 0, "new_chars": 0}
        self.parts = 0
        self.file_error: str | None = None

    def complete(self) -> dict | None:
        """The done record of a file complete already (``"skipped": True``), else None."""
        if not self.done_path.is_file():
            return None
        rec = json.loads(self.done_path.read_text())
        rec.update(new_documents=0, new_chars=0, skipped=True)
        if self.on_part:
            self.on_part({"path": self.path, "documents": rec["documents"], "chars_read": rec["chars_read"],
                          "new": False, "done": True})
        return rec

    def cut(self) -> Iterator[tuple[Path, list, str | None]]:
        """(the part's path, its documents, the file's error if the file broke in it), in order.
        A part whose file exists already (a resumed job) is still read, to find where the next begins."""
        cfg = self.cfg
        buf, size, k, file_error = [], 0, 0, None
        try:
            for doc in read_docs(self.path, cfg.fmt, cfg.text_field, cfg.id_field, cfg.per_line, cfg.max_line_bytes):
                buf.append(doc)
                size += doc.size
                if len(buf) >= cfg.part_docs or size >= cfg.part_chars:
                    yield self.shards / part_name(self.key, k), buf, None
                    buf, size, k = [], 0, k + 1
        except InputFileError as e:
            file_error = str(e)
        if buf or file_error:
            yield self.shards / part_name(self.key, k), buf, file_error

    def add(self, part: Path, docs: list, rows: list | None, file_error: str | None = None) -> None:
        """Count the next part: written already (``rows`` None: its totals are read back), or write
        ``rows`` (the scored ``docs``; a file error adds its own row)."""
        if rows is None:
            t = part_totals(part)
            fresh = False
        else:
            rows = list(rows)
            if file_error:
                rows.append(file_error_row(file_error))
            write_part(part, rows, self.path, self.cfg.columns)
            t = rows_totals(rows)
            self.new["new_documents"] += t["documents"]
            self.new["new_chars"] += t["chars_read"]
            fresh = True
        for k in self.totals:
            self.totals[k] += t[k]
        self.parts += 1
        self.file_error = file_error or self.file_error
        if self.on_part:
            self.on_part({"path": self.path, "documents": t["documents"], "chars_read": t["chars_read"], "new": fresh,
                          "file_pos": docs[-1].file_pos if docs else -1})

    def finish(self) -> dict:
        """Write the done record; returns it with this run's work (``new_documents``, ``new_chars``)."""
        rec = {"path": self.path, "key": self.key, "parts": self.parts, **self.totals, "file_error": self.file_error}
        write_json_atomic(self.done_path, rec)
        rec.update(self.new, skipped=False)
        if self.on_part:
            self.on_part({"path": self.path, "documents": 0, "chars_read": 0, "new": False, "done": True})
        return rec


def process_file(scorer: DocScorer, cfg: JobConfig, path: str, shards: Path,
                 on_part: Callable[[dict], None] | None = None) -> dict:
    """Score one input file into its parts (skipping parts already written) and write its done record
    (:class:`FileParts`).

    Returns the done record: ``{"path", "key", "parts", "documents", "chars_read", "chars_scored",
    "bits", "errors", "file_error"}`` plus this call's work (``"new_documents"``, ``"new_chars"``,
    ``"skipped": True`` when the file was complete already).
    """
    fp = FileParts(cfg, path, shards, on_part)
    rec = fp.complete()
    if rec is not None:
        return rec
    for part, docs, file_error in fp.cut():
        fp.add(part, docs, None if part.is_file() else (scorer.score(docs) if docs else []), file_error)
    return fp.finish()
