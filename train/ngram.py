"""Counting and writing the character n-gram model (``isan train ngram``): the training side of
:mod:`isan.engine.baselines.ngram`, which holds the model, its scoring and its bundle reader (the
module docstring there defines the smoothing, the codes and the bundle layout).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from isan.engine.baselines.ngram import (COUNTS_FILE, DEFAULT_ORDERS, NGRAM_KIND, SMOOTHING, TRAIN_LOG, KneserNeyModel,
                                       check_ids, bits_per_symbol, max_order, ngram_codes, ngram_sha256)
from isan.errors import IsanError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NGramCounts:
    """Counts of a training text up to ``order``: ``raw[n-1]`` = (codes, counts) of the n-grams,
    ``cont[n-1]`` = (codes, continuation counts N1+(. g)) of the n-grams g, for n < order.
    codes uint64 strictly increasing, counts int64 > 0."""

    K: int
    order: int
    raw: tuple
    cont: tuple
    n_chars: int
    seconds: float = 0.0

    def tables(self, order: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The count tables ``a_n`` of a model of this order: continuation counts below it, raw at it."""
        if not 1 <= order <= self.order:
            raise IsanError(f"these counts go up to order {self.order}; asked for order {order}")
        return [self.cont[n - 1] for n in range(1, order)] + [self.raw[order - 1]]


def count_ngrams(ids: np.ndarray, K: int, order: int) -> NGramCounts:
    """Raw counts of every n-gram (n = 1..order) and continuation counts (n < order) of ``ids``.

    Args:
        ids: (T,) int symbol ids in [0, K).
    Raises:
        IsanError: order outside [1, max_order(K)] or ids outside [0, K).
    """
    if not 1 <= order <= max_order(K):
        raise IsanError(f"order must be in [1, {max_order(K)}] for an alphabet of {K} symbols; got {order}")
    ids = check_ids(ids, K, "train ids")
    t0 = time.perf_counter()
    b = np.uint64(bits_per_symbol(K))
    raw, cont = [], []
    c = None
    for n in range(1, order + 1):
        c = ngram_codes(ids, K, n, c)
        u, k = np.unique(c, return_counts=True)
        raw.append((u, k.astype(np.int64)))
    for n in range(1, order):
        # N1+(. g) for an n-gram g: distinct (n+1)-grams v g; dropping v keeps the low n * b bits
        mask = np.uint64((1 << (int(b) * n)) - 1)
        u, k = np.unique(raw[n][0] & mask, return_counts=True)
        cont.append((u, k.astype(np.int64)))
    return NGramCounts(K, order, tuple(raw), tuple(cont), len(ids), time.perf_counter() - t0)


def fit(train_ids: np.ndarray, K: int, order: int) -> KneserNeyModel:
    """Count ``train_ids`` and build the order-``order`` model.

    Args:
        train_ids: (T,) int ids in [0, K). K: alphabet size. order: N >= 1.
    Raises:
        IsanError: order outside [1, max_order(K)] or ids outside [0, K).
    """
    return KneserNeyModel.from_tables(K, count_ngrams(train_ids, K, order).tables(order))


def choose_order(train: np.ndarray, valid: np.ndarray, orders: Sequence[int] = DEFAULT_ORDERS,
                 K: int | None = None) -> tuple[int, list[dict]]:
    """The order with the lowest valid bpc; counts once to the highest order.

    Args:
        train, valid: (T,) int ids. K: alphabet size (None: 1 + the largest id seen).
    Returns:
        (best order, [{"order", "valid_bpc", "seconds", "n_ngrams"} per order, in the order given]);
        ``seconds`` is the time to build and evaluate that order (counting is shared).
    """
    order, results, _ = _choose(train, valid, orders, K)
    return order, results


def _choose(train, valid, orders, K):
    orders = sorted({int(o) for o in orders})
    if not orders:
        raise IsanError("give at least one order to try")
    if K is None:
        K = int(max(np.max(train), np.max(valid) if len(valid) else 0)) + 1
    valid = check_ids(valid, K, "valid ids")
    if len(valid) == 0:
        raise IsanError("the valid split is empty; the order is chosen on valid bpc")
    counts = count_ngrams(train, K, orders[-1])
    results, best = [], None
    for o in orders:
        t0 = time.perf_counter()
        model = KneserNeyModel.from_tables(K, counts.tables(o))
        bpc = model.bpc(valid)
        results.append({"order": o, "valid_bpc": round(bpc, 6), "seconds": round(time.perf_counter() - t0, 3),
                        "n_ngrams": model.n_ngrams})
        log.info("order %d: valid bpc %.4f", o, bpc)
        if best is None or bpc < best[1]:
            best = (o, bpc, model)
    return best[0], results, (best[2], counts)


def _arrays(model: KneserNeyModel) -> dict[str, np.ndarray]:
    out = {}
    for n, (codes, counts) in enumerate(model.tables, start=1):
        if len(counts) and counts.max() >= 2**32:
            raise IsanError(f"order-{n} counts exceed uint32; this text is too long for the bundle format")
        out[f"codes_{n}"] = np.ascontiguousarray(codes, dtype=np.uint64)
        out[f"counts_{n}"] = np.ascontiguousarray(counts, dtype=np.uint32)
    return out


def save_ngram(model: KneserNeyModel, out_dir: str | Path, alphabet, training: dict | None = None,
               metrics: dict | None = None, files: dict[str, bytes] | None = None, overwrite: bool = False,
               normalizer: dict | None = None) -> Path:
    """Write an n-gram bundle directory atomically (see the module doc for the layout).

    Args:
        alphabet: :class:`isan.alphabet.Alphabet` of K symbols.
        files: extra files {name: bytes} to write into the bundle (e.g. train_log.jsonl).
        normalizer: the text normalisation the model declares (``{"name": "text8", "version": 1}``
            for models counted on text8; default none).
    Raises:
        FileExistsError: ``out_dir`` exists and not ``overwrite``.
        IsanError: the alphabet does not have K symbols.
    """
    from safetensors.numpy import save_file

    from isan.atomic import atomic_directory
    from isan.engine.bundle import BUNDLE_FORMAT, CURRENT_VERSION, finalize_manifest

    if len(alphabet) != model.K:
        raise IsanError(f"the model has K={model.K} symbols but the alphabet has {len(alphabet)}")
    arrays = _arrays(model)
    manifest = {
        "format": BUNDLE_FORMAT, "format_version": CURRENT_VERSION, "kind": NGRAM_KIND,
        "alphabet": alphabet.to_list(), "d": model.order, "params_sha256": ngram_sha256(arrays),
        "n_params": model.n_ngrams,
        "model": {"kind": NGRAM_KIND, "K": model.K, "V": model.K, "order": model.order, "smoothing": SMOOTHING,
                  "discounts": [list(d) for d in model.discounts], "counts_file": COUNTS_FILE},
        "training": training or {}, "metrics": metrics or {},
        "normalizer": normalizer or {"name": "none", "version": 1},
    }
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        save_file(arrays, str(tmp / COUNTS_FILE), metadata={"format": BUNDLE_FORMAT, "kind": NGRAM_KIND})
        for name, data in (files or {}).items():
            (tmp / name).write_bytes(data)
        finalize_manifest(tmp, manifest)  # file hashes and the manifest's own (bundle format 2)
    return Path(out_dir)


# ---- training entry point -----------------------------------------------------------------------
def train_ngram(data: str | Path, out_dir: str | Path, orders: Sequence[int] = DEFAULT_ORDERS,
                dataset: str = "text8", overwrite: bool = False) -> dict:
    """``isan train ngram``: count the train split, choose the order on valid, write the bundle.

    The bundle holds ``train_log.jsonl``: one ``{"event": "order", "order", "valid_bpc",
    "seconds", "n_ngrams"}`` line per order tried, then ``{"event": "done", "order",
    "valid_bpc", "count_seconds", "train_chars", "train_chars_per_s", "n_ngrams"}``
    (``train_chars_per_s``: train characters over the counting time to the highest order).

    Args:
        data: text8 / text8.zip / text8_head.txt (``dataset="text8"``: the text8-10M split) or
            any text file (``dataset="text"``: 90% train, 10% valid).
        orders: the orders to try.
    Returns:
        {"out", "order", "valid_bpc", "orders": [per-order results], "n_ngrams", "train_chars",
        "count_seconds"}.
    Raises:
        FileExistsError: ``out_dir`` exists and not ``overwrite``; IsanError: bad data or orders.
    """
    from isan.train.data import load_corpus

    corpus = load_corpus(data, dataset)
    K = len(corpus.alphabet)
    best, results, (model, counts) = _choose(corpus.train, corpus.valid, orders, K)
    best_bpc = next(r["valid_bpc"] for r in results if r["order"] == best)
    done = {"event": "done", "order": best, "valid_bpc": best_bpc, "count_seconds": round(counts.seconds, 3),
            "train_chars": int(len(corpus.train)),
            "train_chars_per_s": round(len(corpus.train) / max(counts.seconds, 1e-9)), "n_ngrams": model.n_ngrams}
    lines = [json.dumps({"event": "order", **r}) for r in results] + [json.dumps(done)]
    training = {"corpus": corpus.name, "data": str(data), "dataset": dataset,
                "orders_tried": [r["order"] for r in results], "train_chars": int(len(corpus.train)),
                "count_seconds": done["count_seconds"]}
    save_ngram(model, out_dir, corpus.alphabet, training=training, metrics={"valid_bpc": best_bpc},
               files={TRAIN_LOG: ("\n".join(lines) + "\n").encode()}, overwrite=overwrite,
               normalizer={"name": "text8", "version": 1} if dataset == "text8" else None)
    return {"out": str(out_dir), "order": best, "valid_bpc": best_bpc, "orders": results, "n_ngrams": model.n_ngrams,
            "train_chars": int(len(corpus.train)), "count_seconds": done["count_seconds"]}
