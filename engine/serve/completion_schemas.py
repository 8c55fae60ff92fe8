"""The request and response models (pydantic) of the OpenAI-compatible API of ``isan-serve``
(:mod:`isan.engine.serve.completions`): ``POST /v1/completions``, ``GET /v1/models`` and the tokenizer
endpoints, the requests built for one served model (its name, V and limits) by :func:`build_openai_schemas`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, create_model

from isan.engine.serve.schemas import MAX_SEED, integer

#: the special token: the start of a text (the initial state)
EOT = "<|endoftext|>"
#: OpenAI's default max_tokens
DEFAULT_MAX_TOKENS = 16
MAX_N = 64
MAX_STOPS = 16
MAX_STOP_CHARS = 256


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
