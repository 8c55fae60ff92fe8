"""Composition of substring maps (Foerster et al. 2017, section 5.1).

For a substring ``s = x_1 .. x_k`` (docs/ARCHITECTURE.md, 'The model and its conventions'):
``A_s = W[x_k] ... W[x_1]``, ``c_s`` its composed bias, so ``h_after = A_s h_before + c_s``; and
the prefix readouts ``R_i = W_ro A_{s[:i]}``, ``r_i = W_ro c_{s[:i]} + b_ro`` (i = 0..k-1,
``R_0 = W_ro``, ``r_0 = b_ro``) give the k logit vectors inside a match, each predicting
``x_{i+1}`` from the state before it.

Keys are visited in lexicographic order of their ids, as a depth-first walk of their trie:
each trie node costs one d x d product (``A_{s+x} = W[x] A_s``) from its parent, in float64.
"""

from __future__ import annotations

import numpy as np

from isan.params import ISANParams


def compose_entries(params: ISANParams, keys: list[np.ndarray], Ac_out: np.ndarray, R_out: np.ndarray,
                    offsets: np.ndarray, progress=None) -> int:
    """Fill ``Ac_out[e] = [A | c]`` (d, d+1) and ``R_out[offsets[e] + i] = [R_i | r_i]`` (V, d+1).

    Args:
        params: the model (computed in float64 whatever the dtype).
        keys: entry e's symbol ids, (k_e,) each, k_e >= 1.
        Ac_out: (n, d, d+1) array to fill (float32/float16, may be a memmap).
        R_out: (sum k_e, V, d+1) array to fill.
        offsets: (n,) first readout row of each entry.
        progress: optional callable(n_done) for a progress bar.
    Returns:
        the number of d x d products computed (trie nodes).
    """
    p = params.astype(np.float64)
    d = p.d
    order = sorted(range(len(keys)), key=lambda e: tuple(int(x) for x in keys[e]))
    # stack[i] = (A, c, Raug) of the current path's prefix of length i
    R0 = np.concatenate([p.W_ro, p.b_ro[:, None]], axis=1)
    stack = [(np.eye(d), np.zeros(d), R0)]
    path: list[int] = []
    products = 0
    for n_done, e in enumerate(order, 1):
        key = [int(x) for x in keys[e]]
        common = 0
        while common < min(len(path), len(key)) and path[common] == key[common]:
            common += 1
        del stack[common + 1 :]
        del path[common:]
        for x in key[common:]:
            A, c, _ = stack[-1]
            A2 = p.W[x] @ A
            c2 = p.W[x] @ c + p.b[x]
            R2 = np.concatenate([p.W_ro @ A2, (p.W_ro @ c2 + p.b_ro)[:, None]], axis=1)
            stack.append((A2, c2, R2))
            path.append(x)
            products += 1
        k = len(key)
        A, c, _ = stack[k]
        Ac_out[e, :, :d] = A
        Ac_out[e, :, d] = c
        for i in range(k):
            R_out[offsets[e] + i] = stack[i][2]
        if progress is not None:
            progress(n_done)
    return products
