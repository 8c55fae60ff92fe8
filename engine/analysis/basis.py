"""Change of basis: the readout subspace and its complement (paper section 3.5, Figures 6-7).

The readout subspace is the span of the rows of ``W_ro`` (V <= d directions); only a state's part
there reaches the logits. Its orthogonal complement is the "computational" subspace: what the
model keeps for later. :func:`readout_basis` returns orthonormal bases of both, and
:func:`bias_study` splits each input bias ``b_x`` into the two and compares their norms with the
unigram log-probability of x and with each other (cosine distances).

Rewriting the model in another basis (``h = origin + M z``, the outputs unchanged) is
:func:`isan.engine.analysis.parentheses.change_basis_affine`.
"""

from __future__ import annotations

import numpy as np

from isan.params import ISANParams


def readout_basis(W_ro: np.ndarray, rtol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal bases of the readout subspace and of its complement: (Q_ro (d, r), Q_perp (d, d - r)),
    r = rank of W_ro. From the SVD of W_ro (the rows of W_ro orthonormalised)."""
    W_ro = np.asarray(W_ro, dtype=np.float64)
    d = W_ro.shape[1]
    _, s, Vt = np.linalg.svd(W_ro, full_matrices=True)
    r = int((s > rtol * s.max()).sum())
    return Vt[:r].T.copy(), Vt[r:].T.copy() if r < d else np.zeros((d, 0))


def unigram_bigram(ids: np.ndarray, V: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts of each symbol (V,) and of each ordered pair (V, V): ``pairs[a, b]`` counts a then b."""
    ids = np.asarray(ids, dtype=np.int64)
    uni = np.bincount(ids, minlength=V).astype(np.float64)
    big = np.bincount(ids[:-1] * V + ids[1:], minlength=V * V).astype(np.float64).reshape(V, V)
    return uni, big


def _pearson(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def cosine_distances(X: np.ndarray) -> np.ndarray:
    """1 - cos(angle) between the rows of X: (n, d) -> (n, n)."""
    n = np.linalg.norm(X, axis=1, keepdims=True)
    U = X / np.where(n > 0, n, 1.0)
    return 1.0 - U @ U.T


def bias_study(p: ISANParams, unigram_counts: np.ndarray, symbols, groups: dict[str, str] | None = None) -> dict:
    """Figures 6-7: the input biases b_x in the readout subspace and in its complement.

    Args:
        unigram_counts: (K,) how often each input symbol occurs in the training text.
        groups: names -> symbols (default vowels ``aeiou``, consonants, space), ordering the cosine
            distance matrices and giving their within- and between-group means.
    Returns:
        {"rank_readout", "d", "norms": {"full", "readout", "complement"} (K,), "logprob" (K,),
        "correlation": {"full", "readout", "complement"} (Pearson, norm against log-probability),
        "order" (symbols in group order), "cosine": {"full", "readout", "complement"} ((K, K) lists in that order),
        "group_means": {subspace: {"a-b": mean distance}}, "variance_fraction_complement"}.
    """
    p = p.astype(np.float64)
    Q_ro, Q_perp = readout_basis(p.W_ro)
    b = p.b
    in_ro = b @ Q_ro  # (K, r) coordinates
    in_perp = b @ Q_perp
    counts = np.asarray(unigram_counts, dtype=np.float64)
    logprob = np.log(np.maximum(counts, 1) / counts.sum())
    norms = {"full": np.linalg.norm(b, axis=1), "readout": np.linalg.norm(in_ro, axis=1),
             "complement": np.linalg.norm(in_perp, axis=1)}
    corr = {k: _pearson(v, logprob) for k, v in norms.items()}
    symbols = list(symbols)
    if groups is None:
        groups = {"vowels": "aeiou", "consonants": "".join(c for c in symbols if c.isalpha() and c not in "aeiou"),
                  "space": " "}
    order = [c for g in groups.values() for c in g if c in symbols]
    idx = [symbols.index(c) for c in order]
    cos = {"full": cosine_distances(b)[np.ix_(idx, idx)],  # Fig 7a: the whole b_x (issue #26)
           "readout": cosine_distances(in_ro)[np.ix_(idx, idx)], "complement": cosine_distances(in_perp)[np.ix_(idx, idx)]}
    gi = {g: [order.index(c) for c in s if c in order] for g, s in groups.items()}
    means = {}
    names = list(groups)
    for sub, D in cos.items():
        m = {}
        for i, a in enumerate(names):
            for bname in names[i:]:
                A, Bi = gi[a], gi[bname]
                if a == bname:
                    if len(A) < 2:
                        continue
                    vals = D[np.ix_(A, A)][np.triu_indices(len(A), 1)]
                else:
                    vals = D[np.ix_(A, Bi)].ravel()
                m[f"{a}-{bname}"] = float(vals.mean())
        means[sub] = m
    return {"rank_readout": int(Q_ro.shape[1]), "d": int(p.d), "norms": {k: v.tolist() for k, v in norms.items()},
            "logprob": logprob.tolist(), "correlation": corr, "order": order,
            "cosine": {k: v.tolist() for k, v in cos.items()}, "group_means": means,
            "variance_fraction_complement": float((norms["complement"] ** 2).sum() / (norms["full"] ** 2).sum())}


def ngram_agreement(p: ISANParams, unigram_counts: np.ndarray, bigram_counts: np.ndarray, symbols) -> dict:
    """Figure 8: ``softmax(b_ro)`` against the unigram distribution, and ``softmax(W_ro b_x + b_ro)`` (the
    prediction after reading x from a zero state) against the bigram ``P(next | x)`` for every x.

    Returns:
        {"unigram": {"model", "data" (V,), "correlation", "kl_bits" (KL(data || model))},
         "bigram": {"model", "data" ((K, V) lists), "correlation" per x, "kl_bits" per x,
         "correlation_all" (every pair pooled), "correlation_median"},
         "space": Fig 8b's numbers for x = '_', "unigram_as_bigram_predictor": Fig 8c's x-axis, the
         correlation of the unigram P(x) with P(next | x) per x, and for how many x the model does better}.
    """
    from isan.engine.reference import log_softmax

    p = p.astype(np.float64)
    uni = np.asarray(unigram_counts, dtype=np.float64)
    pu = uni / uni.sum()
    mu = np.exp(log_softmax(p.b_ro))
    big = np.asarray(bigram_counts, dtype=np.float64)
    pb = big / np.maximum(big.sum(1, keepdims=True), 1)
    mb = np.exp(log_softmax(p.b @ p.W_ro.T + p.b_ro))  # (K, V)

    def kl(a, b):
        m = a > 0
        return float((a[m] * np.log2(a[m] / b[m])).sum())

    corr = [_pearson(mb[x], pb[x]) for x in range(len(mb))]
    corr_uni = [_pearson(pu, pb[x]) for x in range(len(mb))]  # Fig 8c's x-axis: the unigram as a predictor
    sym = list(symbols)
    space = {}
    if " " in sym:  # Fig 8b: softmax(W_ro b_'_' + b_ro) against P(x_t+1 | '_')
        s_ = sym.index(" ")
        space = {"model": mb[s_].tolist(), "data": pb[s_].tolist(), "correlation": corr[s_],
                 "kl_bits": kl(pb[s_], mb[s_]), "unigram_correlation": corr_uni[s_]}
    better = [a > b_ for a, b_ in zip(corr, corr_uni) if a is not None and b_ is not None]
    return {"symbols": sym, "space": space,
            "unigram_as_bigram_predictor": {"correlation": corr_uni, "median": float(np.nanmedian(
                [np.nan if v is None else v for v in corr_uni])), "model_better_for": int(sum(better)),
                "of": len(better)},
            "unigram": {"model": mu.tolist(), "data": pu.tolist(), "correlation": _pearson(mu, pu), "kl_bits": kl(pu, mu)},
            "bigram": {"model": mb.tolist(), "data": pb.tolist(), "correlation": corr,
                       "kl_bits": [kl(pb[x], mb[x]) for x in range(len(mb))],
                       "correlation_all": _pearson(mb.ravel(), pb.ravel()),
                       "correlation_median": float(np.nanmedian(corr))}}
