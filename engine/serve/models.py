"""Request and response models of the HTTP API (pydantic), built for one served model.

The models carry the served model's limits (``max_chars``, its alphabet, V), so the OpenAPI
schema at ``/openapi.json`` states exactly what the server accepts; :func:`parse` validates a body
against them and turns every validation problem into one :class:`RequestError` whose message
names the field and says what to send instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from isan.engine.serve.errors import RequestError

UNKNOWN = ("error", "skip", "replace")
#: a snapshot token is base64url without padding
TOKEN_PATTERN = r"^[A-Za-z0-9_-]+$"


class NextChar(BaseModel):
    symbol: str
    prob: float
    bits: float


class Normalization(BaseModel):
    model_config = ConfigDict(extra="allow")
    normalizer: str
    chars_read: int
    chars_scored: int
    changed: int
    dropped: int
    skipped: int
    replaced: int
    most_changed: list[dict[str, Any]]


class ScoreResponse(BaseModel):
    """The answer to ``POST /v1/score`` and to a stream frame with text."""

    chars: int = Field(description="characters scored (after normalisation)")
    bits: float = Field(description="total bits of the scored characters (log base 2)")
    bpc: Optional[float] = Field(description="bits per character; null when no character was scored")
    normalization: Optional[Normalization] = None
    scoring: Optional[dict[str, Any]] = Field(None, description="how the bits were computed")
    per_char_bits: Optional[list[float]] = Field(None, description="with per_char: the bits of each scored character")
    per_char_offsets: Optional[list[int]] = Field(None, description="with per_char: the input offset of each scored character")
    total_chars: Optional[int] = Field(None, description="running total since the initial state (with a state)")
    total_bits: Optional[float] = None
    total_bpc: Optional[float] = None
    state: Optional[str] = Field(None, description="with return_state: the snapshot of the state after the text")
    next: Optional[list[NextChar]] = Field(None, description="with top_k: the k most likely next characters")


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx answer."""

    model_config = ConfigDict(extra="allow")
    error: str = Field(description="what went wrong and what to do about it")
    status: int = Field(description="the HTTP status (also in error frames of a stream)")
    offset: Optional[int] = Field(None, description="422 for a diverging state: the input offset where it diverges")
    cause: Optional[str] = None
    retry_after_s: Optional[int] = Field(None, description="503: seconds to wait before retrying")


class HealthResponse(BaseModel):
    status: Literal["ok"]
    model: dict[str, Any]
    server: dict[str, Any]


@dataclass(frozen=True)
class Models:
    """The request models of one app (see :func:`build_models`)."""

    score: type[BaseModel]
    frame: type[BaseModel]
    max_chars: int
    allowed: tuple[str, ...]
    frame_allowed: tuple[str, ...]


def build_models(symbols: tuple[str, ...], max_chars: int, normalize_choices: list[str], max_state_chars: int) -> Models:
    """Pydantic models of a score request and a stream frame for a model with these symbols.

    Args:
        symbols: the model's alphabet (``replacement`` must be one of them; ``top_k`` at most its size).
        max_chars: the largest text.
        max_state_chars: the longest snapshot token of the model (:func:`~isan.engine.serve.snapshot.token_chars`).
        normalize_choices: accepted values of ``normalize``.
    """
    Sym = Literal[tuple(symbols)]  # type: ignore[valid-type]
    Norm = Literal[tuple(normalize_choices)]  # type: ignore[valid-type]
    Unk = Literal[UNKNOWN]  # type: ignore[valid-type]
    common = dict(
        per_char=(bool, Field(False, description="also answer the bits and input offset of every scored character")),
        unknown=(Unk, Field("error", description="characters outside the alphabet after normalisation: error (422), "
                                                 "skip, or replace with `replacement`")),
        replacement=(Optional[Sym], Field(None, description="the symbol that replaces unknown characters")),
        normalize=(Norm, Field("auto", description="auto: the model's normaliser; none: raw text; or a normaliser name")),
        return_state=(bool, Field(False, description="answer a snapshot of the state after the text (`state`)")),
        top_k=(int, Field(0, ge=0, le=len(symbols), description="answer the k most likely next characters (`next`)")),
    )
    cfg = ConfigDict(extra="forbid", strict=True)
    score = create_model(
        "ScoreRequest", __config__=cfg,
        text=(str, Field(min_length=1, max_length=max_chars, description="the text to score")),
        state=(Optional[str], Field(None, min_length=1, max_length=max_state_chars, pattern=TOKEN_PATTERN,
                                    description="a snapshot (from return_state) to continue from; totals then run on")),
        **common)
    frame = create_model(
        "StreamFrame", __config__=cfg,
        text=(Optional[str], Field(None, max_length=max_chars, description="the next chunk of the stream's text")),
        reset=(bool, Field(False, description="first go back to the initial state")),
        restore=(Optional[str], Field(None, min_length=1, max_length=max_state_chars, pattern=TOKEN_PATTERN,
                                      description="first continue from this snapshot")),
        snapshot=(bool, Field(False, description="answer a snapshot of the state (after the text, if any)")),
        **common)
    return Models(score, frame, max_chars, tuple(score.model_fields), tuple(frame.model_fields))


def _field(loc) -> str:
    return ".".join(str(x) for x in loc)


def parse(model: type[BaseModel], raw: bytes | str, allowed: tuple[str, ...], max_chars: int, what: str = "body"):
    """Validate ``raw`` JSON against ``model``.

    Raises:
        RequestError: 400 (not JSON, not an object, missing, unknown or bad fields, empty text) or
            413 (text over ``max_chars``), the message naming every problem.
    """
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise describe(e, allowed, max_chars, what) from None


def describe(e: ValidationError, allowed: tuple[str, ...], max_chars: int, what: str = "body") -> RequestError:
    status = 400
    msgs: list[str] = []
    extra_fields: list[str] = []
    for err in e.errors(include_url=False):
        typ, loc = err["type"], err["loc"]
        name = _field(loc)
        if typ == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "")
            hint = (": a \\uD800-\\uDFFF escape without its pair is not a Unicode character"
                    if "hex escape" in reason or "surrogate" in reason else "")
            return RequestError(400, f"the {what} is not valid JSON ({reason}){hint}; send an object like "
                                     '{"text": "..."}')
        if not loc:
            return RequestError(400, f'the {what} must be a JSON object like {{"text": "..."}}')
        if typ == "extra_forbidden":
            extra_fields.append(name)
        elif typ == "missing":
            msgs.append(f'the field "{name}" is required and must be a string')
        elif name == "text" and typ == "string_too_long":
            status = 413
            n = len(err["input"]) if isinstance(err.get("input"), str) else None
            msgs.append(f"the text has {n:,} characters; the limit is {max_chars:,} (split it, or use /v1/stream)")
        elif name == "text" and typ == "string_too_short":
            msgs.append("the text is empty; give at least one character")
        elif typ == "literal_error":
            choices = (err.get("ctx") or {}).get("expected", "")
            msgs.append(f'"{name}" must be one of {choices}')
        elif typ in ("string_type",):
            msgs.append(f'"{name}" must be a string')
        elif typ in ("bool_type", "bool_parsing"):
            msgs.append(f'"{name}" must be true or false')
        elif typ in ("int_type", "int_parsing", "int_from_float"):
            msgs.append(f'"{name}" must be an integer')
        elif name in ("state", "restore") and typ in ("string_pattern_mismatch", "string_too_short", "string_too_long"):
            msgs.append(f'"{name}" is not a state snapshot of this model (a base64url string); take one with '
                        '"return_state": true or {"snapshot": true}')
        else:
            msgs.append(f'"{name}": {err["msg"]}')
    if extra_fields:
        msgs.insert(0, f"unknown fields {sorted(set(extra_fields))}; allowed: {', '.join(allowed)}")
    return RequestError(status, "; ".join(msgs) or f"the {what} is not a valid request")
