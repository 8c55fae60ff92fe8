"""The engine: an immutable model and explicit, immutable state values.

Example:
    >>> from isan.engine import Engine
    >>> eng = Engine.default()
    >>> r = eng.score("the quick brown fox")
    >>> r2 = eng.score(" jumps", state=r.state)   # streaming: carry the state
    >>> eng.top_k(r2.state, 3)                    # next-character distribution

Units: bits (log base 2) everywhere; ``bpc`` is bits per character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from isan.alphabet import Alphabet
from isan.errors import AttributionCheckError, EmptyTextError, IsanError, TableFormatError, TextTooLongError
from isan.params import ISANParams
from isan.engine.bundle import load_isan_bundle
from isan.engine.reference import LOG2E, kappa_ref, log_softmax, score_ref, segment_kappa_ref, states_ref

DEFAULT_MODEL = "text8-d216"
MAX_ATTRIBUTION_CHARS = 2000


def default_model_path() -> Path:
    """Path of the default model bundle shipped inside the package."""
    return Path(str(resources.files("isan") / "models" / DEFAULT_MODEL))


@dataclass(frozen=True)
class State:
    """The recurrent state between two calls: ``h`` (d,) float64 (read-only), plus running totals.

    A value: every engine call returns a new State and never changes the one passed in.
    ``chars`` and ``bits`` count what was scored since the initial state.
    """

    h: np.ndarray
    chars: int = 0
    bits: float = 0.0

    def __post_init__(self) -> None:
        h = np.array(self.h, dtype=np.float64, copy=True)
        h.setflags(write=False)
        object.__setattr__(self, "h", h)

    @property
    def bpc(self) -> float:
        return self.bits / self.chars if self.chars else float("nan")


@dataclass(frozen=True)
class ScoreResult:
    """Scoring of one text: ``chars``, total ``bits``, ``bpc`` = bits / chars, optional
    ``per_char_bits`` (chars,) float64, and the ``state`` after the text."""

    chars: int
    bits: float
    per_char_bits: np.ndarray | None
    state: State

    @property
    def bpc(self) -> float:
        return self.bits / self.chars if self.chars else float("nan")

    def to_json(self, per_char: bool = False) -> dict:
        out = {"chars": self.chars, "bits": float(self.bits), "bpc": float(self.bpc)}
        if per_char and self.per_char_bits is not None:
            out["per_char_bits"] = [float(b) for b in self.per_char_bits]
        return out


@dataclass(frozen=True)
class Attribution:
    """Exact attribution of logits to sources (paper eqs. 4-6).

    ``kappa`` (T, S, V) float64: ``kappa[t, s]`` is source s's contribution to the logits after
    character t (which predict character t+1). Sources: ``sources[0]`` is ``"<h0>"`` (the
    initial state), then characters (``by="char"``) or words and spaces (``by="word"``).
    ``logits`` (T, V) are computed independently by the reference path, and
    ``max_abs_error`` = max |b_ro + sum_s kappa[t, s] - logits[t]|.
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

    def next_char_contributions(self) -> np.ndarray:
        """(T, S): contributions to the logit of the character that actually comes next
        (for the last position, of the most likely next character)."""
        ids = self.alphabet.encode(self.text)
        nxt = np.append(ids[1:], int(np.argmax(self.logits[-1])))
        return self.kappa[np.arange(len(ids)), :, nxt]

    def to_json(self, full: bool = False) -> dict:
        ids = self.alphabet.encode(self.text)
        nxt = np.append(ids[1:], int(np.argmax(self.logits[-1])))
        out = {
            "text": self.text, "by": self.by, "sources": self.sources,
            "source_spans": [list(s) for s in self.source_spans],
            "targets": [self.alphabet.symbols[i] for i in nxt],
            "next_char_kappa": np.round(self.next_char_contributions(), 6).tolist(),
            "check_max_abs_error": self.max_abs_error,
        }
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


class Engine:
    """An immutable ISAN with numpy inference; safe to share across threads.

    Construct with :meth:`load` (a bundle directory) or :meth:`default` (the shipped model).
    The reference path computes in float64 one character at a time.
    """

    def __init__(self, params: ISANParams, alphabet: Alphabet, manifest: dict | None = None,
                 source: str | None = None, table=None, path: str | None = None):
        if params.K != len(alphabet) or params.V != len(alphabet):
            raise IsanError(f"params have K={params.K}, V={params.V} but the alphabet has {len(alphabet)} symbols")
        self.params32 = params.astype(np.float32)
        self.params = params.astype(np.float64)  # reference path dtype
        self.alphabet = alphabet
        self.manifest = dict(manifest or {})
        self.source = source
        self.table = table
        self._composed = None
        if table is not None:
            from isan.engine.composed import ComposedPath

            self._composed = ComposedPath(table, self.params32)
        self.path = path or ("composed" if table is not None else "reference")
        if self.path not in ("composed", "reference"):
            raise IsanError(f"path must be composed or reference; got {self.path!r}")
        if self.path == "composed" and table is None:
            raise TableFormatError(f"{source or 'this model'} has no trie table for the composed path; "
                                   "build one with `isan export CHECKPOINT_DIR BUNDLE` (tables are on by default)")
        self.backend = "numpy"

    # ---- construction -----------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, path_mode: str = "auto", progress_bar: bool = True) -> "Engine":
        """Load a bundle directory written by ``isan export``.

        Args:
            path_mode: ``"auto"`` (composed when the bundle has a table or a table recipe, else
                reference), ``"composed"`` (error without a table) or ``"reference"``.
            progress_bar: show a progress bar if a table recipe must be composed on first use.
        Raises:
            BundleFormatError: missing, corrupt or mismatched files (the message says how to rebuild).
            TableFormatError: the bundle's table is corrupt or belongs to another model.
        """
        if path_mode not in ("auto", "composed", "reference"):
            raise IsanError(f"path must be auto, composed or reference; got {path_mode!r}")
        manifest, params, alphabet = load_isan_bundle(path)
        table = None
        if path_mode != "reference":
            table = find_table(Path(path), manifest, params, alphabet, progress_bar=progress_bar)
        return cls(params, alphabet, manifest, source=str(path), table=table,
                   path=None if path_mode == "auto" else path_mode)

    @classmethod
    def default(cls, path_mode: str = "auto") -> "Engine":
        """The default model shipped in the package (ISAN d=216 trained on text8-10M)."""
        return cls.load(default_model_path(), path_mode=path_mode)

    def with_path(self, path: str) -> "Engine":
        """The same model on another computation path (``"composed"`` or ``"reference"``)."""
        return Engine(self.params32, self.alphabet, self.manifest, self.source, self.table, path)

    # ---- basic facts --------------------------------------------------------------------
    @property
    def d(self) -> int:
        return self.params.d

    @property
    def params_sha256(self) -> str:
        return self.manifest.get("params_sha256") or self.params32.sha256()

    def describe(self) -> dict:
        out = {"kind": "isan", "d": self.d, "alphabet": "".join(self.alphabet.symbols),
               "path": self.path, "backend": self.backend, "source": self.source,
               "params_sha256": self.params_sha256}
        if self.table is not None:
            out["table"] = {"path": str(self.table.path), "entries": self.table.n_entries, "bytes": self.table.nbytes}
        return out

    def initial_state(self) -> State:
        """The learned initial state h0 with zero totals."""
        return State(self.params.h0)

    def encode(self, text: str, unknown: str = "error", replacement: str | None = None) -> np.ndarray:
        """Text to ids (see :meth:`Alphabet.encode`); raises AlphabetError naming the character and offset."""
        return self.alphabet.encode(text, unknown=unknown, replacement=replacement)

    def _ids(self, text: str | Sequence[int] | np.ndarray, unknown: str, replacement: str | None) -> np.ndarray:
        return self.alphabet.as_ids(text, unknown, replacement)

    # ---- scoring ------------------------------------------------------------------------
    def score(self, text: str | np.ndarray, state: State | None = None, per_char: bool = False,
              unknown: str = "error", replacement: str | None = None) -> ScoreResult:
        """Bits of each character of ``text`` given ``state`` (default: the initial state).

        ``bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]`` (DESIGN.md section 2).

        Returns:
            ScoreResult with chars, bits, bpc, per_char_bits (if asked) and the new state,
            whose running totals include this text.
        Raises:
            EmptyTextError: nothing to score (empty, or empty after skipping unknown characters).
            AlphabetError: a character outside the alphabet (with unknown="error").
        """
        ids = self._ids(text, unknown, replacement)
        if len(ids) == 0:
            raise EmptyTextError("the text is empty (after removing unknown characters); give at least one character")
        state = state or self.initial_state()
        bits, h = self._score_ids(ids, state.h)
        total = float(bits.sum())
        new = State(h, state.chars + len(ids), state.bits + total)
        return ScoreResult(len(ids), total, bits if per_char else None, new)

    def _score_ids(self, ids: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.path == "composed":
            bits, hf = self._composed.score(ids, h.astype(np.float32))
            return bits, hf.astype(np.float64)
        return score_ref(self.params, ids, h)

    def score_batch(self, texts: Sequence[str | np.ndarray], states: Sequence[State] | None = None,
                    per_char: bool = False, unknown: str = "error", replacement: str | None = None,
                    group: str | None = None) -> list[ScoreResult]:
        """Score many independent texts together (DESIGN.md section 6: group work, never gather).

        Args:
            group: ``"entry"`` (composed table jumps shared by streams needing the same entry;
                the default with a table) or ``"symbol"`` (per-character steps grouped by symbol).
        Returns:
            one ScoreResult per text, equal to scoring each alone within float32 tolerance.
        """
        ids = [self._ids(t, unknown, replacement) for t in texts]
        for i, x in enumerate(ids):
            if len(x) == 0:
                raise EmptyTextError(f"text {i} of the batch is empty")
        states = list(states) if states is not None else [self.initial_state()] * len(ids)
        group = group or ("entry" if self._composed is not None else "symbol")
        if group == "entry" and self._composed is None:
            raise TableFormatError("group='entry' needs a trie table; use group='symbol'")
        if self._composed is not None:
            path = self._composed
        else:
            from isan.engine.composed import ComposedPath

            path = ComposedPath(None, self.params32)  # symbol grouping needs only the weights
        hs = np.stack([s.h for s in states]) if states else np.zeros((0, self.d))
        bits, finals = path.score_batch(ids, hs, group=group)
        out = []
        for s, b, hf in zip(states, bits, finals):
            total = float(b.sum())
            out.append(ScoreResult(len(b), total, b if per_char else None,
                                   State(hf.astype(np.float64), s.chars + len(b), s.bits + total)))
        return out

    def advance(self, text: str | np.ndarray, state: State | None = None, unknown: str = "error",
                replacement: str | None = None) -> State:
        """Ingest text without scoring it (no readout); totals are left unchanged."""
        ids = self._ids(text, unknown, replacement)
        state = state or self.initial_state()
        if len(ids) == 0:
            return state
        return State(self._advance_ids(ids, state.h), state.chars, state.bits)

    def _advance_ids(self, ids: np.ndarray, h: np.ndarray) -> np.ndarray:
        if self.path == "composed":
            return self._composed.advance(ids, h.astype(np.float32)).astype(np.float64)
        return states_ref(self.params, ids, h)[-1]

    # ---- next-character distribution ----------------------------------------------------
    def logits(self, state: State | None = None) -> np.ndarray:
        """Logits (V,) float64 for the next character: ``W_ro h + b_ro``."""
        h = (state or self.initial_state()).h
        return self.params.W_ro @ h + self.params.b_ro

    def distribution(self, state: State | None = None, temperature: float = 1.0) -> np.ndarray:
        """Next-character probabilities (V,) float64, summing to 1; ``temperature`` > 0 scales the logits."""
        if not temperature > 0:
            raise IsanError(f"temperature must be > 0; got {temperature}")
        return np.exp(log_softmax(self.logits(state) / temperature))

    def top_k(self, state: State | None = None, k: int = 5) -> list[dict]:
        """The k most likely next characters: [{"symbol", "prob", "bits"}], most likely first."""
        lp = log_softmax(self.logits(state))
        order = np.argsort(-lp, kind="stable")[:k]
        return [{"symbol": self.alphabet.symbols[i], "prob": float(np.exp(lp[i])), "bits": float(-lp[i] * LOG2E)}
                for i in order]

    # ---- sampling -----------------------------------------------------------------------
    def sample(self, prompt: str = "", n: int = 200, temperature: float = 1.0, top_k: int | None = None,
               seed: int | None = None, state: State | None = None) -> Sample:
        """Generate ``n`` characters after ``prompt``. Deterministic for a given seed.

        Args:
            temperature: > 0; logits are divided by it.
            top_k: sample only among the k most likely characters (None: all).
        """
        from isan.engine.sampling import check_sampling_args, sample_ids

        check_sampling_args(n, temperature, top_k, len(self.alphabet))
        state = self.advance(prompt, state) if prompt else (state or self.initial_state())
        p = self.params
        ids, bits = sample_ids(lambda h: p.W_ro @ h + p.b_ro, lambda h, x: p.W[x] @ h + p.b[x], state.h.copy(),
                               n, temperature, top_k, seed)
        return Sample(prompt, self.alphabet.decode(ids), bits, seed, temperature, top_k)

    # ---- attribution --------------------------------------------------------------------
    def attribute(self, text: str, by: str = "char", state: State | None = None, unknown: str = "error",
                  replacement: str | None = None, tol: float = 1e-6) -> Attribution:
        """Exact attribution of each logit to the initial state and to each character or word.

        ``kappa[t, s] = W_ro (W[x_t] ... W[x_{s+1}]) b[x_s]`` with ``b[x_0] := h`` (paper eqs. 4-6).
        Word sources (``by="word"``) are maximal runs of non-space or of space characters;
        their kappa comes from the composed bias of the word carried forward (section 3.4).

        Raises:
            AttributionCheckError: ``b_ro + sum_s kappa[t, s]`` differs from the logits by more
                than ``tol * max(1, max |logits|)`` (never expected; it guards the promise).
            TextTooLongError: more than MAX_ATTRIBUTION_CHARS characters (memory is O(T^2 V)).
        """
        if by not in ("char", "word"):
            raise IsanError(f"by must be 'char' or 'word'; got {by!r}")
        if unknown == "skip":
            text = "".join(c for c in text if c in self.alphabet)
            unknown = "error"
        elif unknown == "replace":
            ids0 = self.encode(text, unknown, replacement)
            text = self.alphabet.decode(ids0)
        ids = self.encode(text, unknown, replacement)
        if len(ids) == 0:
            raise EmptyTextError("the text to attribute is empty; give at least one character")
        if len(ids) > MAX_ATTRIBUTION_CHARS:
            raise TextTooLongError(f"attribution of {len(ids)} characters needs O(T^2) memory; give at most {MAX_ATTRIBUTION_CHARS}")
        h = (state or self.initial_state()).h
        p = self.params
        if by == "char":
            spans = [(i, i + 1) for i in range(len(ids))]
            kappa = kappa_ref(p, ids, h)
        else:
            spans = [m.span() for m in re.finditer(r"[^ ]+| +", text)]
            kappa = segment_kappa_ref(p, ids, spans, h)
        logits = states_ref(p, ids, h) @ p.W_ro.T + p.b_ro
        err = float(np.abs(p.b_ro + kappa.sum(axis=1) - logits).max())
        if err > tol * max(1.0, float(np.abs(logits).max())):
            raise AttributionCheckError(f"b_ro + sum kappa differs from the logits by {err:.3g}")
        sources = ["<h0>"] + [text[i:j] for i, j in spans]
        return Attribution(text, by, sources, [(0, 0)] + spans, kappa, logits, p.b_ro.copy(), err, self.alphabet)


def find_table(bundle: Path, manifest: dict, params: ISANParams, alphabet: Alphabet, progress_bar: bool = True):
    """The bundle's trie table: ``table/`` inside it, or its ``table_recipe.json`` composed into the
    cache on first use; None if it has neither. A broken table raises, never silently falls back."""
    from isan.trie_tables.build import RECIPE, cached_table
    from isan.trie_tables.format import load_table

    sha = manifest["params_sha256"]
    if (bundle / "table").exists():
        return load_table(bundle / "table", sha, alphabet, params.d)
    if (bundle / RECIPE).exists():
        return cached_table(bundle / RECIPE, params, alphabet, sha, progress_bar=progress_bar)
    return None


def load_engine(model: str | Path | None = None, path: str = "auto", backend: str = "numpy", device: str = "cpu"):
    """Load a bundle (``None``: the default model) with the chosen computation path and backend.

    Args:
        path: ``"auto"`` (composed when the bundle has a table, else reference), ``"composed"``
            or ``"reference"``.
        backend: ``"numpy"`` or ``"onnx"`` (onnxruntime over the bundle's ONNX graphs; the
            provider that runs is reported in ``describe()``, never silently swapped).
        device: for the onnx backend: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    Returns:
        an :class:`Engine` for ISAN bundles on the numpy backend, else an engine with the same
        scoring API (``score``, ``score_batch``, ``advance``, ``top_k``, ``sample``, ``describe``).
    Raises:
        BundleFormatError, TableFormatError, IsanError: with a message that says how to fix it.
    """
    from isan.engine.bundle import read_manifest

    if backend not in ("numpy", "onnx"):
        raise IsanError(f"backend must be numpy or onnx; got {backend!r}")
    if path not in ("auto", "composed", "reference"):
        raise IsanError(f"path must be auto, composed or reference; got {path!r}")
    src = default_model_path() if model is None else Path(model)
    if backend == "onnx":
        from isan.engine.onnx_backend import load_onnx_engine

        return load_onnx_engine(src, device=device, path_mode=path)
    kind = read_manifest(src)["kind"]
    if kind != "isan":
        if path == "composed":
            raise IsanError("trie tables exist only for ISAN bundles; use --path auto or reference")
        if kind == "ngram":
            from isan.engine.ngram import load_ngram_engine

            return load_ngram_engine(src)
        if kind in ("linear", "linear_nlro", "isan_nobias"):
            from isan.engine.linear_ref import load_linear_engine

            return load_linear_engine(src)
        from isan.engine.baseline_ref import load_baseline_engine

        return load_baseline_engine(src)
    return Engine.load(src, path_mode=path)
