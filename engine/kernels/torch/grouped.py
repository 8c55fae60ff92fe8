"""One step of many state rows as one fused, grouped GEMM in Triton: :func:`grouped_step`.

A step of the ISAN (``h <- W[x] h + b[x]``, Foerster et al. 2017, eq. 1) over many rows is the
routing of a mixture of experts: a row's symbol is its expert. The plain torch step
(:class:`~isan.engine.kernels.torch.TorchStreams` with ``step="mm"``) gathers the rows in symbol
order, runs one GEMM per symbol present and scatters them back: about 30 kernels and three passes
over the states a step. Here the gather, the product and the scatter are one kernel, as the
grouped GEMMs of mixtures of experts do (Triton's tutorial 08-grouped-gemm; vLLM's ``fused_moe``
and its block alignment): the rows of a step are laid out in symbol order, each symbol's group
padded to a whole number of tiles of ``BM`` rows, so a tile has one symbol; a program multiplies
one tile of rows, read straight from the state rows by their indices, by one block of columns of
that symbol's ``W^T`` (homogeneous layout ``[h, 1]``, so the bias rides in the product) and writes
them to their rows of the output.

The layout of a whole block of steps (:func:`tile_layout`) is made on the device from the sorted
symbols, with a static upper bound on the number of tiles, so a step costs one launch and no
transfer to the host.

``float32`` products are IEEE float32 by default (``input_precision="ieee"``: never plain TF32,
which would err by about 1e-3), or three TF32 tensor-core products (``"tf32x3"``,
:data:`PRECISIONS`); ``float64`` runs float64 products. On torch CPU tensors the kernel runs in
Triton's interpreter (numpy; ``TRITON_INTERPRET=1`` set before Triton is imported): that is how CI
tests it without a GPU. Triton is imported when this module is (the torch backend imports it only
when this step is asked for).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

#: Rows a tile (the layout's unit). Columns a program and the depth of a product slice are tuned on
#: a GPU (:data:`CONFIGS`); the interpreter takes the whole width at once.
BM = 64
#: Row strides of states and weights are padded to a multiple of this many elements (64 bytes in
#: float32), so that rows start aligned and loads vectorise; the padding is never read.
PAD = 16


def _grouped_step_kernel(h_in, h_out, WT, rows_ptr, tile_sym_ptr, stride_h, stride_wk, stride_wr,
                         n_cols: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,  # noqa: N803
                         PREC: tl.constexpr):
    """Program (t, n): rows ``rows[t BM : (t + 1) BM]`` (``-1``: padding) of ``h_in`` times columns
    ``n BN ..`` of ``WT[tile_sym[t]]``, into the same rows of ``h_out``; a tile of symbol -1 is empty."""
    t = tl.program_id(0)
    nb = tl.program_id(1)
    sym = tl.load(tile_sym_ptr + t)
    if sym >= 0:
        offs_m = t * BM + tl.arange(0, BM)
        rows = tl.load(rows_ptr + offs_m)
        m_row = rows >= 0
        rows = tl.where(m_row, rows, 0).to(tl.int64)
        offs_n = nb * BN + tl.arange(0, BN)
        m_n = offs_n < n_cols
        acc = tl.zeros((BM, BN), dtype=h_out.dtype.element_ty)
        w_base = WT + sym.to(tl.int64) * stride_wk
        for k0 in range(0, n_cols, BK):
            offs_k = k0 + tl.arange(0, BK)
            m_k = offs_k < n_cols
            a = tl.load(h_in + rows[:, None] * stride_h + offs_k[None, :], mask=m_row[:, None] & m_k[None, :], other=0.0)
            b = tl.load(w_base + offs_k[:, None] * stride_wr + offs_n[None, :], mask=m_k[:, None] & m_n[None, :],
                        other=0.0)
            acc += tl.dot(a, b, input_precision=PREC)
        tl.store(h_out + rows[:, None] * stride_h + offs_n[None, :], acc, mask=m_row[:, None] & m_n[None, :])


_KERNEL = triton.jit(_grouped_step_kernel)
#: The GPU's choices of (columns a program, slice depth, warps, pipeline stages), timed once per
#: width, dtype and precision by Triton's autotuner (the step writes only ``h_out``, so a timed rerun
#: is harmless). On the H200 (isan/bench/gpu_check.sh) 128 columns and slices of 32 won in float32
#: (8 warps) and float64 (4 warps) out of seven; these four are kept to bound the tuning time.
CONFIGS = [triton.Config({"BN": bn, "BK": bk}, num_warps=w, num_stages=st)
           for bn, bk, w, st in ((64, 32, 4, 3), (128, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 3))]
_TUNED = triton.autotune(CONFIGS, key=["n_cols", "PREC"])(_KERNEL)
#: The products' precisions: ``"ieee"`` (float32 or float64 arithmetic) and, for float32 on a GPU,
#: ``"tf32x3"`` (each float32 split into a TF32 high and low part, three TF32 tensor-core products
#: summed: about float32's accuracy, not its rounding; the interpreter computes it in float32).
PRECISIONS = ("ieee", "tf32x3")


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter in this process (``TRITON_INTERPRET=1`` set
    before Triton was imported): then on torch CPU tensors only, else on GPU tensors only."""
    knobs = getattr(triton, "knobs", None)
    return bool(knobs.runtime.interpret) if knobs is not None else os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_device(device: torch.device) -> None:
    """Raise ValueError where this process's Triton cannot run on ``device`` (see :func:`interpreted`)."""
    if device.type == "cpu" and not interpreted():
        raise ValueError("the Triton step runs on the CPU device only in Triton's interpreter: set "
                         "TRITON_INTERPRET=1 before Triton is imported, or use step='mm'")
    if device.type != "cpu" and interpreted():
        raise ValueError(f"Triton's interpreter is on (TRITON_INTERPRET=1): it runs on the CPU device only, "
                         f"not {device}; unset it, or use step='mm'")


def tuned_configs() -> dict:
    """What the autotuner chose on this GPU so far: ``{key: "BN, BK, warps, stages"}`` (empty before a
    GPU step ran)."""
    return {str(k): f"BN {c.kwargs.get('BN')}, BK {c.kwargs.get('BK')}, {c.num_warps} warps, {c.num_stages} stages"
            for k, c in getattr(_TUNED, "cache", {}).items()}


def padded(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`PAD`: the row stride of states and weights."""
    return -(-n // PAD) * PAD


def with_identity(WT: torch.Tensor) -> torch.Tensor:
    """(K, d + 1, d + 1) -> (K + 1, w, w), w = :func:`padded` (d + 1), zeros beyond d + 1: symbol K
    (rows past their end) maps a row to itself, exactly (each output is the input times 1 plus
    products with 0)."""
    K, n = WT.shape[0], WT.shape[1]
    out = torch.zeros((K + 1, padded(n), padded(n)), dtype=WT.dtype, device=WT.device)
    out[:K, :n, :n] = WT
    out[K, :n, :n] = torch.eye(n, dtype=WT.dtype, device=WT.device)
    return out


def max_tiles(n_rows: int, n_syms: int) -> int:
    """An upper bound on the tiles of a step: each symbol's group pads by under one tile."""
    return -(-n_rows // BM) + n_syms


def tile_layout(sorted_sym: torch.Tensor, perm: torch.Tensor, n_syms: int,
                counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiles of each step of a block, on the device.

    Args:
        sorted_sym: (steps, R) int64, each step's symbols (0 .. n_syms - 1) sorted ascending.
        perm: (steps, R) int64, the rows in that order (``sorted_sym[j] = sym[j][perm[j]]``).
        n_syms: symbols (with the sentinel of rows past their end).
        counts: (steps, n_syms) int64, each step's rows of each symbol, where the caller has them
            (else counted here).
    Returns:
        rows (steps, T * BM) int32, the row of each slot or -1 (padding), and tile_sym (steps, T)
        int32, each tile's symbol or -1 (past the step's last tile); T = :func:`max_tiles`.
    """
    steps, R = perm.shape
    dev = perm.device
    T = max_tiles(R, n_syms)
    if counts is None:
        counts = torch.zeros(steps, n_syms, dtype=torch.int64, device=dev)
        counts.scatter_add_(1, sorted_sym, torch.ones_like(sorted_sym))
    padded = (counts + BM - 1) // BM * BM
    pend = torch.cumsum(padded, dim=1)
    pstart = pend - padded
    gstart = torch.cumsum(counts, dim=1) - counts
    i = torch.arange(R, device=dev).expand(steps, R)
    slot = pstart.gather(1, sorted_sym) + i - gstart.gather(1, sorted_sym)
    rows = torch.full((steps, T * BM), -1, dtype=torch.int32, device=dev)
    rows.scatter_(1, slot, perm.to(torch.int32))
    tile_start = (torch.arange(T, device=dev) * BM).expand(steps, T).contiguous()
    tile_sym = torch.searchsorted(pend, tile_start, right=True)
    tile_sym = torch.where(tile_sym < n_syms, tile_sym, -1).to(torch.int32)
    return rows, tile_sym


def grouped_step(h_in: torch.Tensor, h_out: torch.Tensor, WT_ext: torch.Tensor, rows: torch.Tensor,
                 tile_sym: torch.Tensor, n_cols: int | None = None, precision: str = "ieee") -> None:
    """``h_out[r, :n] = h_in[r, :n] @ WT_ext[s, :n, :n]`` for every row r of symbol s in the layout
    (one launch; n = ``n_cols``, the state width d + 1).

    Args:
        h_in, h_out: (R, w >= n) float32 or float64, rows contiguous, on one device; distinct
            tensors (w: :func:`padded` (n) for aligned rows; columns past n are neither read nor written).
        WT_ext: (S, w', w') with w' >= n, contiguous, same dtype (:func:`with_identity`).
        rows, tile_sym: one step of :func:`tile_layout` ((T * BM,) and (T,) int32).
        n_cols: n (default: the width of ``h_in``).
        precision: one of :data:`PRECISIONS` (``"tf32x3"``: float32 only).
    Raises:
        ValueError: an unknown precision, or ``"tf32x3"`` in float64.
    Every row the layout names is written; a row it does not name is left as it was.
    """
    n_cols = int(n_cols or h_in.shape[1])
    if precision not in PRECISIONS or (precision != "ieee" and h_in.dtype != torch.float32):
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (tf32x3: float32 only); got {precision!r}")
    assert h_in.stride(1) == h_out.stride(1) == WT_ext.stride(2) == 1 and h_in.stride(0) == h_out.stride(0)
    args = (h_in, h_out, WT_ext, rows, tile_sym, h_in.stride(0), WT_ext.stride(0), WT_ext.stride(1))
    if h_in.device.type == "cpu":  # the interpreter pays per program and per slice: one of each a tile,
        w = triton.next_power_of_2(n_cols)  # and no program for the empty tiles at the end (-1: last)
        _KERNEL[(int((tile_sym >= 0).sum()), 1)](*args, n_cols=n_cols, BM=BM, BN=w, BK=w, PREC=precision)
    else:
        _launch_tuned(args, tile_sym.numel(), n_cols, precision, h_in.dtype)


#: The autotuner's choice by (width, precision, dtype), once made: later steps launch the kernel with
#: it directly, without the autotuner's own bookkeeping a launch (about 40 us of host time of a step's
#: 120-140 us on the H200's host, bench_results/gpu_h200/run4: the long text launches 1,441 steps).
_CHOSEN: dict = {}


def _launch_tuned(args: tuple, tiles: int, n_cols: int, precision: str, dtype) -> None:
    """One step on a GPU: through the autotuner until it has chosen for this key, then directly
    with its choice (a direct launch that fails falls back to the autotuner for good)."""
    key = (n_cols, precision, dtype)
    cfg = _CHOSEN.get(key)
    if cfg:
        try:
            _KERNEL[(tiles, triton.cdiv(n_cols, cfg.kwargs["BN"]))](
                *args, n_cols=n_cols, BM=BM, PREC=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                **cfg.kwargs)
            return
        except Exception:  # noqa: BLE001 - a Triton whose launch API differs: the autotuner still works
            _CHOSEN[key] = False
    _TUNED[lambda meta: (tiles, triton.cdiv(n_cols, meta["BN"]))](*args, n_cols=n_cols, BM=BM, PREC=precision)
    if cfg is None and getattr(_TUNED, "best_config", None) is not None:
        _CHOSEN[key] = _TUNED.best_config
