"""Reader processes feeding one scoring process: the corpus job on a backend that must run in one
process (a GPU, or float64 on the torch backend: :attr:`Backend.one_process`).

In one process the device waits while the host reads, decompresses, parses JSON, normalises and
maps each part's text to ids (about 9M characters a second a core, where an H200 scores 55M). Here
``readers`` processes (``concurrent.futures.ProcessPoolExecutor``, started with ``spawn``) each take
whole input files: a reader cuts its file into the job's parts exactly as one process does
(:class:`~isan.engine.corpus.parts.FileParts`), prepares each part
(:func:`~isan.engine.corpus.prepared.prepare_docs`: ids as uint8 arrays, the rows of documents that
cannot be scored) and puts it on one bounded queue (``multiprocessing``'s manager queue, at most
``readers + 1`` parts waiting); this process takes the parts as they come, scores each on the device
in batches of ``batch_chars`` (:meth:`~isan.engine.corpus.scoring.DocScorer.score_prepared`, the
same batches as one process cuts) and writes each part and done record as one process does.

The output files are those of one process: a part holds the same documents, batched the same way,
and each file's parts come in order from its one reader. A job killed at any moment resumes as
before (a reader still reads the parts written already, to find where the next begins, and sends
only their place). A reader that dies (out of memory, killed) ends the job with a message; what was
written stands, and a re-run resumes. The readers and the queue's manager end with this process,
however it ends. A reader needs no model: the alphabet and normaliser travel to it
(:class:`~isan.engine.corpus.prepared.TextPreparer`).

The queue is the manager's, not a pipe shared by the readers: a reader killed in the middle of
putting a part on a shared pipe would leave half a message there and the scoring process waiting for
the rest for ever; the manager only loses that reader's connection.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import multiprocessing
import pickle
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


def _init_reader(cfg: dict, preparer, q) -> None:
    """Keep the job, the text preparer and the queue in this reader; end with the scoring process."""
    global _READER
    from isan.engine.corpus.workers import exit_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the scoring process's: it stops the readers
    exit_with_parent()
    from isan.engine.corpus.parts import JobConfig

    _READER = (JobConfig(**cfg), preparer, q)


def _read_file(path: str, shards: str) -> float:
    """Cut ``path`` into the job's parts, prepare each and put it on the queue, in order, then
    ``("end", path)``; returns the seconds it took."""
    from isan.engine.corpus.parts import FileParts
    from isan.engine.corpus.prepared import prepare_docs, without_text

    cfg, preparer, q = _READER
    t0 = time.perf_counter()
    fp = FileParts(cfg, path, Path(shards))
    for part, docs, file_error in fp.cut():
        if part.is_file():  # written by an earlier run: only its place travels
            q.put(("skip", path, str(part), [without_text(docs[-1])] if docs else [], file_error))
        else:
            prepared = prepare_docs(preparer, docs, cfg.normalize, cfg.unknown, cfg.replacement, cfg.row_max_chars)
            # pickled here: the manager passes bytes on (a copy) instead of rebuilding the part twice
            q.put(("part", path, str(part), pickle.dumps(prepared, protocol=pickle.HIGHEST_PROTOCOL), file_error))
    q.put(("end", path))
    return time.perf_counter() - t0


# ---- in the scoring process ------------------------------------------------------------------
def run_readers(paths: list[str], cfg, shards: Path, scorer, readers: int,
                on_part: Callable[[dict], None] | None = None) -> tuple[list[dict], dict]:
    """Score ``paths`` with ``scorer`` in this process, fed by ``readers`` reader processes.

    Returns:
        (one done record per path, in order; facts about the run: readers, the seconds this process
        spent scoring, writing and unpickling parts, until the first part came, and waiting for (and
        receiving) parts after it: the time the device waited for the readers).
    Raises:
        IsanError: a reader failed or died; what was written stands.
    """
    from multiprocessing.managers import SyncManager

    from isan.engine.corpus.parts import FileParts
    from isan.engine.corpus.prepared import TextPreparer
    from isan.engine.corpus.workers import init_manager, pool_run

    if readers < 1:
        raise IsanError(f"readers must be at least 1 here; got {readers}")
    t_start = time.perf_counter()
    stats = {"readers": readers, "scoring_seconds": 0.0, "writing_seconds": 0.0, "unpickling_seconds": 0.0,
             "first_part_seconds": None, "wait_seconds": 0.0, "parts": 0}
    records, todo = _complete_files(paths, cfg, shards, on_part)
    if not todo:
        return [records[p] for p in paths], stats
    ctx = multiprocessing.get_context("spawn")
    manager = SyncManager(ctx=ctx)
    manager.start(init_manager)
    ex = None
    with contextlib.ExitStack() as ending:
        ending.callback(manager.shutdown)  # after the pool has ended, whichever way
        ending.enter_context(pool_run(lambda: ex, "reader", broken=(EOFError, ConnectionError, BrokenPipeError)))
        q = manager.Queue(maxsize=readers + 1)
        ex = cf.ProcessPoolExecutor(readers, mp_context=ctx, initializer=_init_reader,
                                    initargs=(asdict(cfg), TextPreparer.of(scorer.engine), q))
        active: dict[str, tuple[cf.Future, FileParts]] = {}
        waiting = list(reversed(todo))

        def submit() -> None:  # at most two files a reader handed over at once
            while waiting and len(active) < 2 * readers:
                p = waiting.pop()
                active[p] = (ex.submit(_read_file, p, str(shards)), FileParts(cfg, p, shards, on_part))

        submit()
        _feed_scorer(q, active, submit, records, scorer, stats, t_start)
    return [records[p] for p in paths], stats


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
        kind, path = msg[0], msg[1]
        fp = active[path][1]
        if kind == "end":
            records[path] = fp.finish()
            del active[path]
            submit()
        else:
            _take_part(fp, msg, scorer, stats)


def _take_part(fp, msg: tuple, scorer, stats: dict) -> None:
    """Add one part a reader sent to its file: a part written already (``"skip"``: its place), or a
    prepared part (``"part"``), scored here and written."""
    t0 = time.perf_counter()
    if msg[0] == "skip":
        _, _, part, docs, file_error = msg
        fp.add(Path(part), docs, None, file_error)
        return
    _, _, part, blob, file_error = msg
    prepared = pickle.loads(blob)
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
