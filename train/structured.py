"""A structured ISAN (issue #48, step 1): each symbol's map is diagonal plus low rank,
``W[x] = diag(a[x]) + U[x] V[x]^T`` with ``U[x], V[x]`` of shape (d, r).

The recurrence is the ISAN's (Foerster et al. 2017, section 2.1, eq. 1), ``h_t = W[x_t] h_{t-1} + b[x_t]``,
with the readout of eqs. 2-3, ``l_t = W_ro h_t + b_ro``; only the parameterisation of ``W[x]`` changes, so a
step costs ``d (2 r + 1)`` multiply-adds instead of ``d^2`` and the map is still exactly affine: composition
and the attribution ``kappa`` of eqs. 4-6 hold with ``W[x] = dense_W()[x]`` (:meth:`DPLRISAN.dense_W`).

What it follows:
  * S4 (Gu, Goel and Re 2022, "Efficiently Modeling Long Sequences with Structured State Spaces", ICLR),
    its diagonal-plus-low-rank (DPLR) state matrix ``A = Lambda - P Q^*`` (a normal matrix, diagonalised,
    plus a low-rank correction; the paper's section 3, "the S4 parameterization"). Here the diagonal is real
    and learned per input symbol, and the correction ``U V^T`` has rank r; S4's use of the form (a Cauchy
    kernel and the Woodbury identity for a convolution kernel) does not apply to an input-switched
    recurrence, only the matrix form does. (Read from secondary sources, not the paper's text:
    results/structured/README.md says which.)
  * The LRU (Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long Sequences", ICML): a
    linear, diagonal recurrence whose eigenvalues are initialised uniformly on a ring ``r_min <= |lambda|
    <= r_max`` with phases in ``[0, max_phase]``. A real diagonal's only phases are 0 and pi, so
    :class:`DPLRISAN` draws ``|a|`` on the ring (uniform over its area) and a random sign.
  * Stability as in the dense ISAN (train/models.py, ``init_scale`` 0.95): ``||W[x]||_2 <= max|a[x]| +
    ||U[x]||_2 ||V[x]||_2 <= r_max + lowrank_scale = 0.95`` at the start.

Row-vector convention for the scans (as train/scan.py): ``h`` is (B, d) and a step is
``h_new = a[x] * h + (h V[x]) U[x]^T + b[x]``; two skinny GEMMs ((n, d) x (d, r), (n, r) x (r, d)) and an
elementwise product per symbol group.

:func:`dplr_scan` is the fast path (custom autograd Functions: ``"sorted"`` groups streams by symbol, one
pair of skinny GEMMs per symbol present, for the CPU; ``"masked"`` runs all symbols side by side in one
(B, d) x (d, K r) GEMM and masks, with static shapes and no host synchronisation, for a GPU);
:func:`dplr_scan_ref` is its plain autograd twin (the tests compare them, and both with
:func:`isan.train.scan.isan_scan` on :meth:`DPLRISAN.dense_W`).
"""

from __future__ import annotations


import torch
from torch import nn

from isan.train.models import add_bias_and_readout
from isan.train.scan import step_groups


# ---- cost ----------------------------------------------------------------------------------------
def dense_cost(d: int, V: int = 27) -> int:
    """Multiply-adds a character of a dense ISAN: ``d^2`` (the step) + ``V d`` (the readout)."""
    return d * d + V * d


def dplr_cost(d: int, r: int, V: int = 27) -> int:
    """Multiply-adds a character of a DPLR ISAN: ``d (2 r + 1)`` (the step) + ``V d`` (the readout)."""
    return d * (2 * r + 1) + V * d


def equal_cost_rank(d: int, budget: int, V: int = 27) -> int:
    """The largest rank r whose :func:`dplr_cost` at state size d is at most ``budget`` multiply-adds
    (issue #48: ``equal_cost_rank(384, dense_cost(216)) == 54``, ``equal_cost_rank(512, ...) == 37``)."""
    r = (budget - V * d - d) // (2 * d)
    if r < 1:
        raise ValueError(f"no rank r >= 1 fits {budget:,} multiply-adds at d = {d}")
    return int(r)


def dplr_param_count(K: int, V: int, d: int, r: int) -> int:
    """Parameters: a (K, d), U and V (K, d, r), b (K, d), W_ro (V, d), b_ro (V,), h0 (d,)."""
    return K * d * (2 * r + 2) + V * d + V + d


def structure_problem(structure: str, rank: int | None, model: str = "isan", d: int | None = None,
                      stable_rho: float | None = None, stable_basis: bool = False, teacher: str | None = None,
                      alphabet: str = "chars", distributed: bool = False) -> str | None:
    """Why a run's options do not go with ``structure`` (a sentence that says what to change), or None."""
    if structure == "dense":
        return "--rank goes with --structure dplr" if rank is not None else None
    if structure != "dplr":
        return f"unknown structure {structure!r}; choose dense or dplr"
    if model != "isan":
        return f"--structure dplr applies to the isan model only, not {model}"
    if rank is None or rank < 1:
        return "--structure dplr needs --rank R (R >= 1), e.g. --d 384 --rank 54 (the default's cost)"
    if d is None:
        return "--structure dplr needs the state size --d (no --params budget), e.g. --d 384 --rank 54"
    if rank > d:
        return f"--rank {rank} exceeds --d {d}"
    refused = [name for name, given in (("--stable-rho", stable_rho), ("--stable-basis", stable_basis),
                                        ("--teacher", teacher), ("--distributed", distributed)) if given]
    if alphabet != "chars":
        refused.append(f"--alphabet {alphabet}")
    if refused:
        return (f"--structure dplr does not support {', '.join(refused)} yet (issue #48 step 1 is the probe; "
                f"the certificate comes with step 2): drop {' and '.join(refused)} or train --structure dense")
    return None


# ---- the scans ---------------------------------------------------------------------------------
def _weight_grads(x, h_init, H, G, Z, GU, K):
    """Weight gradients once per chunk from every step's output gradient G (T, B, d), the low-rank
    codes Z = h_prev V[x] (T, B, r) and GU = g U[x] (T, B, r), all in stream order: per symbol k over the
    positions that read it, ``dU[k] = G^T Z``, ``dV[k] = H_prev^T GU``, ``da[k] = sum g * h_prev``,
    ``db[k] = sum g``. Returns (da (K, d), dU (K, d, r), dV (K, d, r), db (K, d))."""
    T, B, d = H.shape
    r = Z.shape[-1]
    Hp = torch.cat([h_init.unsqueeze(0), H[:-1]], 0).reshape(T * B, d)
    Gf, xf = G.reshape(T * B, d), x.reshape(T * B)
    db = torch.zeros(K, d, dtype=G.dtype, device=G.device).index_add_(0, xf, Gf)
    da = torch.zeros(K, d, dtype=G.dtype, device=G.device).index_add_(0, xf, Gf * Hp)
    order = torch.argsort(xf, stable=True)
    counts = torch.bincount(xf, minlength=K).tolist()
    Gs, Hs = Gf.index_select(0, order), Hp.index_select(0, order)
    Zs, GUs = Z.reshape(T * B, r).index_select(0, order), GU.reshape(T * B, r).index_select(0, order)
    dU = torch.zeros(K, d, r, dtype=G.dtype, device=G.device)
    dV = torch.zeros_like(dU)
    s = 0
    for k, c in enumerate(counts):
        if c:
            torch.mm(Gs[s: s + c].T, Zs[s: s + c], out=dU[k])
            torch.mm(Hs[s: s + c].T, GUs[s: s + c], out=dV[k])
            s += c
    return da, dU, dV, db


def _unsort(perm, Ys):
    """Rows of Ys (T, B, n), sorted per step by ``perm`` (T, B), back in stream order."""
    return torch.empty_like(Ys).scatter_(1, perm.unsqueeze(-1).expand_as(Ys), Ys)


class DPLRScanSorted(torch.autograd.Function):
    """The DPLR recurrence grouped by symbol (as :class:`isan.train.scan.ISANScan`): each step sorts the
    streams by symbol once; per symbol present, ``out = b[k] + a[k] * h`` then ``out += (h V[k]) U[k]^T``.
    The backward pass runs ``g a[k] + (g U[k]) V[k]^T``; weight gradients come once per chunk."""

    @staticmethod
    def forward(ctx, a, U, V, b, h_init, x):
        T, B = x.shape
        K, d, r = U.shape
        perm, groups = step_groups(x, K)
        H = h_init.new_empty(T, B, d)
        Zs = h_init.new_empty(T, B, r)  # h_prev V[x], rows sorted per step
        UT = U.transpose(1, 2)
        buf = h_init.new_empty(B, d)
        h = h_init
        for t in range(T):
            p = perm[t]
            hp = h.index_select(0, p)
            for k, s, e in groups[t]:
                torch.addcmul(b[k], a[k], hp[s:e], out=buf[s:e])
                torch.mm(hp[s:e], V[k], out=Zs[t, s:e])
                buf[s:e].addmm_(Zs[t, s:e], UT[k])
            H[t].index_copy_(0, p, buf)
            h = H[t]
        ctx.save_for_backward(a, U, V, h_init, x, H, Zs, perm)
        ctx.groups = groups
        return H

    @staticmethod
    def backward(ctx, dH):
        a, U, V, h_init, x, H, Zs, perm = ctx.saved_tensors
        groups = ctx.groups
        T, B, d = H.shape
        K, _, r = U.shape
        dH = dH.contiguous()
        VT = V.transpose(1, 2)
        G = torch.empty_like(H)
        GUs = h_init.new_empty(T, B, r)  # g U[x], rows sorted per step
        carry = torch.zeros_like(h_init)
        buf = torch.empty_like(h_init)
        for t in range(T - 1, -1, -1):
            g = G[t]
            torch.add(dH[t], carry, out=g)
            p = perm[t]
            gp = g.index_select(0, p)
            for k, s, e in groups[t]:
                torch.mm(gp[s:e], U[k], out=GUs[t, s:e])
                torch.mul(gp[s:e], a[k], out=buf[s:e])
                buf[s:e].addmm_(GUs[t, s:e], VT[k])
            carry = torch.empty_like(h_init)
            carry.index_copy_(0, p, buf)
        da, dU, dV, db = _weight_grads(x, h_init, H, G, _unsort(perm, Zs), _unsort(perm, GUs), K)
        return da, dU, dV, db, carry, None


class DPLRScanMasked(torch.autograd.Function):
    """The DPLR recurrence for a GPU (as :class:`isan.train.scan.ISANScanDense`): each step is one GEMM of
    all B rows against every symbol's V side by side (``h [V[0] | ... | V[K-1]]``, (B, K r)), a mask that
    keeps each row's symbol block, one GEMM against the stacked ``U[k]^T`` (K r, d) and ``b[x] + a[x] * h``
    (gathered once a chunk). K times the useful FLOPs of the low-rank part, a fixed number of launches a step,
    static shapes, no host synchronisation; the weight gradients of U and V are one GEMM each a chunk."""

    @staticmethod
    def forward(ctx, a, U, V, b, h_init, x):
        T, B = x.shape
        K, d, r = U.shape
        Vcat = V.permute(1, 0, 2).reshape(d, K * r)  # block k: V[k]
        UcatT = U.transpose(1, 2).reshape(K * r, d)  # block k: U[k]^T
        M = torch.nn.functional.one_hot(x, K).to(h_init.dtype).unsqueeze(-1)  # (T, B, K, 1)
        ax, bx = a[x], b[x]  # (T, B, d)
        H = h_init.new_empty(T, B, d)
        Zm = h_init.new_empty(T, B, K * r)  # masked codes: row (t, i) holds h V[x] in block x
        h = h_init
        for t in range(T):
            torch.mul(torch.mm(h, Vcat).view(B, K, r), M[t], out=Zm[t].view(B, K, r))
            torch.addcmul(bx[t], ax[t], h, out=H[t])
            H[t].addmm_(Zm[t], UcatT)
            h = H[t]
        ctx.save_for_backward(a, U, V, h_init, x, H, Zm)
        return H

    @staticmethod
    def backward(ctx, dH):
        a, U, V, h_init, x, H, Zm = ctx.saved_tensors
        T, B, d = H.shape
        K, _, r = U.shape
        Ucat = U.permute(1, 0, 2).reshape(d, K * r)  # block k: U[k]
        VcatT = V.transpose(1, 2).reshape(K * r, d)  # block k: V[k]^T
        M = torch.nn.functional.one_hot(x, K).to(h_init.dtype).unsqueeze(-1)
        ax = a[x]
        dH = dH.contiguous()
        G = torch.empty_like(H)
        GUm = h_init.new_empty(T, B, K * r)
        carry = torch.zeros_like(h_init)
        for t in range(T - 1, -1, -1):
            torch.add(dH[t], carry, out=G[t])
            torch.mul(torch.mm(G[t], Ucat).view(B, K, r), M[t], out=GUm[t].view(B, K, r))
            carry = torch.mul(G[t], ax[t])
            carry.addmm_(GUm[t], VcatT)
        N = T * B
        Hp = torch.cat([h_init.unsqueeze(0), H[:-1]], 0).reshape(N, d)
        Gf, xf = G.reshape(N, d), x.reshape(N)
        dU = torch.mm(Gf.T, Zm.reshape(N, K * r)).view(d, K, r).permute(1, 0, 2).contiguous()
        dV = torch.mm(Hp.T, GUm.reshape(N, K * r)).view(d, K, r).permute(1, 0, 2).contiguous()
        da = torch.zeros(K, d, dtype=G.dtype, device=G.device).index_add_(0, xf, Gf * Hp)
        db = torch.zeros(K, d, dtype=G.dtype, device=G.device).index_add_(0, xf, Gf)
        return da, dU, dV, db, carry, None


#: how :func:`dplr_scan` runs: ``"sorted"`` (:class:`DPLRScanSorted`), ``"masked"``
#: (:class:`DPLRScanMasked`), ``"ref"`` (:func:`dplr_scan_ref`) or ``"auto"``: sorted on the CPU, masked
#: elsewhere
DPLR_SCAN_IMPLS = ("auto", "sorted", "masked", "ref")


def dplr_scan(a: torch.Tensor, U: torch.Tensor, V: torch.Tensor, b: torch.Tensor, h_init: torch.Tensor,
              x: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """All states of the DPLR ISAN over a chunk.

    Args:
        a: (K, d) diagonals, U, V: (K, d, r), b: (K, d), all float32 or float64 on one device;
        h_init: (B, d) the state before the chunk; x: (T, B) int64 symbol ids on the same device.
        impl: one of :data:`DPLR_SCAN_IMPLS` (all give the same states and gradients within rounding).
    Returns:
        H: (T, B, d), ``H[t] = (diag(a[x_t]) + U[x_t] V[x_t]^T) H[t-1] + b[x_t]`` per stream (ISAN eq. 1),
        ``H[-1]`` := h_init.
    """
    if impl not in DPLR_SCAN_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(DPLR_SCAN_IMPLS)}; got {impl!r}")
    if impl == "auto":
        impl = "sorted" if a.device.type == "cpu" else "masked"
    if impl == "ref":
        return dplr_scan_ref(a, U, V, b, h_init, x)
    return (DPLRScanSorted if impl == "sorted" else DPLRScanMasked).apply(a, U, V, b, h_init, x)


def dplr_scan_ref(a: torch.Tensor, U: torch.Tensor, V: torch.Tensor, b: torch.Tensor, h_init: torch.Tensor,
                  x: torch.Tensor) -> torch.Tensor:
    """Plain autograd twin of :func:`dplr_scan` (gathers ``U[x_t]``, ``V[x_t]`` per stream); same
    arguments and result."""
    h = h_init
    out = []
    for t in range(x.shape[0]):
        k = x[t]
        z = torch.einsum("bdr,bd->br", V[k], h)  # (B, r)
        h = a[k] * h + torch.einsum("bdr,br->bd", U[k], z) + b[k]
        out.append(h)
    return torch.stack(out, 0)


# ---- the model -----------------------------------------------------------------------------------
class DPLRISAN(nn.Module):
    """The ISAN with ``W[x] = diag(a[x]) + U[x] V[x]^T`` (ISAN eqs. 1-3; S4's DPLR form; LRU's ring init).

    Parameters (float32): a (K, d), U (K, d, r), V (K, d, r), b (K, d), W_ro (V, d), b_ro (V,), h0 (d,).
    ``config()`` has ``"kind": "isan"`` with ``"structure": "dplr"`` and ``"rank"``; best.safetensors also
    holds the materialised ``W = dense_W()`` (:meth:`checkpoint_tensors`), so ``isan export`` writes a
    normal dense bundle, exactly the same affine maps.

    Init: ``|a|`` on the LRU's ring ``[r_min, r_max]`` (uniform over its area) with a random sign; V with
    orthonormal columns and U with orthonormal columns times ``lowrank_scale``, so ``||U V^T||_2 =
    lowrank_scale`` and ``||W[x]||_2 <= r_max + lowrank_scale`` (0.95, the dense ISAN's init scale).
    """

    kind = "isan"
    structure = "dplr"
    #: parameters AdamW does not decay (``--weight-decay`` acts on a, U, V and W_ro)
    no_decay = ("b", "b_ro", "h0")
    #: how the recurrence runs (:data:`DPLR_SCAN_IMPLS`; auto: by the parameters' device)
    scan_impl = "auto"

    def __init__(self, K: int, V: int, d: int, rank: int, seed: int | None = None, state_dropout: float = 0.0,
                 r_min: float = 0.5, r_max: float = 0.9, lowrank_scale: float = 0.05):
        super().__init__()
        if not 1 <= rank <= d:
            raise ValueError(f"the rank must be in 1..d = {d}; got {rank}")
        self.K, self.n_out, self.d, self.rank = K, V, d, int(rank)
        self.state_dropout = float(state_dropout)
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        u = torch.rand(K, d, generator=g)
        mag = torch.sqrt(u * (r_max ** 2 - r_min ** 2) + r_min ** 2)  # uniform over the ring's area
        sign = torch.where(torch.rand(K, d, generator=g) < 0.5, -1.0, 1.0)
        self.a = nn.Parameter(mag * sign)
        Us, Vs = torch.empty(K, d, rank), torch.empty(K, d, rank)
        for k in range(K):
            Us[k] = torch.linalg.qr(torch.randn(d, rank, generator=g))[0] * lowrank_scale
            Vs[k] = torch.linalg.qr(torch.randn(d, rank, generator=g))[0]
        self.U = nn.Parameter(Us)
        self.V = nn.Parameter(Vs)  # (the output count is n_out: "V" in config(), as the dense ISAN's)
        add_bias_and_readout(self, K, V, d, g)

    @staticmethod
    def param_count(K: int, V: int, d: int, r: int) -> int:
        return dplr_param_count(K, V, d, r)

    def config(self) -> dict:
        c = {"kind": self.kind, "K": self.K, "V": self.n_out, "d": self.d, "structure": self.structure,
             "rank": self.rank}
        if self.state_dropout:
            c["state_dropout"] = self.state_dropout
        return c

    def dense_W(self) -> torch.Tensor:
        """(K, d, d): ``diag(a[k]) + U[k] V[k]^T`` for every symbol (column convention, ``W[k] @ h``)."""
        return torch.diag_embed(self.a) + torch.bmm(self.U, self.V.transpose(1, 2))

    def initial_state(self, B: int) -> torch.Tensor:
        return self.h0.unsqueeze(0).expand(B, self.d)

    def forward(self, x: torch.Tensor, h: torch.Tensor):
        """x: (T, B) int64; h: (B, d) state before x[0]. Returns (logits (T, B, V) predicting x[t] from the
        state before it, H[-1] (B, d)) exactly as :meth:`isan.train.models.ISAN.forward`."""
        H = dplr_scan(self.a, self.U, self.V, self.b, h, x, impl=self.scan_impl)
        S = torch.cat([h.unsqueeze(0), H[:-1]], 0)
        if self.training and self.state_dropout:
            S = torch.nn.functional.dropout(S, self.state_dropout)
        return torch.matmul(S, self.W_ro.T) + self.b_ro, H[-1]

    def checkpoint_tensors(self) -> dict:
        """What best.safetensors holds: the state dict plus the materialised ``W`` (K, d, d)."""
        return {**self.state_dict(), "W": self.dense_W().detach()}

    def numpy_params(self) -> dict:
        """The dense ISAN's tensors (W = dense_W()), float32 numpy, for the engine and the tests."""
        t = {"W": self.dense_W(), "b": self.b, "W_ro": self.W_ro, "b_ro": self.b_ro, "h0": self.h0}
        return {n: v.detach().cpu().float().numpy() for n, v in t.items()}
