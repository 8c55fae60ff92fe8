"""A prepared part handed from a reader process to the scoring process through shared memory.

A reader pickles what it sends (:func:`put`: a part's :class:`~isan.engine.corpus.prepared.PreparedDocs`,
its path and its file's error) with pickle's protocol 5, its arrays (the ids, bounds and steps, the
reports' counts) *out of band*: they are copied once, as they are, into one
``multiprocessing.shared_memory`` block beside the few bytes of the pickle, never pickled into a
stream. The block's name is all that goes through the queue. The scoring process (:func:`take`)
copies the block into its own memory, removes it, and unpickles the part with its arrays as views of
that copy: no pickled array, nothing copied through another process.

A block's name starts with its job's prefix (:func:`job_prefix`), so that every exit path can
remove what its readers left (:func:`remove_blocks`: a reader killed between making a block and
sending its name, a job stopped with parts on the queue). On Linux the blocks are the files of
``/dev/shm``; Python's resource tracker also removes, when the job's processes have all ended, any
block of theirs still there (a scoring process killed with ``kill -9``).
"""

from __future__ import annotations

import os
import pickle
import secrets
import struct
from multiprocessing import shared_memory

#: the start of a block: a mark of the format, how many arrays, the pickle's length
_HEAD = struct.Struct("<4sIQ")
_MAGIC = b"isp1"
#: each array starts on a multiple of this many bytes
_ALIGN = 64
#: where a Linux machine lists the blocks
SHM_DIR = "/dev/shm"


def job_prefix() -> str:
    """The start of the names of one job's blocks: ``isan-`` and 8 random hex digits and ``-``
    (short: macOS takes names of at most 31 characters)."""
    return f"isan-{secrets.token_hex(4)}-"


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def put(obj, name: str) -> int:
    """Pickle ``obj`` into a new shared-memory block ``name``, its arrays out of band; returns the
    block's size in bytes. The block stays until :func:`take` (or :func:`remove_blocks`) removes it.

    Raises:
        FileExistsError: a block of that name exists. OSError: no room for the block.
    """
    buffers: list[pickle.PickleBuffer] = []
    meta = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    table = _HEAD.size + 8 * len(raws)
    at, offsets = _align(table + len(meta)), []
    for r in raws:
        offsets.append(at)
        at = _align(at + r.nbytes)
    shm = shared_memory.SharedMemory(name=name, create=True, size=max(at, 1))
    try:
        buf = shm.buf
        _HEAD.pack_into(buf, 0, _MAGIC, len(raws), len(meta))
        struct.pack_into(f"<{len(raws)}Q", buf, _HEAD.size, *(r.nbytes for r in raws))
        buf[table : table + len(meta)] = meta
        for o, r in zip(offsets, raws):
            buf[o : o + r.nbytes] = r
        del buf
        shm.close()
    except BaseException:
        shm.close()
        shm.unlink()
        raise
    return at


def take(name: str):
    """The object in block ``name`` (:func:`put`); the block is removed. Its arrays are views of
    one copy of the block in this process's memory (writable).

    Raises:
        FileNotFoundError: no block of that name.
    """
    shm = shared_memory.SharedMemory(name=name)
    try:
        data = memoryview(bytearray(shm.buf))
    finally:
        shm.close()
        shm.unlink()
    magic, n, meta_len = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC:
        raise ValueError(f"the shared-memory block {name} does not hold a part")
    sizes = struct.unpack_from(f"<{n}Q", data, _HEAD.size)
    table = _HEAD.size + 8 * n
    at, buffers = _align(table + meta_len), []
    for size in sizes:
        buffers.append(data[at : at + size])
        at = _align(at + size)
    return pickle.loads(data[table : table + meta_len], buffers=buffers)


def remove(name: str) -> bool:
    """Remove block ``name`` unread; False when there was none."""
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return False
    shm.close()
    shm.unlink()
    return True


def remove_blocks(prefix: str) -> int:
    """Remove every block whose name starts with ``prefix`` (a job's: :func:`job_prefix`); returns
    how many there were. Where the blocks cannot be listed (no ``/dev/shm``), none is removed here:
    the resource tracker removes them when the job's processes have ended."""
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return 0
    return sum(remove(n) for n in names)


def count_blocks(prefix: str = "isan-") -> int:
    """Blocks whose name starts with ``prefix`` (0 where they cannot be listed)."""
    try:
        return sum(1 for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except OSError:
        return 0
