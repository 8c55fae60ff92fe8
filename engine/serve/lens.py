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

from dataclasses import dataclass
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
    _check_request(eng, req)
    text = _read(eng, req)
    att = _attribution(eng.params, text, *_window(text, req.by, window, eng.alphabet))
    return _answer(eng.alphabet, req, text, att, _target(eng.params, eng.alphabet.symbols, req, text, att), window)


def _check_request(eng, req) -> None:
    """Raise the 400 of options that need another, and the 422 of a model with no exact attribution."""
    if req.unknown == "replace" and req.replacement is None:
        raise RequestError(400, '"unknown": "replace" needs "replacement", one symbol of the alphabet')
    if req.target == "logit_diff" and req.other is None:
        raise RequestError(400, '"target": "logit_diff" needs "other", the subtracted symbol')
    if not hasattr(eng, "params") or not hasattr(eng, "attribute"):
        raise RequestError(422, "this model has no exact attribution (it is not an ISAN on the numpy backend); "
                                "serve an ISAN bundle to explain predictions")


@dataclass
class _Text:
    """The explained text as the model reads it.

    Attributes:
        prep: the prepared text (None for an empty text).
        ids, offs: (T,) int64, each symbol's id and the input offset it comes from.
        n_in: the input's characters; offset: the explained input offset (clamped to n_in).
        i: symbols read before the prediction; h0: (d,) float64, the initial state.
    """

    prep: object
    ids: np.ndarray
    offs: np.ndarray
    n_in: int
    offset: int
    i: int
    h0: np.ndarray

    def end_offset(self, j: int) -> int:
        """The input offset where symbol ``j`` starts (the input's length past the last symbol)."""
        return int(self.offs[j]) if j < len(self.ids) else self.n_in


def _read(eng, req) -> _Text:
    """The text of ``req`` read by the model (422: text it cannot read), and the symbol explained."""
    from isan.errors import IsanError

    start = eng.initial_state()
    try:
        prep = eng.prepare(req.text, req.normalize, req.unknown, req.replacement, start) if req.text else None
    except IsanError as e:
        raise from_isan(e) from None
    ids = np.asarray(prep.ids if prep is not None else [], dtype=np.int64)
    offs = np.asarray(prep.offsets if prep is not None else [], dtype=np.int64)
    n_in = len(req.text)
    offset = n_in if req.offset is None else min(int(req.offset), n_in)
    i = int(np.searchsorted(offs, offset, side="left"))  # symbols read before the prediction
    return _Text(prep, ids, offs, n_in, offset, i, np.asarray(start.h, dtype=np.float64))


def _window(text: _Text, by: str, window: int, alphabet) -> tuple[int, list[tuple[int, int]]]:
    """(lo, spans): the window, the last ``window`` symbols before the prediction (in word mode,
    widened back to a word's start), and its sources, each symbol's or word's [start, end)."""
    from isan.engine.prepare import word_spans

    i, ids = text.i, text.ids
    lo = max(0, i - window)
    spans: list[tuple[int, int]] = []
    if by == "word" and i > 0 and alphabet.kind != "words":  # a word model's symbols are its words
        text_read = text.prep.text if alphabet.kind == "chars" else ""
        for a, b in word_spans(ids[:i], text_read[:i] if alphabet.kind == "chars" else "", alphabet):
            if b > lo:
                spans.append((a, b))
        lo = spans[0][0] if spans else lo
    else:
        spans = [(s, s + 1) for s in range(lo, i)]
    return lo, spans


@dataclass
class _Attribution:
    """The exact attribution of the logits at the prediction to the sources.

    Attributes:
        lo, spans: the window's first symbol and its sources (:func:`_window`).
        logits: (V,) float64 at the prediction.
        rows: (i - lo, V) float64, each windowed symbol's kappa.
        kappa: (1 + len(spans), V) float64, the state before the window's kappa, then each source's.
        kappa_err: max |b_ro + sum kappa - logits|; scale: max(1, max |logits|).
    """

    lo: int
    spans: list[tuple[int, int]]
    logits: np.ndarray
    rows: np.ndarray
    kappa: np.ndarray
    kappa_err: float
    scale: float


def _attribution(p, text: _Text, lo: int, spans: list[tuple[int, int]]) -> _Attribution:
    """The state's float64 reference steps to the prediction, then one backward pass for kappa.

    Raises:
        RequestError: 422 when the state diverges, or kappa does not sum to the logits within TOL.
    """
    ids, i = text.ids, text.i
    # the state before the window (float64 reference steps), then before the prediction
    h = text.h0
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
    return _Attribution(lo, spans, logits, rows, kappa, kappa_err, scale)


@dataclass
class _Target:
    """The explained target: ``c`` and ``o`` (the symbols' ids, ``o`` None but for logit_diff), the
    symbol that follows (``actual``, None at the end), ``lp`` (V,) the log-probabilities, ``ta``
    the target's contributions, ``hist_bits`` the bits of ``c`` keeping the last n symbols."""

    c: int
    o: int | None
    actual: int | None
    lp: np.ndarray
    ta: object
    hist_bits: np.ndarray


def _target(p, symbols, req, text: _Text, att: _Attribution) -> _Target:
    """The target's contributions (422 when they cannot be computed) and the Fig 4c curve."""
    from isan.engine.analysis.attribution import target_contributions
    from isan.engine.reference import LOG2E, log_softmax
    from isan.errors import IsanError

    actual = int(text.ids[text.i]) if text.i < len(text.ids) else None
    lp = log_softmax(att.logits)
    c = symbols.index(req.char) if req.char is not None else (actual if actual is not None else int(np.argmax(lp)))
    o = symbols.index(req.other) if req.other is not None else None
    try:
        ta = target_contributions(att.kappa[None], att.logits[None], p.b_ro, req.target, char=c,
                                  other=o if o is not None else None)
    except IsanError as e:
        raise RequestError(422, f"{e}; explain a shorter text") from None
    # Fig 4c: bits of c keeping the last n symbols (n = 0: b_ro only); the full model adds the rest
    keep = np.vstack([np.zeros(p.V), np.cumsum(att.rows[::-1], axis=0)]) + p.b_ro  # (i - lo + 1, V)
    hist_bits = -log_softmax(keep)[:, c] * LOG2E
    return _Target(c, o, actual, lp, ta, hist_bits)


def _label(alphabet, ids: np.ndarray, a: int, b_: int) -> str:
    """The label of the source made of symbols [a, b_)."""
    symbols = alphabet.symbols
    if alphabet.kind == "chars":
        return "".join(symbols[int(x)] for x in ids[a:b_])
    try:
        return alphabet.decode(ids[a:b_])
    except Exception:  # noqa: BLE001 - a piece of a multi-byte character: its symbols' labels
        return "".join(symbols[int(x)] for x in ids[a:b_])


def _answer(alphabet, req, text: _Text, att: _Attribution, t: _Target, window: int) -> dict:
    """The JSON answer (:class:`ExplainResponse`)."""
    from isan.engine.reference import LOG2E

    symbols, ids, lo, spans, ta, c = alphabet.symbols, text.ids, att.lo, att.spans, t.ta, t.c
    head = "<h0>" if lo == 0 else "<history>"
    out = {
        "offset": text.offset, "position": text.i,
        "tokens": [symbols[int(x)] for x in ids], "token_offsets": text.offs.tolist(),
        "actual": symbols[t.actual] if t.actual is not None else None,
        "target": req.target, "char": symbols[c], "other": symbols[t.o] if t.o is not None else None,
        "value": float(ta.value[0]), "base": float(ta.base[0]), "logit": float(att.logits[c]),
        "bits": float(-t.lp[c] * LOG2E),
        "sources": [head] + [_label(alphabet, ids, a, b_) for a, b_ in spans],
        "source_spans": [[0, lo]] + [[a, b_] for a, b_ in spans],
        "source_offsets": [[0, text.end_offset(lo) if lo else 0]]
                          + [[text.end_offset(a), text.end_offset(b_)] for a, b_ in spans],
        "contributions": ta.contributions[0].tolist(),
        "check": {"identity": "value = base + sum(contributions); logits = b_ro + sum kappa",
                  "sum": float(ta.base[0] + ta.contributions[0].sum()), "max_abs_error": float(ta.max_abs_error),
                  "logits_max_abs_error": att.kappa_err, "tolerance": TOL * att.scale, "ok": True},
        "history": {"n": list(range(text.i - lo + 1)), "bits": t.hist_bits.tolist(),
                    "full_bits": float(-t.lp[c] * LOG2E), "window": window, "complete": lo == 0},
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
