"""What the server knows of a model before (and apart from) loading it: :class:`ModelInfo` (its
alphabet for the request models, the length of its state for snapshots, its identity from the
bundle's manifest) and :func:`public_describe` (``engine.describe()`` without absolute paths).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelInfo:
    """What the app needs of a model before it is loaded: its alphabet (the request models), the
    length of its state (snapshots) and its identity (from the bundle's manifest)."""

    symbols: tuple[str, ...]
    state_size: int
    params_sha256: str
    describe: dict
    #: the name of the normaliser ``"normalize": "auto"`` uses (None: not known)
    normalizer: str | None = None
    #: whether the symbols are the text's characters (a State's ``last_symbol``, the last character
    #: read, is then one of them; pairs, words and bytes models read other units)
    reads_chars: bool = False

    @property
    def raw_normalize(self) -> tuple[str, ...]:
        """The values of ``normalize`` that read a text as it is (the identity normaliser)."""
        return ("none", "none-v1") + (("auto",) if self.normalizer == "none" else ())

    @classmethod
    def of_engine(cls, engine) -> "ModelInfo":
        sha = getattr(engine, "params_sha256", None)
        if not sha:  # engines without one: a stable id of what they serve
            sha = hashlib.sha256(json.dumps(engine.describe(), sort_keys=True, default=str).encode()).hexdigest()
        norm = getattr(getattr(engine, "normalizer", None), "name", None)
        return cls(tuple(engine.alphabet.symbols), len(engine.initial_state().h), sha, public_describe(engine.describe()),
                   norm if isinstance(norm, str) else None, getattr(engine.alphabet, "kind", None) == "chars")

    @classmethod
    def of_manifest(cls, manifest: dict, source: str | None) -> "ModelInfo":
        from isan.engine.bundle import manifest_alphabet
        from isan.tokens import alphabet_label

        alphabet = manifest_alphabet(manifest)
        symbols = tuple(alphabet.symbols)
        d = int(manifest.get("d") or 0)
        desc = {"kind": manifest.get("kind"), "d": d,
                "alphabet": alphabet_label(alphabet),
                "params_sha256": manifest.get("params_sha256"), "source": source}
        decl = manifest.get("normalizer", {"name": "none"})
        norm = decl.get("name") if isinstance(decl, dict) else None
        return cls(symbols, d, manifest.get("params_sha256") or "", public_describe(desc),
                   norm if isinstance(norm, str) else None, getattr(alphabet, "kind", None) == "chars")


def public_describe(desc: dict) -> dict:
    """``engine.describe()`` without absolute paths: the model is named by its directory's name and
    the table by its size (a health check must not tell the server's file layout)."""
    out = dict(desc)
    src = out.get("source")
    if src:
        out["source"] = Path(str(src)).name
    table = out.get("table")
    if isinstance(table, dict):
        out["table"] = {k: v for k, v in table.items() if k != "path"}
    for k, v in list(out.items()):
        if isinstance(v, str) and (v.startswith("/") or (len(v) > 2 and v[1] == ":" and v[2] in "\\/")):
            out[k] = Path(v).name
    return out
