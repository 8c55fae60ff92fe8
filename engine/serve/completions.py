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
from typing import Annotated, Any, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, create_model

from isan.engine.serve.budget import job_bytes, logprobs_bytes, prepare_bytes
from isan.engine.serve.errors import RequestError
from isan.engine.serve.schemas import MAX_SEED, integer

log = logging.getLogger(__name__)

#: the special token: the start of a text (the initial state)
EOT = "<|endoftext|>"
LN2 = math.log(2.0)
#: OpenAI's default max_tokens
DEFAULT_MAX_TOKENS = 16
MAX_N = 64
MAX_STOPS = 16
MAX_STOP_CHARS = 256
#: the most top_logprobs entries (tokens x logprobs) one request may ask for
MAX_TOP_VALUES = 4_000_000
#: characters generated between two checks of the stop sequences, the client and the deadline
GEN_PIECE = 64
#: the paths of this API (their errors have OpenAI's shape)
PATHS = ("/v1/completions", "/v1/models", "/tokenize", "/detokenize", "/tokenizer_info")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 409: "conflict_error",
          413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
          426: "invalid_request_error", 500: "server_error", 503: "overloaded_error"}


def openai_error(e: RequestError, param: str | None = None) -> dict:
    """The OpenAI error body of ``e``: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": e.message, "type": _TYPES.get(e.status, "invalid_request_error"),
                      "param": e.extra.get("param", param), "code": e.status}}


# ---- the API's schema ---------------------------------------------------------------------------
class OpenAIErrorInfo(BaseModel):
    message: str = Field(description="what went wrong and what to do about it")
    type: str
    param: Optional[str] = None
    code: int = Field(description="the HTTP status")


class OpenAIError(BaseModel):
    """Every 4xx and 5xx answer of the OpenAI-compatible endpoints."""

    error: OpenAIErrorInfo


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(description="the choice's tokens (the model's symbols; <|endoftext|> for token id V)")
    token_logprobs: list[Optional[float]] = Field(description="natural-log probability of each token given the "
                                                             "tokens before it (null for <|endoftext|>)")
    top_logprobs: list[Optional[dict[str, float]]] = Field(description="the `logprobs` most likely tokens at each "
                                                                        "position, and the token itself")
    text_offset: list[int] = Field(description="the offset in the choice's text where each token came from")


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[Literal["stop", "length"]] = None
    stop_reason: Optional[str] = Field(None, description="the stop sequence that ended the choice")


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    """The answer to ``POST /v1/completions`` (and, with ``"stream": true``, each event's data)."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[CompletionUsage] = None


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str]


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    tokenizer_class: str
    eos_token: str
    bos_token: str
    vocab_size: int
    model_max_length: int


@dataclass(frozen=True)
class OpenAISchemas:
    completion: type[BaseModel]
    tokenize: type[BaseModel]
    detokenize: type[BaseModel]

    @staticmethod
    def allowed(model: type[BaseModel]) -> tuple[str, ...]:
        return tuple(model.model_fields)


def prompt_schema(V: int, max_chars: int, max_prompts: int) -> dict:
    ids = {"type": "array", "minItems": 1, "maxItems": max_chars,
           "items": {"type": "integer", "minimum": 0, "maximum": V}}
    return {"anyOf": [
        {"type": "string", "maxLength": max_chars},
        {"type": "array", "minItems": 1, "maxItems": max_prompts, "items": {"type": "string", "maxLength": max_chars}},
        ids,
        {"type": "array", "minItems": 1, "maxItems": max_prompts, "items": ids},
    ], "description": f"a text, a list of texts, a list of token ids (0..{V - 1} the symbols, {V} {EOT} which may only "
                      "come first), or a list of such lists"}


StopStr = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


def build_openai_schemas(name: str, V: int, max_chars: int, max_prompts: int, max_tokens: int) -> OpenAISchemas:
    """The request models of the OpenAI-compatible endpoints for a served model called ``name``
    with V symbols (its schema names the model, the token ids and the limits)."""

    def config():
        return ConfigDict(extra="forbid", strict=True)

    model_field = (Optional[Literal[name]], Field(None, description=f"the served model, `{name}` (GET /v1/models)"))
    completion = create_model(
        "CompletionRequest", __config__=config(),
        model=model_field,
        prompt=(Any, Field(json_schema_extra=prompt_schema(V, max_chars, max_prompts))),
        max_tokens=(Optional[integer(0, max_tokens)], Field(DEFAULT_MAX_TOKENS, description="tokens to generate "
                                                              "after each prompt (0: score the prompt only)")),
        echo=(bool, Field(False, description="put the prompt before the generated text (and its tokens in logprobs)")),
        logprobs=(Optional[integer(0, V)], Field(None, description="answer logprobs, with the this many most likely "
                                                                    "tokens at each position in top_logprobs")),
        temperature=(Optional[float], Field(None, ge=0.0, le=100.0, description="logits are divided by it (default 1; "
                                                                                 "0: greedy)")),
        top_p=(Optional[float], Field(None, gt=0.0, le=1.0, description="nucleus sampling (default 1: off)")),
        top_k=(Optional[integer(-1, V)], Field(None, description="sample among the k most likely tokens (-1 or 0: all)")),
        seed=(Optional[integer(0, MAX_SEED)], Field(None, description="seed of choice 0 (choice j uses seed + j); "
                                                                      "default: drawn by the server")),
        stop=(Optional[Union[StopStr, Annotated[list[StopStr], Field(max_length=MAX_STOPS)]]],
              Field(None, description="sequences that end a choice (not included in its text)")),
        n=(integer(1, MAX_N), Field(1, description="choices for each prompt")),
        stream=(bool, Field(False, description="answer Server-Sent Events `data: {chunk}`, then `data: [DONE]`")),
        stream_options=(Optional[dict[Literal["include_usage"], bool]], Field(None, description="include_usage: a last "
                                                                                              "chunk with usage")),
        user=(Optional[str], Field(None, max_length=256, description="ignored")),
    )
    tokenize = create_model(
        "TokenizeRequest", __config__=config(),
        model=model_field,
        prompt=(str, Field(max_length=max_chars, description=f"the text to tokenize ({EOT} is the special token)")),
        add_special_tokens=(bool, Field(False, description=f"put {EOT} (token id {V}, the initial state) first")),
    )
    detokenize = create_model(
        "DetokenizeRequest", __config__=config(),
        model=model_field,
        tokens=(list[integer(0, V)], Field(max_length=max_chars, description="token ids")),
    )
    return OpenAISchemas(completion, tokenize, detokenize)


# ---- tokens -------------------------------------------------------------------------------------
class Tokens:
    """The model's symbols as OpenAI tokens (ids 0..V-1 and V for ``<|endoftext|>``)."""

    def __init__(self, alphabet):
        self.alphabet = alphabet
        self.kind = getattr(alphabet, "kind", "chars")
        self.V = len(alphabet)
        if self.kind == "bytes":
            self.strs = [chr(b) if b < 128 else f"bytes:\\x{b:02x}" for b in range(256)]
        elif self.kind == "chars":
            self.strs = list(alphabet.symbols)
        else:
            self.strs = [alphabet.decode(np.array([i])) for i in range(self.V)]
        self.strs.append(EOT)
        # token strings as dictionary keys must be distinct (top_logprobs)
        if len(set(self.strs)) != len(self.strs):
            seen: dict[str, int] = {}
            for i, s in enumerate(self.strs):
                if s in seen:
                    self.strs[i] = f"{s}#{i}"
                seen[s] = i

    def decode(self, ids) -> str:
        """The text of token ids (``<|endoftext|>`` for V)."""
        out, run = [], []
        for i in ids:
            if int(i) == self.V:
                if run:
                    out.append(self.alphabet.decode(np.asarray(run)))
                    run = []
                out.append(EOT)
            else:
                run.append(int(i))
        if run:
            out.append(self.alphabet.decode(np.asarray(run)))
        return "".join(out)

    def offsets(self, ids: np.ndarray) -> np.ndarray:
        """The offset in ``decode(ids)`` where each token's text starts."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64)
        if self.kind == "chars" and not (ids == self.V).any():
            return np.arange(len(ids), dtype=np.int64)
        out = np.empty(len(ids), dtype=np.int64)
        pos = 0
        if self.kind == "bytes":  # a byte belongs to the character its lead byte starts
            for k, i in enumerate(ids):
                if i == self.V:
                    out[k] = pos
                    pos += len(EOT)
                else:
                    lead = (int(i) & 0xC0) != 0x80
                    out[k] = pos if lead or k == 0 else out[k - 1]
                    pos += 1 if lead else 0
            return out
        for k, i in enumerate(ids):
            out[k] = pos
            pos += len(EOT) if i == self.V else len(self.alphabet.decode(np.array([int(i)])))
        return out


@dataclass
class Prompt:
    """One prompt: its text (as echoed), its token ids (a leading ``<|endoftext|>`` stripped into ``bos``)."""

    text: str | None = None  # a string prompt (read by the normaliser)
    ids: np.ndarray | None = None  # token ids to score (no EOT)
    bos: bool = False


def _as_int(v) -> int | None:
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    return None


def read_prompts(prompt, V: int, max_chars: int, max_prompts: int) -> list[Prompt]:
    """The prompts of a request's ``prompt`` (checked: 400 for a bad form, 413 over a limit, 422 for
    ``<|endoftext|>`` after the start)."""
    form = (f'"prompt" must be a string, a list of strings, a list of token ids (integers 0..{V}) or a list of such '
            "lists")

    def ids_of(x, where: str) -> Prompt:
        if not x:
            raise RequestError(400, f'{where} is an empty list; give at least one token id', {"param": "prompt"})
        vals = [_as_int(v) for v in x]
        if any(v is None for v in vals):
            raise RequestError(400, form, {"param": "prompt"})
        if len(vals) > max_chars:
            raise RequestError(413, f"{where} has {len(vals):,} tokens; the limit is {max_chars:,} (split it)",
                               {"param": "prompt"})
        if any(not 0 <= v <= V for v in vals):
            raise RequestError(400, f"{where} has a token id outside 0..{V}; use ids of GET /tokenizer_info's "
                                    "vocabulary (POST /tokenize)", {"param": "prompt"})
        bos = vals[0] == V
        rest = np.asarray(vals[1:] if bos else vals, dtype=np.int32)
        if (rest == V).any():
            k = int(np.argmax(rest == V)) + (1 if bos else 0)
            raise RequestError(422, f"{where}: {EOT} (token id {V}) at position {k}; it stands for the initial state "
                                    "and must only start a prompt: split the prompt there", {"param": "prompt"})
        return Prompt(ids=rest, bos=bos)

    if isinstance(prompt, str):
        if len(prompt) > max_chars:
            raise RequestError(413, f'"prompt" has {len(prompt):,} characters; the limit is {max_chars:,} (split it)',
                               {"param": "prompt"})
        return [Prompt(text=prompt)]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError(400, form if not isinstance(prompt, list) else '"prompt" is an empty list; give a text',
                           {"param": "prompt"})
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        if len(prompt) > max_prompts:
            raise RequestError(413, f'"prompt" has {len(prompt):,} prompts; the limit is {max_prompts:,} a request '
                                    "(--max-batch-texts): send several requests", {"param": "prompt"})
        if isinstance(prompt[0], str):
            total = sum(len(p) for p in prompt)
            if total > max_chars:
                raise RequestError(413, f'the prompts have {total:,} characters in all; the limit is {max_chars:,} a '
                                        "request (--max-chars): send several requests", {"param": "prompt"})
            return [Prompt(text=p) for p in prompt]
        out = [ids_of(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        total = sum(len(p.ids) for p in out)
        if total > max_chars:
            raise RequestError(413, f"the prompts have {total:,} tokens in all; the limit is {max_chars:,} a request "
                                    "(--max-chars): send several requests", {"param": "prompt"})
        return out
    return [ids_of(prompt, '"prompt"')]


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
        from isan.engine.serve.service import ClientGone  # noqa: F401 - raised by the helpers

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
        from isan.engine.serve.service import ClientGone

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
