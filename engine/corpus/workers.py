"""Worker processes of the local executor (issue 36): the corpus job on every core of a machine.

One process cannot keep many cores busy: reading, JSON, normalising and writing run in the
interpreter, one at a time, so the threads of the batched kernel stopped gaining at 4 threads on a
16-core host. Here ``workers`` processes (``concurrent.futures.ProcessPoolExecutor``, started with
``spawn``), each with its own engine and ``threads`` kernel threads, share the work in one of two
ways:

* **by file**, when there are at least :data:`FILES_PER_WORKER` input files a worker: each worker
  takes whole files and reads, normalises, scores and writes each as one process does
  (:func:`~isan.engine.corpus.parts.process_file`, as the Ray actors do); nothing passes through
  this process;
* **by piece**, with fewer files (one big file, say): this process reads the inputs and cuts each
  file into its parts exactly as one process does (:class:`~isan.engine.corpus.parts.FileParts`),
  hands each part to the workers in pieces, and writes each part and done record in order as its
  pieces come back.

The output files do not depend on ``workers``: a part holds the same documents whoever scored
them, a document's bits do not depend on its batch (:mod:`isan.engine.corpus.scoring`), and each
part and done record is written whole, atomically. A job killed at any moment resumes as before;
a bad document is a row with its error, in any worker. A worker that dies (out of memory, killed)
ends the job with a message; what was written stands, and a re-run resumes. The workers end with
their driver, however it ends.

Work in flight is bounded: by piece, at most ``2 * workers`` pieces (of at most ``batch_chars``
characters each) wait or run, besides the part being cut; by file, a worker holds a part at a time."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from isan.errors import IsanError

log = logging.getLogger(__name__)

#: with at least this many input files a worker, each worker takes whole files (reading, scoring
#: and writing them itself: nothing passes through this process); with fewer, the files are cut
#: into pieces here so that every worker has work
FILES_PER_WORKER = 2

#: the fewest characters a piece of a part is cut into (below it, handing work over costs more
#: than it gains, and a thread scores 256k characters about 8% slower than 1M: fewer rows a matrix)
MIN_PIECE_CHARS = 512_000


#: inputs smaller than this (in bytes, as stored) are scored in this process by default: a worker
#: takes about a second to start and load the model, the time one core scores about 1M characters
SMALL_JOB_BYTES = 4_000_000


def plan_workers(workers: int | None, threads: int | None, input_bytes: int | None = None,
                 device: str = "cpu", dtype: str = "float32") -> tuple[int, int]:
    """(workers, kernel threads of each) for the local executor, from what the user gave.

    Neither: one thread a worker and a worker a CPU this process may use (a small job, under
    :data:`SMALL_JOB_BYTES` of input, or one on the torch backend, a GPU or float64: one worker,
    this process, with a thread a CPU); ``threads`` alone: the CPUs divided by it; ``workers``
    alone: the CPUs shared among them.
    """
    from isan.engine.kernels import default_threads

    from isan.engine.kernels.backends import default_backend

    cpus = default_threads()
    torch_backend = default_backend(device, dtype) == "torch"  # one process drives the device
    if workers is None and (torch_backend or (threads is None and input_bytes is not None
                                              and input_bytes < SMALL_JOB_BYTES)):
        return 1, threads or cpus
    if workers is None:
        threads = threads or 1
        return max(1, cpus // threads), threads
    return workers, threads or max(1, cpus // workers)


# ---- in each worker process ------------------------------------------------------------------
_SCORER = None
_JOB = None
_LOAD_ERROR: str | None = None
_PROGRESS = None  # the driver's progress queue (a manager's proxy), when it shows progress by file


def _init_worker(cfg: dict, threads: int, progress=None) -> None:
    """Load the job's model once in this worker (the driver's model, checked by hash and kernel).
    A failure is kept and said by the first piece (an initializer that raises would print a
    traceback and break the pool without a word of why)."""
    global _SCORER, _JOB, _LOAD_ERROR, _PROGRESS
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it stops the workers
    exit_with_parent()
    _PROGRESS = progress
    try:
        from isan.engine.corpus.parts import JobConfig, load_corpus_engine
        from isan.engine.corpus.scoring import DocScorer, corpus_path

        job = JobConfig(**cfg)
        engine = load_corpus_engine(job.model, job.device, job.dtype)
        if engine.params_sha256 != job.params_sha256 or corpus_path(engine) != job.kernel:
            raise IsanError(f"it loaded {engine.source} ({engine.params_sha256[:12]}, {corpus_path(engine)} kernel), "
                            f"not the job's model ({job.params_sha256[:12]}, {job.kernel} kernel)")
        _SCORER, _JOB = DocScorer(engine, job.options(threads)), job
    except Exception as e:  # noqa: BLE001 - said by _score_piece, in the driver
        _LOAD_ERROR = f"{type(e).__name__}: {e}"


def exit_with_parent() -> None:
    """End this worker when the driver ends, however it ends (killed, out of memory): a worker of
    a process pool waits on its task queue, whose pipe its siblings keep open, and would otherwise
    wait for ever, holding its model in memory."""
    import threading

    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True, name="isan-parent-watch").start()


def _score_piece(docs: list) -> tuple[list, float]:
    """(the rows of ``docs``, seconds spent scoring them) in a worker."""
    if _SCORER is None:
        raise IsanError(f"a worker process could not load the model ({_LOAD_ERROR})")
    t0 = time.perf_counter()
    rows = _SCORER.score(docs)
    return rows, time.perf_counter() - t0


def _score_file(path: str, shards: str) -> tuple[dict, float]:
    """(the done record of a whole input file read, scored and written by this worker, as
    :func:`~isan.engine.corpus.parts.process_file` does in one process; seconds it took)."""
    from isan.engine.corpus.parts import process_file

    if _SCORER is None:
        raise IsanError(f"a worker process could not load the model ({_LOAD_ERROR})")
    t0 = time.perf_counter()
    rec = process_file(_SCORER, _JOB, path, Path(shards), on_part=_report if _PROGRESS is not None else None)
    return rec, time.perf_counter() - t0


def _report(part: dict) -> None:
    """Tell the driver's progress bar of a part written (best effort: progress is not output)."""
    try:
        _PROGRESS.put(part)
    except Exception:  # noqa: BLE001  a manager gone with its driver
        pass


def init_manager() -> None:
    """The start of a manager process that serves a job's queues: Ctrl-C is its driver's, and it
    ends with its driver, however that ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()


# ---- in the driver ---------------------------------------------------------------------------
@dataclass
class _Part:
    file: object  # FileParts
    path: Path
    docs: list
    file_error: str | None
    futures: list = field(default_factory=list)
    last: bool = False  # the file's last part: its done record follows


def pieces(docs: list, workers: int, batch_chars: int) -> list[list]:
    """A part's documents cut into contiguous pieces for the workers: about an equal share of the
    characters each, at most ``batch_chars`` and at least :data:`MIN_PIECE_CHARS` a piece (as far
    as the documents allow), at most ``workers`` pieces unless ``batch_chars`` asks for more."""
    total = sum(d.size for d in docs)
    n = max(-(-total // max(1, batch_chars)), min(workers, total // MIN_PIECE_CHARS), 1)
    n = min(n, len(docs)) if docs else 1
    if n <= 1:
        return [docs]
    out, cur, size, share = [], [], 0, total / n
    for d in docs:
        cur.append(d)
        size += d.size
        if size >= share * (len(out) + 1) and len(out) < n - 1:
            out.append(cur)
            cur = []
    out.append(cur)
    return [p for p in out if p]


def run_workers(paths: list[str], cfg, shards: Path, workers: int, threads: int,
                on_part: Callable[[dict], None] | None = None) -> tuple[list[dict], dict]:
    """Score ``paths`` with ``workers`` processes of ``threads`` kernel threads each.

    Returns:
        (one done record per path, in order; facts about the run: workers, threads, the seconds
        the workers spent scoring and this process spent besides waiting).
    Raises:
        IsanError: a worker could not load the model, or died; what was written stands.
    """
    if threads < 1 or workers < 1:
        raise IsanError(f"workers and threads must be at least 1; got {workers}, {threads}")
    records: dict[str, dict] = {}
    stats = {"worker_seconds": 0.0, "driver_busy_seconds": 0.0}
    ctx = multiprocessing.get_context("spawn")
    by_file = len(paths) >= FILES_PER_WORKER * workers
    ending = contextlib.ExitStack()
    progress = _progress_queue(ctx, ending) if by_file and on_part is not None else None
    ex = cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                initargs=(asdict(cfg), threads, progress))
    with ending, pool_run(lambda: ex, "worker"):
        if by_file:
            _by_file(ex, paths, cfg, shards, on_part, records, stats, progress)
        else:
            _by_piece(ex, paths, cfg, shards, on_part, records, stats, workers)
    return [records[p] for p in paths], {"workers": workers, "threads": threads,
                                         "shares": "files" if by_file else "pieces", **stats}


def _by_piece(ex, paths: list[str], cfg, shards: Path, on_part, records: dict, stats: dict, workers: int) -> None:
    """Each input file read and cut into its parts here, as one process does
    (:class:`~isan.engine.corpus.parts.FileParts`); each part not yet written handed to the workers
    in pieces (:func:`pieces`, :func:`_score_piece`), and written, with its file's done record, in
    order as they come back (:func:`_drain`); at most ``2 * workers`` pieces wait or run."""
    from isan.engine.corpus.parts import FileParts
    from isan.engine.corpus.scoring import DEFAULT_BATCH_CHARS  # the CPU's: workers run its kernels

    queue: deque[_Part] = deque()
    in_flight = 0
    for path in paths:
        t0 = time.perf_counter()
        fp = FileParts(cfg, path, shards, on_part)
        rec = fp.complete()
        if rec is not None:
            records[path] = rec
            continue
        parts = fp.cut()
        nxt = next(parts, None)
        if nxt is None:  # no document and no error: a done record of no part, as process_file writes
            records[path] = fp.finish()
        while nxt is not None:
            part_path, docs, file_error = nxt
            nxt = next(parts, None)
            part = _Part(fp, part_path, docs, file_error, last=nxt is None)
            if docs and not part_path.is_file():
                for piece in pieces(docs, workers, cfg.batch_chars or DEFAULT_BATCH_CHARS):
                    part.futures.append(ex.submit(_score_piece, piece))
                    in_flight += 1
            queue.append(part)
            stats["driver_busy_seconds"] += time.perf_counter() - t0
            in_flight -= _drain(queue, records, stats, block=False)
            while in_flight > 2 * workers:
                in_flight -= _drain(queue, records, stats, block=True)
            t0 = time.perf_counter()
        stats["driver_busy_seconds"] += time.perf_counter() - t0
    while queue:
        _drain(queue, records, stats, block=True)


def _drain(queue: deque[_Part], records: dict, stats: dict, block: bool) -> int:
    """Write the parts at the front of ``queue`` whose pieces are back (waiting for the first one's
    when ``block``), and the done record of a file whose last part it wrote; returns the pieces
    collected."""
    collected = 0
    while queue:
        part = queue[0]
        if not all(f.done() for f in part.futures):
            if not block:
                return collected
            cf.wait(part.futures)
        block = False
        queue.popleft()
        t0 = time.perf_counter()
        if part.futures or not part.path.is_file():
            rows = []
            for f in part.futures:
                piece_rows, seconds = f.result()
                rows.extend(piece_rows)
                stats["worker_seconds"] += seconds
            collected += len(part.futures)
            part.file.add(part.path, part.docs, rows, part.file_error)
        else:
            part.file.add(part.path, part.docs, None, part.file_error)
        if part.last:
            records[part.file.path] = part.file.finish()
        stats["driver_busy_seconds"] += time.perf_counter() - t0
    return collected


def _progress_queue(ctx, ending: contextlib.ExitStack):
    """A queue the workers report their parts on (a manager's, so that a worker killed while it
    puts cannot break it for the others), shut down by ``ending``."""
    from multiprocessing.managers import SyncManager

    manager = SyncManager(ctx=ctx)
    manager.start(init_manager)
    ending.callback(manager.shutdown)
    return manager.Queue()


#: seconds between looks at the workers' progress queue while they score whole files
POLL_SECONDS = 0.2


def _by_file(ex, paths: list[str], cfg, shards: Path, on_part, records: dict, stats: dict, progress=None) -> None:
    """Each incomplete file to a worker, whole: it reads, scores and writes the file's parts and
    done record itself (:func:`_score_file`), as one process does, and reports each part on
    ``progress`` (when given) for the driver's ``on_part``."""
    import queue as queue_mod

    from isan.engine.corpus.parts import FileParts

    futures = {}
    for path in paths:
        rec = FileParts(cfg, path, shards, on_part).complete()
        if rec is not None:
            records[path] = rec
        else:
            futures[ex.submit(_score_file, path, str(shards))] = path
    pending = set(futures)
    while pending:
        done, pending = cf.wait(pending, timeout=POLL_SECONDS if progress is not None else None,
                                return_when=cf.FIRST_COMPLETED)
        while progress is not None:
            try:
                on_part(progress.get_nowait())
            except queue_mod.Empty:
                break
            except (EOFError, OSError):  # the manager died: the bar stops, the job goes on
                progress = None
        for f in done:
            rec, seconds = f.result()
            stats["worker_seconds"] += seconds
            records[futures[f]] = rec
            if on_part and progress is None:
                on_part({"path": futures[f], "documents": rec["new_documents"], "chars_read": rec["new_chars"],
                         "new": True, "done": True})


@contextlib.contextmanager
def pool_run(pool: Callable[[], "cf.ProcessPoolExecutor | None"], who: str, broken: tuple = ()):
    """The work of a process pool (the local executor's workers, a GPU job's readers), ended the one
    way both need: SIGTERM stops it as Ctrl-C does; a process that died (``BrokenProcessPool``) or a
    broken link to it (``broken``) becomes an IsanError saying that what was written stands and a
    re-run resumes; any error stops the pool at once (:func:`_stop`); a normal end waits for it.
    ``pool`` gives the pool when it ends (None: not started yet)."""
    previous = _terminate_as_interrupt()

    def stop() -> None:
        if pool() is not None:
            _stop(pool())

    try:
        yield
    except cf.process.BrokenProcessPool as e:
        stop()
        raise IsanError(f"a {who} process died ({e}; out of memory, or killed?); the parts written so far are "
                        "kept: run the same command again to resume") from None
    except broken as e:
        stop()
        raise IsanError(f"the {who}s' queue broke ({type(e).__name__}: {e}); the parts written so far are kept: "
                        "run the same command again to resume") from None
    except BaseException:
        stop()
        raise
    else:
        pool().shutdown(wait=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate_as_interrupt():
    """Make SIGTERM (``kill PID``, a time limit, a service manager) stop the workers as Ctrl-C
    does; returns the handler to restore (None off the main thread, where Python cannot set one)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, interrupt)


def _stop(ex: cf.ProcessPoolExecutor) -> None:
    """Stop the pool now (Ctrl-C or an error): cancel what waits, end the workers."""
    procs = list(getattr(ex, "_processes", {}).values())  # the standard library keeps them here (3.9-3.13)
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
