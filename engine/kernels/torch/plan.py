"""How the torch backend cuts work: chunk counts and the correction's tolerance by device and dtype.

A GPU wants many rows in flight (each step's per-symbol GEMMs are small: at 32,768 rows about
1,200 rows a symbol), and chunk-parallel scoring pays a correction of a pair of rows a chunk until
the start error dies out. A chunk must be long enough for it to die out inside the chunk, or the
chunk is redone sequentially in float64 on the host (:class:`~isan.engine.kernels.chunked.Float64Fallback`),
which a GPU must never wait for. The shipped model's certificate proves the error below the
float32 runner's stopping rule (1e-6 / 4 of the state) within 984 characters and below the float64
runner's (1e-13 / 4) within about 1,700 (``Engine.forget_bound_chars``), so chunks are at least
1,024 characters in float32 and 2,048 in float64. On the CPU device (the tests and CI) the CPU
kernels' plan applies. The row target is a starting point, to be set by the GPU check
(``isan/bench/gpu_check.sh``) on a real card; nothing here is measured on one yet.

The float64 runner is the exact reference on the device: its corrections run until the start
error is below 1e-13 of the state (float32: 1e-6, as the compiled kernels), so chunk-parallel bits
equal the float64 reference to about 1e-12.
"""

from __future__ import annotations

from typing import Sequence

from isan.engine.kernels.chunked import DEFAULT_RTOL, MIN_CHUNK, ROWS_PER_THREAD, plan_chunks

#: Rows a GPU batch aims at, and the shortest chunk it cuts by dtype (see the module docstring).
GPU_TARGET_ROWS = 32_768
GPU_MIN_CHUNK = {"float32": MIN_CHUNK, "float64": 2 * MIN_CHUNK}
#: The correction's stopping tolerance of the float64 runner.
FLOAT64_RTOL = 1e-13


def chunks(lengths: Sequence[int], device: str, threads: int = 1, dtype: str = "float32") -> list[int]:
    """Chunks per text for the torch runner on ``device`` in ``dtype`` (``"cpu"``: the CPU kernels'
    row target)."""
    min_chunk = GPU_MIN_CHUNK[dtype]
    if str(device).startswith("cuda"):
        return plan_chunks(lengths, target_rows=GPU_TARGET_ROWS, min_chunk=min_chunk)
    return plan_chunks(lengths, target_rows=ROWS_PER_THREAD * max(1, threads), min_chunk=min_chunk)


def rtol(dtype: str) -> float:
    """The correction's relative tolerance for a runner computing in ``dtype``."""
    return FLOAT64_RTOL if dtype == "float64" else DEFAULT_RTOL
