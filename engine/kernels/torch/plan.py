"""How the torch backend cuts work: chunk counts and the correction's tolerance by device and dtype.

A GPU wants many rows in flight (each step's per-symbol GEMMs are small: at 32,768 rows about
1,200 rows a symbol), and chunk-parallel scoring pays a correction of a pair of rows a chunk until
the start error dies out. A chunk must be long enough for it to die out inside the chunk, or the
chunk is redone sequentially in float64 on the host (:class:`~isan.engine.kernels.chunked.Float64Fallback`),
which a GPU must never wait for. A certificate proves the error below the float32 runner's
stopping rule (1e-6 / 4 of the state) within ``Engine.forget_bound_chars()`` characters and below
the float64 runner's (1e-13 / 4) within ``forget_bound_chars(rtol=1e-13)``. Chunks are at least
1,024 characters in float32 and 2,048 in float64, which covers text8-d216-stable (984 and 1,718); a
model whose certificate proves less (a larger rho or state bound: the default, text8-d216-distil,
needs 1,064 in float32 and 1,855 in float64) gets chunks at least as long as its own bound
(:func:`min_chunk`: 1,280 characters in float32 for the default), as the CPU kernels' plan does
(``Engine.min_chunk``). On the CPU device (the tests and CI) the CPU kernels' row target applies.
The row target is a starting point, to be set by the GPU check (``isan/bench/gpu_check.sh``) on a
real card; nothing here is measured on one yet.

The float64 runner is the exact reference on the device: its corrections run until the start
error is below 1e-13 of the state (float32: 1e-6, as the compiled kernels), so chunk-parallel bits
equal the float64 reference to about 1e-12.
"""

from __future__ import annotations

from typing import Sequence

from isan.engine.kernels.chunked import MIN_CHUNK, ROWS_PER_THREAD, certified_min_chunk, plan_chunks
from isan.engine.kernels.plan import DEFAULT_RTOL

#: Rows a GPU batch aims at, and the shortest chunk it cuts by dtype (see the module docstring).
GPU_TARGET_ROWS = 32_768
GPU_MIN_CHUNK = {"float32": MIN_CHUNK, "float64": 2 * MIN_CHUNK}
#: The correction's stopping tolerance of the float64 runner.
FLOAT64_RTOL = 1e-13


def min_chunk(dtype: str = "float32", forget_chars: int | None = None) -> int:
    """The shortest chunk to cut in ``dtype``: :data:`GPU_MIN_CHUNK`, or, for a model whose certificate
    proves forgetting only after more characters (``forget_chars``: ``Engine.forget_bound_chars`` at
    :func:`rtol` of ``dtype``), that many rounded up to a multiple of 256, so that no chunk falls back."""
    return certified_min_chunk(forget_chars, GPU_MIN_CHUNK[dtype])


def chunks(lengths: Sequence[int], device: str, threads: int = 1, dtype: str = "float32",
           forget_chars: int | None = None) -> list[int]:
    """Chunks per text for the torch runner on ``device`` in ``dtype`` (``"cpu"``: the CPU kernels'
    row target), none shorter than :func:`min_chunk` of ``dtype`` and ``forget_chars`` (the model's
    proven forgetting; None: the plan's minimum alone)."""
    shortest = min_chunk(dtype, forget_chars)
    if str(device).startswith("cuda"):
        return plan_chunks(lengths, target_rows=GPU_TARGET_ROWS, min_chunk=shortest)
    return plan_chunks(lengths, target_rows=ROWS_PER_THREAD * max(1, threads), min_chunk=shortest)


#: Steps between the correction pass's convergence checks on a GPU, where each check is a
#: synchronisation that drains the device's queue (the CPU kernels check every ``CHECK_EVERY``): a
#: converged pair runs at most this many steps more.
GPU_CHECK_EVERY = 64


def check_every(device: str) -> int | None:
    """Steps between convergence checks for the torch runner on ``device`` (None: the default)."""
    return GPU_CHECK_EVERY if str(device).startswith("cuda") else None


def rtol(dtype: str) -> float:
    """The correction's relative tolerance for a runner computing in ``dtype``."""
    return FLOAT64_RTOL if dtype == "float64" else DEFAULT_RTOL
