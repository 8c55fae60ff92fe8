"""The untrained-network baselines' building blocks and our variants of them (issue #15; the models
:mod:`isan.train.reservoir` describes as "ours, kept as named variants"): the constants, the ratio
matrices (:func:`transition_ratios`, the paper's eq. 6 :func:`cooccurrence_ratios`), the dense ESN with
a ridge readout, NPM-U(+), k-means, NPM-T over a torch-trained SRN, and scoring with the engine's
reference scorer. :mod:`isan.train.reservoir` holds the paper's models, built on these, and imports
every name of this module, so they import from there as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from isan.engine.baselines.reservoir import ReservoirParams, reservoir_score_ref, reservoir_states_ref

SPECTRAL_RADIUS = 0.98
O_MIN = 0.001
ESN_RIDGE = 1e-6
WASHOUT = 50
NPM_UNITS = 16
NPM_SCALE = 0.1
ESN_PLUS_SCALE = 0.01
KMEANS_ITERS = 10


def cooccurrence_ratios(ids: np.ndarray, V: int) -> np.ndarray:
    """The paper's eq. 6 (Čerňanský et al. 2008, sec. 4, after Bullinaria and Levy):
    ``R_ij = N (N(i,j) + N(j,i)) / (N(i) N(j))``, N(i, j) the number of times symbol i is immediately
    followed by j, N(i) the number of occurrences of i, N the length of the stream. Symmetric; a row
    and column of zeros for a symbol that never occurs."""
    ids = np.asarray(ids, dtype=np.int64)
    N = float(len(ids))
    B = np.zeros((V, V))
    np.add.at(B, (ids[:-1], ids[1:]), 1.0)
    c = np.bincount(ids, minlength=V).astype(np.float64)
    den = np.outer(c, c)
    return np.divide(N * (B + B.T), den, out=np.zeros_like(den), where=den > 0)


def transition_ratios(ids: np.ndarray, V: int) -> np.ndarray:
    """Ours, not the paper's eq. 6 (see the module docstring): R (V, V) with
    ``R[i, j] = N(j followed by i) / N(j)`` over the stream (a column of zeros for a symbol that is
    never followed)."""
    ids = np.asarray(ids, dtype=np.int64)
    N = np.zeros((V, V))
    np.add.at(N, (ids[1:], ids[:-1]), 1.0)
    tot = N.sum(0, keepdims=True)
    return np.divide(N, tot, out=np.zeros_like(N), where=tot > 0)


def scaled_to_radius(W: np.ndarray, radius: float) -> np.ndarray:
    """``W`` scaled to the spectral radius ``radius`` (unchanged when its radius is 0)."""
    rho = float(np.max(np.abs(np.linalg.eigvals(W)))) if W.size else 0.0
    return W * (radius / rho) if rho > 0 else W


def esn_network(n: int, V: int, rng: np.random.Generator, R: np.ndarray | None = None,
                radius: float = SPECTRAL_RADIUS) -> tuple[np.ndarray, np.ndarray]:
    """(E (V, n), W_hh (n, n)) of an ESN (R None) or ESN+ (``W_in = T_rand R``)."""
    W = scaled_to_radius(rng.uniform(-1.0, 1.0, (n, n)), radius)
    if R is None:
        W_in = rng.uniform(-1.0, 1.0, (n, V))
    else:
        W_in = rng.uniform(-ESN_PLUS_SCALE, ESN_PLUS_SCALE, (n, V)) @ R
    return np.ascontiguousarray(W_in.T), W


def fit_readout(H: np.ndarray, ids: np.ndarray, V: int, ridge: float = ESN_RIDGE,
                washout: int = WASHOUT) -> tuple[np.ndarray, np.ndarray]:
    """Ridge regression of one-hot ``ids[t]`` on the state before it, ``H_before[t]`` (T, n).

    Returns (W_out (V, n), b_out (V,)). The bias is not regularised.
    """
    X = H[washout:]
    y = np.asarray(ids, dtype=np.int64)[washout:]
    T, n = X.shape
    Xa = np.hstack([X, np.ones((T, 1))])
    G = Xa.T @ Xa
    Y = np.zeros((n + 1, V))
    np.add.at(Y.T, y, Xa)  # Xa^T onehot(y), column by column
    lam = ridge * float(np.mean(np.diag(G)[:n])) if n else 0.0
    reg = np.full(n + 1, lam)
    reg[-1] = 0.0
    sol = np.linalg.solve(G + np.diag(reg) + 1e-12 * np.eye(n + 1), Y)  # (n + 1, V)
    return np.ascontiguousarray(sol[:n].T), sol[n].copy()


def states_before(E: np.ndarray, W_hh: np.ndarray, ids: np.ndarray, h0: np.ndarray) -> np.ndarray:
    """(T, n): the state before each symbol (row 0 is h0)."""
    S = reservoir_states_ref(E, W_hh, ids, h0)
    return np.vstack([h0[None, :], S[:-1]]) if len(ids) else np.zeros((0, len(h0)))


def train_esn(train_ids: np.ndarray, V: int, n: int, seed: int, plus: bool = False,
              ridge: float = ESN_RIDGE) -> tuple[dict, dict]:
    """Build and fit an ESN (plus=False) or ESN+: (config, tensors) for :class:`ReservoirParams`."""
    rng = np.random.default_rng(seed)
    R = transition_ratios(train_ids, V) if plus else None
    E, W = esn_network(n, V, rng, R)
    h0 = np.zeros(n)
    H = states_before(E, W, train_ids, h0)
    W_out, b_out = fit_readout(H, train_ids, V, ridge)
    config = {"kind": "esn", "variant": "esn+" if plus else "esn", "K": V, "V": V, "d": n, "o_min": O_MIN,
              "spectral_radius": SPECTRAL_RADIUS, "ridge": ridge, "washout": WASHOUT, "seed": seed}
    return config, {"E": E, "W_hh": W, "h0": h0, "W_out": W_out, "b_out": b_out}


# --------------------------------------------------------------------------------------- k-means
def kmeans(X: np.ndarray, k: int, seed: int, iters: int = KMEANS_ITERS) -> np.ndarray:
    """Centroids (k', n), k' <= k: k-means++ seeding then Lloyd iterations (empty clusters dropped).

    numpy only, whatever else is installed, so that results do not depend on the environment
    (scikit-learn's KMeans, which an earlier version used where present, keeps k duplicate centroids
    on states with fewer distinct values; scipy's kmeans2 redraws empty clusters at random, which
    would blur "k contexts"; this one keeps only the centroids that own states).
    """
    X = np.asarray(X, dtype=np.float64)
    k = max(1, min(k, len(X)))
    from isan.engine.baselines.reservoir import nearest_context

    rng = np.random.default_rng(seed)
    # k-means++ seeding on a subsample (at most 20k states: the seeding is O(N k))
    S = X if len(X) <= 20000 else X[rng.choice(len(X), 20000, replace=False)]
    C = [S[rng.integers(len(S))]]
    d2 = ((S - C[0]) ** 2).sum(1)
    for _ in range(1, k):
        tot = d2.sum()
        if tot <= 0:
            break  # fewer distinct states than k
        c = S[rng.choice(len(S), p=d2 / tot)]
        C.append(c)
        d2 = np.minimum(d2, ((S - c) ** 2).sum(1))
    C = np.array(C)
    X32 = X.astype(np.float32)
    for _ in range(iters):
        a = nearest_context(C.astype(np.float32), X32)  # float32 distances: twice as fast, seeding only
        cnt = np.bincount(a, minlength=len(C))
        sums = np.stack([np.bincount(a, weights=X[:, j], minlength=len(C)) for j in range(X.shape[1])], 1)
        keep = cnt > 0
        newC = sums[keep] / cnt[keep, None]
        if newC.shape == C.shape and np.allclose(newC, C, rtol=0, atol=1e-12):
            C = newC
            break
        C = newC
    return C


def untrained_network(V: int, rng: np.random.Generator, n: int = NPM_UNITS, R: np.ndarray | None = None,
                      scale: float = NPM_SCALE) -> tuple[np.ndarray, np.ndarray]:
    """(E (V, n), W_hh (n, n)) of NPM-U (R None) or NPM-U+ (W_in = T_rand R); E includes the bias."""
    W = rng.uniform(-scale, scale, (n, n))
    if R is None:
        W_in = rng.uniform(-scale, scale, (n, V))
    else:
        T = rng.uniform(-1.0, 1.0, (n, V))
        W_in = T @ R
        W_in *= (scale / 2) / max(float(np.mean(np.abs(W_in))), 1e-300)  # mean |W_in| = NPM-U's
    b = rng.uniform(-scale, scale, n)
    return np.ascontiguousarray(W_in.T + b[None, :]), W


def fit_npm(H_before: np.ndarray, ids: np.ndarray, V: int, M: int, seed: int,
            gamma: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(centroids (M', n), counts (M', V)) of an NPM from the states before each symbol."""
    C = kmeans(H_before, M, seed)
    from isan.engine.baselines.reservoir import nearest_context

    a = nearest_context(C, H_before)
    counts = np.zeros((len(C), V))
    np.add.at(counts, (a, np.asarray(ids, dtype=np.int64)), 1.0)
    return C, counts


def npm_bundle_parts(variant: str, E: np.ndarray, W_hh: np.ndarray, h0: np.ndarray, C: np.ndarray,
                     counts: np.ndarray, gamma: float, seed: int) -> tuple[dict, dict]:
    V = counts.shape[1]
    config = {"kind": "npm", "variant": variant, "K": E.shape[0], "V": V, "d": E.shape[1],
              "contexts": int(len(C)), "gamma": gamma, "seed": seed}
    return config, {"E": E, "W_hh": W_hh, "h0": h0, "centroids": C, "counts": counts}


def train_npm_u(train_ids: np.ndarray, V: int, M: int, seed: int, plus: bool = False,
                eq6: bool = False) -> tuple[dict, dict]:
    """An NPM-U (or NPM-U+: transition ratios, or eq. 6's with ``eq6``) with M contexts: (config, tensors)."""
    rng = np.random.default_rng(seed)
    R = (cooccurrence_ratios if eq6 else transition_ratios)(train_ids, V) if plus else None
    E, W = untrained_network(V, rng, R=R)
    h0 = np.zeros(W.shape[0])
    H = states_before(E, W, train_ids, h0)
    C, counts = fit_npm(H, train_ids, V, M, seed)
    return npm_bundle_parts("npm-u+" if plus else "npm-u", E, W, h0, C, counts, 1.0 / V, seed)


# ---------------------------------------------------------------------------- NPM-T's trained net
def train_srn(train_ids: np.ndarray, V: int, n: int = NPM_UNITS, seed: int = 0, epochs: int = 10,
              lr: float = 1e-2, streams: int = 16, bptt: int = 32) -> tuple[np.ndarray, np.ndarray, dict]:
    """Train a tanh RNN ``h_t = tanh(E[x_t] + W_hh h_{t-1})`` with a softmax readout on next-symbol
    prediction (torch, 1 thread). Returns (E (V, n), W_hh (n, n), info) as float64 numpy.

    The state starts at 0 and is carried across chunks of each stream (truncated BPTT).
    """
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    bound = 1 / math.sqrt(n)
    E = torch.nn.Parameter(torch.empty(V, n).uniform_(-bound, bound, generator=g))
    W = torch.nn.Parameter(torch.empty(n, n).uniform_(-bound, bound, generator=g))
    W_ro = torch.nn.Parameter(torch.empty(V, n).uniform_(-bound, bound, generator=g))
    b_ro = torch.nn.Parameter(torch.zeros(V))
    opt = torch.optim.Adam([E, W, W_ro, b_ro], lr=lr)
    ids = torch.as_tensor(np.asarray(train_ids, dtype=np.int64))
    L = len(ids) // streams
    X = ids[: L * streams].view(streams, L).T.contiguous()  # (L, B)
    losses = []
    for ep in range(epochs):
        h = torch.zeros(streams, n)
        tot, cnt = 0.0, 0
        for s in range(0, L - 1, bptt):
            x = X[s: s + bptt]
            outs = []
            for t in range(len(x)):
                outs.append(h)  # the state before x[t] predicts it
                h = torch.tanh(E[x[t]] + h @ W.T)
            Hb = torch.stack(outs)
            logits = Hb @ W_ro.T + b_ro
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), x.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([E, W, W_ro, b_ro], 1.0)
            opt.step()
            h = h.detach()
            tot += loss.item() * x.numel()
            cnt += x.numel()
        losses.append(tot / cnt / math.log(2))
    info = {"units": n, "epochs": epochs, "lr": lr, "streams": streams, "bptt": bptt, "seed": seed,
            "train_bits_per_epoch": [round(b, 5) for b in losses]}
    return E.detach().double().numpy(), W.detach().double().numpy(), info


def train_npm_t(train_ids: np.ndarray, V: int, M: int, seed: int, net: tuple[np.ndarray, np.ndarray] | None = None,
                epochs: int = 10) -> tuple[dict, dict]:
    """An NPM-T: k-means contexts over the states of a trained 16-unit tanh RNN (trained here unless
    ``net`` = (E, W_hh) is given)."""
    if net is None:
        E, W, _ = train_srn(train_ids, V, seed=seed, epochs=epochs)
    else:
        E, W = net
    h0 = np.zeros(W.shape[0])
    H = states_before(E, W, train_ids, h0)
    C, counts = fit_npm(H, train_ids, V, M, seed)
    return npm_bundle_parts("npm-t", E, W, h0, C, counts, 1.0 / V, seed)


# ------------------------------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class Scored:
    bits_per_symbol: float
    nnl: float
    symbols: int


def score(config: dict, tensors: dict, ids: np.ndarray) -> Scored:
    """Score a stream from the initial state with the engine's reference scorer."""
    p = ReservoirParams.from_tensors(config, tensors)
    bits, _ = reservoir_score_ref(p, ids, p.initial_state())
    b = float(bits.mean())
    return Scored(b, b / math.log2(p.V), int(len(ids)))
