"""The HTTP routes of the API: each reads its request against the served model's schemas and hands
it to the service, as vLLM's ``api_router`` hands requests to its serving classes.

A route's ``work(api, raw, client, res)`` gets the body (``raw``, already read into the memory
budget's reservation ``res``), the connection (``client``: its leaving drops the work) and the
:class:`Api` of the app; it answers a dict (sent as JSON) or an :class:`~isan.engine.serve.asgi.SSE`.
What a request does is decided in :class:`~isan.engine.serve.service.Service` and, for the
OpenAI-compatible API, :class:`~isan.engine.serve.completions.Completions`; the plain ASGI handling
(body, errors, events) is :mod:`isan.engine.serve.asgi`; the declarations in the OpenAPI schema are
:mod:`isan.engine.serve.openapi`; the WebSocket is :mod:`isan.engine.serve.websocket`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from isan.engine.serve.asgi import SSE, get_handler, post_handler
from isan.engine.serve.completions import Completions
from isan.engine.serve.schemas import Schemas, parse
from isan.engine.serve.service import Service


@dataclass
class Api:
    """What the routes use (vLLM keeps the same in ``app.state``).

    Attributes:
        service: the engine, scheduler and budget (:class:`Service`).
        schemas: the request schemas of the served model (:func:`isan.engine.serve.schemas.build_schemas`).
        explain: the request schema of ``POST /v1/explain`` (:func:`isan.engine.serve.lens.build_request`),
            whose texts are at most ``explain_chars`` characters.
        oai: the OpenAI-compatible endpoints.
    """

    service: Service
    schemas: Schemas
    explain: type
    explain_chars: int
    oai: Completions

    def parse(self, schema, raw):
        """``raw`` validated against ``schema`` (RequestError 400 naming the field, 413 over a limit)."""
        return parse(schema, raw, self.schemas.allowed(schema), self.schemas.max_chars)


@dataclass(frozen=True)
class Route:
    """One route: ``method path``; ``endpoint`` labels its metrics; ``openai``: its errors have OpenAI's shape."""

    method: str
    path: str
    endpoint: str
    work: Callable
    openai: bool = False


async def score(api: Api, raw, client, res):
    return await api.service.score(api.parse(api.schemas.score, raw), res, client)


async def score_batch(api: Api, raw, client, res):
    req = api.parse(api.schemas.batch, raw)
    return await api.service.score_many(req.texts, req, res, client)


async def next_chars(api: Api, raw, client, res):
    return await api.service.next_after(api.parse(api.schemas.next, raw), res, client)


async def sample(api: Api, raw, client, res):
    req = api.parse(api.schemas.sample, raw)
    out = await api.service.sample(req, client)
    return SSE(out) if req.stream else out


async def attribute(api: Api, raw, client, res):
    return await api.service.attribute(api.parse(api.schemas.attribute, raw), res)


async def explain(api: Api, raw, client, res):
    req = parse(api.explain, raw, tuple(api.explain.model_fields), api.explain_chars)
    return await api.service.explain(req, res)


async def completions(api: Api, raw, client, res):
    req = api.oai.parse(api.oai.schemas.completion, raw)
    out = await api.oai.complete(req, res, client)
    return SSE(out, named=False) if req.stream else out


async def tokenize(api: Api, raw, client, res):
    return api.oai.tokenize(api.oai.parse(api.oai.schemas.tokenize, raw))


async def detokenize(api: Api, raw, client, res):
    return api.oai.detokenize(api.oai.parse(api.oai.schemas.detokenize, raw))


def models(api: Api) -> dict:
    return api.oai.model_list()


def tokenizer_info(api: Api) -> dict:
    return api.oai.tokenizer_info()


#: every HTTP route of the API (GET routes answer without a body)
ROUTES = (
    Route("POST", "/v1/score", "score", score),
    Route("POST", "/v1/score/batch", "batch", score_batch),
    Route("POST", "/v1/next", "next", next_chars),
    Route("POST", "/v1/sample", "sample", sample),
    Route("POST", "/v1/attribute", "attribute", attribute),
    Route("POST", "/v1/explain", "explain", explain),
    Route("POST", "/v1/completions", "completions", completions, openai=True),
    Route("POST", "/tokenize", "tokenize", tokenize, openai=True),
    Route("POST", "/detokenize", "detokenize", detokenize, openai=True),
    Route("GET", "/v1/models", "models", models, openai=True),
    Route("GET", "/tokenizer_info", "tokenizer_info", tokenizer_info, openai=True),
)


def handlers(api: Api) -> dict:
    """``{(method, path): ASGI handler}`` of every route in :data:`ROUTES`, bound to ``api``."""
    out = {}
    for r in ROUTES:
        if r.method == "GET":
            out[(r.method, r.path)] = get_handler(api.service, r.endpoint, lambda w=r.work: w(api))
        else:
            out[(r.method, r.path)] = post_handler(api.service, r.endpoint,
                                                   lambda raw, client, res, w=r.work: w(api, raw, client, res),
                                                   r.openai)
    return out
