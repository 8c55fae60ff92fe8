"""``isan-serve --malloc-mmap-threshold-kib``: glibc's mmap threshold fixed, so a large block is given
back to the system when freed (engine/serve/malloc.py). Checked in fresh processes with glibc's own
count of mapped bytes (``mallinfo2().hblkhd``): by default the threshold rises once a mapped block is
freed, and the next block of that size comes from the heap; fixed, it is mapped again."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from isan.engine.serve.config import ServeConfig
from isan.engine.serve.malloc import MAX_MMAP_THRESHOLD_KIB, set_mmap_threshold
from isan.errors import IsanError

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

#: a fresh process: malloc and free a 1 MiB block, then malloc one again; glibc's mapped bytes each time
PROBE = """
import ctypes, json, sys
from isan.engine.serve.malloc import set_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
applied = set_mmap_threshold(int(sys.argv[1]))
mapped = []
for _ in range(2):
    before = libc.mallinfo2().hblkhd
    p = libc.malloc(1 << 20)
    mapped.append(libc.mallinfo2().hblkhd - before)
    libc.free(p)
print(json.dumps({"applied": applied, "mapped": mapped}))
"""


def probe(kib: int) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, str(kib)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@glibc
def test_a_fixed_threshold_maps_every_large_block():
    fixed = probe(128)
    assert fixed["applied"] is True and all(m >= 1 << 20 for m in fixed["mapped"]), fixed
    own = probe(0)  # glibc's own threshold rose past 1 MiB when the first block was freed: the second is on the heap
    assert own["applied"] is False and own["mapped"][0] >= 1 << 20 and own["mapped"][1] == 0, own


def test_the_threshold_is_bounded():
    with pytest.raises(ValueError, match="0 to"):
        set_mmap_threshold(MAX_MMAP_THRESHOLD_KIB + 1)
    with pytest.raises(IsanError, match="--malloc-mmap-threshold-kib"):
        ServeConfig(malloc_mmap_threshold_kib=-1)
    assert ServeConfig().to_json()["malloc_mmap_threshold_kib"] == 128
