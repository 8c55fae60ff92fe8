"""Float64 products whose every sum is exact, so that no order of summation can change them: the
error-free splitting of Ozaki et al. (2012, "Error-free transformations of matrix multiplication by
using fast routines of matrix multiplication and its applications", Numer. Algorithms 59).

Why: a BLAS GEMM (MKL or OpenBLAS on the CPU, cuBLAS on a GPU) adds the K products of an entry in
an order of its own choosing: it depends on the number of threads (which MKL may also lower by
itself, MKL_DYNAMIC), on the kernel picked for the shape (MKL rounds a row differently in a call of
3 rows and in one of 4) and on the rows' alignment in memory. In float64 the results differ in the
last bits (about 1e-16 relative a product, 1e-12 in a document's total), so the same job could
write different bytes.

How: the left operand ``a`` (M, k) is split row by row into :data:`LEFT_PIECES` pieces, each a
whole multiple of a power of two fixed by the row's largest magnitude (``a = a_1 + a_2 + a_3 +``
a remainder under 2^-(3 s) of that magnitude, s = :func:`piece_bits` (k)[0]); the right operand ``b``
(k, n), once, column by column into :data:`RIGHT_PIECES` pieces of t bits. Every product of a piece
of ``a`` and a piece of ``b`` is then an integer of at most s + t bits times one power of two a row
and a column, and any sum of k of them an integer of at most s + t + log2(k) <= 53 bits: exact in
float64, whatever the order, the blocking or the threads of the GEMM that adds them, on any device
(a GEMM that forms sums of inputs first, as Strassen's algorithm does, would break this; MKL,
OpenBLAS and cuBLAS do not in float64). The six products come from one GEMM of (3M, k) x (k, 2n) and are added in one
fixed order, smallest first (:func:`combine`), so the result is the same bytes on every run.

Accuracy: the remainders dropped are under 2^-(3 s) of a row's largest magnitude and 2^-(2 t) of
a column's (2^-54 both at k = 217: s = 18, t = 27), and the five additions round at most 6 eps of
the sum of the terms' magnitudes: as good as a float64 GEMM's own rounding. Cost: six times the
GEMM's arithmetic, in one call.
"""

from __future__ import annotations

import math

import torch

__all__ = ["LEFT_PIECES", "RIGHT_PIECES", "combine", "matmul", "piece_bits", "split_left", "split_right"]

#: Pieces of the left operand (the state rows, float64: 53 bits) and of the right (the weights,
#: float32 widened: 24 bits, but spread over about 22 binades in a column of the shipped model).
LEFT_PIECES = 3
RIGHT_PIECES = 2
#: The smallest exponent a row's or column's grid is placed at: rows whose largest magnitude is
#: below 2^-900 are taken as 0 (a state row holds the homogeneous 1; an error row stops long before).
_MIN_EXP = -900


def piece_bits(k: int) -> tuple[int, int]:
    """(s, t): bits of a left and of a right piece for sums of ``k`` products, so that
    s + t + ceil(log2 k) <= 53 (exact in float64) with 3 s and 2 t as close as can be."""
    budget = 53 - max(1, math.ceil(math.log2(max(2, int(k)))))
    s = RIGHT_PIECES * budget // (LEFT_PIECES + RIGHT_PIECES)
    return s, budget - s


#: The order the products of pieces (i, j) are added in: by their magnitude, 2^-(s i + t j) of the
#: largest term, smallest first (s : t is RIGHT_PIECES : LEFT_PIECES, :func:`piece_bits`).
_ORDER = sorted(((i, j) for i in range(LEFT_PIECES) for j in range(RIGHT_PIECES)),
                key=lambda ij: -(RIGHT_PIECES * ij[0] + LEFT_PIECES * ij[1]))


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2.0 ** e exactly (float64), from the bits, for integers e in [-1022, 1023]."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def _split(x: torch.Tensor, dim: int, pieces: int, bits: int) -> torch.Tensor:
    """``pieces`` float64 pieces of ``x``, stacked on a new axis inserted at ``dim`` (``unsqueeze``'s
    rule: (M, pieces, k) from (M, k) at dim 1; (..., k, pieces, n) from (..., k, n) at dim -2).

    With e the exponent of the largest magnitude along ``dim`` (max |x| < 2^e) and u_i = 2^(e - i bits),
    T_i is x rounded to a whole number of u_i; piece 1 is T_1 and piece i is T_i - T_(i-1), exact, a
    whole number of u_i of at most 2^bits; x minus their sum (T_last) is under half a u_last. Scalings
    by powers of two are exact (the exponents stay far from over- and underflow). Non-finite values
    give non-finite pieces (a row with a NaN or an infinity stays non-finite)."""
    mx = torch.linalg.vector_norm(x, ord=math.inf, dim=dim, keepdim=True)
    e = torch.frexp(torch.nan_to_num(mx, nan=0.0, posinf=0.0)).exponent.clamp(min=_MIN_EXP).to(torch.int64)
    shape = [1] * (x.dim() + 1)
    shape[dim] = pieces  # the new axis of the pieces: i bits, i = 1 .. pieces, along it
    shifts = (torch.arange(1, pieces + 1, device=x.device, dtype=torch.int64) * bits).view(shape)
    e = e.unsqueeze(dim)
    T = torch.round(x.unsqueeze(dim) * _pow2(shifts - e)) * _pow2(e - shifts)
    P = T.clone()
    P.narrow(dim, 1, pieces - 1).sub_(T.narrow(dim, 0, pieces - 1))
    return P


def split_left(a: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """The left operand's pieces, row by row, laid out for one GEMM.

    Args:
        a: (M, k) float64, any device.
        k: the length of the sums (default: ``a``'s columns).
    Returns:
        (M, LEFT_PIECES, k) float64, contiguous: rows ``[s:e]`` of it reshaped to (3 (e - s), k) are
        the left operand of :func:`combine`'s GEMM for rows s..e.
    """
    s, _ = piece_bits(k or a.shape[1])
    return _split(a, 1, LEFT_PIECES, s)


def split_right(b: torch.Tensor) -> torch.Tensor:
    """The right operand's pieces, column by column, side by side.

    Args:
        b: (..., k, n) float64 (a stack of matrices: each split by its own columns), any device.
    Returns:
        (..., k, RIGHT_PIECES * n) float64, contiguous: ``[b_1, b_2]``.
    """
    _, t = piece_bits(b.shape[-2])
    P = _split(b, -2, RIGHT_PIECES, t)  # (..., k, pieces, n)
    return P.reshape(*P.shape[:-2], RIGHT_PIECES * P.shape[-1]).contiguous()


def combine(p: torch.Tensor, n: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The sum of the six exact products in one fixed order, smallest first.

    Args:
        p: (M * LEFT_PIECES, RIGHT_PIECES * n) float64, the GEMM of :func:`split_left`'s rows
            (reshaped) by :func:`split_right`'s matrix: entry (3 r + i, j n + c) is the product of
            left piece i of row r and right piece j of column c.
        n: the columns of the product.
        out: (M, n) float64, where the result goes (default: a new tensor).
    Returns:
        (M, n) float64: ``a @ b`` to about float64's rounding, the same bytes for the same inputs.
    """
    q = p.view(-1, LEFT_PIECES, RIGHT_PIECES, n)
    acc = None
    for i, j in _ORDER:
        acc = q[:, i, j] if acc is None else acc + q[:, i, j]
    if out is None:
        return acc
    out.copy_(acc)
    return out


#: Rows of ``a`` :func:`matmul` splits at once (its pieces take three times their bytes).
MATMUL_ROWS = 1 << 14


def matmul(a: torch.Tensor, b_split: torch.Tensor) -> torch.Tensor:
    """``a @ b`` from ``a`` (M, k) float64 and ``b_split = split_right(b)`` (k, 2 n), any device:
    a GEMM whose sums are exact (module docstring) and :func:`combine`, :data:`MATMUL_ROWS` rows
    at a time (a row's result does not depend on the others). Returns (M, n) float64."""
    k, n = b_split.shape[-2], b_split.shape[-1] // RIGHT_PIECES
    out = a.new_empty((a.shape[0], n))
    for r in range(0, a.shape[0], MATMUL_ROWS):
        pieces = split_left(a[r : r + MATMUL_ROWS], k)
        combine(pieces.view(-1, k) @ b_split, n, out=out[r : r + MATMUL_ROWS])
    return out
