"""Model paths: the shipped models' bundle directories and a bundle's trie table.

Imports only the root, the bundle reader and the trie tables (never the Engine).
"""

from __future__ import annotations

from pathlib import Path

import isan.errors as isan_errors
from isan.alphabet import Alphabet
from isan.errors import TableFormatError
from isan.params import ISANParams

DEFAULT_MODEL = "text8-d216-distil"
#: the model of the paper's analyses (results/paper): the first default, trained without a stability certificate
PAPER_MODEL = "text8-d216-unconstrained"


def default_model_path() -> Path:
    """Path of the default model bundle shipped inside the package (``isan/models/``).

    Found beside :mod:`isan.errors`, not through ``isan.__file__``: run from the parent of a
    checkout named ``isan`` with the editable install, ``isan`` itself is imported as a namespace
    package of the checkout's root, while its modules still come from the package folder.
    """
    return Path(isan_errors.__file__).resolve().parent / "models" / DEFAULT_MODEL


def paper_model_path() -> Path:
    """Path of the model the paper's analyses (``isan analyze``, results/paper) were made with."""
    return default_model_path().parent / PAPER_MODEL


def find_table(bundle: Path, manifest: dict, params: ISANParams, alphabet: Alphabet, progress_bar: bool = True):
    """The bundle's trie table: ``table/`` inside it, or its ``table_recipe.json`` composed into the
    cache on first use; None if it has neither. A broken table raises, never silently falls back."""
    from isan.trie_tables.build import RECIPE, cached_table
    from isan.trie_tables.format import load_table

    from isan.engine.bundle import table_view

    sha = manifest["params_sha256"]
    params, keys = table_view(params, alphabet)  # tables are keyed by output ids (tokens: private-use characters)
    if (bundle / "table").exists():
        return load_table(bundle / "table", sha, keys, params.d)
    if (bundle / RECIPE).exists():
        return cached_table(bundle / RECIPE, params, keys, sha, progress_bar=progress_bar)
    mode = (manifest.get("table") or {}).get("mode")
    if mode in ("full", "recipe"):  # the manifest promises a table that is not there
        where = bundle / ("table" if mode == "full" else RECIPE)
        raise TableFormatError(f"{where} is missing, but {bundle / 'manifest.json'} lists a {mode} table; rebuild it "
                               f"with `isan table build --model {bundle} --table-mode {mode}`, or score without it "
                               "with --path chunked")
    return None
