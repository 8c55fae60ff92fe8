"""How the torch backend cuts work: chunk counts and the correction's tolerance by device and dtype.

A GPU wants many rows in flight (each step's per-symbol GEMMs are small: at 32,768 rows about
1,200 rows a symbol), and chunk-parallel scoring pays a correction of about 100 characters a
chunk (two rows each), so chunks stay at least :data:`GPU_MIN_CHUNK` characters long. On the CPU
device (the tests and CI) the CPU kernels' plan applies. These are starting points, to be set by
the GPU check (``isan/bench/gpu_check.sh``) on a real card; nothing here is measured yet.

The float64 runner is the exact reference on the device: its corrections run until the start
error is below 1e-13 of the state (float32: 1e-6, as the compiled kernels), so chunk-parallel bits
equal the float64 reference to about 1e-12.
"""

from __future__ import annotations

from typing import Sequence

from isan.engine.kernels.chunked import DEFAULT_RTOL, MIN_CHUNK, ROWS_PER_THREAD, plan_chunks

#: Rows a GPU batch aims at, and the shortest chunk it cuts (see the module docstring).
GPU_TARGET_ROWS = 32_768
GPU_MIN_CHUNK = 512
#: The correction's stopping tolerance of the float64 runner.
FLOAT64_RTOL = 1e-13


def chunks(lengths: Sequence[int], device: str, threads: int = 1) -> list[int]:
    """Chunks per text for the torch runner on ``device`` (``"cpu"``: the CPU kernels' plan)."""
    if str(device).startswith("cuda"):
        return plan_chunks(lengths, target_rows=GPU_TARGET_ROWS, min_chunk=GPU_MIN_CHUNK)
    return plan_chunks(lengths, target_rows=ROWS_PER_THREAD * max(1, threads), min_chunk=MIN_CHUNK)


def rtol(dtype: str) -> float:
    """The correction's relative tolerance for a runner computing in ``dtype``."""
    return FLOAT64_RTOL if dtype == "float64" else DEFAULT_RTOL
