"""Reader processes feeding one scoring process: the corpus job on a backend that must run in one
process (a GPU, or float64 on the torch backend: :attr:`Backend.one_process`).

In one process the device waits while the host reads, decompresses, parses JSON, normalises and
maps each part's text to ids (about 50M characters a second a core, where an H200 scores 55M). Here
``readers`` processes (``concurrent.futures.ProcessPoolExecutor``, started with ``spawn``) each take
whole input files: a reader cuts its file into the job's parts exactly as one process does
(:class:`~isan.engine.corpus.parts.FileParts`), prepares each part
(:func:`~isan.engine.corpus.prepared.prepare_docs`: ids as uint8 arrays, the rows of documents that
cannot be scored) into a block of shared memory (:mod:`isan.engine.corpus.shared_parts`: its
arrays copied as they are, never pickled) and puts the block's name on one bounded queue (at most
``readers + 1`` parts waiting); this process takes the parts as they come, scores each on the device
in batches of ``batch_chars`` (:meth:`~isan.engine.corpus.scoring.DocScorer.score_prepared`, the
same batches as one process cuts) and writes each part and done record as one process does.

The output files are those of one process: a part holds the same documents, batched the same way,
and each file's parts come in order from its one reader. A job killed at any moment resumes as
before (a reader still reads the parts written already, to find where the next begins, and sends
only their place). A reader that dies (out of memory, killed) ends the job with a message; what was
written stands, and a re-run resumes. The readers end with this process, however it ends, and
so do the blocks: each exit path removes those of the job that are left (a reader killed after
making one, a job stopped with parts waiting), and Python's resource tracker those of a scoring
process killed outright. A reader needs no model: the alphabet and normaliser travel to it
(:class:`~isan.engine.corpus.prepared.TextPreparer`).

The queue is a pipe shared by the readers (``multiprocessing.Queue``), and its messages are a few
numbers and a block's name, under the 4,096 bytes that a pipe writes whole: a reader killed while
it puts one leaves either all of it or nothing, never half a message for this process to wait on.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import multiprocessing
import itertools
import os
import queue as queue_mod
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from isan.errors import IsanError

log = logging.getLogger(__name__)

#: the most reader processes by default (a 16-core machine: 15 readers and the scoring process)
MAX_READERS = 15

#: seconds between looks at the readers while the queue is empty (a reader that died is noticed then)
POLL_SECONDS = 0.2


def plan_readers(readers: int | None, input_bytes: int | None = None) -> int:
    """Reader processes of a one-process job (0: read in the scoring process itself).

    ``readers`` as given, else one a CPU this process may use besides the scoring process's, at most
    :data:`MAX_READERS`; a small job (under :data:`~isan.engine.corpus.workers.SMALL_JOB_BYTES` of
    input, where starting a process costs more than it gains) reads in this process.
    """
    from isan.engine.corpus.workers import SMALL_JOB_BYTES
    from isan.engine.kernels import default_threads

    if readers is not None:
        if readers < 0:
            raise IsanError(f"readers must be at least 0; got {readers}")
        return readers
    if input_bytes is not None and input_bytes < SMALL_JOB_BYTES:
        return 0
    return max(0, min(default_threads() - 1, MAX_READERS))


# ---- in each reader process ------------------------------------------------------------------
_READER = None
_BLOCKS = itertools.count()


def _init_reader(cfg: dict, preparer, q, prefix: str) -> None:
    """Keep the job, the text preparer, the queue and the job's block prefix in this reader; end
    with the scoring process."""
    global _READER
    from isan.engine.corpus.workers import exit_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the scoring process's: it stops the readers
    exit_with_parent()
    keep_freed_memory()
    from isan.engine.corpus.parts import JobConfig

    _READER = (JobConfig(**cfg), preparer, q, prefix)


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory a reader frees for the next part (a process of its
    own: the scoring process is left as it is). By default it hands a freed block of over 128 KB
    back to the system and the next one is mapped anew, a page fault every 4 KB: a third of a
    reader's time went there. Returns whether it could (False off glibc)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except (OSError, AttributeError):
        return False
    # mallopt's M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD (its most, 32 MB on 64-bit systems)
    return all(libc.mallopt(param, value) == 1 for param, value in ((-1, 512 << 20), (-2, 64 << 20), (-3, 32 << 20)))


def _read_file(file_no: int, path: str, shards: str) -> float:
    """Cut ``path`` into the job's parts, prepare each, put it in a block of shared memory and its
    name on the queue (``("part" or "skip", file_no, name)``), in order, then ``("end", file_no)``;
    returns the seconds it took. A part written by an earlier run sends only its place."""
    from isan.engine.corpus import shared_parts
    from isan.engine.corpus.parts import FileParts
    from isan.engine.corpus.prepared import prepare_docs, without_text

    cfg, preparer, q, prefix = _READER
    t0 = time.perf_counter()
    fp = FileParts(cfg, path, Path(shards))
    for part, docs, file_error in fp.cut():
        if part.is_file():  # written by an earlier run: only its place travels
            kind, body = "skip", [without_text(docs[-1])] if docs else []
        else:
            kind = "part"
            body = prepare_docs(preparer, docs, cfg.normalize, cfg.unknown, cfg.replacement, cfg.row_max_chars)
        name = f"{prefix}{os.getpid()}-{next(_BLOCKS)}"
        shared_parts.put((str(part), body, file_error), name)
        try:
            q.put((kind, file_no, name))
        except BaseException:
            shared_parts.remove(name)
            raise
    q.put(("end", file_no))
    return time.perf_counter() - t0


# ---- in the scoring process ------------------------------------------------------------------
def run_readers(paths: list[str], cfg, shards: Path, scorer, readers: int,
                on_part: Callable[[dict], None] | None = None) -> tuple[list[dict], dict]:
    """Score ``paths`` with ``scorer`` in this process, fed by ``readers`` reader processes.

    Returns:
        (one done record per path, in order; facts about the run: readers, the seconds this process
        spent scoring, writing and receiving parts (``unpickling_seconds``: reading a part's block
        and unpickling its documents), until the first part came, and waiting for parts after it:
        the time the device waited for the readers).
    Raises:
        IsanError: a reader failed or died; what was written stands.
    """
    from isan.engine.corpus import shared_parts
    from isan.engine.corpus.parts import FileParts
    from isan.engine.corpus.prepared import TextPreparer
    from isan.engine.corpus.workers import pool_run

    if readers < 1:
        raise IsanError(f"readers must be at least 1 here; got {readers}")
    t_start = time.perf_counter()
    stats = {"readers": readers, "scoring_seconds": 0.0, "writing_seconds": 0.0, "unpickling_seconds": 0.0,
             "first_part_seconds": None, "wait_seconds": 0.0, "parts": 0}
    records, todo = _complete_files(paths, cfg, shards, on_part)
    if not todo:
        return [records[p] for p in paths], stats
    ctx = multiprocessing.get_context("spawn")
    prefix = shared_parts.job_prefix()
    ex = None
    with contextlib.ExitStack() as ending:
        q = ctx.Queue(maxsize=readers + 1)
        ending.callback(_close_queue, q, prefix)  # last: the readers have ended, whichever way
        ending.enter_context(pool_run(lambda: ex, "reader", broken=(EOFError, ConnectionError)))
        ex = cf.ProcessPoolExecutor(readers, mp_context=ctx, initializer=_init_reader,
                                    initargs=(asdict(cfg), TextPreparer.of(scorer.engine), q, prefix))
        active: dict[int, tuple[cf.Future, FileParts]] = {}
        waiting = list(reversed(list(enumerate(todo))))

        def submit() -> None:  # at most two files a reader handed over at once
            while waiting and len(active) < 2 * readers:
                no, p = waiting.pop()
                active[no] = (ex.submit(_read_file, no, p, str(shards)), FileParts(cfg, p, shards, on_part))

        submit()
        _feed_scorer(q, active, submit, records, scorer, stats, t_start)
    return [records[p] for p in paths], stats


def _close_queue(q, prefix: str) -> None:
    """Close the readers' queue and remove the job's blocks still there (parts not taken)."""
    from isan.engine.corpus import shared_parts

    q.close()
    q.cancel_join_thread()
    shared_parts.remove_blocks(prefix)


def _complete_files(paths: list[str], cfg, shards: Path, on_part) -> tuple[dict[str, dict], list[str]]:
    """({path: done record} of the files an earlier run finished, the paths still to read, in order)."""
    from isan.engine.corpus.parts import FileParts

    records: dict[str, dict] = {}
    todo = []
    for path in paths:
        rec = FileParts(cfg, path, shards, on_part).complete()
        if rec is not None:
            records[path] = rec
        else:
            todo.append(path)
    return records, todo


def _feed_scorer(q, active: dict, submit: Callable[[], None], records: dict, scorer, stats: dict,
                 t_start: float) -> None:
    """Take the readers' messages from ``q`` until every file in ``active`` has ended: score and
    write each part, record each file's done record, hand out the next files (``submit``)."""
    while active:
        t0 = time.perf_counter()
        try:
            msg = q.get(timeout=POLL_SECONDS)
        except queue_mod.Empty:
            _check_readers(active)
            _count_wait(stats, t0, t_start)
            continue
        _count_wait(stats, t0, t_start)
        kind, no = msg[0], msg[1]
        fp = active[no][1]
        if kind == "end":
            records[fp.path] = fp.finish()
            del active[no]
            submit()
        else:
            _take_part(fp, msg, scorer, stats)


def _take_part(fp, msg: tuple, scorer, stats: dict) -> None:
    """Add one part a reader sent to its file: a part written already (``"skip"``: its place), or a
    prepared part (``"part"``), scored here and written."""
    from isan.engine.corpus import shared_parts

    t0 = time.perf_counter()
    part, body, file_error = shared_parts.take(msg[2])
    if msg[0] == "skip":
        fp.add(Path(part), body, None, file_error)
        return
    prepared = body
    t1 = time.perf_counter()
    stats["unpickling_seconds"] += t1 - t0
    rows = scorer.score_prepared(prepared) if prepared.docs else []
    t0, t1 = t1, time.perf_counter()
    stats["scoring_seconds"] += t1 - t0
    fp.add(Path(part), prepared.docs, rows, file_error)
    stats["writing_seconds"] += time.perf_counter() - t1
    stats["parts"] += 1


def _count_wait(stats: dict, t0: float, t_start: float) -> None:
    """Add the time since ``t0`` to the wait for the first part (counted from the start) or to the
    wait after it (the time the device waited for the readers)."""
    now = time.perf_counter()
    if stats["parts"] == 0:
        stats["first_part_seconds"] = now - t_start
    else:
        stats["wait_seconds"] += now - t0


def _check_readers(active: dict) -> None:
    """Raise what a reader raised (a reader that died breaks the pool: BrokenProcessPool)."""
    for fut, _ in active.values():
        if fut.done():
            e = fut.exception()
            if isinstance(e, cf.process.BrokenProcessPool):
                raise e
            if e is not None:
                raise IsanError(f"a reader process failed: {type(e).__name__}: {e}; the parts written so far are "
                                "kept: run the same command again to resume") from e
