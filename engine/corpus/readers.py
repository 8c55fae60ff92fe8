"""Reading a corpus: inputs (paths, globs, directories, fsspec URLs), formats, documents.

Formats (``--format auto`` picks by the file name):

- ``jsonl``: one JSON object a line (``.jsonl``, ``.json``, ``.ndjson``, optionally ``.gz`` or
  ``.zst``); the document is the ``text_field`` (default ``text``), its id the ``id_field``
  (default ``id``) when present, else ``NAME:LINE``. Blank lines are skipped.
- ``parquet`` (pyarrow): one document a row, the same two columns.
- ``text``: one document a file (read in blocks, so a file of any size scores in bounded
  memory), or with ``per_line`` one document a non-blank line.

A document that cannot be read (a line that is not UTF-8 or not JSON, a missing or non-string
text field, a number of more than 4,300 digits, nesting deeper than the JSON parser goes, a Parquet
value Python cannot hold) comes out as a :class:`Doc` with ``error`` set; a file that cannot be read
at all (it is missing, unreadable, a corrupt compressed stream, one that ends before its end of
frame, a malformed Parquet file) raises :class:`InputFileError` from the iterator, after the
documents read before the damage (a file read as one document: from its blocks, and the document's
row says why). A line longer than ``max_line_bytes`` is its document's error, and a compressed
file's documents come only from gzip members and zstd frames that decoded whole and passed their
check: those of a damaged one are withheld, and the file error says how many
(:mod:`isan.engine.corpus.lines`).
"""

from __future__ import annotations

import glob
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from isan.engine.corpus.frames import DecodedStream, InputFileError, is_url, open_decoder
from isan.engine.corpus.frames import open_input as _open_raw
from isan.engine.corpus.lines import MAX_LINE_BYTES, checked_lines
from isan.errors import IsanError, install_hint

try:  # a JSON reader several times faster than the standard library's (a dependency of isan's);
    import orjson  # None where it cannot be imported: the standard library reads every line
except ImportError:  # pragma: no cover
    orjson = None

FORMATS = ("auto", "jsonl", "parquet", "text")
_JSONL_EXT = (".jsonl", ".json", ".ndjson")
_COMPRESSED = (".gz", ".zst", ".zstd")


@dataclass
class Doc:
    """One document of an input file.

    Attributes:
        index: its position in the file (0-based; a JSONL document's line is ``index`` counted
            over non-blank lines, its ``line`` is stated in errors).
        id: the id field's value (as a string), else ``NAME:N``.
        text: the document (None when ``blocks`` streams it, or when ``error`` is set).
        chars: its length in characters, when known without reading it (else -1).
        error: why the document cannot be scored (None when it can).
        blocks: for a file read in blocks, a function returning an iterator of its text's blocks.
        file_pos: bytes of its file read when it was read (of the compressed file, for a compressed
            one; in proportion to its rows for Parquet), -1 when unknown: the job's progress.
    """

    index: int
    id: str | None
    text: str | None = None
    error: str | None = None
    blocks: Callable[[], Iterator[str]] | None = None
    chars: int = -1
    file_pos: int = -1

    @property
    def size(self) -> int:
        """Characters, as far as known (for planning parts): the text's length or ``chars``."""
        return len(self.text) if self.text is not None else max(self.chars, 0)

    def __reduce__(self):
        # its fields in order, not a dict of them: a part's documents pickle in half the time
        return Doc, (self.index, self.id, self.text, self.error, self.blocks, self.chars, self.file_pos)


def _has_magic(p: str) -> bool:
    return any(c in p for c in "*?[")


def expand_inputs(inputs: list[str]) -> list[str]:
    """Paths, globs (``**`` recursive), directories (every file below, sorted) and fsspec URLs
    (``s3://...``, globs too, where fsspec is installed) to a sorted list of unique inputs.

    A path that matches nothing is kept as it is: reading it records why it is missing.
    """
    out: list[str] = []
    for raw in inputs:
        p = raw[len("file://"):] if raw.startswith("file://") else raw
        if is_url(p):
            try:
                import fsspec
            except ImportError:
                raise IsanError(f"{p} is a URL; reading URLs needs fsspec: pip install fsspec") from None
            fs, _, paths = fsspec.get_fs_token_paths(p)
            proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
            found = sorted(paths) if _has_magic(p) else ([q for q in sorted(fs.find(paths[0]))] if fs.isdir(paths[0])
                                                         else list(paths))
            out.extend(q if "://" in q else f"{proto}://{q}" for q in found)
            continue
        if _has_magic(p):
            found = sorted(q for q in glob.glob(p, recursive=True) if os.path.isfile(q))
            if not found:
                raise IsanError(f"the pattern {raw!r} matches no file; check the path (quote it so that the shell "
                                "does not expand it)")
            out.extend(found)
        elif os.path.isdir(p):
            found = sorted(str(q) for q in Path(p).rglob("*") if q.is_file() and not q.name.startswith("."))
            if not found:
                raise IsanError(f"the directory {raw} holds no file")
            out.extend(found)
        else:
            out.append(p)
    seen, uniq = set(), []
    for q in out:
        if q not in seen:
            seen.add(q)
            uniq.append(q)
    return uniq


def resolve_input(path: str) -> str:
    """An input's canonical name, the same however it was spelled: a local path made absolute with
    every symbolic link resolved (``k``, ``./k`` and ``/data/k`` are one file), a URL as it is. A
    job names its parts and its ``source`` column by it, so a re-run finds them."""
    p = path[len("file://"):] if path.startswith("file://") else path
    return path if is_url(p) else os.path.realpath(p)


def detect_format(path: str, fmt: str = "auto") -> str:
    if fmt not in FORMATS:
        raise IsanError(f"format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if fmt != "auto":
        return fmt
    name = path.lower()
    for c in _COMPRESSED:
        if name.endswith(c):
            name = name[: -len(c)]
    if name.endswith(_JSONL_EXT):
        return "jsonl"
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    return "text"


def _damaged(path: str, e: Exception) -> InputFileError:
    """The file error of a compressed stream that cannot be decoded to its end."""
    return InputFileError(f"{path}: the file is damaged or truncated ({type(e).__name__}: {e})")


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _id_of(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def read_jsonl(path: str, text_field: str = "text", id_field: str | None = "id",
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Doc]:
    name = _name(path)
    for index, line in enumerate(checked_lines(path, max_line_bytes)):
        fallback_id = f"{name}:{line.lineno}"
        if line.raw is None:
            doc = _too_long(index, fallback_id, line.lineno, line.length, max_line_bytes)
        else:
            try:
                doc = _jsonl_doc(line.raw, index, line.lineno, fallback_id, text_field, id_field)
            except RecursionError:  # json.loads, or str() of a deeply nested id
                doc = Doc(index, fallback_id, error=f"line {line.lineno} is nested too deeply to be read as JSON "
                                                    "(RecursionError)")
        doc.file_pos = line.file_pos
        yield doc


def _too_long(index: int, doc_id: str, lineno: int, length: int, limit: int) -> Doc:
    return Doc(index, doc_id, error=f"line {lineno} is {length:,} bytes long, over the limit of {limit:,} "
                                    "(--max-line-bytes); it was skipped unread")


#: integers this far from 0 or farther come out of orjson as floats (it holds 64-bit integers only)
_FLOAT_INTS = float(2**63)
#: nesting deeper than this is left to the standard library, whose limit (Python's recursion limit,
#: less the stack in use) decides which lines are too deep to read
_ORJSON_DEPTH = 100
#: the types of a value orjson reads exactly as the standard library does, whatever it holds
_FLAT = frozenset({str, int, bool, type(None)})


def _exact(obj) -> bool:
    """Whether orjson's reading of a line is the standard library's: no float in it that could be an
    integer it could not hold (integral, at least 2**63 from 0), nested at most :data:`_ORJSON_DEPTH`
    deep. Walks the nesting without recursion."""
    if type(obj) is dict:  # the usual line: an object of strings, integers, booleans and nulls
        for v in obj.values():
            if type(v) not in _FLAT:
                break
        else:
            return True
    stack = [(obj, 0)]
    while stack:
        o, depth = stack.pop()
        if isinstance(o, (dict, list)):
            if depth >= _ORJSON_DEPTH:
                return False
            stack.extend((v, depth + 1) for v in (o.values() if isinstance(o, dict) else o))
        elif isinstance(o, float) and o.is_integer() and abs(o) >= _FLOAT_INTS:
            return False
    return True


def _loads(raw: bytes):
    """The JSON value of a line: orjson's where it reads the line as the standard library does
    (every valid UTF-8 JSON line but those with integers past 64 bits); else the standard
    library's, which raises UnicodeDecodeError or ValueError with the messages the rows give."""
    if orjson is not None:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:  # not UTF-8, not JSON, NaN, lone surrogates, past the float range...
            pass
        else:
            if _exact(obj):
                return obj
    return json.loads(raw.decode("utf-8"))


def _jsonl_doc(raw: bytes, i: int, lineno: int, fallback_id: str, text_field: str, id_field: str | None) -> Doc:
    """The document of one non-blank JSONL line (``error`` set when it cannot be read)."""
    try:
        obj = _loads(raw)
    except UnicodeDecodeError as e:
        return Doc(i, fallback_id, error=f"line {lineno} is not UTF-8 text ({e.reason} at byte {e.start} of the line)")
    except json.JSONDecodeError as e:
        return Doc(i, fallback_id, error=f"line {lineno} is not JSON ({e.msg} at column {e.colno})")
    except ValueError as e:  # a number of more than 4,300 digits (sys.get_int_max_str_digits)
        return Doc(i, fallback_id, error=f"line {lineno} cannot be read as JSON ({str(e).split(';')[0]})")
    if not isinstance(obj, dict):
        return Doc(i, fallback_id, error=f"line {lineno} is a JSON {type(obj).__name__}, not an object")
    doc_id = _id_of(obj.get(id_field)) if id_field else None
    doc_id = doc_id if doc_id is not None else fallback_id
    if text_field not in obj:
        fields = ", ".join(sorted(map(str, obj))[:8]) or "none"
        return Doc(i, doc_id, error=f"line {lineno} has no field {text_field!r} (its fields: {fields}); "
                                    "choose the field with --text-field")
    text = obj[text_field]
    if not isinstance(text, str):
        return Doc(i, doc_id, error=f"line {lineno}: the field {text_field!r} is {type(text).__name__}, not a string")
    return Doc(i, doc_id, text)


class _Unreadable:
    """In place of a Parquet value that Python cannot hold (a timestamp past the year 9999)."""

    def __init__(self, e: Exception):
        self.reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"


def _values(column) -> list:
    """A column's values as Python objects; one that cannot be converted is an :class:`_Unreadable`
    (pyarrow converts a column at once, and one such value fails it all)."""
    try:
        return column.to_pylist()
    except Exception:  # noqa: BLE001  OverflowError, ValueError, ArrowNotImplementedError, ...
        out = []
        for j in range(len(column)):
            try:
                out.append(column[j].as_py())
            except Exception as e:  # noqa: BLE001
                out.append(_Unreadable(e))
        return out


def read_parquet(path: str, text_field: str = "text", id_field: str | None = "id",
                 batch_rows: int = 4096) -> Iterator[Doc]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputFileError(f"{path}: reading Parquet needs pyarrow: {install_hint('corpus')}") from None
    name = _name(path)
    f = _open_raw(path)
    try:
        try:
            size = f.seek(0, io.SEEK_END)
            f.seek(0)
        except (OSError, ValueError, AttributeError):
            size = -1
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:  # noqa: BLE001  pyarrow.ArrowInvalid and friends
            raise InputFileError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0][:200]})") from None
        cols = pf.schema_arrow.names
        if text_field not in cols:
            raise InputFileError(f"{path}: no column {text_field!r} (its columns: {', '.join(cols[:8])}); "
                                 "choose the column with --text-field")
        want = [text_field] + ([id_field] if id_field and id_field in cols and id_field != text_field else [])
        i, rows = 0, max(pf.metadata.num_rows, 1)
        it = pf.iter_batches(batch_size=batch_rows, columns=want)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001
                raise InputFileError(f"{path}: the Parquet data is damaged after row {i} "
                                     f"({str(e).splitlines()[0][:200]})") from None
            texts = _values(batch.column(0))
            ids = _values(batch.column(1)) if len(want) > 1 else [None] * len(texts)
            for t, doc_id in zip(texts, ids):
                doc = _parquet_doc(t, doc_id, i, f"{name}:{i}", text_field, id_field)
                i += 1
                doc.file_pos = size * i // rows if size >= 0 else -1
                yield doc
    finally:
        f.close()


def _parquet_doc(t, doc_id, i: int, fallback_id: str, text_field: str, id_field: str | None) -> Doc:
    """The document of Parquet row ``i`` (its text and id column's values)."""
    did = _id_of(doc_id) if not isinstance(doc_id, _Unreadable) else None
    did = did if did is not None else fallback_id
    if isinstance(t, _Unreadable) or isinstance(doc_id, _Unreadable):
        column = text_field if isinstance(t, _Unreadable) else id_field
        return Doc(i, did, error=f"row {i}: the column {column!r} holds a value Python cannot read "
                                 f"({(t if isinstance(t, _Unreadable) else doc_id).reason})")
    if t is None:
        return Doc(i, did, error=f"row {i}: the column {text_field!r} is null")
    if isinstance(t, bytes):
        try:
            return Doc(i, did, t.decode("utf-8"))
        except UnicodeDecodeError as e:
            return Doc(i, did, error=f"row {i} is not UTF-8 text ({e.reason} at byte {e.start})")
    if not isinstance(t, str):
        return Doc(i, did, error=f"row {i}: the column {text_field!r} is {type(t).__name__}, not text")
    return Doc(i, did, t)


@dataclass(frozen=True)
class FileBlocks:
    """A file's text in blocks, read anew at each call (``Doc.blocks`` of a file read as one
    document); a value, so that a document can go to a worker process (issue 36) and be read there."""

    path: str
    block_chars: int

    def __call__(self) -> Iterator[str]:
        from isan.engine.blocks import read_blocks

        with DecodedStream(open_decoder(self.path)) as f:
            blocks = read_blocks(f, self.block_chars)
            while True:
                try:
                    block = next(blocks)
                except StopIteration:
                    return
                except IsanError:  # not UTF-8: the document's error
                    raise
                except Exception as e:  # noqa: BLE001  zlib.error, zstandard.ZstdError, EOFError of a cut stream
                    raise _damaged(self.path, e) from None
                yield block


def read_text(path: str, per_line: bool = False, block_chars: int = 1_000_000,
              max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Doc]:
    name = _name(path)
    if not per_line:
        size = -1
        try:
            if not is_url(path) and not path.lower().endswith(_COMPRESSED):
                size = os.path.getsize(path)
        except OSError:
            pass
        with _open_raw(path):  # fail now, as a file error, if it cannot be opened
            pass
        yield Doc(0, path, blocks=FileBlocks(path, block_chars), chars=size)
        return
    for i, line in enumerate(checked_lines(path, max_line_bytes)):
        doc_id = f"{name}:{line.lineno}"
        if line.raw is None:
            doc = _too_long(i, doc_id, line.lineno, line.length, max_line_bytes)
        else:
            try:
                doc = Doc(i, doc_id, line.raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as e:
                doc = Doc(i, doc_id, error=f"line {line.lineno} is not UTF-8 text ({e.reason} at byte {e.start} of "
                                           "the line)")
        doc.file_pos = line.file_pos
        yield doc


def read_docs(path: str, fmt: str = "auto", text_field: str = "text", id_field: str | None = "id",
              per_line: bool = False, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Doc]:
    """The documents of one input file (see the module docstring).

    Args:
        max_line_bytes: the longest line (JSONL, or text one document a line) read, in bytes; a
            longer one is its document's error, skipped in bounded memory.
    Raises:
        InputFileError: (from the iterator) the file cannot be read; documents already yielded stand.
    """
    if max_line_bytes < 1:
        raise IsanError(f"max_line_bytes must be at least 1; got {max_line_bytes}")
    kind = detect_format(path, fmt)
    if kind == "jsonl":
        return read_jsonl(path, text_field, id_field, max_line_bytes)
    if kind == "parquet":
        return read_parquet(path, text_field, id_field)
    return read_text(path, per_line=per_line, max_line_bytes=max_line_bytes)
