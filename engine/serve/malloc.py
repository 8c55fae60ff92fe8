"""The C allocator's hold on freed memory: large blocks given back to the system when freed (glibc).

glibc's ``malloc`` serves a block of at least its *mmap threshold* with a mapping of its own, unmapped
(given back) when the block is freed; smaller blocks come from its heaps (arenas), whose freed memory
mostly stays in the process for reuse. The threshold starts at 128 KiB but rises, up to 32 MiB on
64-bit systems, each time a mapped block is freed (glibc's ``mallopt(3)``: the dynamic threshold).
A server of long texts frees such blocks all the time: a text's ids and bits, and the JSON of a
per-character answer (about a MiB for 40,000 characters). Once the threshold has risen these come
from the heaps of whichever threads made them (the event loop, the scheduler, the encoding threads),
where, interleaved with small long-lived objects, much of the freed memory cannot be given back. The
process's resident memory then climbs well above what it holds (Python's own allocations, numpy
arrays included, do not grow: ``tracemalloc``), towards its peak of concurrent work and beyond.

:func:`set_mmap_threshold` fixes the threshold (``isan-serve --malloc-mmap-threshold``, 128 KiB by
default; each worker sets it for itself), so every block of that size or more is unmapped when freed.
The server guide ('Memory') has the measurement and the command that makes it.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

#: ``mallopt``'s parameter number of the mmap threshold (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
#: the threshold ``isan-serve`` fixes by default, in KiB (glibc's initial one)
DEFAULT_MMAP_THRESHOLD_KIB = 128
#: the largest threshold glibc takes on 64-bit systems (HEAP_MAX_SIZE / 2), in KiB
MAX_MMAP_THRESHOLD_KIB = 32 * 1024


def set_mmap_threshold(kib: int) -> bool:
    """Fix glibc's mmap threshold at ``kib`` KiB for this process (``mallopt(M_MMAP_THRESHOLD)``): from
    then on it no longer rises, and every block of at least ``kib`` KiB is given back to the system
    when freed.

    Args:
        kib: the threshold in KiB, 0 to :data:`MAX_MMAP_THRESHOLD_KIB`; 0 leaves glibc's own
            (dynamic) threshold.
    Returns:
        whether the threshold was set: False for 0, and where the C library is not glibc (musl,
        macOS: their allocators have no such threshold; a warning is logged).
    Raises:
        ValueError: ``kib`` out of range.
    """
    if not 0 <= kib <= MAX_MMAP_THRESHOLD_KIB:
        raise ValueError(f"the mmap threshold must be 0 to {MAX_MMAP_THRESHOLD_KIB} KiB; got {kib}")
    if kib == 0:
        return False
    if platform.libc_ver()[0] != "glibc":
        log.warning("--malloc-mmap-threshold applies to glibc's malloc only; this C library is not glibc: left as is")
        return False
    libc = ctypes.CDLL(None)
    ok = libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(kib * 1024)) == 1
    if not ok:  # pragma: no cover - glibc takes every value in range
        log.warning("glibc refused the mmap threshold %d KiB: left as is", kib)
    return ok
