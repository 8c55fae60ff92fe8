"""The bundle directory (format version 1; DESIGN.md section 3).

A bundle is a directory with ``manifest.json`` and ``weights.safetensors`` (float32 ``W``,
``b``, ``W_ro``, ``b_ro``, ``h0`` for an ISAN), optionally ``table/`` (trie_tables) and
``model.onnx``/``sequence.onnx``. Bundles are written into a temporary directory and renamed
when complete, so an interrupted export leaves nothing that loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from isan.alphabet import Alphabet
from isan.atomic import atomic_directory, write_json_atomic
from isan.errors import AlphabetError, BundleFormatError
from isan.params import ISAN_TENSORS, ISANParams, load_tensors, save_tensors, tensors_sha256

BUNDLE_FORMAT = "isan-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"


def read_manifest(path: str | Path) -> dict:
    """Read and validate ``manifest.json`` of a bundle directory.

    Raises:
        BundleFormatError: missing directory or manifest, invalid JSON, wrong format or version.
    """
    path = Path(path)
    mpath = path / MANIFEST
    if not path.is_dir():
        raise BundleFormatError(f"bundle directory {path} does not exist; create one with `isan export CHECKPOINT_DIR {path}`")
    if not mpath.is_file():
        raise BundleFormatError(f"{path} is not an isan bundle (no {MANIFEST}); create one with `isan export CHECKPOINT_DIR {path}`")
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleFormatError(f"{mpath} is not valid JSON ({e}); re-run `isan export`") from None
    if not isinstance(m, dict) or m.get("format") != BUNDLE_FORMAT:
        raise BundleFormatError(f"{mpath} is not an isan bundle manifest (format != {BUNDLE_FORMAT!r})")
    if m.get("format_version") != BUNDLE_VERSION:
        raise BundleFormatError(
            f"{mpath} has format_version {m.get('format_version')!r}; this isan reads version {BUNDLE_VERSION}. "
            f"Re-export the checkpoint with this version's `isan export`")
    for key in ("kind", "alphabet", "d", "params_sha256"):
        if key not in m:
            raise BundleFormatError(f"{mpath} lacks the field {key!r}; re-run `isan export`")
    try:
        Alphabet.from_list(m["alphabet"])
    except (AlphabetError, TypeError) as e:
        raise BundleFormatError(f"{mpath} has an invalid alphabet: {e}") from None
    return m


def load_isan_bundle(path: str | Path) -> tuple[dict, ISANParams, Alphabet]:
    """Load an ISAN bundle: (manifest, float32 parameters, alphabet).

    Raises:
        BundleFormatError: anything missing, corrupt, mismatched with the manifest, or not an ISAN.
    """
    path = Path(path)
    m = read_manifest(path)
    if m["kind"] != "isan":
        raise BundleFormatError(f"{path} holds a {m['kind']!r} model, not an ISAN")
    t = load_tensors(path / WEIGHTS)
    params = ISANParams(**{n: t[n] for n in ISAN_TENSORS if n in t}) if all(n in t for n in ISAN_TENSORS) else None
    if params is None:
        raise BundleFormatError(f"{path / WEIGHTS} lacks ISAN tensors; has {sorted(t)}; expected {list(ISAN_TENSORS)}")
    alphabet = Alphabet.from_list(m["alphabet"])
    if params.K != len(alphabet) or params.V != len(alphabet) or params.d != m["d"]:
        raise BundleFormatError(
            f"{path}: weights have K={params.K}, V={params.V}, d={params.d} but the manifest says "
            f"{len(alphabet)} symbols and d={m['d']}; re-run `isan export`")
    sha = params.sha256()
    if sha != m["params_sha256"]:
        raise BundleFormatError(f"{path}: weights do not match the manifest's params_sha256 (corrupt or edited); re-run `isan export`")
    return m, params, alphabet


def write_bundle(out_dir: str | Path, tensors: dict[str, np.ndarray], alphabet: Alphabet, kind: str = "isan",
                 training: dict | None = None, metrics: dict | None = None, extra: dict | None = None,
                 files: dict[str, str | Path] | None = None, overwrite: bool = False,
                 hook=None) -> Path:
    """Write a bundle directory atomically.

    Args:
        tensors: float32 arrays by name (ISAN: W, b, W_ro, b_ro, h0).
        files: extra files to copy in, {name in bundle: source path}.
        hook: optional ``hook(tmp_dir, manifest)`` run before the rename (e.g. build a table).
    Returns:
        the bundle path.
    """
    names = ISAN_TENSORS if kind == "isan" else tuple(sorted(tensors))
    if kind == "isan":
        ISANParams(**{n: tensors[n] for n in ISAN_TENSORS})  # validates shapes and finiteness
    d = int(tensors["W"].shape[1]) if kind == "isan" else int((extra or {}).get("d", 0))
    manifest = {
        "format": BUNDLE_FORMAT, "format_version": BUNDLE_VERSION, "kind": kind,
        "alphabet": alphabet.to_list(), "d": d,
        "params_sha256": tensors_sha256(tensors, names),
        "n_params": int(sum(np.asarray(v).size for v in tensors.values())),
        "training": training or {}, "metrics": metrics or {},
    }
    manifest.update(extra or {})
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        save_tensors(tmp / WEIGHTS, tensors, metadata={"format": BUNDLE_FORMAT, "kind": kind})
        for name, src in (files or {}).items():
            shutil.copyfile(src, tmp / name)
        if hook is not None:
            hook(tmp, manifest)
        write_json_atomic(tmp / MANIFEST, manifest)
    return Path(out_dir)
