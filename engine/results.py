"""Values the engine returns: the state, and the results of scoring, attribution and sampling.

All are immutable (frozen dataclasses): a :class:`State` is passed in and out of calls, never
mutated behind the caller's back. Also here: how an error is put in the caller's terms (the input
offset, the repeated letter or pair that led to a diverging state).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from isan.alphabet import Alphabet
from isan.errors import StateDivergedError
from isan.engine.normalize import Prepared


def finite_or_none(x: float) -> float | None:
    """``float(x)``, or None where it is NaN or infinite (JSON has no NaN)."""
    x = float(x)
    return x if np.isfinite(x) else None


def _brief(a: np.ndarray | None) -> str:
    """An array in a repr: its dtype and shape (``float64 (216,)``), never its values."""
    return "None" if a is None else f"{a.dtype} {a.shape}"


def _brief_text(text: str, keep: int = 40) -> str:
    """A text in a repr: its repr, cut to ``keep`` characters with its length when longer."""
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}... ({len(text):,} chars)"


@dataclass(frozen=True)
class State:
    """The recurrent state between two calls: ``h`` (d,) float64 (read-only), plus running totals.

    A value: every engine call returns a new State and never changes the one passed in.
    ``chars`` and ``bits`` count what was scored since the initial state; ``last_symbol`` is
    the last symbol the state consumed ("" at the start), which a normaliser needs to treat a
    chunk boundary as the whole text would (text8: a space after a space is squeezed).
    """

    h: np.ndarray
    chars: int = 0
    bits: float = 0.0
    last_symbol: str = ""

    def __post_init__(self) -> None:
        h = np.array(self.h, dtype=np.float64, copy=True)
        h.setflags(write=False)
        object.__setattr__(self, "h", h)

    @property
    def bpc(self) -> float:
        return self.bits / self.chars if self.chars else float("nan")

    def __repr__(self) -> str:
        """``State(h=float64 (216,) |h|=12.3456, chars=23, bits=71.1362, last_symbol=' ')``: the
        state's shape and L2 norm, not its d floats."""
        return (f"State(h={_brief(self.h)} |h|={float(np.linalg.norm(self.h)):.6g}, chars={self.chars}, "
                f"bits={self.bits:.6g}, last_symbol={self.last_symbol!r})")


@dataclass(frozen=True)
class ScoreResult:
    """Scoring of one text: ``chars`` (characters scored), total ``bits``, ``bpc`` = bits / chars,
    optional ``per_char_bits`` (chars,) float64, and the ``state`` after the text.

    ``normalization`` reports what the normaliser and the unknown-character policy did
    (:mod:`isan.engine.normalize`); with ``per_char``, ``per_char_offsets`` (chars,) int64 gives
    the input offset each scored character came from and ``text`` the scored characters.
    ``scoring`` says how the bits were computed: ``{"path": "composed" | "reference" | "chunked" | "jumps",
    ...}``, for chunk-parallel scoring with its ``chunks``, ``extra_fraction`` (work beyond one
    step a character), the ``residual`` its corrections stopped at (``max|e| / max(1, max|h|)``),
    ``rtol``, ``margin`` and ``fallback_chunks`` (:mod:`isan.engine.kernels.chunked`).
    """

    chars: int
    bits: float
    per_char_bits: np.ndarray | None
    state: State
    normalization: dict | None = None
    per_char_offsets: np.ndarray | None = None
    text: str | None = None
    scoring: dict | None = None
    unit: str = "char"
    V: int | None = None

    @property
    def text_chars(self) -> int:
        """Characters of the scored text: ``chars`` for a character model; for a token model
        (``unit`` byte, pair or word; ``chars`` then counts tokens) the characters they cover."""
        if self.unit == "char" or not self.normalization:
            return self.chars
        return int(self.normalization.get("chars_scored", self.chars))

    @property
    def bpc(self) -> float:
        """Bits per character of the scored text."""
        n = self.text_chars
        return self.bits / n if n else float("nan")

    @property
    def bits_per_token(self) -> float:
        """Bits per scored symbol (per character, byte, pair or word: ``unit``)."""
        return self.bits / self.chars if self.chars else float("nan")

    @property
    def nnl(self) -> float:
        """Mean negative log-likelihood in base V, the number of output classes (Cernansky et al.
        2008, eq. 7): ``bits_per_token / log2(V)``; NaN without V."""
        return self.bits_per_token / np.log2(self.V) if self.V and self.V > 1 else float("nan")

    def __repr__(self) -> str:
        """The totals, the arrays' dtypes and shapes, the path and the state's repr; not every float."""
        path = (self.scoring or {}).get("path")
        unit = "" if self.unit == "char" else f", unit={self.unit!r}, text_chars={self.text_chars}"
        return (f"ScoreResult(chars={self.chars}, bits={self.bits:.6g}, bpc={self.bpc:.6g}{unit}, "
                f"per_char_bits={_brief(self.per_char_bits)}, path={path!r}, state={self.state!r})")

    def to_json(self, per_char: bool = False) -> dict:
        """``{"chars", "bits", "bpc", "nnl", "normalization"}`` (+ ``per_char_bits``, ``per_char_offsets``);
        a token model adds ``{"tokens", "unit", "bits_per_token"}`` (``chars`` is then the characters
        the tokens cover and ``bpc`` bits per character). Never NaN (null when nothing was scored)."""
        out = {"chars": self.text_chars, "bits": float(self.bits),
               "bpc": finite_or_none(self.bpc) if self.chars else None}
        if self.unit != "char":
            out.update({"tokens": self.chars, "unit": self.unit,
                        "bits_per_token": finite_or_none(self.bits_per_token) if self.chars else None})
        if self.V:
            out["nnl"] = finite_or_none(self.nnl) if self.chars else None
        if self.normalization is not None:
            out["normalization"] = self.normalization
        if self.scoring is not None:
            out["scoring"] = self.scoring
        if per_char and self.per_char_bits is not None:
            out["per_char_bits"] = [float(b) for b in self.per_char_bits]
            if self.per_char_offsets is not None:
                out["per_char_offsets"] = self.per_char_offsets.tolist()
        return out


@dataclass(frozen=True)
class Attribution:
    """Exact attribution of logits to sources (paper eqs. 4-6).

    ``kappa`` (T, S, V) float64: ``kappa[t, s]`` is source s's contribution to the logits after
    character t (which predict character t+1). Sources: ``sources[0]`` is ``"<h0>"`` (the
    initial state), then characters (``by="char"``) or words and spaces (``by="word"``).
    ``logits`` (T, V) are computed independently by the reference path, and
    ``max_abs_error`` = max |b_ro + sum_s kappa[t, s] - logits[t]|. ``text`` is the attributed
    (normalised) text; ``input_offsets`` (T,) maps its characters to the input, and
    ``normalization`` reports what changed.
    """

    text: str
    by: str
    sources: list[str]
    source_spans: list[tuple[int, int]]
    kappa: np.ndarray
    logits: np.ndarray
    b_ro: np.ndarray
    max_abs_error: float
    alphabet: Alphabet = field(repr=False)
    normalization: dict | None = None
    input_offsets: np.ndarray | None = field(default=None, repr=False)
    ids: np.ndarray | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        """The text (cut when long), the sources' count, kappa's dtype and shape and the check."""
        return (f"Attribution(text={_brief_text(self.text)}, by={self.by!r}, sources={len(self.sources)}, "
                f"kappa={_brief(self.kappa)}, max_abs_error={self.max_abs_error:.3g})")

    def _ids(self) -> np.ndarray:
        return self.ids if self.ids is not None else self.alphabet.encode(self.text)

    def next_char_contributions(self) -> np.ndarray:
        """(T, S): contributions to the logit of the character that actually comes next
        (for the last position, of the most likely next character)."""
        ids = self._ids()
        nxt = np.append(ids[1:], int(np.argmax(self.logits[-1])))
        return self.kappa[np.arange(len(ids)), :, nxt]

    def to_json(self, full: bool = False) -> dict:
        ids = self._ids()
        nxt = np.append(ids[1:], int(np.argmax(self.logits[-1])))
        out = {
            "text": self.text, "by": self.by, "sources": self.sources,
            "source_spans": [list(s) for s in self.source_spans],
            "targets": [self.alphabet.symbols[i] for i in nxt],
            "next_char_kappa": np.round(self.next_char_contributions(), 6).tolist(),
            "check_max_abs_error": self.max_abs_error,
        }
        if self.normalization is not None:
            out["normalization"] = self.normalization
        if self.input_offsets is not None:
            out["input_offsets"] = self.input_offsets.tolist()
        if full:
            out["alphabet"] = self.alphabet.to_list()
            out["kappa"] = self.kappa.tolist()
            out["logits"] = self.logits.tolist()
            out["b_ro"] = self.b_ro.tolist()
        return out


@dataclass(frozen=True)
class Sample:
    prompt: str
    text: str  # the generated characters (without the prompt)
    bits: float  # total bits of the generated characters under the model (unscaled)
    seed: int | None
    temperature: float
    top_k: int | None
    prompt_normalized: str | None = None  # the prompt as the model read it
    normalization: dict | None = None  # what normalising the prompt changed

    def to_json(self) -> dict:
        out = {"prompt": self.prompt, "text": self.text, "bits": float(self.bits), "seed": self.seed,
               "temperature": self.temperature, "top_k": self.top_k}
        if self.normalization is not None:
            out["prompt_normalized"] = self.prompt_normalized
            out["normalization"] = self.normalization
        return out


def with_prefix(e: Exception, prefix: str) -> Exception:
    """A copy of ``e`` (same type and attributes) whose message starts with ``prefix``."""
    import copy

    new = copy.copy(e)
    new.args = (prefix + str(e),) + tuple(e.args[1:])
    return new


_HINT = re.compile(r", after \d+ characters repeating (symbol id [\d+]+|'[^']*'|\"[^\"]*\")")


def with_repeat_hint(msg: str, ids: np.ndarray, t: int, symbols=None) -> str:
    """``msg`` with its "after N characters repeating 'z'" hint computed over all of ``ids`` (the
    path that raised may have seen only a chunk or a block of the run)."""
    from isan.engine.guard import repeat_hint

    hint = repeat_hint(ids, t, symbols)
    if _HINT.search(msg):
        return _HINT.sub(lambda _: hint, msg, count=1)
    if hint and "path)" in msg:
        return msg.replace("path)", "path)" + hint, 1)
    return msg


def in_input_terms(e: StateDivergedError, prep: Prepared, symbols=None) -> StateDivergedError:
    """The same error with the offset in the caller's input as well (``.input_offset``), and the
    letter or pair whose repeats led there named when the path that raised did not."""
    off = e.offset
    if off is None or not 0 <= off < len(prep.offsets) or getattr(e, "input_offset", None) is not None:
        return e
    inp = int(prep.offsets[off])
    msg = str(e)
    if symbols is not None:  # name the repeated letter or pair (paths without the alphabet give ids)
        msg = with_repeat_hint(msg, prep.ids, off, symbols)
    norm = prep.report.get("normalizer")
    if inp != off:
        msg = msg.replace(f"character offset {off} ", f"input offset {inp} (scored character {off}, after "
                                                   f"{norm} normalisation) ", 1)
    new = StateDivergedError(msg, offset=off, cause=e.cause)
    new.input_offset = inp
    return new
