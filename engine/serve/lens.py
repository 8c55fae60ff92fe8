"""isan lens: the web page at ``/`` (files in ``static/``) and ``POST /v1/explain``, the one
endpoint it needs beyond the others.

The page (``static/index.html``, ``lens.js``, ``lens.css``; plain files, no build step, nothing from a
CDN) colours a text by the bits of each symbol, streamed over ``/v1/stream``; shows the next-symbol
distribution at a point from ``POST /v1/next``; samples from ``POST /v1/sample``; and explains a
prediction with ``POST /v1/explain``.

``POST /v1/explain`` explains the prediction at one offset of a text: the exact attribution
(paper eqs. 4-6, Figs 2-3) of a chosen target -- the logit or the log-probability of a symbol, or
the difference of two logits, as ``isan analyze attribute`` offers them -- to the initial state and
to each earlier symbol or word, with the check that they sum to the target; and the truncated-
history curve of Fig 4c at that position (the bits of the symbol when only the last n symbols'
contributions are kept).

One position costs one backward pass: ``U = W_ro`` and, from the position back, ``kappa[s] =
U b[x_s]``, ``U <- U W[x_s]`` (V d^2 a symbol), instead of the whole (T, T, V) kappa of ``/v1/attribute``.
The last ``window`` symbols (``--max-attribute-chars``) are sources of their own; everything older
and the initial state are summed into one ``<history>`` source (the readout of the state before the
window carried forward), so the identity ``logits = b_ro + sum kappa`` still holds exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, create_model

from isan.engine.serve.errors import RequestError, from_isan
from isan.engine.serve.schemas import UNKNOWN, raw_text_pattern, integer

STATIC = Path(__file__).resolve().parent / "static"
#: the page's files and their media types (nothing else is served from ``static/``)
FILES = {"index.html": "text/html; charset=utf-8", "lens.js": "text/javascript; charset=utf-8",
         "lens.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
#: characters of an explained text, as a multiple of --max-attribute-chars (the exact window)
TEXT_FACTOR = 20
#: relative tolerance of the sum checks
TOL = 1e-6


class ExplainResponse(BaseModel):
    """The answer to ``POST /v1/explain``."""

    model_config = ConfigDict(extra="allow")
    offset: int = Field(description="the input offset explained (clamped to the text's length)")
    position: int = Field(description="symbols read before the prediction (the index of the predicted symbol)")
    tokens: list[str] = Field(description="the symbols of the text as the model reads them (after normalisation)")
    token_offsets: list[int] = Field(description="the input offset each symbol comes from")
    actual: Optional[str] = Field(description="the symbol that follows in the text (null at its end)")
    target: str
    char: str = Field(description="the symbol whose target is explained")
    other: Optional[str] = None
    value: float = Field(description="the target: logit, natural-log probability, or logit difference")
    base: float = Field(description="the target with no source (logits = b_ro)")
    logit: float = Field(description="the logit of `char`")
    bits: float = Field(description="-log2 p(char) at this position")
    sources: list[str] = Field(description="<h0> (the initial state) or <history> (it and every symbol before the "
                                           "window), then each symbol or word")
    source_spans: list[list[int]] = Field(description="each source's symbols [start, end)")
    source_offsets: list[list[int]] = Field(description="each source's input characters [start, end)")
    contributions: list[float] = Field(description="each source's contribution to the target")
    check: dict = Field(description="base + sum(contributions) against value, and b_ro + sum kappa against the logits")
    history: dict = Field(description="Fig 4c: bits of `char` keeping only the last n symbols' kappa (n = 0..)")


def build_request(symbols: tuple[str, ...], max_chars: int, normalize_choices: list[str],
                  raw_normalize: tuple[str, ...]) -> type[BaseModel]:
    """The request model of ``POST /v1/explain`` (its schema holds the same cross-field rules as
    the other endpoints', so a schema-valid request is never answered 400)."""
    Sym = Literal[tuple(symbols)]  # type: ignore[valid-type]
    rules: list[dict] = [
        {"if": {"required": ["unknown"], "properties": {"unknown": {"const": "replace"}}},
         "then": {"required": ["replacement"], "properties": {"replacement": {"enum": list(symbols)}}}},
        {"if": {"required": ["target"], "properties": {"target": {"const": "logit_diff"}}},
         "then": {"required": ["other"], "properties": {"other": {"enum": list(symbols)}}}},
    ]
    raw_text = raw_text_pattern(symbols)
    raw_values = [v for v in raw_normalize if v in normalize_choices]
    if raw_text and raw_values:
        cond: dict = {"properties": {"normalize": {"enum": raw_values}, "unknown": {"const": "error"}}}
        if "auto" not in raw_values:
            cond["required"] = ["normalize"]
        rules.append({"if": cond, "then": {"properties": {"text": {"pattern": raw_text}}}})

    def extra(schema: dict) -> None:
        schema["allOf"] = rules

    return create_model(
        "ExplainRequest", __config__=ConfigDict(extra="forbid", strict=True, json_schema_extra=extra),
        text=(str, Field(max_length=max_chars, description="the text (the prediction at `offset` reads the text before "
                                                           "it)")),
        offset=(Optional[integer(0, max_chars)], Field(None, description="input offset of the predicted symbol "
                                                                         "(default and beyond the end: after the "
                                                                         "whole text)")),
        by=(Literal["char", "word"], Field("char", description="sources: each symbol, or each word and run of spaces")),
        target=(Literal["logit", "logprob", "logit_diff"],
                Field("logit", description="logit: the logit of `char`; logprob: its natural-log probability "
                                           "(integrated gradients from b_ro, exact sum); logit_diff: logit of `char` "
                                           "minus logit of `other`")),
        char=(Optional[Sym], Field(None, description="the target symbol (default: the one that follows in the text, "
                                                     "else the most likely)")),
        other=(Optional[Sym], Field(None, description="with logit_diff: the subtracted symbol")),
        unknown=(Literal[UNKNOWN], Field("error", description="characters outside the alphabet: error (422), skip, "  # type: ignore[valid-type]
                                                              "or replace with `replacement`")),
        replacement=(Optional[Sym], Field(None, description='the symbol for unknown characters (with "unknown": '
                                                            '"replace")')),
        normalize=(Literal[tuple(normalize_choices)], Field("auto", description="as in POST /v1/score")),  # type: ignore[valid-type]
    )


def explain(eng, req, window: int) -> dict:
    """:func:`_explain` with one BLAS thread: its products are small (V x d by d x d), and a pool of
    threads spinning for them on a busy machine costs ten times the work."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _explain(eng, req, window)


def _explain(eng, req, window: int) -> dict:
    """The answer of ``POST /v1/explain`` for the validated request ``req`` (see the module docstring).

    Raises:
        RequestError: 400 (bad options), 422 (text the model cannot read, a diverging state).
    """
    from isan.engine.analysis.attribution import target_contributions
    from isan.engine.prepare import word_spans
    from isan.engine.reference import LOG2E, log_softmax
    from isan.errors import IsanError

    if req.unknown == "replace" and req.replacement is None:
        raise RequestError(400, '"unknown": "replace" needs "replacement", one symbol of the alphabet')
    if req.target == "logit_diff" and req.other is None:
        raise RequestError(400, '"target": "logit_diff" needs "other", the subtracted symbol')
    if not hasattr(eng, "params") or not hasattr(eng, "attribute"):
        raise RequestError(422, "this model has no exact attribution (it is not an ISAN on the numpy backend); "
                                "serve an ISAN bundle to explain predictions")
    start = eng.initial_state()
    try:
        prep = eng.prepare(req.text, req.normalize, req.unknown, req.replacement, start) if req.text else None
    except IsanError as e:
        raise from_isan(e) from None
    alphabet = eng.alphabet
    symbols = alphabet.symbols
    ids = np.asarray(prep.ids if prep is not None else [], dtype=np.int64)
    offs = np.asarray(prep.offsets if prep is not None else [], dtype=np.int64)
    T = len(ids)
    n_in = len(req.text)
    offset = n_in if req.offset is None else min(int(req.offset), n_in)
    i = int(np.searchsorted(offs, offset, side="left"))  # symbols read before the prediction
    p = eng.params  # float64, inputs expanded to output ids
    h0 = np.asarray(start.h, dtype=np.float64)

    def end_offset(j: int) -> int:
        return int(offs[j]) if j < T else n_in

    # the window: the last `window` symbols before i (in word mode, widened back to a word's start)
    lo = max(0, i - window)
    spans: list[tuple[int, int]] = []
    if req.by == "word" and i > 0 and alphabet.kind != "words":  # a word model's symbols are its words
        text_read = prep.text if alphabet.kind == "chars" else ""
        for a, b in word_spans(ids[:i], text_read[:i] if alphabet.kind == "chars" else "", alphabet):
            if b > lo:
                spans.append((a, b))
        lo = spans[0][0] if spans else lo
    else:
        spans = [(s, s + 1) for s in range(lo, i)]
    # the state before the window (float64 reference steps), then before the prediction
    h = h0
    W, b = p.W, p.b
    for x in ids[:lo]:
        h = W[x] @ h + b[x]
    h_lo = h
    for x in ids[lo:i]:
        h = W[x] @ h + b[x]
    if not np.all(np.isfinite(h)) or np.abs(h).max(initial=0.0) > 1e30:
        raise RequestError(422, "the state diverges inside this text; explain a shorter text, or serve a model whose "
                                "state stays bounded (isan model check)")
    logits = p.W_ro @ h + p.b_ro
    # one backward pass: rows[s - lo] = W_ro W[x_{i-1}] ... W[x_{s+1}] b[x_s]
    U = p.W_ro.copy()
    rows = np.zeros((i - lo, p.V))
    for s in range(i - 1, lo - 1, -1):
        x = ids[s]
        rows[s - lo] = U @ b[x]
        U = U @ W[x]
    first = U @ h_lo  # the initial state, and every symbol before the window, carried to i
    kappa_err = float(np.abs(p.b_ro + first + rows.sum(axis=0) - logits).max(initial=0.0))
    scale = max(1.0, float(np.abs(logits).max(initial=0.0)))
    if not np.isfinite(kappa_err) or kappa_err > TOL * scale:
        raise RequestError(422, "the attribution of this text does not sum to its logits within the tolerance (a state "
                                "near its range); explain a shorter text")
    kappa = np.vstack([first[None], [rows[a - lo:b_ - lo].sum(axis=0) for a, b_ in spans]]) if spans else first[None]
    actual = int(ids[i]) if i < T else None
    lp = log_softmax(logits)
    c = symbols.index(req.char) if req.char is not None else (actual if actual is not None else int(np.argmax(lp)))
    o = symbols.index(req.other) if req.other is not None else None
    try:
        ta = target_contributions(kappa[None], logits[None], p.b_ro, req.target, char=c,
                                  other=o if o is not None else None)
    except IsanError as e:
        raise RequestError(422, f"{e}; explain a shorter text") from None
    # Fig 4c: bits of c keeping the last n symbols (n = 0: b_ro only); the full model adds the rest
    keep = np.vstack([np.zeros(p.V), np.cumsum(rows[::-1], axis=0)]) + p.b_ro  # (i - lo + 1, V)
    hist_bits = -log_softmax(keep)[:, c] * LOG2E

    def label(a: int, b_: int) -> str:
        if alphabet.kind == "chars":
            return "".join(symbols[int(x)] for x in ids[a:b_])
        try:
            return alphabet.decode(ids[a:b_])
        except Exception:  # noqa: BLE001 - a piece of a multi-byte character: its symbols' labels
            return "".join(symbols[int(x)] for x in ids[a:b_])

    head = "<h0>" if lo == 0 else "<history>"
    out = {
        "offset": offset, "position": i,
        "tokens": [symbols[int(x)] for x in ids], "token_offsets": offs.tolist(),
        "actual": symbols[actual] if actual is not None else None,
        "target": req.target, "char": symbols[c], "other": symbols[o] if o is not None else None,
        "value": float(ta.value[0]), "base": float(ta.base[0]), "logit": float(logits[c]),
        "bits": float(-lp[c] * LOG2E),
        "sources": [head] + [label(a, b_) for a, b_ in spans],
        "source_spans": [[0, lo]] + [[a, b_] for a, b_ in spans],
        "source_offsets": [[0, end_offset(lo) if lo else 0]] + [[end_offset(a), end_offset(b_)] for a, b_ in spans],
        "contributions": ta.contributions[0].tolist(),
        "check": {"identity": "value = base + sum(contributions); logits = b_ro + sum kappa",
                  "sum": float(ta.base[0] + ta.contributions[0].sum()), "max_abs_error": float(ta.max_abs_error),
                  "logits_max_abs_error": kappa_err, "tolerance": TOL * scale, "ok": True},
        "history": {"n": list(range(i - lo + 1)), "bits": hist_bits.tolist(), "full_bits": float(-lp[c] * LOG2E),
                    "window": window, "complete": lo == 0},
        "window": window,
        "unit": getattr(alphabet, "unit", "char"),
    }
    if ta.nodes:
        out["check"]["quadrature_nodes"] = int(ta.nodes)
    return out


def static_file(name: str) -> tuple[bytes, str] | None:
    """The bytes and media type of one of the page's files, or None."""
    if name not in FILES:
        return None
    try:
        return (STATIC / name).read_bytes(), FILES[name]
    except OSError:
        return None
