"""Untrained-network baselines of Čerňanský, Makula and Beňušková (2008), "Improving the State Space
Organization of Untrained Recurrent Networks": ESN, ESN+, NPM-U, NPM-U+ and NPM-T (numpy; the
16-unit network of NPM-T is trained with torch).

Every model runs ``h_t = tanh(E[x_t] + W_hh h_{t-1})`` from ``h_0 = 0`` (``E = W_in^T``, plus the
bias for an NPM's network) and predicts ``x_t`` from the state before it; the forward pass and the
scorers are :mod:`isan.engine.baselines.reservoir` (this module only builds and fits the weights).

Two sets of models live here (issue #26):

**The paper's, as written** (the study's Fig. 1 since issue #26; :func:`train_paper_esn`,
:func:`cooccurrence_ratios`, :func:`train_srn_ekf`):

* ESN (sec. 3, eqs. 2-5; sec. 6). ``x(t) = tanh(W_in u(t) + W x(t-1) + W_back y(t-1))`` (eq. 2) and
  ``y(t) = W_out [u(t), x(t), y(t-1)]`` (eq. 3, f_out linear: "Output units had linear activation
  function"); "recursive least squares were used to train the network" (sec. 3): :func:`rls_readout`.
  The reservoir is sparse: "we set p_rec = min(1, 10/n), where n is the number of reservoir units"
  (sec. 6), spectral radius 0.98; input weights with probability 1.0, "uniform distribution from
  interval (-1.0, 1.0)" (sec. 6). Outputs clipped below at o_min = 0.001 and normalised (eqs. 4-5).
* ESN+ (sec. 4, eq. 6). ``W_in = T_rand R`` with ``T_rand`` uniform in (-0.01, 0.01) and
  ``R_ij = N (N(i,j) + N(j,i)) / (N(i) N(j))`` (eq. 6: "N(i, j) is the number of times symbol i and
  j occur next to each other and N is the length of training sequence"), and, for Elman's grammar,
  "p_rec was increased to p_rec = min(1, 50/n)" (sec. 6).
* NPM-U+ uses the same ``R`` (eq. 6) for its input weights.
* NPM-T: "NPM-T was build over SRNs carefully trained using Kalman filtration [16]" (sec. 6):
  :func:`train_srn_ekf`, a global extended Kalman filter with RTRL derivatives.

What the paper leaves open, and what we chose (each is a constant below): the distribution of the
non-zero recurrent weights (uniform in (-1, 1) before the rescaling to radius 0.98, like the input
weights); the output-feedback weights ``W_back`` (not given: drawn like the random part of each
model's input weights, uniform in (-1, 1) for the ESN and in (-0.01, 0.01) for the ESN+); how the
feedback is driven (not given; we follow its reference [12], Jaeger's report: teacher forcing while
the readout is trained, ``y(t-1) = d(t-1)``, the one-hot of the symbol that came, which for next-symbol
prediction is ``u(t)`` itself, and the network's own output ``y(t-1)`` when it is run on test text);
the RLS constants (forgetting factor 1, ``P(0) = I / delta`` with delta = RLS_DELTA; with teacher
forcing the states do not depend on W_out, so the RLS solution equals the ridge solve
``(Z^T Z + delta I)^{-1} Z^T D``, which the tests check); the washout (the first 50 steps are not
used to fit); the EKF's constants (P(0), Q, R, the output units: see :func:`train_srn_ekf`).

**Ours, kept as named variants** in :mod:`isan.train.reservoir_variants` (the study's first Fig. 1,
issue #15): every one runs ``h_t = tanh(E[x_t] + W_hh h_{t-1})`` from ``h_0 = 0`` (``E = W_in^T``, plus
the bias for an NPM's network) and predicts ``x_t`` from the state before it; the forward pass and the scorers are
:mod:`isan.engine.baselines.reservoir` (bundles exist for these only).

ESN-dense (model key ``esn``; eqs. 2-5 without feedback). ``n`` tanh units; ``W_hh`` dense, uniform in
(-1, 1), rescaled to spectral radius 0.98; input weights ``W_in`` (n, |A|) uniform in (-1, 1); a linear
readout ``o = W_out h + b_out`` fitted by ridge regression of the one-hot next symbol on the state over
the training stream (the first ``washout`` = 50 states left out), regularisation
``ridge * mean diag(X^T X)`` with ridge = 1e-6; outputs clipped below at o_min = 0.001, then normalised.
It departs from the paper in three ways: a dense reservoir (the paper's p_rec = min(1, 10/n)), no
output feedback (eq. 2's ``W_back y(t-1)`` and eq. 3's ``y(t-1)``), ridge instead of RLS.

ESN+-transition (model key ``esn+``). ``W_in = T_rand R`` with ``T_rand`` (n, |A|) uniform in
(-0.01, 0.01) and ``R = transition_ratios``: ``R_ij = N(j followed by i) / N(j)``, the distribution of
the symbol after j. This is not the paper's eq. 6 (a symmetric ratio over both orders, scaled by N and
divided by both unigram counts; :func:`cooccurrence_ratios`): it was written when eq. 6 was not at hand.

NPM (eq. 1; Tiňo et al.'s neural prediction machine). A network of 16 tanh units; the states along
the training stream are clustered by k-means into M contexts (k-means++ seeding, at most 10 Lloyd iterations,
:func:`kmeans`); the prediction in context c is ``(N(c, a) + gamma) / (N(c) + |A| gamma)`` with
gamma = 1/|A|, from the counts of the symbols that followed the states of c.

* NPM-U: the untrained network has small weights, ``W_in``, ``W_hh`` and ``b`` uniform in
  (-0.1, 0.1) (our choice: "small weights" makes the map contractive, so the state codes the recent
  symbols, the architectural bias the paper builds on).
* NPM-U+ (model key ``npm-u+``: transition ratios; ``npm-u+eq6``: the paper's eq. 6): the same, with
  ``W_in = T_rand R``, ``T_rand`` uniform in (-s, s), s chosen so that the mean |W_in| equals NPM-U's
  (0.05): the paper gives (-0.01, 0.01) for the ESN+, whose readout is linear and so insensitive to
  the scale; k-means is not, relative to the recurrent weights.
* NPM-T (model key ``npm-t``: Adam; ``npm-t-ekf``: the paper's Kalman filter): the network is trained
  first (:func:`train_srn`: a 16-unit tanh RNN with one-hot input and a softmax readout, Adam, truncated
  BPTT of 32 over 16 streams, ``epochs`` passes; or :func:`train_srn_ekf`), then its states are
  clustered as above.

Reservoir sizes, contexts and runs for the study (Fig. 1) are in :mod:`isan.train.studies.elman_study`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

# the constants, building blocks and our variants (issue #15) live in reservoir_variants.py
from isan.train.reservoir_variants import (ESN_PLUS_SCALE, NPM_UNITS, O_MIN, SPECTRAL_RADIUS, WASHOUT, cooccurrence_ratios,
                                          scaled_to_radius)

log = logging.getLogger(__name__)


# =============================================================================== the paper's ESN
#: sec. 6: "p_rec = min(1, 10/n)" for the ESN; "For EG dataset p_rec was increased to p_rec = min(1, 50/n)"
P_REC_ESN = 10.0
P_REC_ESN_PLUS_EG = 50.0
#: the RLS initial inverse correlation P(0) = I / RLS_DELTA (our choice; the paper gives no constant)
RLS_DELTA = 1e-2


def sparse_reservoir(n: int, p_rec: float, rng: np.random.Generator, radius: float = SPECTRAL_RADIUS) -> np.ndarray:
    """W (n, n): each weight present with probability ``p_rec`` (sec. 6), its value uniform in (-1, 1)
    (our choice: the paper gives no distribution for the recurrent weights), rescaled to spectral radius
    ``radius``. A draw whose spectral radius is 0 (e.g. nilpotent when very sparse) is kept as drawn."""
    mask = rng.random((n, n)) < p_rec
    W = np.where(mask, rng.uniform(-1.0, 1.0, (n, n)), 0.0)
    return scaled_to_radius(W, radius)


@dataclass
class PaperESN:
    """The weights of an ESN of eqs. 2-3: W_in (n, V), W (n, n), W_back (n, V), W_out (V, V + n + V)
    over ``[u(t), x(t), y(t-1)]`` (no separate bias: u is one-hot, so its block acts as one)."""

    W_in: np.ndarray
    W: np.ndarray
    W_back: np.ndarray
    W_out: np.ndarray | None = None
    o_min: float = O_MIN
    feedback: str = "output"

    @property
    def n(self) -> int:
        return self.W.shape[0]


def paper_esn_network(n: int, V: int, rng: np.random.Generator, R: np.ndarray | None = None,
                      p_rec: float | None = None, radius: float = SPECTRAL_RADIUS) -> PaperESN:
    """An ESN (R None) or ESN+ (``W_in = T_rand R``, eq. 6's R) as sec. 6 describes it for Elman's grammar."""
    if p_rec is None:
        p_rec = min(1.0, (P_REC_ESN if R is None else P_REC_ESN_PLUS_EG) / n)
    W = sparse_reservoir(n, p_rec, rng, radius)
    if R is None:
        W_in = rng.uniform(-1.0, 1.0, (n, V))  # "probability of existence of input weight was 1.0", (-1, 1)
        W_back = rng.uniform(-1.0, 1.0, (n, V))  # our choice: like W_in
    else:
        W_in = rng.uniform(-ESN_PLUS_SCALE, ESN_PLUS_SCALE, (n, V)) @ R  # sec. 4: W_in = T_rand R
        W_back = rng.uniform(-ESN_PLUS_SCALE, ESN_PLUS_SCALE, (n, V))  # our choice: like T_rand
    return PaperESN(W_in, W, W_back)


def teacher_forced_inputs(net: PaperESN, ids: np.ndarray) -> np.ndarray:
    """Z (T, V + n + V): the rows ``[u(t), x(t), d(t-1)]`` of eq. 3 along the stream, the feedback
    teacher-forced (``d(t-1)`` = one-hot of the symbol at t, the target of step t - 1; d(-1) = 0).
    Row t's target is the one-hot of ``ids[t + 1]`` (the last row has none)."""
    ids = np.asarray(ids, dtype=np.int64)
    V, n = net.W_in.shape[1], net.n
    T = len(ids)
    Z = np.zeros((T, 2 * V + n))
    x = np.zeros(n)
    WinT = np.ascontiguousarray(net.W_in.T)
    WbT = np.ascontiguousarray(net.W_back.T)
    WT = np.ascontiguousarray(net.W.T)
    prev = -1
    for t, s in enumerate(ids.tolist()):
        pre = WinT[s] + x @ WT
        if prev >= 0:
            pre = pre + WbT[s]  # d(t-1) is the one-hot of ids[t]
        x = np.tanh(pre)
        Z[t, s] = 1.0
        Z[t, V:V + n] = x
        if prev >= 0:
            Z[t, V + n + s] = 1.0
        prev = s
    return Z


def rls_readout(Z: np.ndarray, D: np.ndarray, delta: float = RLS_DELTA, forget: float = 1.0,
                W0: np.ndarray | None = None) -> np.ndarray:
    """Recursive least squares (the paper's readout training, sec. 3): W (V, m) with ``y = W z``,
    one update per row of Z (T, m) towards D (T, V)::

        k = P z / (forget + z^T P z);  W += (d - W z) k^T;  P = (P - k z^T P) / forget;  P(0) = I / delta

    With forget = 1 and W0 = 0 the result is the regularised least-squares solution
    ``D^T Z (Z^T Z + delta I)^{-1}`` (:func:`ridge_closed_form`)."""
    T, m = Z.shape
    V = D.shape[1]
    W = np.zeros((V, m)) if W0 is None else np.array(W0, dtype=np.float64)
    P = np.eye(m) / delta
    for t in range(T):
        z = Z[t]
        Pz = P @ z
        k = Pz / (forget + z @ Pz)
        W += np.outer(D[t] - W @ z, k)
        P -= np.outer(k, Pz)
        if forget != 1.0:
            P /= forget
        if t % 1000 == 999:
            P = 0.5 * (P + P.T)  # keep it symmetric against rounding
    return W


def ridge_closed_form(Z: np.ndarray, D: np.ndarray, delta: float = RLS_DELTA) -> np.ndarray:
    """``D^T Z (Z^T Z + delta I)^{-1}``: what :func:`rls_readout` converges to (forget = 1)."""
    m = Z.shape[1]
    return np.linalg.solve(Z.T @ Z + delta * np.eye(m), Z.T @ D).T


def train_paper_esn(train_ids: np.ndarray, V: int, n: int, seed: int, plus: bool = False,
                    delta: float = RLS_DELTA, washout: int = WASHOUT, rls: bool = True,
                    feedback: str = "output") -> PaperESN:
    """Build an ESN (or ESN+) as sec. 6 describes it and train its readout by RLS over the
    teacher-forced training stream (rows from ``washout`` on). ``rls=False`` solves the same problem in
    closed form (equal to rounding; faster, for checks)."""
    rng = np.random.default_rng(seed)
    R = cooccurrence_ratios(train_ids, V) if plus else None
    net = paper_esn_network(n, V, rng, R)
    ids = np.asarray(train_ids, dtype=np.int64)
    Z = teacher_forced_inputs(net, ids)[washout:len(ids) - 1]
    D = np.zeros((len(Z), V))
    D[np.arange(len(Z)), ids[washout + 1:]] = 1.0
    net.W_out = rls_readout(Z, D, delta) if rls else ridge_closed_form(Z, D, delta)
    net.feedback = feedback
    return net


def paper_esn_log_probs(net: PaperESN, ids: np.ndarray) -> np.ndarray:
    """(T, V) natural-log P(ids[t] | ids[:t]) from eqs. 2-5, run over the stream from x = 0, y = 0.

    feedback "output": ``y(t-1)`` in eqs. 2-3 is the network's own output (how [12] runs a trained
    ESN); "teacher": the one-hot of the symbol that came (as in training). Row 0 (nothing read yet:
    y = 0, every output clipped to o_min) is uniform."""
    ids = np.asarray(ids, dtype=np.int64)
    V, n = net.W_in.shape[1], net.n
    Wu, Wx, Wy = net.W_out[:, :V], net.W_out[:, V:V + n], net.W_out[:, V + n:]
    WinT, WbT, WT = (np.ascontiguousarray(a.T) for a in (net.W_in, net.W_back, net.W))
    WxT, WyT = np.ascontiguousarray(Wx.T), np.ascontiguousarray(Wy.T)
    out = np.empty((len(ids), V))
    x = np.zeros(n)
    y = np.zeros(V)  # y(-1)
    o = np.zeros(V)  # the output that predicts ids[0]
    for t, s in enumerate(ids.tolist()):
        oc = np.maximum(o, net.o_min)  # eqs. 4-5
        out[t] = np.log(oc) - np.log(oc.sum())
        if net.feedback == "teacher":
            fb = np.zeros(V)
            if t > 0:
                fb[s] = 1.0
        else:
            fb = y
        x = np.tanh(WinT[s] + x @ WT + fb @ WbT)  # eq. 2
        o = Wu[:, s] + x @ WxT + fb @ WyT  # eq. 3 (linear output units)
        y = o
    return out


def paper_esn_nnl(net: PaperESN, ids: np.ndarray) -> float:
    """NNL (eq. 7, base |A|) of the stream."""
    lp = paper_esn_log_probs(net, ids)
    ids = np.asarray(ids, dtype=np.int64)
    return float(-lp[np.arange(len(ids)), ids].mean() / math.log(lp.shape[1]))


# ========================================================================= NPM-T's EKF-trained SRN
#: EKF constants (our choice: the paper cites [16] for "Kalman filtration" and gives none): P(0) = EKF_P0 I;
#: the measurement noise R = r I annealed from EKF_R[0] to EKF_R[1] over training; process noise Q = EKF_Q I.
EKF_P0 = 1000.0
EKF_R = (100.0, 3.0)
EKF_Q = 1e-4


def _sigm(a):
    return 1.0 / (1.0 + np.exp(-a))


def ekf_step(w: np.ndarray, P: np.ndarray, H: np.ndarray, err: np.ndarray, r: float, q: float,
             PHt: np.ndarray | None = None, symmetrize: bool = True):
    """One global-EKF update of weights w (m,) with covariance P (m, m), the Jacobian of the outputs
    H (V, m) and the error ``target - output`` err (V,)::

        A = H P H^T + r I;  K = P H^T A^{-1};  w += K err;  P = P - K H P + q I

    ``PHt`` = P H^T may be passed when the caller computed it more cheaply. Updates w and P in place
    and returns them."""
    if PHt is None:
        PHt = P @ H.T
    A = H @ PHt
    A[np.diag_indices_from(A)] += r
    K = np.linalg.solve(A, PHt.T).T  # (m, V); A is symmetric
    w += K @ err
    P -= K @ PHt.T
    if symmetrize:
        P += P.T
        P *= 0.5
    P[np.diag_indices_from(P)] += q
    return w, P


def train_srn_ekf(train_ids: np.ndarray, V: int, n: int = NPM_UNITS, seed: int = 0, epochs: float = 1.0,
                  p0: float = EKF_P0, r=EKF_R, q: float = EKF_Q, log_every: int = 5000):
    """An Elman SRN ``h_t = tanh(W_in u_t + W h_{t-1} + b)``, ``y_t = sigmoid(W_o h_t + b_o)`` (logistic
    output units, squared error against the one-hot of the next symbol) trained by a global extended
    Kalman filter with RTRL derivatives (Čerňanský and Beňušková 2003, the paper's [16]; our
    reconstruction: [16] is not at hand), one update per symbol, ``epochs`` passes over the stream (a
    fraction allowed). Weights start uniform in (-0.1, 0.1).

    Returns (E (V, n) = W_in^T + b, W (n, n), info) in the layout of :func:`train_srn`.
    """
    rng = np.random.default_rng(seed)
    ids = np.asarray(train_ids, dtype=np.int64)
    nin, nrec = n * V, n * n
    m_h = nin + nrec + n  # W_in, W, b
    m = m_h + V * n + V  # + W_o, b_o
    w = rng.uniform(-0.1, 0.1, m)
    P = np.eye(m) * p0
    J = np.zeros((n, m_h))  # d h_t / d (hidden weights), RTRL
    h = np.zeros(n)
    steps = int(round(epochs * (len(ids) - 1)))
    r0, r1 = (r, r) if np.isscalar(r) else r
    sq, sqs, losses = 0.0, 0, []
    for k in range(steps):
        t = k % (len(ids) - 1)
        if t == 0:
            h = np.zeros(n)
            J[:] = 0.0
        s, nxt = ids[t], ids[t + 1]
        W_in = w[:nin].reshape(n, V)
        W = w[nin:nin + nrec].reshape(n, n)
        b = w[nin + nrec:m_h]
        W_o = w[m_h:m_h + V * n].reshape(V, n)
        b_o = w[m_h + V * n:]
        h_prev = h
        h = np.tanh(W_in[:, s] + W @ h_prev + b)
        # RTRL: J_t = diag(1 - h^2) (d a / d w (direct) + W J_{t-1})
        G = W @ J
        for i in range(n):  # the direct terms: W_in[i, s] -> 1, W[i, j] -> h_prev[j], b[i] -> 1
            G[i, i * V + s] += 1.0
            G[i, nin + i * n: nin + (i + 1) * n] += h_prev
            G[i, nin + nrec + i] += 1.0
        J = (1.0 - h * h)[:, None] * G
        y = _sigm(W_o @ h + b_o)
        dy = y * (1.0 - y)
        H = np.zeros((V, m))
        Hh = (dy[:, None] * W_o) @ J
        H[:, :m_h] = Hh
        H[:, m_h:m_h + V * n] = (dy[:, None, None] * np.eye(V)[:, :, None] * h[None, None, :]).reshape(V, V * n)
        H[np.arange(V), m_h + V * n + np.arange(V)] = dy
        # P H^T, exploiting the block structure of the output weights' columns of H
        PHt = P[:, :m_h] @ Hh.T
        PHt += np.einsum("mon,n->mo", P[:, m_h:m_h + V * n].reshape(m, V, n), h) * dy
        PHt += P[:, m_h + V * n:] * dy
        d = np.zeros(V)
        d[nxt] = 1.0
        err = d - y
        rr = r0 + (r1 - r0) * min(1.0, k / max(1, steps - 1))
        w, P = ekf_step(w, P, H, err, rr, q, PHt=PHt, symmetrize=k % 100 == 99)
        p = np.clip(y / y.sum(), 1e-12, 1.0)
        sq += -math.log2(p[nxt])
        sqs += 1
        if log_every and (k + 1) % log_every == 0:
            losses.append(round(sq / sqs, 5))
            log.info("ekf step %d/%d: normalised-output bits %.4f", k + 1, steps, sq / sqs)
            sq, sqs = 0.0, 0
    W_in = w[:nin].reshape(n, V)
    W = w[nin:nin + nrec].reshape(n, n)
    b = w[nin + nrec:m_h]
    info = {"units": n, "trainer": "ekf", "epochs": epochs, "steps": steps, "p0": p0, "r": [r0, r1], "q": q,
            "seed": seed, "train_bits_windows": losses,
            "note": "bits of the normalised logistic outputs over windows of log_every symbols"}
    return np.ascontiguousarray(W_in.T + b[None, :]), W.copy(), info
