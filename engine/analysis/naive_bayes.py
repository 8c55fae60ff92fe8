"""The Naive Bayes control of Table 1's discussion (issue #26).

Foerster et al. (ICML 2017, Sec 3.1; Sec 4.1 of the ICLR 2017 workshop version): the fully linear
network "achieves a cross-entropy of 3.1 bits / char, independent of network size. This perplexity is
only slightly better than that of a Naive Bayes model on the task, at 3.3 bits / char. The output
probability of the fully linear network is a product of contributions from each previous character, as
in Naive Bayes."

The paper does not define its Naive Bayes model (which previous characters, how smoothed). We read it as
the classifier of the next character x_t from the previous k characters as independent features, each
with its own lag::

    P(x_t = a | x_{t-1}, ..., x_{t-k})  ∝  P(a) * prod_{j=1..k} P(x_{t-j} | x_t = a, lag j)

with the lag-j conditionals counted on the training split and add-``alpha`` smoothing. At k = 1 it is
the bigram model exactly; past that the product over-counts evidence, which is what makes it naive. The
result is reported for every k up to ``max_window``; numpy only.
"""

from __future__ import annotations

import math

import numpy as np

LOG2E = 1.0 / math.log(2.0)


def lag_tables(train_ids: np.ndarray, V: int, max_window: int, alpha: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """(log P(a) (V,), log P(c at lag j | a) (max_window, V [a], V [c])) from the training stream."""
    ids = np.asarray(train_ids, dtype=np.int64)
    uni = np.bincount(ids, minlength=V).astype(np.float64) + alpha
    log_prior = np.log(uni / uni.sum())
    tabs = np.empty((max_window, V, V))
    for j in range(1, max_window + 1):
        C = np.bincount(ids[j:] * V + ids[:-j], minlength=V * V).reshape(V, V).astype(np.float64) + alpha
        tabs[j - 1] = np.log(C / C.sum(1, keepdims=True))
    return log_prior, tabs


def naive_bayes_bits(train_ids: np.ndarray, test_ids: np.ndarray, V: int, max_window: int = 10,
                     alpha: float = 0.5) -> dict:
    """Test bits/char of the Naive Bayes predictor for each window k = 1..max_window (positions with a
    full window: from index max_window on), plus the unigram (k = 0)."""
    log_prior, tabs = lag_tables(train_ids, V, max_window, alpha)
    te = np.asarray(test_ids, dtype=np.int64)
    T = len(te)
    t = np.arange(max_window, T)
    score = np.broadcast_to(log_prior, (len(t), V)).copy()
    y = te[t]
    out = {"alpha": alpha, "positions": int(len(t)), "bits": {}}

    def bits(s):
        m = s.max(1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(s - m).sum(1))
        return float(-(s[np.arange(len(t)), y] - lse).mean() * LOG2E)

    out["bits"]["0"] = bits(score)
    for j in range(1, max_window + 1):
        score += tabs[j - 1][:, te[t - j]].T  # log P(x_{t-j} | a, lag j) for every candidate a
        out["bits"][str(j)] = bits(score)
    best = min(out["bits"].items(), key=lambda kv: kv[1])
    out["best_window"], out["best_bits"] = int(best[0]), best[1]
    return out
