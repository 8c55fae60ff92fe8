"""Continuous batching: one scheduler thread scores the pending work of every request and stream.

Every text to score (an HTTP request's, a stream frame's) becomes a :class:`Job` holding its
symbol ids and its state. The scheduler thread runs *rounds*: each round it takes a slice of
every pending job (:func:`plan_round`: max-min fair within ``round_chars`` characters, so short
texts finish in their first round and long ones advance by equal slices), scores all slices with
one call of a compiled batched kernel (:class:`KernelRounds`: what
``Engine.score_batch(slices, states)`` computes, without its per-call preparation; GIL released,
all threads) and carries each job's state to its next slice. Engines other than
:class:`~isan.engine.Engine` are called through their ``score_batch``. State is an immutable value, and the
ISAN's bits for a text cut anywhere equal the bits of the whole (docs/ARCHITECTURE.md, 'The model and
its conventions'), so slicing changes the bits only within float32 rounding.

Between rounds the scheduler drops jobs whose client left or timed out (``Job.cancelled``): their
remaining slices are never scored. A job whose slice drives the state out of range fails alone
(the kernel names the slice; through ``score_batch`` the batch is split in halves until the
failing slice is found), and its error names the offset in the job's own input. Finished jobs are
handed back with one wake-up of the event loop per round.

With ``batching=False`` each slice is scored alone with ``Engine.score`` (the engine's own path,
composed by default), one after another: the same fairness and cancellation without batching.

Example:
    >>> sched = Scheduler(engine, round_chars=131072)
    >>> job = Job(engine.prepare("the cat").ids, engine.initial_state())
    >>> fut = sched.submit(job)          # in an event loop; resolves to the finished job
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from isan.errors import IsanError, StateDivergedError

log = logging.getLogger(__name__)


class ShuttingDown(Exception):
    """The scheduler stopped before the job finished."""


@dataclass(eq=False)
class Job:
    """One text to score from a state.

    Attributes:
        ids: (n,) symbol ids (already normalised); offsets: (n,) the input offset of each, or None.
        state: the state before the next unscored character (updated each round).
        per_char: keep every character's bits (``bits``).
        normalizer: the normaliser's id, for error messages.
        pos: characters scored so far; total: their bits; rounds: rounds that scored a slice.
        cancelled: set by the client's side (it left, or timed out): no more slices are scored.
        error: the IsanError that ended the job, if any.
    """

    ids: np.ndarray
    state: object
    per_char: bool = False
    offsets: np.ndarray | None = None
    normalizer: str | None = None
    pos: int = 0
    total: float = 0.0
    rounds: int = 0
    bits: np.ndarray | None = None
    cancelled: bool = False
    error: BaseException | None = None
    scoring: dict = field(default_factory=dict)
    t_submit: float = 0.0
    t_done: float = 0.0
    last_round: int = -1
    seq: int = 0
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _future: asyncio.Future | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.ids = np.ascontiguousarray(self.ids, dtype=np.int32)
        if self.per_char and self.bits is None:
            self.bits = np.empty(len(self.ids), dtype=np.float64)

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def remaining(self) -> int:
        return self.n - self.pos

    @property
    def done(self) -> bool:
        return self.pos >= self.n or self.error is not None


def plan_round(remaining: list[int], budget: int, min_slice: int) -> list[int]:
    """Characters each job scores in one round (same order as ``remaining``).

    Max-min fair: when everything fits in ``budget`` every job finishes; otherwise each job gets
    ``min(remaining, cap)`` with the largest cap that fits, so short jobs finish and long ones share
    the rest equally. When so many jobs wait that the cap would fall below ``min_slice``, the jobs
    are served in the given order (the caller puts the least recently served first) with
    ``min_slice`` each (or what they have left) while it fits; the others wait for the next round.

    Example:
        >>> plan_round([100, 5000, 90000], 10000, 1024)
        [100, 4950, 4950]
    """
    n = len(remaining)
    if n == 0:
        return []
    if sum(remaining) <= budget:
        return list(remaining)
    s = sorted(remaining)
    acc = 0
    cap = 0
    for k, r in enumerate(s):
        if acc + r * (n - k) > budget:
            cap = (budget - acc) // (n - k)
            break
        acc += r
    if cap >= min_slice:
        return [min(r, cap) for r in remaining]
    out, left = [], budget
    for r in remaining:
        take = min(r, min_slice)
        if take > left:
            take = 0
        out.append(take)
        left -= take
    return out


def _takes(fn, name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (engines other than Engine take no ``threads``)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class KernelRounds:
    """Scores a round's slices with the engine's batched call on ids (:meth:`Engine.score_ids`):
    what ``Engine.score_batch(ids, states, normalize="none")`` computes (the same call, so the same
    bits), without what the scheduler does not need per call: preparing ids that are already ids
    and a State per text. On a short-text round those took about a fifth of the scheduler's time.

    Raises (from :meth:`score`): StateDivergedError naming the offset in the slice, with
    ``text_index`` the failing slice.
    """

    def __init__(self, engine):
        # the route of Engine.score_batch's default (the engine's batch route): composed jumps on the
        # jumps path, chosen by the round's rows on the composed path, one character a step otherwise
        self.engine = engine
        self.route = engine.routes.for_batch()
        self.symbols = tuple(engine.alphabet.symbols)
        a = engine.alphabet  # the last character each symbol leaves (a normaliser's context)
        self.last_chars = self.symbols if a.kind == "chars" else tuple(a.decode([i])[-1:] for i in range(len(a)))
        self.d = engine.d

    @staticmethod
    def supports(engine) -> bool:
        from isan.engine.core import Engine

        return isinstance(engine, Engine)

    def score(self, texts: list[np.ndarray], hs: np.ndarray, threads: int) -> tuple[list[np.ndarray], np.ndarray]:
        """(bits (n_i,) float64 of each text, final states (B, d) float64) from states ``hs`` (B, d)."""
        bits, finals, _ = self.engine.score_ids(texts, hs, chunks=self.route.chunks, threads=threads,
                                                kernel=self.route.kernel, where="batched")
        return bits, finals.astype(np.float64)


@dataclass
class _Slice:
    """One slice's result (the fields of a ScoreResult the scheduler reads)."""

    bits: float
    per_char_bits: np.ndarray
    state: object
    scoring: dict | None = None


@dataclass
class RoundStats:
    """What one round did (passed to the ``on_round`` hook)."""

    jobs: int
    chars: int
    seconds: float
    pending: int


class Scheduler:
    """The scheduler thread (see the module docstring). Thread-safe; started on the first submit.

    Args:
        engine: an :class:`isan.engine.Engine` (or any engine with ``score_batch(texts, states,
            per_char=...)`` and ``score``).
        round_chars, min_slice_chars: see :func:`plan_round`.
        batching: one ``score_batch`` call per round (True) or ``score`` per slice (False).
        threads: threads for the engine's kernels (None: the engine's default).
        on_round: called after each round with a :class:`RoundStats` (metrics).
    """

    def __init__(self, engine, round_chars: int = 131_072, min_slice_chars: int = 1024, batching: bool = True,
                 threads: int | None = None, on_round: Callable[[RoundStats], None] | None = None):
        self.engine = engine
        self.round_chars = int(round_chars)
        self.min_slice_chars = int(min_slice_chars)
        self.batching = batching
        self.threads = threads
        self.on_round = on_round
        self._incoming: deque[Job] = deque()  # appended by clients (thread-safe), drained by the thread
        self._active: list[Job] = []  # the scheduler thread's own
        self._wake = threading.Event()
        self._idle = False
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._seq = itertools.count(1)
        self.rounds = 0
        self.chars_scored = 0
        self.cancelled_jobs = 0
        self.busy_seconds = 0.0
        self._kw = {"threads": threads} if threads is not None and _takes(engine.score_batch, "threads") else {}
        self._kernel = KernelRounds(engine) if batching and KernelRounds.supports(engine) else None
        self._threads = threads or getattr(engine, "threads", 1) or 1

    # ---- client side (event loop) ----------------------------------------------------------
    def submit(self, job: Job) -> asyncio.Future:
        """Queue ``job``; returns a future (of the running event loop) that resolves to it when it
        is finished, failed (``job.error``) or dropped by :meth:`stop` (ShuttingDown)."""
        loop = asyncio.get_running_loop()
        job._loop, job._future = loop, loop.create_future()
        job.t_submit = time.perf_counter()
        if job.n == 0:
            job._future.set_result(job)
            return job._future
        if self._stop:
            raise ShuttingDown("the server is shutting down")
        job.seq = next(self._seq)
        self._incoming.append(job)
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="isan-scheduler", daemon=True)
                    self._thread.start()
        if self._idle:
            self._wake.set()
        return job._future

    def cancel(self, job: Job) -> None:
        """Drop the rest of ``job``'s work (its client left or timed out)."""
        job.cancelled = True

    @property
    def pending(self) -> int:
        """Jobs queued or in progress (a snapshot; it changes while you read it)."""
        return len(self._incoming) + len(self._active)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread after its current round; unfinished jobs fail with ShuttingDown."""
        self._stop = True
        self._wake.set()
        th = self._thread
        if th is not None:
            th.join(timeout)
        left = list(self._incoming) + self._active
        self._incoming.clear()
        self._active = []
        for job in left:
            if not job.done:
                job.error = ShuttingDown("the server is shutting down")
            self._resolve(job)

    # ---- the scheduler thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            while self._incoming:
                self._active.append(self._incoming.popleft())
            if not self._active:
                # sleep until a submit; _idle is set before the last look, so no wake-up is lost
                self._idle = True
                if not self._incoming and not self._stop:
                    self._wake.wait()
                self._wake.clear()
                self._idle = False
                continue
            try:
                self._round()
            except Exception:  # pragma: no cover - a bug; fail the round's jobs rather than the thread
                log.exception("scheduler round failed")
                for job in self._active:
                    job.error = RuntimeError("internal error in the scheduler")
                    self._resolve(job)
                self._active = []

    def _round(self) -> None:
        live = []
        for job in self._active:
            if job.cancelled:
                self.cancelled_jobs += 1
                self._resolve(job)
            else:
                live.append(job)
        self._active = live
        if not live:
            return
        live.sort(key=lambda j: (j.last_round, j.seq))  # least recently served first
        sizes = plan_round([j.remaining for j in live], self.round_chars, self.min_slice_chars)
        items = [(j, j.pos, j.pos + k) for j, k in zip(live, sizes) if k > 0]
        t0 = time.perf_counter()
        results = self._score_batch(items) if self.batching else [self._score_one(it) for it in items]
        dt = time.perf_counter() - t0
        self.rounds += 1
        chars = 0
        for (job, a, b), res in results:
            job.last_round = self.rounds
            if isinstance(res, BaseException):
                job.error = res
                continue
            if job.cancelled:
                continue
            job.rounds += 1
            job.state = res.state
            job.total += res.bits
            if job.bits is not None:
                job.bits[a:b] = res.per_char_bits
            job.pos = b
            chars += b - a
            if res.scoring:
                job.scoring = res.scoring
        self.chars_scored += chars
        self.busy_seconds += dt
        still, finished = [], []
        now = time.perf_counter()
        for job in self._active:
            if job.done or job.cancelled:
                if job.cancelled and not job.done:
                    self.cancelled_jobs += 1
                job.t_done = now
                finished.append(job)
            else:
                still.append(job)
        self._active = still
        self._resolve_all(finished)
        if self.on_round is not None:
            try:
                self.on_round(RoundStats(len(items), chars, dt, len(still)))
            except Exception:  # pragma: no cover - metrics must not stop scoring
                log.exception("on_round hook failed")

    def _score_batch(self, items: list) -> list:
        """Score slices ``(job, a, b)`` in one call; on a library error, split the batch in halves
        so that only the slices that fail get the error."""
        if not items:
            return []
        if self._kernel is not None:
            return self._score_kernel(items)
        texts = [job.ids[a:b] for job, a, b in items]
        states = [job.state for job, _, _ in items]
        try:
            res = self.engine.score_batch(texts, states, per_char=True, normalize="none", **self._kw)
            return list(zip(items, res))
        except IsanError as e:
            if len(items) == 1:
                return [(items[0], self._in_job_terms(e, *items[0]))]
            mid = len(items) // 2
            return self._score_batch(items[:mid]) + self._score_batch(items[mid:])
        except Exception as e:  # a bug: every slice of the call fails, the server goes on
            log.exception("score_batch failed")
            return [(it, e) for it in items]

    def _score_kernel(self, items: list) -> list:
        """:meth:`_score_batch` through :class:`KernelRounds`: a slice that diverges gets the error,
        the others are scored again without it."""
        out: list = []
        while items:
            texts = [job.ids[a:b] for job, a, b in items]
            hs = np.stack([job.state.h for job, _, _ in items])
            try:
                bits, finals = self._kernel.score(texts, hs, self._threads)
            except StateDivergedError as e:
                i = getattr(e, "text_index", None)
                if i is None:  # pragma: no cover - the kernel always names the text
                    return out + [(it, e) for it in items]
                out.append((items[i], self._in_job_terms(e, *items[i])))
                items = items[:i] + items[i + 1 :]
                continue
            except Exception as e:  # a bug: every slice of the call fails, the server goes on
                log.exception("scoring a round failed")
                return out + [(it, e) for it in items]
            from isan.engine.results import State

            for (job, a, b), bb, hf in zip(items, bits, finals):
                total = float(bb.sum())
                st = job.state
                last = self._kernel.last_chars[int(job.ids[b - 1])]
                res = _Slice(total, bb, State(hf, st.chars + (b - a), st.bits + total, last))
                out.append(((job, a, b), res))
            return out
        return out

    def _score_one(self, item) -> tuple:
        job, a, b = item
        try:
            res = self.engine.score(job.ids[a:b], state=job.state, per_char=True, normalize="none",
                                    **self._kw)
            return item, res
        except IsanError as e:
            return item, self._in_job_terms(e, job, a, b)
        except Exception as e:  # pragma: no cover - a bug
            log.exception("score failed")
            return item, e

    @staticmethod
    def _in_job_terms(e: IsanError, job: Job, a: int, b: int) -> IsanError:
        if isinstance(e, StateDivergedError):
            from isan.engine.serve.errors import shift_diverged

            return shift_diverged(e, a, job.offsets, job.normalizer)
        return e

    @staticmethod
    def _resolve_all(jobs: list[Job]) -> None:
        """Resolve finished jobs: one wake-up of each event loop for all of its jobs (a wake-up per
        job cost a tenth of the scheduler's time with 1,000 streams)."""
        by_loop: dict = {}
        for job in jobs:
            if job._future is not None and job._loop is not None:
                by_loop.setdefault(job._loop, []).append(job)
        for loop, js in by_loop.items():
            def done(js=js):
                for job in js:
                    if not job._future.done():
                        job._future.set_result(job)

            try:
                loop.call_soon_threadsafe(done)
            except RuntimeError:  # the client's event loop has closed: nobody waits for these jobs
                pass

    @staticmethod
    def _resolve(job: Job) -> None:
        fut, loop = job._future, job._loop
        if fut is None or loop is None:
            return

        def done():
            if not fut.done():
                fut.set_result(job)

        try:
            loop.call_soon_threadsafe(done)
        except RuntimeError:  # the client's event loop has closed: nobody waits for this job
            pass
