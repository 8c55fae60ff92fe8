"""What the server does for one text, apart from HTTP and WebSocket: the library calls, the
memory budget, the scheduler, snapshots and the answer's fields.

The routes (:mod:`isan.engine.serve.routes`) and the stream (:mod:`isan.engine.serve.websocket`)
parse and format; this module decides. Every text goes
``prepare`` (normalise, map to ids: errors name the input offset) -> reserve its memory in the
budget (503 if it does not fit) -> a :class:`~isan.engine.serve.scheduler.Job` in the scheduler
-> the answer, built from the finished job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

import numpy as np

from isan.errors import EmptyTextError, IsanError
from isan.engine.guard import MAX_STATE_ABS
from isan.engine.serve.budget import Budget, Reservation, job_bytes, prepare_bytes
from isan.engine.serve.config import ServeConfig
from isan.engine.serve.errors import RequestError, busy, from_isan
from isan.engine.serve.scheduler import Job, Scheduler, ShuttingDown
from isan.engine.serve.snapshot import decode_state, encode_state, new_secret
# a connection's side and what is known of a model live in their own modules; their names import from here too
from isan.engine.serve.clients import Client, ClientGone, TimedOut, expire_future
from isan.engine.serve.model_info import ModelInfo

log = logging.getLogger(__name__)

#: texts (and sampling prompts) longer than this are normalised in a worker thread rather than in the event loop
PREPARE_INLINE_CHARS = 20_000
#: characters of the first Server-Sent Event of a sample, and of each later one
SAMPLE_FIRST_PIECE, SAMPLE_PIECE = 16, 64


def server_threads(engine) -> int | None:
    """Kernel threads when ``--threads`` is not given: the engine's own (one a CPU). Since the
    kernels split rows between threads without a barrier, two threads beside the event loop beat
    one on 2 cores (``isan bench serve``: 100 clients x 1 KB, 437 against 321 requests/s)."""
    threads = getattr(engine, "threads", None)
    return threads if isinstance(threads, int) and threads >= 1 else None


class Service:
    """The engine, the scheduler, the budget and the snapshot key of one server.

    The engine may arrive after the server has started (:meth:`attach`): until then
    :attr:`status` is ``"loading"`` and :meth:`ready` raises a 503 RequestError; a load that fails
    makes it ``"failed"``.

    Args:
        engine: an :class:`isan.engine.Engine` (or an engine with the same scoring API), or None
            to :meth:`attach` one later.
        config: the limits (:class:`ServeConfig`).
        metrics: an :class:`isan.engine.serve.metrics.Metrics` or None.
        info: what is known of the model before it loads (required without ``engine``).
    """

    def __init__(self, engine, config: ServeConfig, metrics=None, info: ModelInfo | None = None):
        self.config = config
        self.metrics = metrics
        # with workers, /metrics reads every worker's pending bytes from its files: kept current
        shared = metrics is not None and metrics.multiprocess_dir is not None
        self.budget = Budget(config.max_pending_bytes, on_change=metrics.pending_bytes.set if shared else None)
        self.secret = new_secret() if config.state_secret is None else config.state_secret
        self.streams_open = 0
        self.engine = None
        self.scheduler: Scheduler | None = None
        self.status = "loading"
        self.error: str | None = None
        self.batching = config.batching
        self.threads = config.threads
        self.t_start = time.time()
        self.load_seconds: float | None = None
        self._attribute_lock = asyncio.Semaphore(1)
        self._explain_lock = asyncio.Lock()
        if engine is None and info is None:
            raise ValueError("give an engine, or the ModelInfo of the one to attach later")
        self.info = info or ModelInfo.of_engine(engine)
        self.symbols = self.info.symbols
        self.state_size = self.info.state_size
        self.params_sha256 = self.info.params_sha256
        self.state_limit = MAX_STATE_ABS
        if engine is not None:
            self.attach(engine)

    def attach(self, engine) -> None:
        """Serve ``engine`` (its alphabet must be the one the app was built for)."""
        info = ModelInfo.of_engine(engine)
        if info.symbols != self.info.symbols:
            raise ValueError("the loaded model's alphabet differs from its manifest's")
        batching = self.config.batching
        if getattr(engine, "path", None) == "reference" and batching:
            log.info("--path reference: scoring each text alone on the float64 reference path (no batching)")
            batching = False
        self.batching = batching
        self.threads = self.config.threads or server_threads(engine)
        self.scheduler = Scheduler(engine, round_chars=self.config.round_chars,
                                   min_slice_chars=self.config.min_slice_chars, batching=batching, threads=self.threads,
                                   on_round=self.metrics.on_round if self.metrics is not None else None)
        self.info = info
        self.state_size = info.state_size
        self.params_sha256 = info.params_sha256
        self.state_limit = getattr(engine, "state_limit", MAX_STATE_ABS)
        self.engine = engine
        self.load_seconds = round(time.time() - self.t_start, 3)
        self.status = "ready"

    def fail(self, message: str) -> None:
        self.status = "failed"
        self.error = message

    def ready(self):
        """The engine; raises RequestError 503 while the model loads, or if its load failed."""
        if self.engine is not None:
            return self.engine
        if self.status == "failed":
            raise RequestError(503, f"the model could not be loaded: {self.error}; fix it and restart the server")
        raise busy("the model is still loading (GET /healthz says when it is ready); retry shortly", retry_after_s=2)

    # ---- states -------------------------------------------------------------------------
    def snapshot(self, state) -> str:
        """The signed token of ``state``; raises RequestError 422 when its running totals are beyond
        what a snapshot carries (:func:`~isan.engine.serve.snapshot.encode_state`)."""
        try:
            return encode_state(state, self.params_sha256, self.secret)
        except IsanError as e:
            raise from_isan(e) from None

    def restore(self, token: str):
        """The State in ``token``; raises RequestError (400, 403, 409 or 422 as the snapshot module says)."""
        try:
            chars = self.symbols if self.info.reads_chars else None  # tokens' states end on a character too
            return decode_state(token, self.params_sha256, self.secret, self.state_size, self.state_limit, chars)
        except IsanError as e:
            raise from_isan(e) from None

    def nnl(self, bits: float, chars: int) -> float | None:
        """Mean negative log-likelihood in base V, the alphabet's size (``ScoreResult.nnl``, the
        ``nnl`` of ``isan score --json``); None when nothing was scored."""
        V = len(self.symbols)
        return float(bits / chars / np.log2(V)) if chars and V > 1 else None

    def totals(self, state) -> dict:
        chars, bits = int(state.chars), float(state.bits)
        return {"total_chars": chars, "total_bits": bits, "total_bpc": bits / chars if chars else None,
                "total_nnl": self.nnl(bits, chars)}

    def next_chars(self, state, k: int) -> list[dict]:
        return self.ready().top_k(state, k)

    # ---- scoring ------------------------------------------------------------------------
    def reserve(self, res: Reservation, need: int, how: str = "split it, or use /v1/stream") -> None:
        """Hold ``need`` bytes (estimated) in ``res`` (at least: it never shrinks here).

        Raises:
            RequestError: 413 when the request alone needs more than the budget (``--max-pending-mb``;
                ``how`` says what to do), 503 while other requests hold it.
        """
        if need > self.budget.limit:
            raise RequestError(413, f"this request needs about {need / 2**20:.1f} MiB, more than the server's "
                                    f"{self.config.max_pending_mb:g} MiB for pending texts (--max-pending-mb); {how}")
        if not res.resize(max(need, res.bytes)):
            if self.metrics is not None:
                self.metrics.rejected.labels("busy").inc()
            raise busy(f"the server is busy: {self.budget.used / 2**20:.0f} MiB of its {self.config.max_pending_mb:g} "
                       "MiB for pending texts are in use (--max-pending-mb); retry shortly")

    def _check_opts(self, opts) -> None:
        if getattr(opts, "unknown", "error") == "replace" and getattr(opts, "replacement", None) is None:
            raise RequestError(400, '"unknown": "replace" needs "replacement", one symbol of the alphabet '
                                    f'{"".join(self.symbols)!r}')

    async def prepare(self, text: str, opts, start):
        """``Engine.prepare`` of ``text`` from the state ``start`` (normalised, mapped to ids; a long
        text in a worker thread); raises RequestError for a text the model cannot read."""
        eng = self.ready()
        args = (text, opts.normalize, getattr(opts, "unknown", "error"), getattr(opts, "replacement", None), start)
        try:
            if len(text) > PREPARE_INLINE_CHARS:
                return await asyncio.to_thread(eng.prepare, *args)
            return eng.prepare(*args)
        except IsanError as e:
            raise from_isan(e) from None

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
        eng = self.ready()
        self._check_opts(opts)
        start = state if state is not None else eng.initial_state()
        per_char = getattr(opts, "per_char", False)
        # reserve the peak of normalising (more than the job holds afterwards), then shrink to the job's
        self.reserve(res, max(prepare_bytes(len(text)), job_bytes(len(text), per_char)))
        prep = await self.prepare(text, opts, start)
        n = len(prep.ids)
        report = prep.report
        if n == 0:
            if not text:
                raise from_isan(EmptyTextError("the text is empty; give at least one character"))
            if not streaming:  # a well-formed request whose text the model cannot score
                raise RequestError(422, "the text is empty after normalisation and removing unknown characters; give "
                                        "at least one character the model reads")
            out = {"chars": 0, "bits": 0.0, "bpc": None, "nnl": None, "normalization": report,
                   "scoring": {"path": "none", "rounds": 0}}
            if per_char:
                out["per_char_bits"], out["per_char_offsets"] = [], []
            return out, start
        job = Job(prep.ids, start, per_char=per_char, offsets=prep.offsets.astype(np.int32),
                  normalizer=report.get("normalizer"))
        del prep
        res.resize(job_bytes(len(text), per_char))
        (job,) = await self.score_jobs([job], client)
        return self._fields(job, report, per_char), job.state

    def _fields(self, job: Job, report: dict, per_char: bool) -> dict:
        out = {"chars": job.n, "bits": float(job.total), "bpc": float(job.total / job.n),
               "nnl": self.nnl(float(job.total), job.n), "normalization": report,
               "scoring": {"path": "batched" if self.batching else job.scoring.get("path"), "rounds": job.rounds}}
        if per_char:
            out["per_char_bits"] = job.bits
            out["per_char_offsets"] = job.offsets
        return out

    async def score(self, req, res: Reservation, client: Client) -> dict:
        """``POST /v1/score``: ``req.text`` scored from ``req.state`` (a snapshot) or the initial state,
        with the running totals when it continues a state or returns one, the snapshot after it
        (``return_state``) and the ``top_k`` next characters."""
        state = self.restore(req.state) if req.state is not None else None
        out, new_state = await self.score_text(req.text, state, state is not None, req, res, client)
        if state is not None or req.return_state:
            out.update(self.totals(new_state))
        if req.return_state:
            out["state"] = self.snapshot(new_state)
        if req.top_k:
            out["next"] = self.next_chars(new_state, req.top_k)
        return out

    async def score_many(self, texts: list[str], opts, res: Reservation, client: Client) -> dict:
        """``POST /v1/score/batch``: every text from the initial state, all submitted at once (they
        share the scheduler's rounds). A text the library refuses fails the request, naming it."""
        eng = self.ready()
        self._check_opts(opts)
        total = sum(len(t) for t in texts)
        if total > self.config.max_chars:
            raise RequestError(413, f"the texts have {total:,} characters in all; the limit is "
                                    f"{self.config.max_chars:,} a request (--max-chars); send several requests")
        per_char = opts.per_char
        need = max(sum(prepare_bytes(len(t)) for t in texts), sum(job_bytes(len(t), per_char) for t in texts))
        self.reserve(res, need)
        start = eng.initial_state()
        jobs, reports = [], []
        for i, t in enumerate(texts):
            try:
                prep = await self.prepare(t, opts, start)
            except RequestError as e:
                e.message = f"texts[{i}]: {e.message}"
                e.extra["index"] = i
                raise
            if len(prep.ids) == 0:
                raise RequestError(422, f"texts[{i}] is empty after normalisation and removing unknown characters; "
                                        "give at least one character the model reads", {"index": i})
            jobs.append(Job(prep.ids, start, per_char=per_char, offsets=prep.offsets.astype(np.int32),
                            normalizer=prep.report.get("normalizer")))
            reports.append(prep.report)
        res.resize(sum(job_bytes(len(t), per_char) for t in texts))
        try:
            jobs = await self.score_jobs(jobs, client)
        except RequestError as e:
            i = e.extra.get("index", 0 if len(jobs) == 1 and e.status in (413, 422) else None)
            if i is not None:
                e.message = f"texts[{i}]: {e.message}"
                e.extra["index"] = i
            raise
        results = []
        for job, report in zip(jobs, reports):
            out = self._fields(job, report, per_char)
            if opts.return_state:
                out.update(self.totals(job.state))
                out["state"] = self.snapshot(job.state)
            if opts.top_k:
                out["next"] = self.next_chars(job.state, opts.top_k)
            results.append(out)
        chars = sum(j.n for j in jobs)
        bits = float(sum(j.total for j in jobs))
        return {"results": results, "chars": chars, "bits": bits, "bpc": bits / chars if chars else None,
                "nnl": self.nnl(bits, chars)}

    async def next_after(self, req, res: Reservation, client: Client) -> dict:
        """``POST /v1/next``: the k most likely next characters after ``req.text`` (scored), from
        ``req.state`` or the initial state."""
        eng = self.ready()
        self._check_opts(req)
        state = self.restore(req.state) if req.state is not None else eng.initial_state()
        if req.text:
            fields, state = await self.score_text(req.text, state, True, req, res, client)
            out = {k: fields[k] for k in ("chars", "bits", "bpc", "nnl", "normalization")}
        else:
            out = {"chars": 0, "bits": 0.0, "bpc": None, "nnl": None}
        out["next"] = self.next_chars(state, req.k)
        out.update(self.totals(state))
        if req.return_state:
            out["state"] = self.snapshot(state)
        return out

    async def score_jobs(self, jobs: list[Job], client: Client) -> list[Job]:
        """Submit ``jobs`` and wait until all are scored; the client's leaving or the request
        timeout drops the work of all of them."""
        try:
            futs = [self.scheduler.submit(job) for job in jobs]
        except ShuttingDown:
            for job in jobs:
                self.scheduler.cancel(job)
            raise busy("the server is shutting down; retry on another") from None
        client._futs = futs
        if client.gone:
            client.leave()
        t0 = min(job.t_submit for job in jobs)

        def expire():
            for fut in futs:
                expire_future(fut)

        timer = asyncio.get_running_loop().call_later(
            max(0.0, self.config.request_timeout_s - (time.perf_counter() - t0)), expire)
        try:
            await asyncio.gather(*futs)
        except (ClientGone, TimedOut, asyncio.CancelledError) as e:
            for job in jobs:
                self.scheduler.cancel(job)
            for fut in futs:  # retrieve every exception, so none is logged as never retrieved
                if fut.done() and not fut.cancelled():
                    fut.exception()
                else:
                    fut.cancel()
            reason = "disconnect" if not isinstance(e, TimedOut) else "timeout"
            if self.metrics is not None:
                self.metrics.cancelled.labels(reason).inc(len(jobs))
            if isinstance(e, TimedOut):
                raise busy(f"the text was not scored within {self.config.request_timeout_s:g} s (--request-timeout); "
                           "the server is overloaded: retry later, or send shorter texts", retry_after_s=5) from None
            if isinstance(e, asyncio.CancelledError):
                raise
            raise ClientGone() from None
        finally:
            timer.cancel()
            client._futs = []
        done = [fut.result() for fut in futs]
        for i, job in enumerate(done):
            if job.error is not None:
                for other in done:
                    self.scheduler.cancel(other)
                e = job.error
                if isinstance(e, IsanError):
                    err = from_isan(e)
                elif isinstance(e, ShuttingDown):
                    err = busy("the server is shutting down; retry on another")
                else:
                    err = RequestError(500, "internal error while scoring; the server log has the details")
                if len(done) > 1:
                    err.extra["index"] = i
                raise err
        return done

    # ---- sampling and attribution --------------------------------------------------------
    async def attribute(self, req, res: Reservation) -> dict:
        """``POST /v1/attribute``: :meth:`isan.engine.Engine.attribute` in a worker thread (one at a
        time: it is O(T^2) in memory and time), its memory reserved in the budget."""
        eng = self.ready()
        self._check_opts(req)
        if not hasattr(eng, "attribute"):
            raise RequestError(400, "this model has no exact attribution (it is not an ISAN on the numpy backend)")
        state = self.restore(req.state) if req.state is not None else None
        T, V = len(req.text), len(self.symbols)
        values = T * (T + 1) * V
        if req.full and values > FULL_KAPPA_MAX_VALUES:
            raise RequestError(413, f'"full": true answers kappa with T (T + 1) V = {values:,} numbers for this text; the '
                                    f"limit is {FULL_KAPPA_MAX_VALUES:,} (about {_max_full_chars(V)} characters by char); "
                                    'send a shorter text, "by": "word", or leave out "full"')
        self.reserve(res, prepare_bytes(T) + 4 * 8 * values)
        async with self._attribute_lock:
            try:
                a = await asyncio.to_thread(eng.attribute, req.text, req.by, state, req.unknown, req.replacement,
                                            normalize=req.normalize)
            except EmptyTextError:  # a well-formed text the model cannot read (nothing left after normalisation)
                raise RequestError(422, "the text is empty after normalisation and removing unknown characters; give "
                                        "at least one character the model reads") from None
            except IsanError as e:
                raise from_isan(e) from None
            out = await asyncio.to_thread(a.to_json, req.full)
        logits_max = float(np.abs(a.logits).max()) if a.logits.size else 0.0
        out["check"] = {"identity": "logits[t] = b_ro + sum_s kappa[t, s]", "max_abs_error": a.max_abs_error,
                        "tolerance": ATTRIBUTION_TOL * max(1.0, logits_max), "ok": True}
        return out

    def sampler(self, req):
        """A :class:`~isan.engine.serve.sampling.StreamSampler` for ``req`` (the prompt already read);
        raises RequestError for a prompt the model cannot read."""
        from isan.engine.serve.sampling import StreamSampler

        eng = self.ready()
        state = self.restore(req.state) if req.state is not None else None
        try:
            return StreamSampler(eng, req.prompt, req.n, temperature=req.temperature,
                                 inverse_temperature=req.inverse_temperature, top_k=req.top_k, seed=req.seed,
                                 state=state, normalize=req.normalize)
        except IsanError as e:
            raise from_isan(e) from None

    async def sample(self, req, client: Client):
        """``POST /v1/sample``: with ``req.stream``, an async iterator of Server-Sent Events
        ``(event, data)``: ``("chars", {"text", "offset"})`` as characters are generated
        (:data:`SAMPLE_FIRST_PIECE`, then :data:`SAMPLE_PIECE` at a time), then ``("done", the
        answer)`` or ``("error", {"error", "status"})``; else the answer (a dict): ``smp.result()``
        with the running totals and, with ``return_state``, the snapshot after the generated text.
        Raises RequestError for a request the model cannot serve, ClientGone when the client leaves."""
        if req.temperature is not None and req.inverse_temperature is not None:
            raise RequestError(400, 'give "temperature" or "inverse_temperature", not both')
        smp = await asyncio.to_thread(self.sampler, req) if len(req.prompt) > PREPARE_INLINE_CHARS else self.sampler(req)

        def finish() -> dict:
            out = smp.result()
            st = smp.final_state()
            if st is not None:
                out.update(self.totals(st))
                if req.return_state:
                    out["state"] = self.snapshot(st)
            return out

        async def piece(k: int) -> str:
            try:
                p = await asyncio.to_thread(smp.next_piece, k) if k > 8 else smp.next_piece(k)
            except IsanError as e:
                raise from_isan(e) from None
            if self.metrics is not None:
                self.metrics.sampled.inc(len(p))
            return p

        if not req.stream:
            while not smp.done:
                if client.gone:
                    raise ClientGone()
                await piece(SAMPLE_PIECE * 4)
            return finish()

        async def events():
            k, offset = SAMPLE_FIRST_PIECE, 0
            while not smp.done:
                try:
                    p = await piece(k)
                except RequestError as e:
                    yield "error", e.body()
                    return
                except Exception:  # pragma: no cover - a bug: reported in the stream
                    log.exception("sampling failed")
                    yield "error", RequestError(500, "internal error; the server log has the details").body()
                    return
                yield "chars", {"text": p, "offset": offset}
                offset += len(p)
                k = SAMPLE_PIECE
            try:
                done = finish()
            except RequestError as e:  # a snapshot of running totals out of range
                yield "error", e.body()
                return
            yield "done", done

        return events()

    async def explain(self, req, res: Reservation) -> dict:
        """``POST /v1/explain``: :func:`isan.engine.serve.lens.explain` in a worker thread (one at a
        time), its memory reserved in the budget; the truncated-history window is
        ``--max-attribute-chars``."""
        from isan.engine.serve.lens import explain

        eng = self.ready()
        self.reserve(res, 8 * (len(req.text) + 64) * (len(self.symbols) + 4))
        async with self._explain_lock:
            return await asyncio.to_thread(explain, eng, req, self.config.max_attribute_chars)

    def health(self) -> dict:
        sched = self.scheduler
        model = dict(self.info.describe)
        return {"status": self.status, **({"error": self.error} if self.error else {}), "model": model,
                "worker": {"pid": os.getpid(), "workers": self.config.workers},
                "server": {**self.config.to_json(), "batching": self.batching, "threads": self.threads,
                           "load_seconds": self.load_seconds,
                           "pending_mb": round(self.budget.used / 2**20, 3),
                           "pending_jobs": sched.pending if sched else 0, "streams_open": self.streams_open,
                           "rounds": sched.rounds if sched else 0, "chars_scored": sched.chars_scored if sched else 0}}

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.metrics is not None:
            self.metrics.close()


#: the attribution check's relative tolerance (:meth:`isan.engine.Engine.attribute`'s ``tol``)
ATTRIBUTION_TOL = 1e-6
#: the most kappa values ``"full": true`` answers (about 190 characters by char for V = 27)
FULL_KAPPA_MAX_VALUES = 1_000_000


def _max_full_chars(V: int) -> int:
    T = 1
    while (T + 1) * (T + 2) * V <= FULL_KAPPA_MAX_VALUES:
        T += 1
    return T


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

    def default(o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"cannot encode {type(o).__name__}")

    return json.dumps(obj, allow_nan=False, default=default).encode()
