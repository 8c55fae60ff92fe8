"""The n-gram model as an ARPA file, the text format KenLM, SRILM and most n-gram tools read.

An interpolated Kneser-Ney model is a backoff model in disguise (Chen & Goodman 1998): for a
context h whose extension h w was seen, ``p(w | h)`` is the interpolated probability; otherwise
``p(w | h) = gamma(h) p(w | h')``. So the ARPA file lists, for every n-gram g stored by the
model (:mod:`isan.engine.baselines.ngram`), ``log10 p(last | rest)`` and, when g is itself a context one
order up, its backoff weight ``log10 gamma(g)``. A backoff reader (:func:`arpa_bits`, KenLM)
then gives the same probabilities as the model, to the 7 decimals written (about 2e-7 bits).

Characters become ARPA words: each symbol stands for itself, except space, written ``_`` (the
paper's notation); :func:`arpa_words` turns a text into the word sequence to query.
``<s>``, ``</s>`` and ``<unk>`` are listed (tools expect them) with log10 probability -99: the
model never predicts them, and texts are scored without a begin-of-sentence context, as isan
scores them (the first characters use the shorter contexts they have).

Example (KenLM's Python module, ``pip install kenlm``)::

    isan export NGRAM_BUNDLE OUT_DIR --arpa        # writes OUT_DIR/model.arpa
    >>> import kenlm
    >>> m = kenlm.Model("OUT_DIR/model.arpa")
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import numpy as np

from isan.errors import IsanError

SPACE_WORD = "_"
SPECIAL = ("<s>", "</s>", "<unk>")
UNSEEN_LOG10 = -99.0


def symbol_words(symbols: Iterable[str]) -> list[str]:
    """The ARPA word of each symbol (space -> ``_``). Raises IsanError if a word would be ambiguous."""
    words = [SPACE_WORD if s == " " else s for s in symbols]
    if len(set(words)) != len(words) or any(not w or w.isspace() or w in SPECIAL for w in words):
        raise IsanError("the alphabet cannot be written as ARPA words (a symbol is whitespace other than "
                        "space, or '_' is a symbol as well as space)")
    return words


def arpa_words(text: str) -> list[str]:
    """The ARPA words of a text (its characters, space as ``_``)."""
    return [SPACE_WORD if c == " " else c for c in text]


def _decode(codes: np.ndarray, n: int, b: int) -> np.ndarray:
    """(M, n) ids of n-gram codes (big-endian, see isan.engine.baselines.ngram)."""
    out = np.empty((len(codes), n), dtype=np.int64)
    mask = np.uint64((1 << b) - 1)
    for j in range(n):
        out[:, j] = ((codes >> np.uint64(b * (n - 1 - j))) & mask).astype(np.int64) - 1
    return out


def arpa_sections(model) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Per order n: (ids (M, n), log10 p (M,), log10 backoff (M,) or None at the top order).

    Every stored n-gram is listed, plus any context an n-gram needs that the model did not
    store (the text's first characters), with the model's own probability, so a backoff reader
    finds each context and gives the model's distribution.
    """
    from isan.engine.baselines.ngram import bits_per_symbol

    K, N = model.K, model.order
    b = bits_per_symbol(K)
    codes_by_order = [np.asarray(c, dtype=np.uint64) for c, _ in model.tables]
    all_unigrams = np.arange(1, K + 1, dtype=np.uint64)
    codes_by_order[0] = np.union1d(codes_by_order[0], all_unigrams)
    for n in range(N, 1, -1):  # add missing contexts, top down
        ctx = np.unique(codes_by_order[n - 1] >> np.uint64(b))
        codes_by_order[n - 2] = np.union1d(codes_by_order[n - 2], ctx)
    out = []
    for n in range(1, N + 1):
        codes = codes_by_order[n - 1]
        ids = _decode(codes, n, b)
        hist = np.full((len(codes), N - 1), -1, dtype=np.int64)
        if n > 1:
            hist[:, N - n :] = ids[:, :-1]
        p = model.prob(hist, ids[:, -1])
        logp = np.log10(p)
        backoff = None
        if n < N:
            o = model._orders[n]  # contexts of order n + 1 are n-grams
            i = np.minimum(np.searchsorted(o.ctx, codes), max(len(o.ctx) - 1, 0))
            seen = (o.ctx[i] == codes) if len(o.ctx) else np.zeros(len(codes), dtype=bool)
            backoff = np.zeros(len(codes))
            backoff[seen] = np.log10(o.gamma_num[i[seen]] / o.S[i[seen]])
        out.append((ids, logp, backoff))
    return out


def write_arpa(model, alphabet, path: str | Path) -> dict:
    """Write ``model`` (a :class:`~isan.engine.baselines.ngram.KneserNeyModel`) as an ARPA file, atomically.

    Returns:
        {"path", "order", "ngrams": [count per order], "bytes"}.
    Raises:
        IsanError: the alphabet cannot be written as ARPA words.
    """
    from isan.atomic import atomic_path

    words = np.array(symbol_words(alphabet.symbols), dtype=object)
    sections = arpa_sections(model)
    counts = [len(s[1]) + (len(SPECIAL) if n == 0 else 0) for n, s in enumerate(sections)]
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("\\data\\\n")
        for n, c in enumerate(counts, start=1):
            f.write(f"ngram {n}={c}\n")
        for n, (ids, logp, backoff) in enumerate(sections, start=1):
            f.write(f"\n\\{n}-grams:\n")
            if n == 1:
                f.write(f"{UNSEEN_LOG10:.7f}\t<s>\t0.0000000\n" if model.order > 1 else f"{UNSEEN_LOG10:.7f}\t<s>\n")
                f.write(f"{UNSEEN_LOG10:.7f}\t</s>\n{UNSEEN_LOG10:.7f}\t<unk>\n")
            grams = [" ".join(row) for row in words[ids]]
            if backoff is None:
                f.writelines(f"{lp:.7f}\t{g}\n" for lp, g in zip(logp.tolist(), grams))
            else:
                f.writelines(f"{lp:.7f}\t{g}\t{bo:.7f}\n" for lp, g, bo in zip(logp.tolist(), grams, backoff.tolist()))
        f.write("\n\\end\\\n")
    return {"path": str(path), "order": model.order, "ngrams": counts, "bytes": Path(path).stat().st_size}


def read_arpa(path: str | Path) -> tuple[int, dict[tuple[str, ...], tuple[float, float]]]:
    """(order, {n-gram words: (log10 p, log10 backoff)}) of an ARPA file (plain Python; for tests)."""
    table: dict[tuple[str, ...], tuple[float, float]] = {}
    order = 0
    section = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith("\\"):
                if line.endswith("-grams:"):
                    section = int(line[1:].split("-")[0])
                    order = max(order, section)
                continue
            if section == 0:
                continue
            parts = line.split("\t")
            gram = tuple(parts[1].split(" "))
            if len(gram) != section:
                raise IsanError(f"{path}: {parts[1]!r} in the {section}-grams section")
            table[gram] = (float(parts[0]), float(parts[2]) if len(parts) > 2 else 0.0)
    return order, table


def arpa_bits(order: int, table: dict, words: list[str]) -> np.ndarray:
    """Bits of each word under the backoff model of an ARPA table, with no begin-of-sentence
    context (the standard backoff recursion: p(w | h) = p(h w) if listed, else bo(h) p(w | h'))."""
    out = np.empty(len(words))
    for t, w in enumerate(words):
        ctx = tuple(words[max(0, t - order + 1) : t])
        log10p = 0.0
        while True:
            hit = table.get(ctx + (w,))
            if hit is not None:
                log10p += hit[0]
                break
            if not ctx:
                log10p += UNSEEN_LOG10
                break
            log10p += table.get(ctx, (0.0, 0.0))[1]
            ctx = ctx[1:]
        out[t] = -log10p * math.log2(10.0)
    return out
