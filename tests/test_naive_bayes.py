"""Table 1's Naive Bayes control (issue #26): at one previous character it is the bigram model."""

import math

import numpy as np

from isan.engine.analysis.naive_bayes import naive_bayes_bits


def test_window_one_is_the_bigram_model():
    rng = np.random.default_rng(0)
    V, alpha = 4, 0.5
    tr = rng.integers(0, V, 3000)
    te = rng.integers(0, V, 500)
    r = naive_bayes_bits(tr, te, V, max_window=3, alpha=alpha)
    # P(a | c) ∝ P(a) P(c | a): Bayes' rule on the same smoothed counts
    uni = np.bincount(tr, minlength=V) + alpha
    C = np.zeros((V, V))
    np.add.at(C, (tr[1:], tr[:-1]), 1.0)
    C += alpha
    post = (uni / uni.sum())[:, None] * C / C.sum(1, keepdims=True)  # (a, c)
    post /= post.sum(0, keepdims=True)
    t = np.arange(3, len(te))
    bits = -np.log2(post[te[t], te[t - 1]]).mean()
    assert math.isclose(r["bits"]["1"], bits, rel_tol=0, abs_tol=1e-12)
    assert math.isclose(r["bits"]["0"], -np.log2((uni / uni.sum())[te[t]]).mean(), abs_tol=1e-12)
    assert r["best_window"] in (0, 1, 2, 3)
