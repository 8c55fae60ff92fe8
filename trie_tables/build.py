"""Planning and building tables: mining a corpus, recipes, and the on-first-use cache.

* :func:`plan_table` mines a corpus and chooses entries within a byte budget (a dry run
  reports its size and expected average match length without composing anything).
* A *recipe* (``table_recipe.json``: the chosen keys and options) is small enough to ship
  inside a package; :func:`cached_table` composes it on first use (seconds) into a cache
  directory (``$ISAN_CACHE_DIR`` or ``~/.cache/isan``) and loads it from there afterwards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from isan.alphabet import Alphabet
from isan.atomic import write_json_atomic
from isan.errors import TableFormatError
from isan.jsonfile import read_json
from isan.params import ISANParams
from isan.trie_tables.codes import decode_code, max_code_length
from isan.trie_tables.format import DTYPES, Table, build_table, load_table
from isan.trie_tables.mining import parse_bytes, select_entries

log = logging.getLogger(__name__)

RECIPE = "table_recipe.json"
#: Chosen by `isan bench budgets`: a table that stays in the caches beats longer matches read from memory.
DEFAULT_BUDGET = "16MB"


def plan_table(corpus_ids: np.ndarray, params: ISANParams, alphabet: Alphabet, budget: str | int = DEFAULT_BUDGET,
               max_len: int = 12, dtype: str = "float32", heldout_ids: np.ndarray | None = None,
               min_count: int = 20) -> dict:
    """Choose table keys for a model from a corpus. Returns a recipe dict (keys, options, expected stats)."""
    if dtype not in DTYPES:
        raise TableFormatError(f"table dtype must be float32 or float16; got {dtype!r}")
    max_len = min(max_len, max_code_length(params.K))
    t0 = time.perf_counter()
    sel = select_entries(corpus_ids, params.K, params.V, params.d, parse_bytes(budget), max_len=max_len,
                         min_count=min_count, itemsize=np.dtype(DTYPES[dtype]).itemsize, heldout=heldout_ids)
    keys = [alphabet.decode(decode_code(int(c), params.K)) for c in sel.codes]
    return {
        "format": "isan-table-recipe", "format_version": 1, "keys": keys, "dtype": dtype, "max_len": max_len,
        "budget_bytes": parse_bytes(budget), "expected_bytes": sel.bytes,
        "avg_match_length": round(sel.avg_match_length, 4),
        "avg_match_length_on": "held-out text" if heldout_ids is not None else "the mining corpus",
        "mining": {"corpus_chars": int(len(corpus_ids)), "candidates": sel.n_candidates, "min_count": min_count,
                   "seconds": round(time.perf_counter() - t0, 2)},
    }


def build_from_recipe(out_dir: str | Path, recipe: dict, params: ISANParams, alphabet: Alphabet, params_sha256: str,
                      overwrite: bool = False, progress_bar: bool = False) -> Path:
    info = {k: recipe.get(k) for k in ("budget_bytes", "avg_match_length", "avg_match_length_on", "mining")}
    return build_table(out_dir, params, alphabet, recipe["keys"], params_sha256, dtype=recipe.get("dtype", "float32"),
                       max_len=recipe.get("max_len"), build_info=info, overwrite=overwrite, progress_bar=progress_bar)


def read_recipe(path: str | Path) -> dict:
    """Read and validate a ``table_recipe.json``.

    Raises:
        TableFormatError: missing, not JSON, hostile content, another format or version, or a
            missing or mistyped field; the message names the command that rebuilds it.
    """
    fix = ("re-create it with `isan export CHECKPOINT_DIR BUNDLE --table-mode recipe --overwrite`, "
           "or reinstall isan for the shipped model")
    r = read_json(path, TableFormatError, fix, what="table recipe")
    if not isinstance(r, dict) or r.get("format") != "isan-table-recipe" or r.get("format_version") != 1:
        raise TableFormatError(f"{path} is not a version-1 table recipe; {fix}")
    keys = r.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise TableFormatError(f"{path}: 'keys' must be a list of non-empty strings; {fix}")
    if not isinstance(r.get("dtype", "float32"), str) or r.get("dtype", "float32") not in DTYPES:
        raise TableFormatError(f"{path}: 'dtype' must be float32 or float16; got {r.get('dtype')!r}; {fix}")
    ml = r.get("max_len")
    if ml is not None and (type(ml) is not int or not 1 <= ml <= 63):
        raise TableFormatError(f"{path}: 'max_len' must be an integer in [1, 63]; got {ml!r}; {fix}")
    return r


def write_recipe(path: str | Path, recipe: dict) -> None:
    write_json_atomic(path, recipe)


def cache_dir() -> Path:
    return Path(os.environ.get("ISAN_CACHE_DIR") or Path.home() / ".cache" / "isan")


def cached_table(recipe_path: str | Path, params: ISANParams, alphabet: Alphabet, params_sha256: str,
                 progress_bar: bool = True) -> Table:
    """Load the table of a recipe from the cache, composing it first if needed (atomic).

    A cached table that is unusable (corrupt, truncated, another version) is rebuilt, with a
    warning; leftover partial builds beside it are removed by the next build.
    """
    recipe = read_recipe(recipe_path)
    key = hashlib.sha256(json.dumps([params_sha256, recipe["keys"], recipe.get("dtype")]).encode()).hexdigest()[:20]
    path = cache_dir() / "tables" / key
    rebuild = f"it is rebuilt automatically: delete {path} and run the command again"
    if (path / "header.json").exists():
        try:
            return load_table(path, params_sha256, alphabet, params.d, rebuild=rebuild)
        except TableFormatError as e:
            log.warning("cached table %s is unusable (%s); rebuilding it", path, e)
    log.info("composing the table for %s into %s", recipe_path, path)
    build_from_recipe(path, recipe, params, alphabet, params_sha256, overwrite=True, progress_bar=progress_bar)
    return load_table(path, params_sha256, alphabet, params.d, rebuild=rebuild)
