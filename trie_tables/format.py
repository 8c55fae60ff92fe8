"""The trie table on disk (format version 1; specified in trie_tables/FORMAT.md) and in memory.

A table directory holds ``header.json``, ``keys.marisa`` (marisa-trie: key -> id),
``Ac.npy`` (n, d, d+1), ``R.npy`` (rows, V, d+1) and ``index.npy`` (n, 2). Every section's
byte size and sha256 are in the header; loading checks magic, version, completeness, the
model it belongs to (``params_sha256``), shapes, sizes and checksums, and raises
:class:`~isan.errors.TableFormatError` with the command that rebuilds the table.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import marisa_trie
import numpy as np

from isan.alphabet import Alphabet
from isan.atomic import atomic_directory, write_json_atomic
from isan.errors import TableFormatError
from isan.params import ISANParams
from isan.trie_tables.codes import code_of, max_code_length
from isan.trie_tables.compose import compose_entries

log = logging.getLogger(__name__)

MAGIC = "ISAN-TRIE-TABLE"
VERSION = 1
SECTIONS = ("keys.marisa", "Ac.npy", "R.npy", "index.npy")
DTYPES = {"float32": np.float32, "float16": np.float16}
REBUILD = "rebuild it with `isan export CHECKPOINT_DIR BUNDLE --overwrite` (or `isan table build --model BUNDLE`)"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def build_table(out_dir: str | Path, params: ISANParams, alphabet: Alphabet, keys: list[str], params_sha256: str,
                dtype: str = "float32", max_len: int | None = None, build_info: dict | None = None,
                overwrite: bool = False, progress_bar: bool = False) -> Path:
    """Compose and write a table for ``keys`` (strings over the alphabet) atomically.

    The K single symbols are always added. Composition is in float64; storage in ``dtype``.

    Raises:
        TableFormatError: a key outside the alphabet, longer than the code limit, or a bad dtype.
    """
    if dtype not in DTYPES:
        raise TableFormatError(f"table dtype must be float32 or float16; got {dtype!r}")
    K, V, d = params.K, params.V, params.d
    keys = sorted(set(keys) | set(alphabet.symbols))
    limit = max_code_length(K)
    for s in keys:
        if not s or len(s) > limit or any(ch not in alphabet for ch in s):
            raise TableFormatError(f"table key {s!r} is empty, longer than {limit} or outside the alphabet")
    max_len = max(max_len or 0, max(len(s) for s in keys))
    trie = marisa_trie.Trie(keys)
    n = len(trie)
    ids_of = [None] * n
    for s in keys:
        ids_of[trie.key_id(s)] = alphabet.encode(s)
    lengths = np.array([len(k) for k in ids_of], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    t0 = time.perf_counter()
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        trie.save(str(tmp / "keys.marisa"))
        np_dtype = DTYPES[dtype]
        Ac = np.lib.format.open_memmap(tmp / "Ac.npy", mode="w+", dtype=np_dtype, shape=(n, d, d + 1))
        R = np.lib.format.open_memmap(tmp / "R.npy", mode="w+", dtype=np_dtype, shape=(int(lengths.sum()), V, d + 1))
        bar = None
        if progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=n, desc="composing table", unit="entry")
        products = compose_entries(params, ids_of, Ac, R, offsets,
                                   progress=(lambda i: bar.update(1)) if bar is not None else None)
        if bar is not None:
            bar.close()
        Ac.flush()
        R.flush()
        del Ac, R
        np.save(tmp / "index.npy", np.stack([offsets, lengths], axis=1))
        header = {
            "magic": MAGIC, "format_version": VERSION, "complete": True,
            "dtype": dtype, "K": K, "V": V, "d": d, "alphabet": alphabet.to_list(), "max_len": int(max_len),
            "params_sha256": params_sha256, "n_entries": n, "n_readout_rows": int(lengths.sum()),
            "sections": {name: {"bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)} for name in SECTIONS},
            "build": {**(build_info or {}), "compose_seconds": round(time.perf_counter() - t0, 3),
                      "matrix_products": products},
        }
        write_json_atomic(tmp / "header.json", header)
    return Path(out_dir)


class Table:
    """A loaded table: the marisa trie, memory-mapped arrays and a sorted code index for matching.

    Attributes:
        Ac: (n, d, d+1) float32 ``[A | c]`` per entry (memory-mapped for float32 files;
            float16 files are converted to float32 in memory).
        R: (rows, V, d+1) float32 stacked prefix readouts ``[R_i | r_i]``.
        offsets, lengths: (n,) int64; entry e's readouts are ``R[offsets[e] : offsets[e] + lengths[e]]``.
        sorted_codes, entry_of_sorted: uint64 codes of the keys, ascending, and their entry ids.
    """

    def __init__(self, path: str | Path, header: dict, trie, Ac, R, index, alphabet: Alphabet):
        self.path = Path(path)
        self.header = header
        self.trie = trie
        self.Ac = Ac
        self.R = R
        self.offsets = np.ascontiguousarray(index[:, 0])
        self.lengths = np.ascontiguousarray(index[:, 1])
        self.alphabet = alphabet
        self.K, self.V, self.d = header["K"], header["V"], header["d"]
        self.max_len = header["max_len"]
        codes = np.empty(len(self.lengths), dtype=np.uint64)
        for key, e in trie.iteritems():
            codes[e] = code_of(alphabet.encode(key), self.K)
        order = np.argsort(codes)
        self.sorted_codes = codes[order]
        self.entry_of_sorted = order.astype(np.int64)

    @property
    def n_entries(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return int(sum(s["bytes"] for s in self.header["sections"].values()))

    def entries_of(self, codes: np.ndarray) -> np.ndarray:
        """Entry ids of codes known to be in the table."""
        return self.entry_of_sorted[np.searchsorted(self.sorted_codes, codes)]

    def info(self) -> dict:
        h = self.header
        hist = np.bincount(self.lengths).tolist()
        return {"path": str(self.path), "entries": self.n_entries, "bytes": self.nbytes, "dtype": h["dtype"],
                "d": self.d, "max_len": self.max_len, "params_sha256": h["params_sha256"],
                "length_histogram": {str(k): c for k, c in enumerate(hist) if c},
                "expected_avg_match_length": h.get("build", {}).get("avg_match_length"),
                "build": h.get("build", {})}


def read_header(path: str | Path) -> dict:
    path = Path(path)
    hp = path / "header.json"
    if not hp.is_file():
        raise TableFormatError(f"{path} is not a complete trie table (no header.json: missing or interrupted build); {REBUILD}")
    try:
        h = json.loads(hp.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TableFormatError(f"{hp} is not valid JSON ({e}); {REBUILD}") from None
    if not isinstance(h, dict) or h.get("magic") != MAGIC:
        raise TableFormatError(f"{hp} is not a trie table header (magic != {MAGIC!r}); {REBUILD}")
    if h.get("format_version") != VERSION:
        raise TableFormatError(f"{path} has table format_version {h.get('format_version')!r}; this isan reads {VERSION}; {REBUILD}")
    if h.get("complete") is not True:
        raise TableFormatError(f"{path} is an incomplete table (its build did not finish); {REBUILD}")
    return h


def load_table(path: str | Path, params_sha256: str | None = None, alphabet: Alphabet | None = None,
               d: int | None = None, verify: bool = True) -> Table:
    """Load and validate a table directory.

    Args:
        params_sha256, alphabet, d: the model the table must belong to (checked when given).
        verify: check every section's sha256 (reads the whole table once).
    Raises:
        TableFormatError: missing, truncated, corrupt, unknown version, or another model's table.
    """
    path = Path(path)
    h = read_header(path)
    if params_sha256 is not None and h.get("params_sha256") != params_sha256:
        raise TableFormatError(f"{path} was built for another model (params_sha256 {str(h.get('params_sha256'))[:12]}... "
                               f"!= {params_sha256[:12]}...); {REBUILD}")
    if alphabet is not None and h.get("alphabet") != alphabet.to_list():
        raise TableFormatError(f"{path} was built for another alphabet; {REBUILD}")
    if d is not None and h.get("d") != d:
        raise TableFormatError(f"{path} has d={h.get('d')} but the model has d={d}; {REBUILD}")
    if h.get("dtype") not in DTYPES:
        raise TableFormatError(f"{path}: unknown table dtype {h.get('dtype')!r}; {REBUILD}")
    for name in SECTIONS:
        sp = path / name
        meta = h.get("sections", {}).get(name)
        if meta is None or not sp.is_file():
            raise TableFormatError(f"{path} lacks section {name}; {REBUILD}")
        size = sp.stat().st_size
        if size != meta["bytes"]:
            raise TableFormatError(f"{sp} has {size:,} bytes, the header says {meta['bytes']:,} (truncated or replaced); {REBUILD}")
        if verify and _sha256(sp) != meta["sha256"]:
            raise TableFormatError(f"{sp} does not match its sha256 in the header (corrupt); {REBUILD}")
    n, rows, V, dd = h["n_entries"], h["n_readout_rows"], h["V"], h["d"]
    np_dtype = DTYPES[h["dtype"]]
    try:
        Ac = np.load(path / "Ac.npy", mmap_mode="r")
        R = np.load(path / "R.npy", mmap_mode="r")
        index = np.load(path / "index.npy")
        trie = marisa_trie.Trie()
        trie.load(str(path / "keys.marisa"))
    except Exception as e:
        raise TableFormatError(f"{path}: a section cannot be read ({e}); {REBUILD}") from None
    if Ac.shape != (n, dd, dd + 1) or Ac.dtype != np_dtype:
        raise TableFormatError(f"{path}/Ac.npy has shape {Ac.shape} {Ac.dtype}; expected {(n, dd, dd + 1)} {h['dtype']}; {REBUILD}")
    if R.shape != (rows, V, dd + 1) or R.dtype != np_dtype:
        raise TableFormatError(f"{path}/R.npy has shape {R.shape}; expected {(rows, V, dd + 1)}; {REBUILD}")
    if index.shape != (n, 2) or index.dtype != np.int64:
        raise TableFormatError(f"{path}/index.npy has shape {index.shape}; expected {(n, 2)}; {REBUILD}")
    if len(trie) != n:
        raise TableFormatError(f"{path}/keys.marisa has {len(trie)} keys; the header says {n}; {REBUILD}")
    alpha = Alphabet.from_list(h["alphabet"])
    offsets, lengths = index[:, 0], index[:, 1]
    if lengths.min() < 1 or lengths.sum() != rows or np.any(offsets != np.concatenate([[0], np.cumsum(lengths)[:-1]])):
        raise TableFormatError(f"{path}/index.npy is inconsistent; {REBUILD}")
    for key, e in trie.iteritems():
        if len(key) != lengths[e] or any(ch not in alpha for ch in key):
            raise TableFormatError(f"{path}: key {key!r} does not match entry {e}; {REBUILD}")
    if any(s not in trie for s in alpha.symbols):
        raise TableFormatError(f"{path}: the table lacks single-symbol entries; {REBUILD}")
    if np_dtype != np.float32:  # float16 storage: compute in float32
        Ac = np.asarray(Ac, dtype=np.float32)
        R = np.asarray(R, dtype=np.float32)
    return Table(path, h, trie, Ac, R, index, alpha)
