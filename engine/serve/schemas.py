"""Request and response models of the HTTP API (pydantic), built for one served model.

The models carry the served model's limits (``max_chars``, its alphabet, V), so the OpenAPI
schema at ``/openapi.json`` states exactly what the server accepts; :func:`parse` validates a body
against them and turns every validation problem into one :class:`RequestError` whose message
names the field and says what to send instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model

from isan.engine.serve.errors import RequestError
from isan.engine.serve.snapshot import MAX_TOKEN_CHARS, TOKEN_PATTERN, TOKEN_PREFIX

UNKNOWN = ("error", "skip", "replace")
#: the largest seed: 2^53 - 1, the largest integer every JSON reader (a JavaScript client too) holds exactly
MAX_SEED = 2**53 - 1


def _integral(v):
    """A number with no fraction is an integer, as JSON Schema has it (``5.0`` is a valid ``integer``)."""
    if type(v) is float and v.is_integer():
        return int(v)
    return v


def integer(ge: int, le: int):
    """An integer field from ``ge`` to ``le``: JSON integers, and numbers such as 5.0 (strings and
    booleans are refused); its schema is ``{"type": "integer", "minimum", "maximum"}``."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


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
    most_dropped: list[dict[str, Any]]


class ScoreResponse(BaseModel):
    """The answer to ``POST /v1/score`` and to a stream frame with text."""

    chars: int = Field(description="characters scored (after normalisation)")
    bits: float = Field(description="total bits of the scored characters (log base 2)")
    bpc: Optional[float] = Field(description="bits per character; null when no character was scored")
    nnl: Optional[float] = Field(None, description="mean negative log-likelihood in base V, the alphabet's size: bpc / "
                                                 "log2(V), as `isan score --json`; null when no character was scored")
    normalization: Optional[Normalization] = None
    scoring: Optional[dict[str, Any]] = Field(None, description="how the bits were computed")
    per_char_bits: Optional[list[float]] = Field(None, description="with per_char: the bits of each scored character")
    per_char_offsets: Optional[list[int]] = Field(None, description="with per_char: the input offset of each scored character")
    total_chars: Optional[int] = Field(None, description="running total since the initial state (with a state)")
    total_bits: Optional[float] = None
    total_bpc: Optional[float] = None
    total_nnl: Optional[float] = Field(None, description="the running total's nnl")
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
    status: Literal["loading", "ready", "failed"] = Field(description="loading: the model is being loaded (every "
                                                          "/v1 endpoint answers 503); ready; failed (see error)")
    error: Optional[str] = Field(None, description="failed: why the model could not be loaded")
    model: dict[str, Any]
    worker: dict[str, int] = Field(description="the process that answered: its `pid`, and how many `workers` serve "
                                               "the port (isan-serve --workers; the other fields are this worker's)")
    server: dict[str, Any]


class BatchResponse(BaseModel):
    """The answer to ``POST /v1/score/batch``."""

    results: list[ScoreResponse] = Field(description="one result per text, in order")
    chars: int = Field(description="characters scored over all texts")
    bits: float = Field(description="bits over all texts")
    bpc: Optional[float] = None
    nnl: Optional[float] = Field(None, description="bpc / log2(V) over all texts")


class NextResponse(BaseModel):
    """The answer to ``POST /v1/next``."""

    model_config = ConfigDict(extra="allow")
    next: list[NextChar] = Field(description="the k most likely next characters, most likely first")
    chars: int = Field(description="characters of `text` scored (0 without text)")
    bits: float = 0.0
    bpc: Optional[float] = None
    nnl: Optional[float] = Field(None, description="bpc / log2(V) of `text`; null without text")
    total_chars: int
    total_bits: float
    total_bpc: Optional[float] = None
    total_nnl: Optional[float] = None
    state: Optional[str] = None


class SampleResponse(BaseModel):
    """``POST /v1/sample`` with ``"stream": false``, and the data of the final ``done`` event of the stream."""

    model_config = ConfigDict(extra="allow")
    prompt: str
    text: str = Field(description="the generated characters (without the prompt)")
    chars: int
    bits: float = Field(description="bits of the generated characters under the model (unscaled by temperature)")
    seed: int = Field(description="the seed used (drawn by the server when none was given): send it to repeat the sample")
    temperature: Optional[float] = Field(description="the temperature (null with inverse_temperature 0: uniform)")
    top_k: Optional[int] = None
    state: Optional[str] = None


class AttributeResponse(BaseModel):
    """The answer to ``POST /v1/attribute`` (:meth:`isan.engine.Attribution.to_json`)."""

    model_config = ConfigDict(extra="allow")
    text: str
    by: str
    sources: list[str]
    source_spans: list[list[int]]
    targets: list[str]
    next_char_kappa: list[list[float]]
    check_max_abs_error: float
    check: dict[str, Any]


@dataclass(frozen=True)
class Schemas:
    """The request schemas of one app (see :func:`build_schemas`)."""

    score: type[BaseModel]
    frame: type[BaseModel]
    batch: type[BaseModel]
    next: type[BaseModel]
    sample: type[BaseModel]
    attribute: type[BaseModel]
    max_chars: int

    def allowed(self, model: type[BaseModel]) -> tuple[str, ...]:
        return tuple(model.model_fields)


def build_schemas(symbols: tuple[str, ...], max_chars: int, normalize_choices: list[str],
                 raw_normalize: tuple[str, ...] = ("none", "none-v1"), max_batch_texts: int = 1024,
                 max_sample_chars: int = 10_000, max_attribute_chars: int = 500) -> Schemas:
    """Pydantic models of the requests and stream frames for a model with these symbols.

    Their JSON schemas (``/openapi.json``) say what the server accepts, so that a request valid per
    the schema is never answered 400: a ``state`` must look like a snapshot (its prefix and
    length; a token of any model, so that one of another model gets its 409), ``"unknown":
    "replace"`` needs ``replacement``, a text read raw (``normalize`` in ``raw_normalize`` and
    ``"unknown": "error"``) must be made of the alphabet's symbols (422 otherwise, with the
    offset), and a sample takes one of the two temperatures. What no schema can say (a text that
    normalises to nothing, a diverging state, a snapshot's signature) is 403, 409, 413 or 422.

    Args:
        symbols: the model's alphabet (``replacement`` must be one of them; ``top_k`` at most its size).
        max_chars: the largest text.
        normalize_choices: accepted values of ``normalize``.
        raw_normalize: the values of ``normalize`` that read the text as it is (``"auto"`` too when
            the model declares no normaliser).
        max_batch_texts, max_sample_chars, max_attribute_chars: the limits of those endpoints.
    """
    fields = _RequestFields.of(symbols, max_chars, normalize_choices, raw_normalize)
    return Schemas(_score_request(fields), _frame_request(fields), _batch_request(fields, max_batch_texts),
                   _next_request(fields), _sample_request(fields, max_sample_chars),
                   _attribute_request(fields, max_attribute_chars), max_chars)


@dataclass
class _RequestFields:
    """What the request models of one served model share: its symbols, its largest text, the text
    options (``unknown``, ``replacement``, ``normalize``), the scoring options and the rule of a
    text read raw (:func:`build_schemas`)."""

    symbols: tuple[str, ...]
    max_chars: int
    text_opts: dict
    common: dict
    raw_text: str | None
    raw_values: list[str]

    @classmethod
    def of(cls, symbols: tuple[str, ...], max_chars: int, normalize_choices: list[str],
           raw_normalize: tuple[str, ...]) -> _RequestFields:
        V = len(symbols)
        Sym = Literal[tuple(symbols)]  # type: ignore[valid-type]
        Norm = Literal[tuple(normalize_choices)]  # type: ignore[valid-type]
        Unk = Literal[UNKNOWN]  # type: ignore[valid-type]
        text_opts = dict(
            unknown=(Unk, Field("error", description="characters outside the alphabet after normalisation: error "
                                                     "(422), skip, or replace with `replacement`")),
            replacement=(Optional[Sym], Field(None, description='the symbol that replaces unknown characters '
                                                                '(required with "unknown": "replace")')),
            normalize=(Norm, Field("auto", description="auto: the model's normaliser; none: raw text (every character "
                                                       "a symbol of the alphabet, unless `unknown` says otherwise); or "
                                                       "a normaliser name")),
        )
        common = dict(
            per_char=(bool, Field(False, description="also answer the bits and input offset of every scored "
                                                     "character")),
            **text_opts,
            return_state=(bool, Field(False, description="answer a snapshot of the state after the text (`state`)")),
            top_k=(integer(0, V), Field(0, description="answer the k most likely next characters (`next`)")),
        )
        return cls(symbols, max_chars, text_opts, common, raw_text_pattern(symbols),
                   [v for v in raw_normalize if v in normalize_choices])

    @property
    def V(self) -> int:
        return len(self.symbols)

    def config(self, text_field: str | None, unknown: bool = True, temperatures: bool = False) -> ConfigDict:
        """A request model's config: no unknown field, strict types, and its cross-field rules."""
        return ConfigDict(extra="forbid", strict=True,
                          json_schema_extra=_rules(self, text_field, unknown, temperatures))


def _rules(fields: _RequestFields, text_field: str | None, unknown: bool = True, temperatures: bool = False):
    """The schema's cross-field rules (``allOf`` of ``if``/``then``) for a request model."""
    out = []
    if unknown:
        out.append({"if": {"required": ["unknown"], "properties": {"unknown": {"const": "replace"}}},
                    "then": {"required": ["replacement"],
                             "properties": {"replacement": {"enum": list(fields.symbols)}}}})
    if text_field and fields.raw_text and fields.raw_values:
        cond: dict = {"properties": {"normalize": {"enum": fields.raw_values}}}
        if unknown:
            cond["properties"]["unknown"] = {"const": "error"}
        if "auto" not in fields.raw_values:
            cond["required"] = ["normalize"]
        text = {"pattern": fields.raw_text}
        then = {"items": text} if text_field == "texts" else text
        out.append({"if": cond, "then": {"properties": {text_field: then}}})
    if temperatures:
        out.append({"not": {"required": ["temperature", "inverse_temperature"],
                            "properties": {"temperature": {"type": "number"},
                                           "inverse_temperature": {"type": "number"}}}})

    def extra(schema: dict) -> None:
        if out:
            schema["allOf"] = out
    return extra


def _state_field(what: str):
    return (Optional[str], Field(None, max_length=MAX_TOKEN_CHARS, pattern=TOKEN_PATTERN,
                                 description=what + " (a token answered as `state` by this server)"))


def _score_request(fields: _RequestFields) -> type[BaseModel]:
    """``POST /v1/score``."""
    return create_model(
        "ScoreRequest", __config__=fields.config(text_field="text"),
        text=(str, Field(min_length=1, max_length=fields.max_chars, description="the text to score")),
        state=_state_field("a snapshot (from return_state) to continue from; totals then run on"),
        **fields.common)


def _frame_request(fields: _RequestFields) -> type[BaseModel]:
    """A frame of the WebSocket ``/v1/stream``."""
    return create_model(
        "StreamFrame", __config__=fields.config(text_field="text"),
        text=(Optional[str], Field(None, max_length=fields.max_chars,
                                   description="the next chunk of the stream's text")),
        reset=(bool, Field(False, description="first go back to the initial state")),
        restore=_state_field("first continue from this snapshot"),
        snapshot=(bool, Field(False, description="answer a snapshot of the state (after the text, if any)")),
        **fields.common)


def _batch_request(fields: _RequestFields, max_batch_texts: int) -> type[BaseModel]:
    """``POST /v1/score/batch``."""
    max_chars = fields.max_chars
    return create_model(
        "BatchRequest", __config__=fields.config(text_field="texts"),
        texts=(list[Annotated[str, Field(min_length=1, max_length=max_chars)]],
               Field(min_length=1, max_length=max_batch_texts,
                     description=f"independent texts, each scored from the initial state (at most {max_batch_texts:,}, "
                                 f"{max_chars:,} characters in all)")),
        **fields.common)


def _next_request(fields: _RequestFields) -> type[BaseModel]:
    """``POST /v1/next``."""
    V = fields.V
    return create_model(
        "NextRequest", __config__=fields.config(text_field="text"),
        text=(Optional[str], Field(None, max_length=fields.max_chars,
                                   description="text to read first (scored: its bits are answered too); none: the "
                                               "distribution at `state` or at the initial state")),
        state=_state_field("a snapshot to start from (default: the initial state)"),
        k=(integer(1, V), Field(5, description=f"how many next characters (up to the alphabet's {V}: the whole "
                                                  "distribution)")),
        return_state=(bool, Field(False, description="answer a snapshot of the state after the text (`state`)")),
        **fields.text_opts)


def _sample_request(fields: _RequestFields, max_sample_chars: int) -> type[BaseModel]:
    """``POST /v1/sample``."""
    return create_model(
        "SampleRequest", __config__=fields.config(text_field="prompt", unknown=False, temperatures=True),
        prompt=(str, Field("", max_length=fields.max_chars, description="text the model reads before generating")),
        n=(integer(1, max_sample_chars), Field(200, description="characters to generate")),
        temperature=(Optional[float], Field(None, ge=0.01, le=100.0,
                                            description="logits are divided by it (default 1; give this or "
                                                        "inverse_temperature)")),
        inverse_temperature=(Optional[float], Field(None, ge=0.0, le=100.0,
                                                    description="logits are multiplied by it (0: uniform)")),
        top_k=(Optional[integer(1, fields.V)],
               Field(None, description="sample only among the k most likely characters")),
        seed=(Optional[integer(0, MAX_SEED)], Field(None,
                                   description="seed of the random generator (default: drawn by the server and "
                                               "answered): the same seed gives the same text")),
        state=_state_field("a snapshot to start from (default: the initial state)"),
        normalize=fields.text_opts["normalize"],
        stream=(bool, Field(True, description="true: Server-Sent Events (`chars` events as characters are "
                                              "generated, then `done`); false: one JSON answer")),
        return_state=(bool, Field(False, description="answer a snapshot of the state after the generated text")),
    )


def _attribute_request(fields: _RequestFields, max_attribute_chars: int) -> type[BaseModel]:
    """``POST /v1/attribute``."""
    return create_model(
        "AttributeRequest", __config__=fields.config(text_field="text"),
        text=(str, Field(min_length=1, max_length=max_attribute_chars,
                         description="the text whose logits are attributed (memory grows with its length squared)")),
        by=(Literal["char", "word"], Field("char", description="sources: each character, or each word and run of spaces")),
        state=_state_field("a snapshot to start from (its state is the source <h0>)"),
        full=(bool, Field(False, description="also answer the whole kappa (T, S, V), the logits and b_ro")),
        **fields.text_opts)


def raw_text_pattern(symbols: tuple[str, ...]) -> str | None:
    """The pattern of a text made only of ``symbols`` (after an optional byte-order mark, which is
    dropped), or None when a symbol is not one character of the Basic Multilingual Plane."""
    if not symbols or any(len(c) != 1 or ord(c) > 0xFFFF or 0xD800 <= ord(c) <= 0xDFFF for c in symbols):
        return None
    cls = "".join(c if c.isascii() and c.isalnum() else f"\\u{ord(c):04x}" for c in sorted(set(symbols)))
    return f"^\\ufeff?[{cls}]*$"


def _field(loc) -> str:
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def parse(model: type[BaseModel], raw: bytes | str, allowed: tuple[str, ...], max_chars: int, what: str = "body"):
    """Validate ``raw`` JSON against ``model``.

    Raises:
        RequestError: 400 (not JSON, not an object, missing, unknown or bad fields, empty text),
            413 (a text, or a list of texts, over its limit), the message naming every problem, or
            422 (an object that names a key twice).
    """
    try:
        out = model.model_validate_json(raw)
    except ValidationError as e:
        raise describe(e, allowed, max_chars, what) from None
    dup = duplicate_keys(raw)
    if dup:
        raise RequestError(422, f"the {what} names {', '.join(json.dumps(k) for k in dup)} more than once (JSON "
                                "leaves duplicate keys undefined, so this server reads none of them); give each "
                                "field once")
    return out


def duplicate_keys(raw: bytes | str) -> list[str]:
    """The keys that some object of the JSON text ``raw`` has more than once (``raw`` is valid JSON:
    the request model has read it)."""
    dups: list[str] = []

    def pairs(items):
        seen = set()
        for k, _ in items:
            if k in seen and k not in dups:
                dups.append(k)
            seen.add(k)
        return None  # the values are not needed

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # pragma: no cover - pydantic has accepted it
        pass
    return dups


_TEXTS = ("text", "texts", "prompt")


def describe(e: ValidationError, allowed: tuple[str, ...], max_chars: int, what: str = "body") -> RequestError:
    """One RequestError naming every problem of ``e`` and what to send instead (never echoing the input)."""
    status = 400
    msgs: list[str] = []
    extra_fields: list[str] = []
    for err in e.errors(include_url=False, include_input=True):
        typ, loc = err["type"], err["loc"]
        ctx = err.get("ctx") or {}
        name = _field(loc)
        top = str(loc[0]) if loc else ""
        if typ == "json_invalid":
            reason = ctx.get("error", "")
            hint = (": a \\uD800-\\uDFFF escape without its pair is not a Unicode character"
                    if "hex escape" in reason or "surrogate" in reason else "")
            return RequestError(400, f"the {what} is not valid JSON ({reason}){hint}; send an object like "
                                     '{"text": "..."}')
        if not loc:
            return RequestError(400, f'the {what} must be a JSON object like {{"text": "..."}}')
        if typ == "extra_forbidden":
            extra_fields.append(name)
        elif typ == "missing":
            kind = "a list of strings" if top == "texts" else "a string"
            msgs.append(f'the field "{name}" is required and must be {kind}')
        elif top in _TEXTS and typ == "string_too_long":
            status = 413
            n = len(err["input"]) if isinstance(err.get("input"), str) else None
            limit = ctx.get("max_length", max_chars)
            n_s = f"{n:,}" if n is not None else "too many"
            msgs.append(f'"{name}" has {n_s} characters; the limit is {limit:,} (split it'
                        + (", or use /v1/stream)" if limit == max_chars else ")"))
        elif top == "texts" and typ == "too_long":
            status = 413
            msgs.append(f'"texts" has {len(err["input"]):,} texts; the limit is {ctx.get("max_length")} a request '
                        "(send several requests)")
        elif top == "texts" and typ == "too_short":
            msgs.append('"texts" is empty; give at least one text')
        elif top in _TEXTS and typ == "string_too_short":
            msgs.append(f'"{name}" is empty; give at least one character')
        elif typ == "literal_error":
            msgs.append(f'"{name}" must be one of {ctx.get("expected", "")}')
        elif typ == "string_type":
            msgs.append(f'"{name}" must be a string')
        elif typ == "list_type":
            msgs.append(f'"{name}" must be a list of strings')
        elif typ in ("bool_type", "bool_parsing"):
            msgs.append(f'"{name}" must be true or false')
        elif typ in ("int_type", "int_parsing", "int_from_float"):
            msgs.append(f'"{name}" must be an integer')
        elif typ in ("float_type", "float_parsing", "finite_number"):
            msgs.append(f'"{name}" must be a finite number')
        elif typ in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            lo_hi = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}[typ]
            bound = next(iter(ctx.values()), "?")
            msgs.append(f'"{name}" must be {lo_hi} {bound}')
        elif name in ("state", "restore") and typ in ("string_pattern_mismatch", "string_too_short", "string_too_long"):
            msgs.append(f'"{name}" is not a state snapshot (a token that starts {TOKEN_PREFIX!r}, as a server '
                        'answers it in "state"); take one with "return_state": true or {"snapshot": true}')
        elif typ in ("string_too_long", "too_long"):
            what = "characters" if typ == "string_too_long" else "items"
            status = 413 if top in ("tokens",) else status
            msgs.append(f'"{name}" must have at most {ctx.get("max_length", "?")} {what}')
        elif typ in ("string_too_short", "too_short"):
            what = "characters" if typ == "string_too_short" else "items"
            msgs.append(f'"{name}" must have at least {ctx.get("min_length", "?")} {what}')
        elif typ == "dict_type":
            msgs.append(f'"{name}" must be an object')
        else:
            msgs.append(f'"{name}": {err["msg"]}')
    if extra_fields:
        msgs.insert(0, f"unknown fields {sorted(set(extra_fields))}; allowed: {', '.join(allowed)}")
    return RequestError(status, "; ".join(msgs) or f"the {what} is not a valid request")
