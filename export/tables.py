"""Trie tables for bundles: mine the model's training split, then compose into ``table/``.

Where the mining corpus is found (:func:`resolve_corpus`): a path the user gives
(``--table-corpus``, relative to the working directory); else the corpus recorded in the
bundle's manifest (``table.corpus.path``, relative to the bundle directory, written by
``isan export``); else the training data of the model's training config (an absolute path as
is; a relative one against the bundle directory). So ``isan table build --model BUNDLE`` works
from any directory.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from isan.alphabet import Alphabet
from isan.tokens import alphabet_from_json
from isan.engine.bundle import table_view
from isan.engine.bundle import load_isan_bundle
from isan.data import read_text, read_text8_split
from isan.errors import IsanError
from isan.params import ISANParams
from isan.trie_tables.build import DEFAULT_BUDGET, RECIPE, build_from_recipe, plan_table, write_recipe

log = logging.getLogger(__name__)


def corpus_ids(alphabet: Alphabet, data: str | Path, dataset: str = "text8", split: str = "train") -> np.ndarray:
    """Encode the mining corpus: a text8-10M split, or the 90/10 split of any text file."""
    data = Path(data)
    if not data.exists():
        raise IsanError(f"the table corpus {data} does not exist; pass --table-corpus PATH, or --no-table")
    if dataset == "text8":
        text = read_text8_split(data, split)
    else:
        text = read_text(data)
        cut = int(len(text) * 0.9)
        text = text[:cut] if split == "train" else text[cut:]
    return alphabet.encode(text, unknown="skip")


def table_options_from(cfg: dict, corpus: str | None, dataset: str | None) -> tuple[str, str]:
    """(corpus, dataset) from a training config (checkpoint ``config.json`` or a manifest's
    ``training``), unless given; the corpus path is as recorded (see :func:`resolve_corpus`)."""
    cfg = cfg if isinstance(cfg, dict) else {}
    train = cfg.get("config") or cfg.get("train") or {}
    train = train if isinstance(train, dict) else {}
    return corpus or train.get("data"), dataset or train.get("dataset", "text8")


def resolve_corpus(bundle: str | Path, manifest: dict, corpus: str | None = None,
                   dataset: str | None = None) -> tuple[Path, str]:
    """The mining corpus of a bundle and how to split it (see the module docstring).

    Raises:
        IsanError: no corpus is recorded, or the recorded one does not exist (the message says
            to pass --table-corpus).
    """
    bundle = Path(bundle)
    if corpus is not None:
        return Path(corpus), dataset or _recorded_dataset(manifest) or "text8"
    rec = (manifest.get("table") or {}).get("corpus") if isinstance(manifest.get("table"), dict) else None
    if isinstance(rec, dict) and isinstance(rec.get("path"), str):
        p = Path(rec["path"])
        p = p if p.is_absolute() else bundle / p
        if not p.exists():
            raise IsanError(f"the table corpus recorded in {bundle}/manifest.json ({rec['path']}, relative to the "
                            f"bundle) does not exist: pass --table-corpus PATH")
        return p, dataset or rec.get("dataset") or "text8"
    data, ds = table_options_from(manifest.get("training", {}), None, dataset)
    if not isinstance(data, str):
        raise IsanError(f"{bundle}/manifest.json records no training corpus: pass --table-corpus PATH")
    p = Path(data)
    if not p.is_absolute():
        p = bundle / p
    if not p.exists():
        raise IsanError(f"the training corpus {data!r} recorded in {bundle}/manifest.json is not found relative to "
                        f"the bundle ({p}): pass --table-corpus PATH")
    return p, ds


def _recorded_dataset(manifest: dict) -> str | None:
    t = manifest.get("table") if isinstance(manifest.get("table"), dict) else {}
    rec = t.get("corpus") if isinstance(t.get("corpus"), dict) else {}
    return rec.get("dataset") or table_options_from(manifest.get("training", {}), None, None)[1]


def corpus_record(corpus: str | Path, dataset: str, bundle_dir: str | Path) -> dict:
    """The manifest's ``table.corpus``: the path relative to the bundle (absolute if on another drive)."""
    c = Path(corpus).resolve()
    try:
        rel = os.path.relpath(c, Path(bundle_dir).resolve())
    except ValueError:  # another drive (Windows)
        rel = str(c)
    return {"path": Path(rel).as_posix(), "dataset": dataset, "split": "train"}


def _plan(alphabet, params: ISANParams, corpus: str, dataset: str, budget, max_len: int, dtype: str) -> dict:
    """Mine the train split of ``corpus``; the expected match length is measured on its valid split if any."""
    train = corpus_ids(alphabet, corpus, dataset, "train")
    try:
        heldout = corpus_ids(alphabet, corpus, dataset, "valid")
    except IsanError:
        heldout = None
    tparams, keys = table_view(params, alphabet)
    return plan_table(train, tparams, keys, budget=budget, max_len=max_len, dtype=dtype, heldout_ids=heldout)


def make_table(bundle_tmp: Path, manifest: dict, params: ISANParams, alphabet: Alphabet, corpus: str, dataset: str,
               budget: str = DEFAULT_BUDGET, max_len: int = 12, dtype: str = "float32", mode: str = "full",
               progress_bar: bool = True) -> dict:
    """Mine ``corpus`` and write ``table/`` (mode "full") or only ``table_recipe.json`` (mode "recipe",
    composed into the user's cache on first use) into a bundle directory being written."""
    recipe = _plan(alphabet, params, corpus, dataset, budget, max_len, dtype)
    recipe["corpus"] = corpus_record(corpus, dataset, bundle_tmp)  # bundle_tmp is a sibling of the bundle
    if mode == "recipe":
        write_recipe(bundle_tmp / RECIPE, recipe)
    elif mode == "full":
        build_from_recipe(bundle_tmp / "table", recipe, *table_view(params, alphabet), manifest["params_sha256"],
                          progress_bar=progress_bar)
    else:
        raise IsanError(f"table mode must be full or recipe; got {mode!r}")
    manifest["table"] = {"mode": mode, "entries": len(recipe["keys"]), "bytes": recipe["expected_bytes"],
                         "dtype": dtype, "max_len": recipe["max_len"], "avg_match_length": recipe["avg_match_length"],
                         "corpus": recipe["corpus"]}
    return recipe


def build_bundle_table(bundle: str | Path, corpus: str | None = None, dataset: str | None = None,
                       budget: str = DEFAULT_BUDGET, max_len: int = 12, dtype: str = "float32",
                       overwrite: bool = False, progress_bar: bool = True, mode: str = "full") -> dict:
    """``isan table build``: mine the bundle's corpus and write ``BUNDLE/table`` atomically (or,
    with ``mode="recipe"``, only ``BUNDLE/table_recipe.json``: the chosen keys, composed into the
    user cache on first use); the manifest's ``table`` section (and, when it carries hashes, its
    file records) follow.

    Returns:
        {"table", "entries", "bytes", "corpus"}.
    Raises:
        BundleFormatError, IsanError (no corpus), FileExistsError (a table exists, no overwrite).
    """
    from isan.engine.bundle import finalize_manifest, has_integrity
    from isan.trie_tables.format import build_table

    import shutil

    from isan.trie_tables.build import RECIPE, write_recipe

    if mode not in ("full", "recipe"):
        raise IsanError(f"table mode must be full or recipe; got {mode!r}")
    bundle = Path(bundle)
    m, params, alphabet = load_isan_bundle(bundle)
    path, ds = resolve_corpus(bundle, m, corpus, dataset)
    target = bundle / ("table" if mode == "full" else RECIPE)
    if ((bundle / "table").exists() or (bundle / RECIPE).exists()) and not overwrite:
        raise FileExistsError(f"{bundle} already has a table or a table recipe; pass --overwrite to replace it")
    recipe = _plan(alphabet, params, str(path), ds, budget, max_len, dtype)
    rec = corpus_record(path, ds, bundle)
    info = {k: recipe.get(k) for k in ("budget_bytes", "avg_match_length", "avg_match_length_on", "mining")}
    info["corpus"] = rec
    if mode == "full":
        out = build_table(target, *table_view(params, alphabet), recipe["keys"], m["params_sha256"], dtype=dtype,
                          max_len=recipe["max_len"], build_info=info, overwrite=overwrite, progress_bar=progress_bar)
        (bundle / RECIPE).unlink(missing_ok=True)
    else:
        write_recipe(target, recipe)
        out = target
        shutil.rmtree(bundle / "table", ignore_errors=True)
    m["table"] = {"mode": mode, "entries": len(recipe["keys"]), "bytes": recipe["expected_bytes"], "dtype": dtype,
                  "max_len": recipe["max_len"], "avg_match_length": recipe["avg_match_length"], "corpus": rec}
    if has_integrity(m):  # its hashes are checked whatever version it claims: they must follow
        finalize_manifest(bundle, m)
    return {"table": str(out), "entries": len(recipe["keys"]), "bytes": recipe["expected_bytes"], "corpus": rec}


def dry_run(ckpt_or_bundle: str | Path, corpus: str | None, dataset: str | None, budget: str, max_len: int,
            dtype: str) -> dict:
    """Plan a table without composing it: entries, bytes and the expected average match length."""
    from isan.export.runs import read_checkpoint

    p = Path(ckpt_or_bundle)
    if (p / "manifest.json").exists():
        m, params, alphabet = load_isan_bundle(p)
        path, dataset = resolve_corpus(p, m, corpus, dataset)
        corpus = str(path)
    else:
        cfg, tensors = read_checkpoint(p)
        params = ISANParams(**{n: tensors[n] for n in ("W", "b", "W_ro", "b_ro", "h0")})
        alphabet = alphabet_from_json(cfg["alphabet"])
        corpus, dataset = table_options_from(cfg, corpus, dataset)
    r = _plan(alphabet, params, corpus, dataset, budget, max_len, dtype)
    return {"entries": len(r["keys"]), "bytes": r["expected_bytes"], "budget_bytes": r["budget_bytes"],
            "dtype": dtype, "max_len": r["max_len"], "expected_avg_match_length": r["avg_match_length"],
            "measured_on": r["avg_match_length_on"], "mining_seconds": r["mining"]["seconds"]}
