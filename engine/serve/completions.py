"""The OpenAI-compatible API of ``isan-serve``: ``POST /v1/completions``, ``GET /v1/models`` and the
tokenizer endpoints of vLLM's server (``GET /tokenizer_info``, ``POST /tokenize``, ``POST /detokenize``).

It follows the OpenAI completions API as vLLM and the llama.cpp server implement it, so that
evaluation harnesses (lm-evaluation-harness's ``local-completions``) and scripts built on the
``openai`` client score and sample text with an ISAN:

* Tokens are the model's symbols: characters for a text8 model, bytes for a byte model. Token id
  ``i < V`` is symbol ``i`` of the alphabet; id ``V`` is ``<|endoftext|>``, which may only begin a
  prompt of token ids and stands for the initial state (lm-evaluation-harness puts it before a
  text it scores whole: its log-probability is null, and the text is scored from ``h0``).
* A string prompt is read as ``POST /v1/score`` reads a text (the model's normaliser; unknown
  characters are a 422), and scored by the same scheduler, so ``echo`` with ``max_tokens: 0``
  gives the per-character bits of ``/v1/score`` as natural-log ``token_logprobs`` (``-bits *
  ln 2``). ``tokens`` are the scored symbols; ``text_offset`` maps each to the offset in the
  choice's ``text`` (the prompt as given, then the generated text) where it came from, so a
  character the normaliser changed or dropped shows in the offsets.
* The first token's log-probability is the model's from its initial state (an ISAN has one), not
  null as in vLLM; only ``<|endoftext|>`` has null.
* ``top_logprobs`` (``logprobs: n``) holds the n most likely symbols at each position plus the
  token itself, computed in float64 from the state before each token; the token's own entry is
  its ``token_logprobs`` value, so a token is greedy exactly when it has the largest value there.
* Generation (``max_tokens`` > 0) uses :class:`~isan.engine.serve.sampling.StreamSampler`, as
  ``POST /v1/sample`` does: ``temperature`` 0 is greedy, ``top_p`` nucleus, ``top_k`` (vLLM's
  extension), ``seed`` (choice j uses ``seed + j``), ``stop``, ``n``; generated tokens' log-probs
  are the unscaled model's (vLLM's ``raw_logprobs``). ``stream`` sends ``data: {chunk}`` events and
  ``data: [DONE]``.
* Errors are ``{"error": {"message", "type", "param", "code"}}`` (``code`` is the HTTP status).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from isan.engine.serve.budget import job_bytes, logprobs_bytes, prepare_bytes
from isan.engine.serve.errors import RequestError
from isan.engine.serve.schemas import MAX_SEED
# the API's schema (its request and response models) lives in completion_schemas.py
from isan.engine.serve.completion_schemas import DEFAULT_MAX_TOKENS, EOT, build_openai_schemas
# the tokens (the model's symbols as ids) and the prompts read live in completion_tokens.py
from isan.engine.serve.completion_tokens import Prompt, Tokens, read_prompts  # noqa: F401

log = logging.getLogger(__name__)

LN2 = math.log(2.0)
#: the most top_logprobs entries (tokens x logprobs) one request may ask for
MAX_TOP_VALUES = 4_000_000
#: characters generated between two checks of the stop sequences, the client and the deadline
GEN_PIECE = 64
#: the paths of this API (their errors have OpenAI's shape)
PATHS = ("/v1/completions", "/v1/models", "/tokenize", "/detokenize", "/tokenizer_info")
#: the OpenAI API's paths that this server does not serve (a chat model's, embeddings...): their 404
#: has OpenAI's shape too, so an OpenAI client shows its message
UNSERVED_PATHS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/moderations", "/v1/models",
                  "/v1/audio", "/v1/images", "/v1/files", "/v1/uploads", "/v1/batches", "/v1/fine_tuning",
                  "/v1/assistants", "/v1/threads", "/v1/vector_stores", "/v1/realtime")


def openai_path(path: str) -> bool:
    """Whether errors on ``path`` have OpenAI's shape: the paths of this API, and the OpenAI API's
    others (:data:`UNSERVED_PATHS` and what lies under them, like ``/v1/models/NAME``)."""
    return path in PATHS or any(path == p or path.startswith(p + "/") for p in UNSERVED_PATHS)


def unserved_message(method: str, path: str) -> str | None:
    """The 404 message of an OpenAI API path this server does not serve; None for other paths."""
    if not openai_path(path) or path in PATHS:
        return None
    if path.startswith("/v1/chat/"):
        return (f"there is no {method} {path}: this server has a character-level model without a chat template; "
                "send the text as the prompt of POST /v1/completions")
    return (f"there is no {method} {path}; the OpenAI-compatible API of this server is POST /v1/completions and "
            "GET /v1/models")


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 409: "conflict_error",
          413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
          426: "invalid_request_error", 500: "server_error", 503: "overloaded_error"}


def openai_error(e: RequestError, param: str | None = None) -> dict:
    """The OpenAI error body of ``e``: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": e.message, "type": _TYPES.get(e.status, "invalid_request_error"),
                      "param": e.extra.get("param", param), "code": e.status}}


# ---- scoring and generating -----------------------------------------------------------------------
@dataclass
class Scored:
    """A prompt after scoring: its ids, natural-log probabilities, text offsets and the state after it."""

    prompt: Prompt
    text: str  # the prompt's text as echoed
    ids: np.ndarray  # scored token ids
    logprobs: np.ndarray  # (n,) natural log
    offsets: np.ndarray  # (n,) into text
    state: object  # after the prompt
    state_start_h: np.ndarray | None = None  # before it (the initial state)


def top_logprobs(params, h: np.ndarray, ids: np.ndarray, k: int, block: int = 2048):
    """The float64 reference from state ``h`` through ``ids``: (log-prob of each token (n,), the k
    most likely ids (n, k) and their log-probs (n, k), the state after the last token)."""
    from isan.engine.reference import log_softmax, states_ref

    n = len(ids)
    lp = np.empty(n)
    top_i = np.empty((n, k), dtype=np.int64)
    top_v = np.empty((n, k))
    h = np.asarray(h, dtype=np.float64)
    for s in range(0, n, block):
        x = np.asarray(ids[s : s + block], dtype=np.int64)
        H = states_ref(params, x, h)
        S = np.vstack([h[None, :], H[:-1]])
        L = log_softmax(S @ params.W_ro.T + params.b_ro)
        lp[s : s + len(x)] = L[np.arange(len(x)), x]
        if k:
            part = np.argpartition(-L, k - 1, axis=1)[:, :k] if k < L.shape[1] else np.tile(np.arange(L.shape[1]), (len(x), 1))
            vals = np.take_along_axis(L, part, axis=1)
            order = np.argsort(-vals, axis=1, kind="stable")
            top_i[s : s + len(x)] = np.take_along_axis(part, order, axis=1)
            top_v[s : s + len(x)] = np.take_along_axis(vals, order, axis=1)
        h = H[-1]
    return lp, top_i, top_v, h


class Completions:
    """The OpenAI-compatible endpoints of one server (``service``: the app's :class:`Service`)."""

    def __init__(self, service, config, metrics=None, name: str | None = None):
        self.service = service
        self.config = config
        self.metrics = metrics
        self.name = name or served_name(service.info)
        self.created = int(service.t_start)
        self.schemas = build_openai_schemas(self.name, len(service.symbols), config.max_chars, config.max_batch_texts,
                                            config.max_sample_chars)
        self._tokens: Tokens | None = None
        self._ref_lock = asyncio.Semaphore(2)

    @property
    def tokens(self) -> Tokens:
        if self._tokens is None:
            self._tokens = Tokens(self.service.ready().alphabet)
        return self._tokens

    # ---- GET endpoints ---------------------------------------------------------------------
    def model_list(self) -> dict:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                            "owned_by": "isan", "root": self.name, "parent": None,
                                            "max_model_len": self.config.max_chars,
                                            "isan": dict(self.service.info.describe)}]}

    def tokenizer_info(self) -> dict:
        tok = self.tokens
        return {"tokenizer_class": "IsanSymbols", "eos_token": EOT, "bos_token": EOT, "pad_token": None,
                "unk_token": None, "vocab_size": tok.V + 1, "model_max_length": self.config.max_chars,
                "add_bos_token": False, "unit": getattr(tok.alphabet, "unit", "char"),
                "symbols": tok.strs[: tok.V], "chat_template": None}

    # ---- tokenizer -------------------------------------------------------------------------
    def tokenize(self, req) -> dict:
        eng = self.service.ready()
        tok = self.tokens
        ids: list[int] = [tok.V] if req.add_special_tokens else []
        pieces = req.prompt.split(EOT)
        from isan.errors import IsanError

        from isan.engine.serve.errors import from_isan

        for k, piece in enumerate(pieces):
            if k:
                ids.append(tok.V)
            if piece:
                try:
                    prep = eng.prepare(piece, "auto", "error", None, None)
                except IsanError as e:
                    raise from_isan(e) from None
                ids.extend(int(i) for i in prep.ids)
        return {"count": len(ids), "max_model_len": self.config.max_chars, "tokens": ids,
                "token_strs": [tok.strs[i] for i in ids]}

    def detokenize(self, req) -> dict:
        self.service.ready()
        return {"prompt": self.tokens.decode(req.tokens)}

    # ---- completions -----------------------------------------------------------------------
    def parse(self, schema, raw):
        """The request ``raw`` validated against one of :attr:`schemas` (RequestError 400 naming the
        field; for a completion naming another model, 404 as OpenAI answers)."""
        from isan.engine.serve.schemas import parse

        try:
            return parse(schema, raw, self.schemas.allowed(schema), self.config.max_chars)
        except RequestError:
            if schema is self.schemas.completion:
                self.check_model(raw)
            raise

    def check_model(self, raw) -> None:
        """Raise 404 when the JSON body ``raw`` names a model other than the served one."""
        import json

        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return
        if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"] != self.name:
            raise RequestError(404, f"the model {body['model'][:100]!r} does not exist; this server serves "
                                    f"{self.name!r} (GET /v1/models): pass model={self.name}", {"param": "model"})

    def check(self, req) -> list[Prompt]:
        if req.model is not None and req.model != self.name:  # pragma: no cover - the schema's enum refuses it
            raise RequestError(404, f"the model {req.model!r} does not exist; this server serves {self.name!r} "
                                    "(GET /v1/models)", {"param": "model"})
        V = len(self.service.symbols)
        prompts = read_prompts(req.prompt, V, self.config.max_chars, self.config.max_batch_texts)
        choices = len(prompts) * req.n
        if choices > self.config.max_batch_texts:
            raise RequestError(413, f"{len(prompts)} prompts x n = {req.n} is {choices:,} choices; the limit is "
                                    f"{self.config.max_batch_texts:,} a request (--max-batch-texts): send several "
                                    "requests or lower n", {"param": "n"})
        max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        gen = choices * max_tokens
        if gen > 16 * self.config.max_sample_chars:
            raise RequestError(413, f"{choices:,} choices x max_tokens = {max_tokens:,} is {gen:,} tokens to generate; "
                                    f"the limit is {16 * self.config.max_sample_chars:,} a request (16 x "
                                    "--max-sample-chars): lower max_tokens or n", {"param": "max_tokens"})
        k = req.logprobs or 0
        if req.logprobs is not None:
            values = (sum(len(p.text) if p.text is not None else len(p.ids) + 1 for p in prompts) * req.echo
                      + gen) * max(k, 1)
            if values > MAX_TOP_VALUES:
                raise RequestError(413, f"logprobs = {k} for this request is {values:,} top_logprobs entries; the limit "
                                        f"is {MAX_TOP_VALUES:,}: lower logprobs, or split the prompt",
                                   {"param": "logprobs"})
        return prompts

    def reserve_answer(self, req, tokens: list[int], res) -> None:
        """Reserve in ``res`` what the answer's ``logprobs`` will hold (:func:`logprobs_bytes`; the
        prompts' ``tokens`` when echoed, ``max_tokens`` for each choice), before they are built:
        RequestError 413 when the request alone needs more than ``--max-pending-mb``, 503 while
        other requests hold the budget."""
        if req.logprobs is None:
            return
        k = req.logprobs
        gen = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        need = (sum(logprobs_bytes(t, k, req.n) for t in tokens) if req.echo else 0) \
            + len(tokens) * req.n * logprobs_bytes(gen, k)
        try:
            self.service.reserve(res, res.bytes + need, "lower logprobs, max_tokens or n, or split the prompt")
        except RequestError as e:
            e.extra["param"] = "logprobs"
            raise

    async def score(self, prompts: list[Prompt], need_states: bool, res, client, req=None) -> list[Scored]:
        """Score every prompt through the scheduler (one batch, as ``POST /v1/score/batch``); with
        ``req``, its answer's log-probs are reserved (:meth:`reserve_answer`) before the scoring."""
        from isan.engine.serve.scheduler import Job

        service = self.service
        eng = service.ready()
        tok = self.tokens
        sizes = [len(p.text) if p.text is not None else len(p.ids) for p in prompts]
        need = max(sum(prepare_bytes(n) for n in sizes), sum(job_bytes(n, True) for n in sizes))
        service.reserve(res, need)
        start = eng.initial_state()
        opts = SimpleNamespace(normalize="auto", unknown="error", replacement=None)
        jobs, where = [], []
        out: list[Scored | None] = []
        for i, p in enumerate(prompts):
            if p.text is not None:
                try:
                    prep = await service.prepare(p.text, opts, start)
                except RequestError as e:
                    if len(prompts) > 1:
                        e.message = f"prompt[{i}]: {e.message}"
                    e.extra["param"] = "prompt"
                    raise
                ids, offsets = np.asarray(prep.ids, dtype=np.int32), np.asarray(prep.offsets, dtype=np.int64)
                text = p.text
            else:
                ids = p.ids
                text = tok.decode(([tok.V] if p.bos else []) + ids.tolist())
                offsets = tok.offsets(np.concatenate([[tok.V], ids]) if p.bos else ids)
                offsets = offsets[1:] if p.bos else offsets
            out.append(Scored(p, text, ids, np.zeros(0), offsets, start, start.h))
            if len(ids):
                jobs.append(Job(ids, start, per_char=True, offsets=offsets.astype(np.int32),
                                normalizer=(prep.report.get("normalizer") if p.text is not None else None)))
                where.append(i)
        res.resize(sum(job_bytes(n, True) for n in sizes))
        if req is not None:
            self.reserve_answer(req, [len(sc.ids) + sc.prompt.bos for sc in out], res)
        if jobs:
            try:
                done = await service.score_jobs(jobs, client)
            except RequestError as e:
                i = e.extra.pop("index", None)
                if i is not None and len(prompts) > 1:
                    e.message = f"prompt[{where[i]}]: {e.message}"
                e.extra["param"] = "prompt"
                raise
            for i, job in zip(where, done):
                out[i].logprobs = -np.asarray(job.bits, dtype=np.float64) * LN2
                out[i].state = job.state
        return out  # type: ignore[return-value]

    async def reference(self, h, ids, k: int):
        """:func:`top_logprobs` in a worker thread (two at a time)."""
        params = self.service.ready().params
        async with self._ref_lock:
            if len(ids) <= 256:
                return top_logprobs(params, h, ids, k)
            return await asyncio.to_thread(top_logprobs, params, h, ids, k)

    def logprobs_json(self, ids, lps, top_i, top_v, offsets, base: int, bos: bool, k: int) -> dict:
        """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` of ``ids`` (after an
        ``<|endoftext|>`` when ``bos``), ``offsets`` shifted by ``base``."""
        strs = self.tokens.strs
        tokens, tlp, top, off = [], [], [], []
        if bos:
            tokens.append(EOT)
            tlp.append(None)
            top.append(None)
            off.append(base)
        lps_l = [float(v) for v in lps]
        tokens += [strs[int(i)] for i in ids]
        tlp += lps_l
        off += [int(o) + base for o in offsets]
        for t in range(len(ids)):
            d = {}
            if k:
                for j in range(k):
                    d[strs[int(top_i[t, j])]] = float(top_v[t, j])
            d[strs[int(ids[t])]] = lps_l[t]  # the token's own value, as token_logprobs has it
            top.append(d)
        return {"tokens": tokens, "token_logprobs": tlp, "top_logprobs": top, "text_offset": off}


    # ---- the request -------------------------------------------------------------------------
    async def complete(self, req, res, client):
        """``POST /v1/completions``: the answer (a dict), or with ``stream`` an async iterator of
        ``(None, chunk)`` / ``("error", body)`` for the app to send as Server-Sent Events."""
        from isan.engine.serve.clients import ClientGone  # noqa: F401 - raised by the helpers

        prompts = self.check(req)
        t0 = time.perf_counter()
        deadline = t0 + self.config.request_timeout_s
        max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        scored = await self.score(prompts, max_tokens > 0, res, client, req)
        head = {"id": completion_id(), "object": "text_completion", "created": now(), "model": self.name}
        seed = req.seed if req.seed is not None else secrets.randbits(53)
        usage = {"prompt_tokens": sum(len(s.ids) + s.prompt.bos for s in scored), "completion_tokens": 0}

        async def choices():
            """(index, segment) for every choice in order; a segment is {"text", "logprobs"} or the
            choice's end {"finish_reason", "stop_reason"}."""
            for i, sc in enumerate(scored):
                echo_lp = None
                if req.echo and req.logprobs is not None:
                    k = req.logprobs
                    if k and len(sc.ids):
                        _, ti, tv, _ = await self.reference(sc.state_start_h, sc.ids, k)
                    else:
                        ti = tv = None
                    echo_lp = self.logprobs_json(sc.ids, sc.logprobs, ti, tv, sc.offsets, 0, sc.prompt.bos, k)
                for j in range(req.n):
                    index = i * req.n + j
                    if req.echo:
                        yield index, {"text": sc.text, "logprobs": echo_lp}
                    async for seg in self.generate(sc, req, max_tokens, (seed + index) % (MAX_SEED + 1), client,
                                                   deadline, len(sc.text) if req.echo else 0, usage):
                        yield index, seg

        if not req.stream:
            out: dict[int, dict] = {}
            async for index, seg in choices():
                c = out.setdefault(index, {"index": index, "text": "", "logprobs": None, "finish_reason": None,
                                           "stop_reason": None})
                if "finish_reason" in seg:
                    c["finish_reason"], c["stop_reason"] = seg["finish_reason"], seg["stop_reason"]
                    continue
                c["text"] += seg["text"]
                if req.logprobs is not None:
                    if c["logprobs"] is None:
                        c["logprobs"] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                    for key, vals in (seg["logprobs"] or {}).items():
                        c["logprobs"][key].extend(vals)
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            return {**head, "choices": [out[i] for i in sorted(out)], "usage": usage}

        include_usage = bool((req.stream_options or {}).get("include_usage"))

        async def events():
            try:
                async for index, seg in choices():
                    if "finish_reason" in seg:
                        c = {"index": index, "text": "", "logprobs": None, **seg}
                    else:
                        c = {"index": index, "text": seg["text"], "logprobs": seg["logprobs"], "finish_reason": None,
                             "stop_reason": None}
                    yield None, {**head, "choices": [c], "usage": None}
            except RequestError as e:
                yield "error", openai_error(e)
                return
            except ClientGone:  # the client left: nobody to answer
                return
            except Exception:  # a bug: the stream still ends as the API says, with an error event
                log.exception("a streamed completion failed")
                yield "error", openai_error(RequestError(500, "internal error; the server log has the details"))
                return
            if include_usage:
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                yield None, {**head, "choices": [], "usage": usage}

        return events()

    async def generate(self, sc: "Scored", req, max_tokens: int, seed: int, client, deadline: float, base: int,
                       usage: dict):
        """The segments of one choice's generated text (see :meth:`complete`), then its end."""
        from isan.errors import IsanError

        from isan.engine.serve.errors import busy, from_isan
        from isan.engine.serve.sampling import StreamSampler
        from isan.engine.serve.clients import ClientGone

        if max_tokens == 0:
            yield {"finish_reason": "length", "stop_reason": None}
            return
        eng = self.service.ready()
        tok = self.tokens
        aligned = tok.kind == "chars"
        from isan.engine.sampling import greedy

        top_k = req.top_k if req.top_k not in (None, -1, 0) else None
        temperature, top_k = greedy(1.0 if req.temperature is None else req.temperature, top_k)
        stops = stops_of(req.stop)
        hold = max((len(s) for s in stops), default=1) - 1
        k = req.logprobs or 0

        def make():
            return StreamSampler(eng, "", max_tokens, temperature=temperature, top_k=top_k, seed=seed,
                                 state=sc.state, normalize="none", top_p=req.top_p)

        try:
            smp = await asyncio.to_thread(make) if not aligned else make()
        except IsanError as e:
            raise from_isan(e) from None
        h = np.asarray(sc.state.h, dtype=np.float64)
        sent = 0  # characters of smp.text sent
        finish, reason = "length", None
        while True:
            if client.gone:
                raise ClientGone()
            if time.perf_counter() > deadline:
                raise busy(f"the completion was not done within {self.config.request_timeout_s:g} s "
                           "(--request-timeout): lower max_tokens or n, or retry later", retry_after_s=5)
            if not smp.done:
                try:
                    piece = await asyncio.to_thread(smp.next_piece, GEN_PIECE)
                except IsanError as e:
                    raise from_isan(e) from None
                if self.metrics is not None:
                    self.metrics.sampled.inc(len(piece))
            text = smp.text
            end = len(text)
            hit = find_stop(text, stops, max(0, sent - hold)) if stops else None
            if hit is not None:
                end, finish, reason = hit[0], "stop", hit[1]
            elif not smp.done:
                end = max(sent, len(text) - hold)
            last = hit is not None or smp.done
            if aligned and end > sent:
                seg = text[sent:end]
                ids = eng.alphabet.as_ids(seg, "error", None)
                lp = None
                if req.logprobs is not None:
                    lps, ti, tv, h = await self.reference(h, ids, k)
                    lp = self.logprobs_json(ids, lps, ti, tv, np.arange(sent, end), base, False, k)
                usage["completion_tokens"] += len(ids)
                yield {"text": seg, "logprobs": lp}
                sent = end
            if last:
                if not aligned:
                    seg = text[:end]
                    ids = eng.alphabet.as_ids(seg, "error", None) if seg else np.zeros(0, dtype=np.int64)
                    lp = None
                    if req.logprobs is not None:
                        lps, ti, tv, _ = await self.reference(h, ids, k)
                        lp = self.logprobs_json(ids, lps, ti, tv, tok.offsets(ids), base, False, k)
                    usage["completion_tokens"] += len(ids)
                    yield {"text": seg, "logprobs": lp}
                yield {"finish_reason": finish, "stop_reason": reason}
                return


def served_name(info) -> str:
    """The name the model is served under: its bundle directory's name (``text8-d216`` for the
    shipped model), else its kind."""
    desc = info.describe or {}
    src = desc.get("source")
    if src:
        return str(src)
    return str(desc.get("kind") or "isan")


def completion_id() -> str:
    return "cmpl-" + secrets.token_hex(12)


def stops_of(stop) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def find_stop(text: str, stops: list[str], start: int) -> tuple[int, str] | None:
    """The first stop sequence in ``text`` at or after ``start``: (its position, it)."""
    best = None
    for s in stops:
        p = text.find(s, start)
        if p >= 0 and (best is None or p < best[0]):
            best = (p, s)
    return best


def now() -> int:
    return int(time.time())
