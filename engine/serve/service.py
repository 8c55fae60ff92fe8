"""What the server does for one text, apart from HTTP and WebSocket: the library calls, the
memory budget, the scheduler, snapshots and the answer's fields.

The app (:mod:`isan.engine.serve.app`) parses and formats; this module decides. Every text goes
``prepare`` (normalise, map to ids: errors name the input offset) -> reserve its memory in the
budget (503 if it does not fit) -> a :class:`~isan.engine.serve.scheduler.Job` in the scheduler
-> the answer, built from the finished job.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time

import numpy as np

from isan.errors import EmptyTextError, IsanError
from isan.engine.guard import MAX_STATE_ABS
from isan.engine.serve.budget import Budget, Reservation, job_bytes, prepare_bytes
from isan.engine.serve.config import ServeConfig
from isan.engine.serve.errors import RequestError, busy, from_isan
from isan.engine.serve.scheduler import Job, Scheduler, ShuttingDown
from isan.engine.serve.snapshot import decode_state, encode_state, new_secret

log = logging.getLogger(__name__)

#: texts longer than this are normalised in a worker thread rather than in the event loop
PREPARE_INLINE_CHARS = 20_000


def server_threads(engine) -> int | None:
    """Kernel threads when ``--threads`` is not given: one CPU fewer than the engine would use, so
    that the event loop (HTTP, WebSocket, JSON) keeps a core. On 2 cores, two kernel threads beside
    a busy event loop ran 3-4x slower than one (``isan bench serve``: they wait on each other)."""
    threads = getattr(engine, "threads", None)
    if not isinstance(threads, int):
        return None
    from isan.engine.kernels import default_threads

    return max(1, min(threads, default_threads()) - 1)


class ClientGone(Exception):
    """The client disconnected while its text was being scored (its work was dropped)."""


class _TimedOut(Exception):
    pass


class Client:
    """One connection (an HTTP request or a stream): :meth:`leave` when it disconnects fails the job
    it waits for at once (the scheduler drops the rest of that job's work)."""

    __slots__ = ("gone", "_fut")

    def __init__(self):
        self.gone = False
        self._fut: asyncio.Future | None = None

    def leave(self) -> None:
        self.gone = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_exception(ClientGone())


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(_TimedOut())


class Service:
    """The engine, the scheduler, the budget and the snapshot key of one server.

    Args:
        engine: an :class:`isan.engine.Engine` (or an engine with the same scoring API).
        config: the limits (:class:`ServeConfig`).
        metrics: an :class:`isan.engine.serve.metrics.Metrics` or None.
    """

    def __init__(self, engine, config: ServeConfig, metrics=None):
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.budget = Budget(config.max_pending_bytes)
        self.secret = config.state_secret or new_secret()
        batching = config.batching
        if getattr(engine, "path", None) == "reference" and batching:
            log.info("--path reference: scoring each text alone on the float64 reference path (no batching)")
            batching = False
        self.batching = batching
        self.threads = config.threads or server_threads(engine)
        self.scheduler = Scheduler(engine, round_chars=config.round_chars, min_slice_chars=config.min_slice_chars,
                                   batching=batching, threads=self.threads,
                                   on_round=metrics.on_round if metrics is not None else None)
        self.streams_open = 0
        init = engine.initial_state()
        self.state_size = len(init.h)
        sha = getattr(engine, "params_sha256", None)
        if not sha:  # engines without one: a stable id of what they serve
            sha = hashlib.sha256(json.dumps(engine.describe(), sort_keys=True, default=str).encode()).hexdigest()
        self.params_sha256 = sha
        self.state_limit = getattr(engine, "state_limit", MAX_STATE_ABS)
        self.symbols = tuple(engine.alphabet.symbols)

    # ---- states -------------------------------------------------------------------------
    def snapshot(self, state) -> str:
        return encode_state(state, self.params_sha256, self.secret)

    def restore(self, token: str):
        """The State in ``token``; raises RequestError (400, 403, 409 or 422 as the snapshot module says)."""
        try:
            return decode_state(token, self.params_sha256, self.secret, self.state_size, self.state_limit)
        except IsanError as e:
            raise from_isan(e) from None

    @staticmethod
    def totals(state) -> dict:
        return {"total_chars": int(state.chars), "total_bits": float(state.bits),
                "total_bpc": float(state.bits / state.chars) if state.chars else None}

    def next_chars(self, state, k: int) -> list[dict]:
        return self.engine.top_k(state, k)

    # ---- scoring ------------------------------------------------------------------------
    async def score_text(self, text: str, state, streaming: bool, opts, res: Reservation,
                         client: Client) -> tuple[dict, object]:
        """Score ``text`` from ``state`` (None: the initial state).

        Args:
            streaming: the text continues a state (a stream frame, or a request with a snapshot):
                a text that normalises to nothing scores zero characters instead of being an error.
            opts: the validated request (``per_char``, ``unknown``, ``replacement``, ``normalize``).
            res: the request's reservation in the budget (resized to the text's estimate here).
            client: the connection (its disconnect drops the work).
        Returns:
            (the answer's scoring fields, the state after the text).
        Raises:
            RequestError: bad options, a library error (its status and message), the budget full
                or the request timed out (503). ClientGone: the client left.
        """
        eng = self.engine
        if opts.unknown == "replace" and opts.replacement is None:
            raise RequestError(400, '"unknown": "replace" needs "replacement", one symbol of the alphabet '
                                    f'{"".join(self.symbols)!r}')
        start = state if state is not None else eng.initial_state()
        # reserve the peak of normalising (more than the job holds afterwards), then shrink to the job's
        need = max(prepare_bytes(len(text)), job_bytes(len(text), opts.per_char))
        if need > self.budget.limit:
            raise RequestError(413, f"scoring this text needs about {need / 2**20:.1f} MiB, more than the server's "
                                    f"{self.config.max_pending_mb:g} MiB for pending texts (--max-pending-mb); split it, "
                                    "or use /v1/stream")
        if not res.resize(max(need, res.bytes)):
            if self.metrics is not None:
                self.metrics.rejected.labels("busy").inc()
            raise busy(f"the server is busy: {self.budget.used / 2**20:.0f} MiB of its {self.config.max_pending_mb:g} "
                       "MiB for pending texts are in use (--max-pending-mb); retry shortly")
        try:
            args = (text, opts.normalize, opts.unknown, opts.replacement, start)
            prep = await asyncio.to_thread(eng.prepare, *args) if len(text) > PREPARE_INLINE_CHARS else eng.prepare(*args)
        except IsanError as e:
            raise from_isan(e) from None
        n = len(prep.ids)
        report = prep.report
        if n == 0:
            if not streaming or not text:
                raise from_isan(EmptyTextError("the text is empty after normalisation and removing unknown "
                                               "characters; give at least one character"))
            out = {"chars": 0, "bits": 0.0, "bpc": None, "normalization": report, "scoring": {"path": "none", "rounds": 0}}
            if opts.per_char:
                out["per_char_bits"], out["per_char_offsets"] = [], []
            return out, start
        job = Job(prep.ids, start, per_char=opts.per_char, offsets=prep.offsets.astype(np.int32),
                  normalizer=report.get("normalizer"))
        del prep
        res.resize(job_bytes(len(text), opts.per_char))
        job = await self._wait(job, client)
        out = {"chars": job.n, "bits": float(job.total), "bpc": float(job.total / job.n), "normalization": report,
               "scoring": {"path": "batched" if self.batching else job.scoring.get("path"), "rounds": job.rounds}}
        if opts.per_char:
            out["per_char_bits"] = job.bits
            out["per_char_offsets"] = job.offsets
        return out, job.state

    async def _wait(self, job: Job, client: Client) -> Job:
        try:
            fut = self.scheduler.submit(job)
        except ShuttingDown:
            raise busy("the server is shutting down; retry on another") from None
        client._fut = fut
        if client.gone:
            client.leave()
        timer = asyncio.get_running_loop().call_later(
            max(0.0, self.config.request_timeout_s - (time.perf_counter() - job.t_submit)), _expire, fut)
        try:
            await fut
        except (ClientGone, _TimedOut, asyncio.CancelledError) as e:
            self.scheduler.cancel(job)
            reason = "disconnect" if not isinstance(e, _TimedOut) else "timeout"
            if self.metrics is not None:
                self.metrics.cancelled.labels(reason).inc()
            if isinstance(e, _TimedOut):
                raise busy(f"the text was not scored within {self.config.request_timeout_s:g} s (--request-timeout); "
                           "the server is overloaded: retry later, or send shorter texts", retry_after_s=5) from None
            if isinstance(e, asyncio.CancelledError):
                raise
            raise ClientGone() from None
        finally:
            timer.cancel()
            client._fut = None
        job = fut.result()
        if job.error is not None:
            e = job.error
            if isinstance(e, IsanError):
                raise from_isan(e)
            if isinstance(e, ShuttingDown):
                raise busy("the server is shutting down; retry on another")
            raise RequestError(500, "internal error while scoring; the server log has the details")
        return job

    def health(self) -> dict:
        return {"status": "ok", "model": self.engine.describe(),
                "server": {**self.config.to_json(), "batching": self.batching, "threads": self.threads,
                           "pending_mb": round(self.budget.used / 2**20, 3), "pending_jobs": self.scheduler.pending,
                           "streams_open": self.streams_open, "rounds": self.scheduler.rounds,
                           "chars_scored": self.scheduler.chars_scored}}

    def close(self) -> None:
        self.scheduler.stop()


def encode_json(obj: dict) -> bytes:
    """JSON bytes of an answer (numpy arrays as lists). NaN or inf would be a bug: ValueError."""
    for v in obj.values():
        if isinstance(v, float) and not np.isfinite(v):
            raise ValueError("refusing to send a non-finite number")
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and not np.isfinite(v).all():
            raise ValueError("refusing to send a non-finite number")
    try:
        import orjson

        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except ImportError:  # pragma: no cover - orjson is in the serve extra
        pass
    except TypeError:  # e.g. a lone surrogate in a reported character: json escapes it
        pass
    plain = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in obj.items()}
    return json.dumps(plain, allow_nan=False).encode()
