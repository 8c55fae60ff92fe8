"""The trie table on disk (format version 2, version 1 still read; specified in
trie_tables/FORMAT.md) and in memory.

A table directory holds ``header.json``, ``keys.marisa`` (marisa-trie: key -> id),
``Ac.npy`` (n, d, d+1), ``R.npy`` (rows, V, d+1) and ``index.npy`` (n, 2). Every section's
byte size and sha256 are in the header, and the header carries the sha256 of its own canonical
content (``header_sha256``); loading checks the header's schema and checksum, magic, version,
completeness, the model it belongs to (``params_sha256``), shapes, sizes and checksums, and
raises :class:`~isan.errors.TableFormatError` with the command that rebuilds the table.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import marisa_trie
import numpy as np

from isan.alphabet import Alphabet
from isan.atomic import atomic_directory, write_json_atomic
from isan.errors import TableFormatError
from isan.jsonfile import canonical_sha256, file_sha256, is_sha256, read_json
from isan.params import ISANParams
from isan.trie_tables.codes import code_of, max_code_length
from isan.trie_tables.compose import compose_entries

log = logging.getLogger(__name__)

MAGIC = "ISAN-TRIE-TABLE"
VERSION = 2  # what build_table writes: version 1 plus header_sha256
READABLE_VERSIONS = (1, 2)
SECTIONS = ("keys.marisa", "Ac.npy", "R.npy", "index.npy")
DTYPES = {"float32": np.float32, "float16": np.float16}
REBUILD = "rebuild it with `isan export CHECKPOINT_DIR BUNDLE --overwrite` (or `isan table build --model BUNDLE`)"


def _sha256(path: Path) -> str:
    return file_sha256(path)


def header_sha256(header: dict) -> str:
    """The ``header_sha256`` of a header: canonical JSON of every field but that one."""
    return canonical_sha256({k: v for k, v in header.items() if k != "header_sha256"})


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
        header["header_sha256"] = header_sha256(header)
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
        item = np.dtype(DTYPES[h["dtype"]]).itemsize
        matrices = item * (h["d"] + 1) * (h["n_entries"] * h["d"] + h["n_readout_rows"] * h["V"])
        # "bytes" counts what a budget counts (the stored matrices: isan export and the manifest say
        # the same); "bytes_on_disk" adds the .npy headers, the index, the trie and the header
        return {"path": str(self.path), "entries": self.n_entries, "bytes": int(matrices),
                "bytes_on_disk": self.nbytes + (self.path / "header.json").stat().st_size, "dtype": h["dtype"],
                "d": self.d, "max_len": self.max_len, "params_sha256": h["params_sha256"],
                "length_histogram": {str(k): c for k, c in enumerate(hist) if c},
                "expected_avg_match_length": h.get("build", {}).get("avg_match_length"),
                "build": h.get("build", {})}


_INT_FIELDS = ("K", "V", "d", "max_len", "n_entries", "n_readout_rows")


def read_header(path: str | Path, rebuild: str = REBUILD) -> dict:
    """Read and validate ``header.json`` of a table directory (schema, checksum, version).

    Raises:
        TableFormatError: missing, not JSON, hostile content (deep nesting, huge numbers), a
            missing or mistyped field, a checksum that does not match, another version, or an
            incomplete table; the message names the command that rebuilds it.
    """
    path = Path(path)
    hp = path / "header.json"
    if not hp.is_file():
        raise TableFormatError(f"{path} is not a complete trie table (no header.json: missing or interrupted build); {rebuild}")
    h = read_json(hp, TableFormatError, rebuild, what="trie table header", max_bytes=1 << 20)
    if not isinstance(h, dict) or h.get("magic") != MAGIC:
        raise TableFormatError(f"{hp} is not a trie table header (magic != {MAGIC!r}); {rebuild}")
    v = h.get("format_version")
    if type(v) is not int or v not in READABLE_VERSIONS:
        raise TableFormatError(f"{path} has table format_version {v!r}; this isan reads "
                               f"{', '.join(map(str, READABLE_VERSIONS))}; {rebuild}")
    if v >= 2:
        if not is_sha256(h.get("header_sha256")):
            raise TableFormatError(f"{hp} lacks its header_sha256 (format version {v}); {rebuild}")
        if header_sha256(h) != h["header_sha256"]:
            raise TableFormatError(f"{hp} does not match its header_sha256 (corrupt or edited); {rebuild}")
    if h.get("complete") is not True:
        raise TableFormatError(f"{path} is an incomplete table (its build did not finish); {rebuild}")
    for key in ("dtype", "alphabet", "params_sha256", "sections") + _INT_FIELDS:
        if key not in h:
            raise TableFormatError(f"{hp} lacks the field {key!r}; {rebuild}")
    for key in _INT_FIELDS:
        if type(h[key]) is not int or h[key] < 0:
            raise TableFormatError(f"{hp}: {key!r} must be a non-negative integer; got {h[key]!r}; {rebuild}")
    if not isinstance(h["dtype"], str) or h["dtype"] not in DTYPES:
        raise TableFormatError(f"{path}: unknown table dtype {h['dtype']!r}; {rebuild}")
    if not isinstance(h["params_sha256"], str):
        raise TableFormatError(f"{hp}: 'params_sha256' must be a string; {rebuild}")
    if not isinstance(h["alphabet"], list) or not all(isinstance(a, str) and len(a) == 1 for a in h["alphabet"]):
        raise TableFormatError(f"{hp}: 'alphabet' must be a list of one-character strings; {rebuild}")
    if len(h["alphabet"]) != h["K"] or len(set(h["alphabet"])) != h["K"]:
        raise TableFormatError(f"{hp}: the alphabet has {len(h['alphabet'])} symbols but K={h['K']}; {rebuild}")
    if not 1 <= h["max_len"] <= max_code_length(max(h["K"], 1)):
        raise TableFormatError(f"{hp}: max_len={h['max_len']} is outside [1, {max_code_length(max(h['K'], 1))}] "
                               f"(keys are matched by 63-bit codes); {rebuild}")
    sec = h["sections"]
    if not isinstance(sec, dict):
        raise TableFormatError(f"{hp}: 'sections' must be a JSON object; {rebuild}")
    for name in SECTIONS:
        meta = sec.get(name)
        if (not isinstance(meta, dict) or type(meta.get("bytes")) is not int or meta["bytes"] < 0
                or not is_sha256(meta.get("sha256"))):
            raise TableFormatError(f"{hp}: section {name} must have {{\"bytes\": int, \"sha256\": hex}}; {rebuild}")
    return h


def load_table(path: str | Path, params_sha256: str | None = None, alphabet: Alphabet | None = None,
               d: int | None = None, verify: bool = True, rebuild: str = REBUILD) -> Table:
    """Load and validate a table directory.

    Args:
        params_sha256, alphabet, d: the model the table must belong to (checked when given).
        verify: check every section's sha256 (reads the whole table once).
        rebuild: the command named in errors (the cache names its own).
    Raises:
        TableFormatError: missing, truncated, corrupt, unknown version, or another model's table.
    """
    path = Path(path)
    h = read_header(path, rebuild)
    if params_sha256 is not None and h.get("params_sha256") != params_sha256:
        raise TableFormatError(f"{path} was built for another model (params_sha256 {str(h.get('params_sha256'))[:12]}... "
                               f"!= {params_sha256[:12]}...); {rebuild}")
    if alphabet is not None and h.get("alphabet") != alphabet.to_list():
        raise TableFormatError(f"{path} was built for another alphabet; {rebuild}")
    if d is not None and h.get("d") != d:
        raise TableFormatError(f"{path} has d={h.get('d')} but the model has d={d}; {rebuild}")
    if h.get("dtype") not in DTYPES:
        raise TableFormatError(f"{path}: unknown table dtype {h.get('dtype')!r}; {rebuild}")
    for name in SECTIONS:
        sp = path / name
        meta = h.get("sections", {}).get(name)
        if meta is None or not sp.is_file():
            raise TableFormatError(f"{path} lacks section {name}; {rebuild}")
        size = sp.stat().st_size
        if size != meta["bytes"]:
            raise TableFormatError(f"{sp} has {size:,} bytes, the header says {meta['bytes']:,} (truncated or replaced); {rebuild}")
        if verify and _sha256(sp) != meta["sha256"]:
            raise TableFormatError(f"{sp} does not match its sha256 in the header (corrupt); {rebuild}")
    n, rows, V, dd = h["n_entries"], h["n_readout_rows"], h["V"], h["d"]
    np_dtype = DTYPES[h["dtype"]]
    try:
        Ac = np.load(path / "Ac.npy", mmap_mode="r")
        R = np.load(path / "R.npy", mmap_mode="r")
        index = np.load(path / "index.npy")
        trie = marisa_trie.Trie()
        trie.load(str(path / "keys.marisa"))
    except Exception as e:
        raise TableFormatError(f"{path}: a section cannot be read ({e}); {rebuild}") from None
    if Ac.shape != (n, dd, dd + 1) or Ac.dtype != np_dtype:
        raise TableFormatError(f"{path}/Ac.npy has shape {Ac.shape} {Ac.dtype}; expected {(n, dd, dd + 1)} {h['dtype']}; {rebuild}")
    if R.shape != (rows, V, dd + 1) or R.dtype != np_dtype:
        raise TableFormatError(f"{path}/R.npy has shape {R.shape}; expected {(rows, V, dd + 1)}; {rebuild}")
    for name, arr in (("Ac.npy", Ac), ("R.npy", R), ("index.npy", index)):
        if not arr.flags.c_contiguous:  # a Fortran-order .npy: the kernels read rows in C order
            raise TableFormatError(f"{path}/{name} is stored in Fortran order; tables MUST be stored in C order "
                                   f"(FORMAT.md); {rebuild}")
    if index.shape != (n, 2) or index.dtype != np.int64:
        raise TableFormatError(f"{path}/index.npy has shape {index.shape}; expected {(n, 2)}; {rebuild}")
    if len(trie) != n:
        raise TableFormatError(f"{path}/keys.marisa has {len(trie)} keys; the header says {n}; {rebuild}")
    alpha = Alphabet.from_list(h["alphabet"])
    offsets, lengths = index[:, 0], index[:, 1]
    if n == 0 or lengths.min() < 1 or lengths.sum() != rows or np.any(offsets != np.concatenate([[0], np.cumsum(lengths)[:-1]])):
        raise TableFormatError(f"{path}/index.npy is inconsistent; {rebuild}")
    for key, e in trie.iteritems():
        if len(key) != lengths[e] or any(ch not in alpha for ch in key):
            raise TableFormatError(f"{path}: key {key!r} does not match entry {e}; {rebuild}")
    if any(s not in trie for s in alpha.symbols):
        raise TableFormatError(f"{path}: the table lacks single-symbol entries; {rebuild}")
    if int(lengths.max()) > h["max_len"]:
        raise TableFormatError(f"{path}: a key of length {int(lengths.max())} exceeds max_len={h['max_len']}; {rebuild}")
    if np_dtype != np.float32:  # float16 storage: compute in float32
        Ac = np.asarray(Ac, dtype=np.float32)
        R = np.asarray(R, dtype=np.float32)
    return Table(path, h, trie, Ac, R, index, alpha)
