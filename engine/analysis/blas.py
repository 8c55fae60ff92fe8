"""One BLAS thread for the analyses' many small GEMMs, restored afterwards.

The studies multiply a d x d matrix by a few hundred columns thousands of times. Two OpenBLAS
threads inside such a small GEMM are slower than one, and collapse when another process holds a
core (DESIGN.md section 6: a 216 x 216 by 216 x 150 product measured 16 ms with two threads on a
loaded machine, 0.7 ms with one). :func:`blas_threads` sets numpy's OpenBLAS thread count for the
duration of a ``with`` block through OpenBLAS's own setter (what threadpoolctl does), and restores
it. Where no OpenBLAS with that setter is loaded it changes nothing and says so once in the log.
"""

from __future__ import annotations

import ctypes
import logging
from contextlib import contextmanager
from functools import lru_cache

log = logging.getLogger(__name__)

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")


@lru_cache(maxsize=1)
def _openblas():
    """(get, set) of the OpenBLAS that numpy loaded, or None."""
    import numpy  # noqa: F401  (loads its BLAS)

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        paths = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pre in _PREFIXES:
            for suf in _SUFFIXES:
                get, set_ = f"{pre}_get_num_threads{suf}", f"{pre}_set_num_threads{suf}"
                if hasattr(lib, get) and hasattr(lib, set_):
                    g, s = getattr(lib, get), getattr(lib, set_)
                    g.restype = ctypes.c_int
                    s.argtypes = [ctypes.c_int]
                    return g, s
    log.info("no OpenBLAS thread setter found; the analyses run with numpy's BLAS threads as they are")
    return None


@contextmanager
def blas_threads(n: int = 1):
    """Run the block with ``n`` OpenBLAS threads (then restore the previous count)."""
    api = _openblas()
    if api is None:
        yield
        return
    get, set_ = api
    before = get()
    set_(int(n))
    try:
        yield
    finally:
        set_(before)
