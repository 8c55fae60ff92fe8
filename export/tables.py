"""Trie tables for bundles: mine the model's training split, then compose into ``table/``."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from isan.alphabet import Alphabet
from isan.engine.bundle import load_isan_bundle
from isan.engine.data import read_text, read_text8_split
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
    train = (cfg or {}).get("config") or (cfg or {}).get("train") or {}
    return corpus or train.get("data"), dataset or train.get("dataset", "text8")


def _plan(alphabet: Alphabet, params: ISANParams, corpus: str, dataset: str, budget, max_len: int, dtype: str) -> dict:
    """Mine the train split of ``corpus``; the expected match length is measured on its valid split if any."""
    train = corpus_ids(alphabet, corpus, dataset, "train")
    try:
        heldout = corpus_ids(alphabet, corpus, dataset, "valid")
    except IsanError:
        heldout = None
    return plan_table(train, params, alphabet, budget=budget, max_len=max_len, dtype=dtype, heldout_ids=heldout)


def make_table(bundle_tmp: Path, manifest: dict, params: ISANParams, alphabet: Alphabet, corpus: str, dataset: str,
               budget: str = DEFAULT_BUDGET, max_len: int = 12, dtype: str = "float32", mode: str = "full",
               progress_bar: bool = True) -> dict:
    """Mine ``corpus`` and write ``table/`` (mode "full") or only ``table_recipe.json`` (mode "recipe",
    composed into the user's cache on first use) into a bundle directory being written."""
    recipe = _plan(alphabet, params, corpus, dataset, budget, max_len, dtype)
    recipe["corpus"] = {"path": str(corpus), "dataset": dataset, "split": "train"}
    if mode == "recipe":
        write_recipe(bundle_tmp / RECIPE, recipe)
    elif mode == "full":
        build_from_recipe(bundle_tmp / "table", recipe, params, alphabet, manifest["params_sha256"],
                          progress_bar=progress_bar)
    else:
        raise IsanError(f"table mode must be full or recipe; got {mode!r}")
    manifest["table"] = {"mode": mode, "entries": len(recipe["keys"]), "bytes": recipe["expected_bytes"],
                         "dtype": dtype, "max_len": recipe["max_len"], "avg_match_length": recipe["avg_match_length"]}
    return recipe


def dry_run(ckpt_or_bundle: str | Path, corpus: str | None, dataset: str | None, budget: str, max_len: int,
            dtype: str) -> dict:
    """Plan a table without composing it: entries, bytes and the expected average match length."""
    from isan.export.checkpoint import read_checkpoint

    p = Path(ckpt_or_bundle)
    if (p / "manifest.json").exists():
        m, params, alphabet = load_isan_bundle(p)
        cfg = m.get("training", {})
    else:
        cfg, tensors = read_checkpoint(p)
        params = ISANParams(**{n: tensors[n] for n in ("W", "b", "W_ro", "b_ro", "h0")})
        alphabet = Alphabet.from_list(cfg["alphabet"])
    corpus, dataset = table_options_from(cfg, corpus, dataset)
    r = _plan(alphabet, params, corpus, dataset, budget, max_len, dtype)
    return {"entries": len(r["keys"]), "bytes": r["expected_bytes"], "budget_bytes": r["budget_bytes"],
            "dtype": dtype, "max_len": r["max_len"], "expected_avg_match_length": r["avg_match_length"],
            "measured_on": r["avg_match_length_on"], "mining_seconds": r["mining"]["seconds"]}
