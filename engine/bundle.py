"""The bundle directory (format version 3; versions 1 and 2 still load; docs/guide/formats.md).

A bundle is a directory with ``manifest.json`` and ``weights.safetensors`` (float32 ``W``,
``b``, ``W_ro``, ``b_ro``, ``h0`` for an ISAN), optionally ``table/`` (trie_tables), a
``table_recipe.json`` and ``model.onnx``/``sequence.onnx``. Bundles are written into a temporary
directory and renamed when complete, so an interrupted export leaves nothing that loads.

Integrity (format version 2). The manifest records

* ``"normalizer": {"name", "version"}``: the text normalisation the model expects
  (:mod:`isan.engine.normalize`; ``"none"`` for raw text);
* ``"files"``: ``{relative path: {"bytes": int, "sha256": hex}}`` for every file of the bundle
  but ``manifest.json`` itself (and hidden files);
* ``"manifest_sha256"``: the sha256 of the manifest's own canonical JSON (sorted keys, no
  spaces, ASCII) without this field, so an edited alphabet, ``d``, ``kind`` or normaliser is
  refused, not silently used.

Loading (:func:`read_manifest`) checks the manifest's schema and hash and, by default, every
listed file's size and the sha256 of every file up to :data:`FAST_HASH_MAX_BYTES` (large files:
size only; the table and ONNX graphs are verified by their own loaders); ``isan verify BUNDLE``
(:func:`verify_bundle`) hashes everything. A manifest that carries ``files`` or
``manifest_sha256`` is checked whatever ``format_version`` it claims (it then needs both), so
lowering the version does not switch the checks off. Version-1 manifests without them (no
``files``, no ``manifest_sha256``, no ``normalizer``) still load, with a logged warning that
nothing could be verified; ``isan verify`` says it cannot verify them.

Format version 3 adds token alphabets (:mod:`isan.tokens`): ``"alphabet"`` is either a list of
one-character strings (characters, as in versions 1-2) or an object ``{"kind": "chars" | "bytes" |
"pairs" | "words", ...}``, and ``"unit"`` names what bits are counted per (char, byte, pair, word).
An ISAN's weights then have K = ``alphabet.K`` inputs and V = ``len(alphabet)`` outputs.

Every malformed manifest (not JSON, deeply nested, huge numbers, a missing key, a wrong type)
is a :class:`~isan.errors.BundleFormatError` whose message says how to rebuild the bundle.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path, PurePosixPath

import numpy as np

from isan.alphabet import Alphabet
from isan.atomic import atomic_directory, write_json_atomic
from isan.errors import AlphabetError, BundleFormatError
from isan.jsonfile import canonical_sha256, file_sha256, is_sha256, read_json
from isan.params import ISAN_TENSORS, ISANParams, expand_inputs, load_tensors, save_tensors, tensors_sha256

BUNDLE_FORMAT = "isan-bundle"
#: the legacy version: manifests without integrity records (still read, and still written by
#: writers that do not call :func:`finalize_manifest`)
BUNDLE_VERSION = 1
#: the version :func:`write_bundle` and :func:`finalize_manifest` write
CURRENT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
#: files up to this size are sha256-checked on every load; larger ones by size (and by `isan verify`)
FAST_HASH_MAX_BYTES = 16 << 20
REBUILD = "re-run `isan export CHECKPOINT_DIR BUNDLE --overwrite` (or restore the bundle from a good copy)"
#: files whose own loader verifies them (with messages that say more than a hash mismatch)
_OWN_LOADER = ("table/", ".onnx")
#: the integrity records: a manifest that carries either is checked whatever format_version it claims
INTEGRITY_FIELDS = ("files", "manifest_sha256")

log = logging.getLogger(__name__)


def has_integrity(manifest: dict) -> bool:
    """Whether a manifest carries integrity records (``files`` or ``manifest_sha256``).

    Such a manifest is checked whatever ``format_version`` it claims: versions 2 and 3 must carry
    them, and a version-1 manifest that carries them was written with them (or edited), so they
    are checked too rather than ignored.
    """
    return any(k in manifest for k in INTEGRITY_FIELDS)


def manifest_sha256(manifest: dict) -> str:
    """The ``manifest_sha256`` of a manifest: canonical JSON of everything but that field."""
    return canonical_sha256({k: v for k, v in manifest.items() if k != "manifest_sha256"})


def _typed(m: dict, mpath: Path, key: str, types, what: str, required: bool = True) -> None:
    if key not in m:
        if required:
            raise BundleFormatError(f"{mpath} lacks the field {key!r}; {REBUILD}")
        return
    v = m[key]
    if not isinstance(v, types) or (isinstance(v, bool) and types is int):
        raise BundleFormatError(f"{mpath}: field {key!r} must be {what}; got {type(v).__name__}; {REBUILD}")


def _check_schema(m, mpath: Path) -> None:
    """Types and ranges of the manifest's fields (BundleFormatError for any violation)."""
    if not isinstance(m, dict):
        raise BundleFormatError(f"{mpath} is not an isan bundle manifest (a JSON object); {REBUILD}")
    if m.get("format") != BUNDLE_FORMAT:
        raise BundleFormatError(f"{mpath} is not an isan bundle manifest (format != {BUNDLE_FORMAT!r}); {REBUILD}")
    v = m.get("format_version")
    if type(v) is not int or v not in READABLE_VERSIONS:
        raise BundleFormatError(
            f"{mpath} has format_version {v!r}; this isan reads versions {', '.join(map(str, READABLE_VERSIONS))}. "
            f"Re-export the checkpoint with this version's `isan export`")
    for key in ("kind", "alphabet", "d", "params_sha256"):
        if key not in m:
            raise BundleFormatError(f"{mpath} lacks the field {key!r}; {REBUILD}")
    _typed(m, mpath, "kind", str, "a string")
    if not 0 < len(m["kind"]) <= 64:
        raise BundleFormatError(f"{mpath}: 'kind' must be a model kind such as \"isan\"; {REBUILD}")
    if v >= 3:
        _typed(m, mpath, "alphabet", (list, dict), "a list of one-character strings or a token alphabet object")
    else:
        _typed(m, mpath, "alphabet", list, "a list of one-character strings")
    _typed(m, mpath, "d", int, "an integer")
    if not 0 <= m["d"] <= 1 << 20:
        raise BundleFormatError(f"{mpath}: d={m['d']} is out of range; {REBUILD}")
    if not is_sha256(m["params_sha256"]):
        raise BundleFormatError(f"{mpath}: 'params_sha256' must be 64 lower-case hex digits; {REBUILD}")
    _typed(m, mpath, "n_params", int, "an integer", required=False)
    for key in ("training", "metrics", "table", "onnx", "model", "normalizer", "files"):
        _typed(m, mpath, key, dict, "a JSON object", required=False)
    alphabet = manifest_alphabet(m, mpath)
    if v >= 2 or has_integrity(m):
        for key in ("files", "manifest_sha256", "normalizer") if v >= 2 else INTEGRITY_FIELDS:
            if key not in m:
                why = "" if v >= 2 else f" (it carries {'files' if key == 'manifest_sha256' else 'manifest_sha256'})"
                raise BundleFormatError(f"{mpath} (format_version {v}) lacks the field {key!r}{why}; {REBUILD}")
        if not is_sha256(m["manifest_sha256"]):
            raise BundleFormatError(f"{mpath}: 'manifest_sha256' must be 64 lower-case hex digits; {REBUILD}")
        for name, rec in m["files"].items():
            if not _safe_relpath(name):
                raise BundleFormatError(f"{mpath} lists the file {name!r}, which is not a plain path inside the "
                                        f"bundle; {REBUILD}")
            if (not isinstance(rec, dict) or set(rec) != {"bytes", "sha256"} or type(rec["bytes"]) is not int
                    or rec["bytes"] < 0 or not is_sha256(rec["sha256"])):
                raise BundleFormatError(f"{mpath}: the record of {name!r} must be {{\"bytes\": int, \"sha256\": hex}}; "
                                        f"{REBUILD}")
    from isan.engine.normalize import from_manifest

    from_manifest({**m, "alphabet": normalizer_view(alphabet)}, str(mpath))  # a known normaliser that fits it


def manifest_alphabet(m: dict, where="manifest.json"):
    """The alphabet a manifest declares: a character :class:`~isan.alphabet.Alphabet` (a list) or a
    token alphabet (:func:`isan.tokens.alphabet_from_json`). Raises BundleFormatError if malformed."""
    from isan.tokens import alphabet_from_json

    try:
        return alphabet_from_json(m["alphabet"])
    except (AlphabetError, TypeError, ValueError) as e:
        raise BundleFormatError(f"{where} has an invalid alphabet: {e}; {REBUILD}") from None


def normalizer_view(alphabet) -> list[str] | None:
    """The characters a normaliser's output must fall in: a character alphabet's symbols, a pair
    alphabet's base symbols; None (no check) for bytes and words."""
    if alphabet.kind == "chars":
        return alphabet.to_list()
    if alphabet.kind == "pairs":
        return alphabet.base.to_list()
    return None


def _safe_relpath(name) -> bool:
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name or len(name) > 255:
        return False
    p = PurePosixPath(name)
    return not p.is_absolute() and all(part not in ("", ".", "..") for part in p.parts) and name == str(p)


def _check_file(bundle: Path, name: str, rec: dict, full: bool) -> str | None:
    """None if the file matches its record, else what is wrong (a phrase)."""
    f = bundle / name
    try:
        st = f.lstat()
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not f.is_file() or f.is_symlink():
        return "is not a regular file"
    if st.st_size != rec["bytes"]:
        return f"has {st.st_size:,} bytes, the manifest records {rec['bytes']:,} (truncated or replaced)"
    if full or st.st_size <= FAST_HASH_MAX_BYTES:
        if file_sha256(f) != rec["sha256"]:
            return "does not match its sha256 in the manifest (corrupt or edited)"
    return None


def read_manifest(path: str | Path, verify: str = "fast") -> dict:
    """Read and validate ``manifest.json`` of a bundle directory.

    Args:
        verify: ``"fast"`` (default: the manifest's own hash, every listed file's size, and the
            sha256 of files up to FAST_HASH_MAX_BYTES; table and ONNX files are left to their
            loaders), ``"full"`` (sha256 of every listed file) or ``"none"`` (schema only).
    Raises:
        BundleFormatError: missing directory or manifest, invalid JSON or schema, wrong format or
            version, an edited manifest, or a file that does not match its record. A manifest
            that carries hashes is checked whatever ``format_version`` it claims; one without them
            (version 1) is read with a logged warning, unless ``verify="none"``.
    """
    if verify not in ("fast", "full", "none"):
        raise ValueError(f"verify must be fast, full or none; got {verify!r}")
    path = Path(path)
    mpath = path / MANIFEST
    if path.exists() and not path.is_dir():
        raise BundleFormatError(
            f"{path} is a file, not a bundle directory: a model bundle is a directory holding {MANIFEST} and "
            "the model's weights (weights.safetensors), made from a training run by `isan export CHECKPOINT_DIR "
            "BUNDLE_DIR`; give the bundle's directory (or no model, for the shipped default)")
    if not path.is_dir():
        raise BundleFormatError(f"bundle directory {path} does not exist; create one with `isan export CHECKPOINT_DIR {path}`")
    if not mpath.is_file():
        raise BundleFormatError(f"{path} is not an isan bundle (no {MANIFEST}); create one with `isan export CHECKPOINT_DIR {path}`")
    m = read_json(mpath, BundleFormatError, REBUILD, what="bundle manifest")
    _check_schema(m, mpath)
    if verify == "none":
        return m
    if not has_integrity(m):
        log.warning("%s (format version %d) records no hashes: the manifest and the files of %s cannot be "
                    "verified; re-export the bundle with `isan export` to add them", mpath, m["format_version"], path)
    else:
        rebuild = rebuild_hint(m, path)
        if manifest_sha256(m) != m["manifest_sha256"]:
            claim = ("" if m["format_version"] >= 2 else f"; it claims format_version {m['format_version']}, but "
                     "a manifest that carries hashes is checked whatever format_version it claims")
            raise BundleFormatError(
                f"{mpath} does not match its manifest_sha256: the manifest was edited or is corrupt (its alphabet, "
                f"d, kind, normaliser or file records cannot be trusted{claim}); {rebuild}")
        for name, rec in m["files"].items():
            if verify == "fast" and (name.startswith(_OWN_LOADER[0]) or name.endswith(_OWN_LOADER[1])):
                continue
            problem = _check_file(path, name, rec, full=verify == "full")
            if problem:
                raise BundleFormatError(f"{path / name} {problem}; {rebuild}")
    return m


def rebuild_hint(manifest: dict, path: str | Path) -> str:
    """The command that rebuilds a bundle of this kind (n-gram bundles are counted, not exported)."""
    if manifest.get("kind") == "ngram":
        return f"rebuild it with `isan train ngram --out {path}` (or restore the bundle from a good copy)"
    return REBUILD


def file_records(directory: str | Path) -> dict[str, dict]:
    """``{relative path: {"bytes", "sha256"}}`` of every regular file under ``directory`` except
    ``manifest.json`` and hidden files or directories (names starting with ``.``)."""
    directory = Path(directory)
    out = {}
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for fn in sorted(files):
            f = Path(root) / fn
            rel = f.relative_to(directory).as_posix()
            if fn.startswith(".") or rel == MANIFEST or not f.is_file() or f.is_symlink():
                continue
            out[rel] = {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
    return dict(sorted(out.items()))


def finalize_manifest(directory: str | Path, manifest: dict) -> dict:
    """Record the integrity fields (format version 2) and write ``manifest.json`` atomically.

    Sets ``format_version`` to :data:`CURRENT_VERSION`, ``normalizer`` (``none`` unless given),
    ``files`` (every file now in ``directory``) and ``manifest_sha256``. Call it last, when every
    other file of the bundle is in place. Returns the manifest written.
    """
    m = {k: v for k, v in manifest.items() if k not in ("files", "manifest_sha256")}
    m["format_version"] = CURRENT_VERSION
    m.setdefault("normalizer", {"name": "none", "version": 1})
    m["files"] = file_records(directory)
    m["manifest_sha256"] = manifest_sha256(m)
    write_json_atomic(Path(directory) / MANIFEST, m)
    return m


def verify_bundle(path: str | Path) -> dict:
    """Check everything a bundle holds, hashing every file (``isan verify``).

    Returns:
        ``{"bundle", "format_version", "ok", "verified", "problems": [str], "checked": {name: "ok" |
        problem}, "unlisted": [names], "table", "onnx"}``; never raises for a damaged bundle (the
        problems are listed), only BundleFormatError when there is no manifest to read at all.
        ``verified`` is False, with a ``warning``, for a manifest that records no hashes (format
        version 1): nothing was found wrong, but the manifest and its files could not be checked.
        A manifest that carries hashes is checked whatever ``format_version`` it claims.
    """
    path = Path(path)
    problems: list[str] = []
    report: dict = {"bundle": str(path), "format_version": None, "ok": False, "verified": False, "problems": problems,
                    "checked": {}, "unlisted": [], "table": None, "onnx": None}
    try:
        m = read_manifest(path, verify="none")
    except BundleFormatError as e:
        problems.append(str(e))
        return report
    report["format_version"] = m["format_version"]
    if not has_integrity(m):
        report["warning"] = (f"format version {m['format_version']}: the manifest records no file hashes, so it and "
                             "its files cannot be verified; re-export the bundle to add them (`isan export`)")
    else:
        report["verified"] = True
        if manifest_sha256(m) != m["manifest_sha256"]:
            problems.append(f"{path / MANIFEST} does not match its manifest_sha256 (edited or corrupt)")
        for name, rec in m["files"].items():
            problem = _check_file(path, name, rec, full=True)
            report["checked"][name] = problem or "ok"
            if problem:
                problems.append(f"{path / name} {problem}")
        listed = set(m["files"])
        report["unlisted"] = [n for n in file_records_names(path) if n not in listed]
        for name in report["unlisted"]:
            problems.append(f"{path / name} is not listed in the manifest (an extra file: remove it, or re-export "
                            "the bundle)")
    if (path / "table").is_dir():
        from isan.errors import TableFormatError
        from isan.trie_tables.format import load_table

        try:
            load_table(path / "table", m["params_sha256"], key_alphabet(manifest_alphabet(m)), m["d"], verify=True)
            report["table"] = "ok"
        except TableFormatError as e:
            report["table"] = str(e)
            problems.append(str(e))
    report["ok"] = not problems
    return report


def file_records_names(directory: Path) -> list[str]:
    """Relative paths of the files :func:`file_records` would list (without hashing them)."""
    out = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for fn in sorted(files):
            rel = (Path(root) / fn).relative_to(directory).as_posix()
            if not fn.startswith(".") and rel != MANIFEST:
                out.append(rel)
    return out


def key_alphabet(alphabet) -> Alphabet:
    """The character alphabet a trie table's keys are written in: a character alphabet itself; for a
    token alphabet, token id i is the character U+E000 + i (Unicode's private use area), so tables,
    their codes and their marisa-trie keys work on tokens unchanged (V <= 6,400)."""
    if alphabet.kind == "chars":
        return alphabet
    V = len(alphabet)
    if V > 6400:
        raise BundleFormatError(f"a token alphabet of {V} symbols is too large for trie tables (at most 6,400)")
    return Alphabet(tuple(chr(0xE000 + i) for i in range(V)))


def table_view(params: ISANParams, alphabet) -> tuple[ISANParams, Alphabet]:
    """(parameters read by output id, the character alphabet of the table's keys): a character
    model as it is; a token model (:mod:`isan.tokens`) with ``W``, ``b`` expanded to its V outputs
    and token i keyed by the private-use character U+E000 + i (:func:`key_alphabet`)."""
    if params.K != len(alphabet):
        params = expand_inputs(params, alphabet.input_map)
    return params, key_alphabet(alphabet)


def load_isan_bundle(path: str | Path, verify: str = "fast") -> tuple[dict, ISANParams, Alphabet]:
    """Load an ISAN bundle: (manifest, float32 parameters, alphabet).

    The parameters are as stored: K = ``alphabet.K`` inputs, V = ``len(alphabet)`` outputs.

    Raises:
        BundleFormatError: anything missing, corrupt, mismatched with the manifest, or not an ISAN.
    """
    path = Path(path)
    m = read_manifest(path, verify=verify)
    if m["kind"] != "isan":
        raise BundleFormatError(f"{path} holds a {m['kind']!r} model, not an ISAN")
    t = load_tensors(path / WEIGHTS)
    params = ISANParams(**{n: t[n] for n in ISAN_TENSORS if n in t}) if all(n in t for n in ISAN_TENSORS) else None
    if params is None:
        raise BundleFormatError(f"{path / WEIGHTS} lacks ISAN tensors; has {sorted(t)}; expected {list(ISAN_TENSORS)}")
    alphabet = manifest_alphabet(m, path / MANIFEST)
    if params.K != alphabet.K or params.V != len(alphabet) or params.d != m["d"]:
        raise BundleFormatError(
            f"{path}: weights have K={params.K}, V={params.V}, d={params.d} but the manifest says "
            f"{alphabet.K} inputs, {len(alphabet)} outputs and d={m['d']}; re-run `isan export`")
    sha = params.sha256()
    if sha != m["params_sha256"]:
        raise BundleFormatError(f"{path}: weights do not match the manifest's params_sha256 (corrupt or edited); re-run `isan export`")
    return m, params, alphabet


def normalizer_decl(normalizer) -> dict:
    """A manifest ``normalizer`` field from a Normalizer, a name/id string or a dict (validated)."""
    from isan.engine.normalize import Normalizer, get_normalizer

    if isinstance(normalizer, Normalizer):
        return normalizer.to_manifest()
    if isinstance(normalizer, str):
        return get_normalizer(normalizer).to_manifest()
    if isinstance(normalizer, dict):
        return get_normalizer(normalizer.get("name"), normalizer.get("version")).to_manifest()
    raise BundleFormatError(f"normalizer must be a name or {{'name', 'version'}}; got {normalizer!r}")


def write_bundle(out_dir: str | Path, tensors: dict[str, np.ndarray], alphabet: Alphabet, kind: str = "isan",
                 training: dict | None = None, metrics: dict | None = None, extra: dict | None = None,
                 files: dict[str, str | Path] | None = None, overwrite: bool = False,
                 hook=None, normalizer=None) -> Path:
    """Write a bundle directory atomically (format version 2, with integrity records).

    Args:
        tensors: float32 arrays by name (ISAN: W, b, W_ro, b_ro, h0).
        files: extra files to copy in, {name in bundle: source path}.
        hook: optional ``hook(tmp_dir, manifest)`` run before the rename (e.g. build a table).
        normalizer: the text normalisation the model expects (``"text8"`` for text8 models; a
            :class:`~isan.engine.normalize.Normalizer`, a name, or ``{"name", "version"}``);
            None: ``"none"`` (raw text).
    Returns:
        the bundle path.
    """
    names = ISAN_TENSORS if kind == "isan" else tuple(sorted(tensors))
    if kind == "isan":
        ISANParams(**{n: tensors[n] for n in ISAN_TENSORS})  # validates shapes and finiteness
    d = int(tensors["W"].shape[1]) if kind == "isan" else int((extra or {}).get("d", 0))
    manifest = {
        "format": BUNDLE_FORMAT, "format_version": CURRENT_VERSION, "kind": kind,
        "alphabet": alphabet.to_list() if alphabet.kind == "chars" else alphabet.to_json(), "d": d,
        "unit": alphabet.unit,
        "params_sha256": tensors_sha256(tensors, names),
        "n_params": int(sum(np.asarray(v).size for v in tensors.values())),
        "normalizer": normalizer_decl(normalizer) if normalizer is not None else {"name": "none", "version": 1},
        "training": training or {}, "metrics": metrics or {},
    }
    manifest.update(extra or {})
    from isan.engine.normalize import from_manifest

    from_manifest({**manifest, "alphabet": normalizer_view(alphabet)},
                  "the bundle being written")  # the normaliser must fit the alphabet
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        save_tensors(tmp / WEIGHTS, tensors, metadata={"format": BUNDLE_FORMAT, "kind": kind})
        for name, src in (files or {}).items():
            shutil.copyfile(src, tmp / name)
        if hook is not None:
            hook(tmp, manifest)
        finalize_manifest(tmp, manifest)
    return Path(out_dir)
