"""The OpenAPI schema of ``isan-serve`` (``/openapi.json``, rendered at ``/docs``): the API's
description and the declarations of its routes, with their request bodies, answers and errors.

The ``/v1`` routes are served as plain ASGI handlers (:mod:`isan.engine.serve.routes`); here they are
declared to FastAPI, whose route for each hands the request to the same handler (:class:`Raw`), so a
request that reaches FastAPI is answered the same. The WebSocket is declared too (OpenAPI does not
describe its frames: :data:`DESCRIPTION` does). With an API key, :func:`add_security` declares both
ways of sending it on the protected paths.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response

from isan.engine.serve.completion_schemas import (CompletionResponse, DetokenizeResponse, ModelList, OpenAIError,
                                                  TokenizeResponse, TokenizerInfo)
from isan.engine.serve.schemas import (AttributeResponse, BatchResponse, ErrorResponse, NextResponse, SampleResponse,
                                       ScoreResponse)

JSON = "application/json"

DESCRIPTION = """Score, predict, sample and attribute text with an Input Switched Affine Network, in bits.

All texts of all requests and stream frames are scored by one scheduler that batches the pending
work of every client into rounds (continuous batching). Limits (see `GET /healthz`): texts up to
`max_chars` characters; request data held at once up to `max_pending_mb` (503 with `Retry-After`
beyond); `request_timeout_s` per text (503); headers and body each within `read_timeout_s` (408);
`max_connections` HTTP connections and `max_streams` streams (503). Request bodies are JSON sent
with `Content-Type: application/json` (415 otherwise), each key once (422 otherwise). Errors are
always `{"error", "status", ...}`, the message saying what to fix: 400 for a request this schema
refuses (a text outside the alphabet read raw is 422, with its offset), 422 for text the model
cannot score. A request whose `Host` is not one of the server's names (`localhost`, a loopback
address, any IP address on a connection to another address, `--allow-host`) is 403.

Scores are in bits (`bits`, `bpc`) and, as `isan score --json` gives it, `nnl`: the mean negative
log-likelihood in base V, the alphabet's size (`bpc / log2(V)`); running totals have `total_*`.

**WebSocket `/v1/stream`** (not described by OpenAPI): send JSON frames `{"text": "chunk"}` (with the
options of `POST /v1/score`), `{"reset": true}`, `{"restore": "<snapshot>"}`, `{"snapshot": true}`;
each answer carries the chunk's `chars`, `bits`, `bpc` and the running `total_chars`, `total_bits`,
`total_bpc`. The state is carried across frames, so chunking never changes the bits. A bad frame is
answered `{"error", "status"}` and the stream's state kept. When the server shuts down, a stream
answers the frame it is scoring, then sends `{"event": "shutdown", "state": "<snapshot>"}` (the state
after the last frame answered) and closes with code 1012: restore it elsewhere and resend the frames
that got no answer.

**State snapshots**: `"return_state": true` (or `{"snapshot": true}` on a stream) answers `state`, a
signed token of the state and the running totals; `"state"` (or `{"restore": ...}`) continues from it.
A changed token is refused with 403, one of another model with 409.

**OpenAI-compatible API** (as vLLM and the llama.cpp server offer it): `POST /v1/completions` scores
(`echo`, `logprobs`, `max_tokens: 0`) and generates text; `GET /v1/models`; `GET /tokenizer_info`,
`POST /tokenize`, `POST /detokenize` (lm-evaluation-harness's remote tokenizer). Tokens are the model's
symbols (token id V, `<|endoftext|>`, may start a prompt: the initial state); log-probs are natural logs;
errors are `{"error": {"message", "type", "param", "code"}}`.
"""


def package_version() -> str:
    """The installed ``isan`` package's version (``/docs``, ``/openapi.json``): its metadata, else
    ``isan.__version__`` when it runs from a source tree that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("isan")
    except PackageNotFoundError:  # pragma: no cover - the tests run on an installed package
        import isan

        return isan.__version__


def error_responses(*codes: int, model=None) -> dict:
    what = {400: "bad request (the message names the field)", 401: "a missing or wrong API key",
            403: "a snapshot changed or signed by another server, or a Host that is not one of the server's names "
                 "(--allow-host)", 404: "no such endpoint", 405: "method not allowed",
            408: "the headers or body were too slow to arrive", 409: "a snapshot of another model",
            413: "text or body over the limit", 415: "a body not sent as Content-Type: application/json",
            422: "text the model cannot score (characters outside its alphabet, nothing left after normalisation, "
                 "a diverging state), or a key given twice",
            426: "a WebSocket endpoint", 500: "internal error",
            503: "busy, loading or timed out: retry after Retry-After"}
    return {c: {"model": model or ErrorResponse, "description": what.get(c, "error")} for c in codes}


class Raw(Response):
    """A FastAPI answer that hands the request to a plain ASGI handler (whose body is unread)."""

    def __init__(self, handler):
        super().__init__()
        self._handler = handler

    async def __call__(self, scope, receive, send) -> None:
        await self._handler(scope, receive, send)


def declare(fa: FastAPI, api, http_routes: dict, stream) -> None:
    """Declare every route of :data:`isan.engine.serve.routes.ROUTES` (``http_routes``: their
    handlers) and the WebSocket ``/v1/stream`` (``stream``: its handler) to FastAPI ``fa``, with the
    request schemas of ``api`` (:class:`isan.engine.serve.routes.Api`)."""
    _declare_api(fa, api, http_routes)
    _declare_openai(fa, api.oai, http_routes)
    _declare_stream(fa, stream)


def _body_schema(model) -> dict:
    """The ``openapi_extra`` of a route whose body is the request model ``model``."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schema["additionalProperties"] = False
    return {"requestBody": {"required": True, "content": {JSON: {"schema": schema}}}}


def _declare_post(fa: FastAPI, http_routes: dict, path: str, model, response, summary: str,
                  codes=(400, 401, 403, 408, 409, 413, 415, 422, 500, 503), extra_200: dict | None = None,
                  error_model=None) -> None:
    """Declare ``POST path``: its body ``model``, its answer ``response``, its errors ``codes``."""
    route_handler = http_routes[("POST", path)]

    async def endpoint(request: Request):
        return Raw(route_handler)

    ok = {"model": response, "description": summary}
    if extra_200:
        ok["content"] = extra_200
    fa.post(path, response_model=None, summary=summary, description=summary,
            responses={200: ok, **error_responses(*codes, model=error_model)}, openapi_extra=_body_schema(model),
            name=path.strip("/").replace("/", "_"))(endpoint)


def _declare_get(fa: FastAPI, http_routes: dict, path: str, response, summary: str) -> None:
    """Declare ``GET path`` answering ``response`` (errors in OpenAI's shape)."""
    route_handler = http_routes[("GET", path)]

    async def endpoint(request: Request):
        return Raw(route_handler)

    fa.get(path, response_model=None, summary=summary, description=summary,
           responses={200: {"model": response, "description": summary},
                      **error_responses(401, 403, 405, 503, model=OpenAIError)},
           name=path.strip("/").replace("/", "_"))(endpoint)


def _declare_api(fa: FastAPI, api, http_routes: dict) -> None:
    """The ``/v1`` routes of the API: score, batch, next, sample, attribute and explain."""
    from isan.engine.serve.lens import ExplainResponse

    schemas = api.schemas

    def declare(*args, **kwargs) -> None:
        _declare_post(fa, http_routes, *args, **kwargs)

    declare("/v1/score", schemas.score, ScoreResponse, "Score one text: its bits, and optionally each character's, "
            "the top-k next characters and a snapshot of the state")
    declare("/v1/score/batch", schemas.batch, BatchResponse, "Score many independent texts together (one result "
            "each); a text the model cannot score fails the request, naming it (texts[i])")
    declare("/v1/next", schemas.next, NextResponse, "The k most likely next characters, with probabilities and "
            "bits, after a text (scored) and/or a snapshot")
    declare("/v1/sample", schemas.sample, SampleResponse, "Generate text after a prompt. With \"stream\": true "
            "(default) the answer is Server-Sent Events: `chars` events {\"text\", \"offset\"} as characters are "
            "generated, then `done` with the data of the JSON answer (or `error` {\"error\", \"status\"})",
            extra_200={"text/event-stream": {"schema": {
                "type": "object", "required": ["event", "data"],
                "description": "one Server-Sent Event; data is JSON: chars {text, offset}, done (as the JSON answer), "
                               "error {error, status}",
                "properties": {"event": {"type": "string", "enum": ["chars", "done", "error"]},
                               "data": {"type": "string"}}}}})
    declare("/v1/attribute", schemas.attribute, AttributeResponse, "Exact attribution of the logits after each "
            "character to the initial state and to each earlier character or word (kappa, paper eqs. 4-6), with "
            "the check that they sum to the logits")

    declare("/v1/explain", api.explain, ExplainResponse, "The prediction at one offset of a text explained: the "
            "exact attribution of a target (the logit or log-probability of a symbol, or the difference of two "
            "logits) to the initial state and each earlier symbol or word, with the check that they sum to it, and "
            "the bits when only the last n symbols are kept (paper Fig 4c)")


def _declare_openai(fa: FastAPI, oai, http_routes: dict) -> None:
    """The OpenAI-compatible routes: completions, tokenize, detokenize, the model list, the tokenizer."""
    oai_codes = (400, 401, 403, 404, 408, 413, 415, 422, 500, 503)

    def declare(*args, **kwargs) -> None:
        _declare_post(fa, http_routes, *args, codes=oai_codes, error_model=OpenAIError, **kwargs)

    declare("/v1/completions", oai.schemas.completion, CompletionResponse, "OpenAI-compatible completions (as vLLM "
            "and llama.cpp): score a prompt (echo, logprobs, max_tokens 0) and generate after it. Tokens are the "
            "model's symbols; log-probs natural logs. With \"stream\": true, Server-Sent Events `data: {chunk}` "
            "ending with `data: [DONE]`",
            extra_200={"text/event-stream": {"schema": {
                "type": "object", "required": ["data"],
                "description": "one Server-Sent Event (no event name): data is a CompletionResponse with one choice's "
                               "piece, then `[DONE]`; an error ends the stream with {\"error\": {...}}",
                "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}})
    declare("/tokenize", oai.schemas.tokenize, TokenizeResponse, "The token ids of a text, as the model reads it "
            "(vLLM's /tokenize)")
    declare("/detokenize", oai.schemas.detokenize, DetokenizeResponse, "The text of token ids (vLLM's /detokenize)")

    _declare_get(fa, http_routes, "/v1/models", ModelList, "The served model (OpenAI's model list)")
    _declare_get(fa, http_routes, "/tokenizer_info", TokenizerInfo, "The tokenizer: the model's symbols, and "
                 "<|endoftext|> (token id V), which stands for the initial state (vLLM's /tokenizer_info)")


def _declare_stream(fa: FastAPI, stream) -> None:
    """The WebSocket ``/v1/stream`` (OpenAPI does not describe it: :data:`DESCRIPTION` does)."""

    @fa.websocket("/v1/stream")
    async def _declared_stream(ws: WebSocket):  # pragma: no cover - IsanApp routes streams to the StreamEndpoint
        await stream(ws.scope, ws.receive, ws.send, True)


def add_security(fa: FastAPI, protected: set[str]) -> None:
    """Declare the API key in the OpenAPI schema (both ways of sending it) on the protected paths."""
    base = fa.openapi

    def openapi():
        if fa.openapi_schema:
            return fa.openapi_schema
        schema = base()
        comps = schema.setdefault("components", {}).setdefault("securitySchemes", {})
        comps["bearer"] = {"type": "http", "scheme": "bearer", "description": "the server's API key"}
        comps["apiKey"] = {"type": "apiKey", "in": "header", "name": "X-API-Key"}
        for path, ops in schema.get("paths", {}).items():
            if path in protected:
                for op in ops.values():
                    op["security"] = [{"bearer": []}, {"apiKey": []}]
                    op.setdefault("responses", {}).setdefault("401", {
                        "description": "a missing or wrong API key",
                        "content": {JSON: {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
        fa.openapi_schema = schema
        return schema

    fa.openapi = openapi

