"""Fast ISAN recurrence over a whole chunk: a custom autograd Function.

``H = isan_scan(W, b, h_init, x)`` runs ``h_t = W[x_t] @ h_{t-1} + b[x_t]`` (paper eq. 1) for
T steps over B independent streams and returns every state, shape (T, B, d).

Why a custom Function: autograd through a per-row gathered ``W[x_t]`` (B d^2 floats per
step) runs at a few thousand chars/s on 2 cores. Here each step sorts the B streams by
symbol once and runs one ``addmm`` per symbol present on a contiguous slice; the backward
pass does the same with ``W[k]^T``, and the weight gradients are accumulated once per chunk
with one product per symbol over all (t, stream) positions that read it.

:func:`isan_scan_ref` is the plain autograd twin used by the tests.
"""

from __future__ import annotations

import torch


def step_groups(x: torch.Tensor, K: int):
    """Per step: the permutation that sorts streams by symbol, and (k, start, end) slices.

    x: int64 (T, B). Returns (perm (T, B) int64, list over t of list of (k, s, e)).
    """
    T, B = x.shape
    xs, perm = torch.sort(x, dim=1, stable=True)
    counts = torch.zeros(T, K, dtype=torch.int64, device=x.device)
    counts.scatter_add_(1, x, torch.ones_like(x))
    counts = counts.tolist()
    groups = []
    for t in range(T):
        g, s = [], 0
        for k, c in enumerate(counts[t]):
            if c:
                g.append((k, s, s + c))
                s += c
        groups.append(g)
    return perm, groups


class ISANScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, W, b, h_init, x):
        T, B = x.shape
        K, d, _ = W.shape
        perm, groups = step_groups(x, K)
        H = h_init.new_empty(T, B, d)
        WT = W.transpose(1, 2)  # row-vector convention: h_row @ W[k]^T
        buf = h_init.new_empty(B, d)
        h = h_init
        for t in range(T):
            p = perm[t]
            hp = h.index_select(0, p)
            for k, s, e in groups[t]:
                torch.addmm(b[k], hp[s:e], WT[k], out=buf[s:e])
            H[t].index_copy_(0, p, buf)
            h = H[t]
        ctx.save_for_backward(W, h_init, x, H, perm)
        ctx.groups = groups
        return H

    @staticmethod
    def backward(ctx, dH):
        W, h_init, x, H, perm = ctx.saved_tensors
        groups = ctx.groups
        T, B, d = H.shape
        K = W.shape[0]
        dH = dH.contiguous()
        G = torch.empty_like(H)  # gradient w.r.t. the output of step t
        carry = torch.zeros_like(h_init)
        buf = torch.empty_like(h_init)
        for t in range(T - 1, -1, -1):
            g = G[t]
            torch.add(dH[t], carry, out=g)
            p = perm[t]
            gp = g.index_select(0, p)
            for k, s, e in groups[t]:
                torch.mm(gp[s:e], W[k], out=buf[s:e])
            carry = torch.empty_like(h_init)
            carry.index_copy_(0, p, buf)
        dW, db = _weight_grads(W, h_init, x, H, G)
        return dW, db, carry, None


def _weight_grads(W, h_init, x, H, G):
    """The weight gradients once per chunk, from every step's output gradient ``G`` (T, B, d):
    ``dW[k] = sum over positions reading k of g h_prev^T`` (one product per symbol over all its
    positions) and ``db[k] = sum of g``."""
    T, B, d = H.shape
    K = W.shape[0]
    H_prev = torch.cat([h_init.unsqueeze(0), H[:-1]], 0).reshape(T * B, d)
    Gf = G.reshape(T * B, d)
    xf = x.reshape(T * B)
    db = torch.zeros(K, d, dtype=G.dtype, device=G.device).index_add_(0, xf, Gf)
    order = torch.argsort(xf, stable=True)
    counts = torch.bincount(xf, minlength=K).tolist()
    Gs = Gf.index_select(0, order)
    Hs = H_prev.index_select(0, order)
    dW = torch.zeros_like(W)
    s = 0
    for k, c in enumerate(counts):
        if c:
            torch.mm(Gs[s : s + c].T, Hs[s : s + c], out=dW[k])
            s += c
    return dW, db


class ISANScanDense(torch.autograd.Function):
    """The same recurrence for devices where a launch costs more than FLOPs (a GPU at small B):
    each step is one GEMM of all B rows against every symbol's matrix side by side
    (``h @ [W[0]^T | ... | W[K-1]^T]``, K times the useful FLOPs) from which each row keeps its
    symbol's block, instead of one small GEMM per symbol present; the backward pass does the same
    with ``[W[0] | ... | W[K-1]]``. A step is a fixed number of launches whatever the symbols, with
    static shapes. The weight gradients are accumulated once per chunk as in :class:`ISANScan`."""

    @staticmethod
    def forward(ctx, W, b, h_init, x):
        T, B = x.shape
        K, d, _ = W.shape
        Wcat = W.transpose(1, 2).permute(1, 0, 2).reshape(d, K * d)  # block k: W[k]^T
        rows = torch.arange(B, device=x.device)
        H = h_init.new_empty(T, B, d)
        h = h_init
        for t in range(T):
            h = torch.mm(h, Wcat).view(B, K, d)[rows, x[t]] + b[x[t]]
            H[t] = h
        ctx.save_for_backward(W, h_init, x, H)
        return H

    @staticmethod
    def backward(ctx, dH):
        W, h_init, x, H = ctx.saved_tensors
        T, B, d = H.shape
        K = W.shape[0]
        Wstack = W.permute(1, 0, 2).reshape(d, K * d)  # block k: W[k]
        rows = torch.arange(B, device=x.device)
        dH = dH.contiguous()
        G = torch.empty_like(H)  # gradient w.r.t. the output of step t
        carry = torch.zeros_like(h_init)
        for t in range(T - 1, -1, -1):
            torch.add(dH[t], carry, out=G[t])
            carry = torch.mm(G[t], Wstack).view(B, K, d)[rows, x[t]]  # W[x_t]^T g, per row
        dW, db = _weight_grads(W, h_init, x, H, G)
        return dW, db, carry, None


#: how :func:`isan_scan` runs: ``"sorted"`` (:class:`ISANScan`, one GEMM per symbol a step),
#: ``"dense"`` (:class:`ISANScanDense`), ``"ref"`` (:func:`isan_scan_ref`, autograd through gathered
#: matrices) or ``"auto"``: sorted on the CPU, dense elsewhere (issue 35: on a GPU at B = 256 the
#: gathered matrices, 187 KB a row a step at d = 216, and their scattered gradients made
#: training launch- and memory-bound, 112k chars/s on an H200)
SCAN_IMPLS = ("auto", "sorted", "dense", "ref")


def isan_scan(W: torch.Tensor, b: torch.Tensor, h_init: torch.Tensor, x: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """All states of the ISAN over a chunk.

    Args:
        W: (K, d, d) float, b: (K, d), h_init: (B, d) state before the chunk,
        x: (T, B) int64 symbol ids.
        impl: one of :data:`SCAN_IMPLS` (all give the same states and gradients within rounding).
    Returns:
        H: (T, B, d) with ``H[t] = W[x[t]] @ H[t-1] + b[x[t]]`` per stream, ``H[-1]`` := h_init.
    """
    if impl not in SCAN_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(SCAN_IMPLS)}; got {impl!r}")
    if impl == "auto":
        impl = "sorted" if W.device.type == "cpu" else "dense"
    if impl == "ref":
        return isan_scan_ref(W, b, h_init, x)
    return (ISANScan if impl == "sorted" else ISANScanDense).apply(W, b, h_init, x)


def isan_scan_ref(W: torch.Tensor, b: torch.Tensor, h_init: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Plain autograd twin of :func:`isan_scan` (gathers ``W[x_t]`` per stream)."""
    h = h_init
    out = []
    for t in range(x.shape[0]):
        h = torch.bmm(W[x[t]], h.unsqueeze(-1)).squeeze(-1) + b[x[t]]
        out.append(h)
    return torch.stack(out, 0)
