"""The engine: an immutable model and explicit, immutable state values.

Example:
    >>> from isan.engine import Engine
    >>> eng = Engine.default()
    >>> r = eng.score("the quick brown fox")
    >>> r2 = eng.score(" jumps", state=r.state)   # streaming: carry the state
    >>> eng.top_k(r2.state, 3)                    # next-character distribution

Units: bits (log base 2) everywhere; ``bpc`` is bits per character.

Text goes through the model's declared normaliser first (``normalize="auto"``, see
:mod:`isan.engine.normalize`); every result reports what it changed and maps each scored
character back to its input offset. No call returns NaN or inf: a state that leaves the range of
:data:`isan.engine.guard.MAX_STATE_ABS` raises :class:`~isan.errors.StateDivergedError` naming the offset.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np

import isan.errors as isan_errors
from isan.alphabet import Alphabet
from isan.errors import (AttributionCheckError, EmptyTextError, IsanError, StateDivergedError, TableFormatError,
                         TextTooLongError)
from isan.params import ISANParams, expand_inputs
from isan.tokens import alphabet_label
from isan.engine.bundle import load_isan_bundle
from isan.engine.guard import MAX_STATE_ABS, check_bits, check_states, raise_diverged
from isan.engine.normalize import Normalizer, Prepared, from_manifest, prepare, resolve
from isan.engine.reference import LOG2E, kappa_ref, log_softmax, logits_ref, segment_kappa_ref, states_ref
# the values the engine returns live in results.py; they are importable from here as before
from isan.engine.results import (Attribution, Sample, ScoreResult, State, finite_or_none,  # noqa: F401
                                 in_input_terms, with_prefix, with_repeat_hint)

DEFAULT_MODEL = "text8-d216-distil"
#: the model of the paper's analyses (results/paper): the first default, trained without a stability certificate
PAPER_MODEL = "text8-d216-unconstrained"
MAX_ATTRIBUTION_CHARS = 2000

#: Computation paths: ``composed`` (trie-table jumps, sequential; long texts chunk-parallel by the
#: kernel :meth:`Engine._batch_plan` chooses), ``chunked`` (chunk-parallel batches through the
#: compiled kernels, one character a step), ``jumps`` (the same, each row always advanced by
#: composed jumps of the trie table's keys: :mod:`isan.engine.kernels.jumps`, issue 22),
#: ``reference`` (float64 numpy, one character at a time).
PATHS = ("composed", "chunked", "jumps", "reference")
#: On the composed path, texts of at least this many characters are scored chunk-parallel
#: (measured: chunk-parallel overtakes one stream through the table between 5,000 and 10,000).
CHUNKED_MIN_CHARS = 10_000


def default_model_path() -> Path:
    """Path of the default model bundle shipped inside the package (``isan/models/``).

    Found beside :mod:`isan.errors`, not through ``isan.__file__``: run from the parent of a
    checkout named ``isan`` with the editable install, ``isan`` itself is imported as a namespace
    package of the checkout's root, while its modules still come from the package folder.
    """
    return Path(isan_errors.__file__).resolve().parent / "models" / DEFAULT_MODEL


def paper_model_path() -> Path:
    """Path of the model the paper's analyses (``isan analyze``, results/paper) were made with."""
    return default_model_path().parent / PAPER_MODEL


class Engine:
    """An immutable ISAN with numpy inference; safe to share across threads.

    Construct with :meth:`load` (a bundle directory) or :meth:`default` (the shipped model).
    The reference path computes in float64 one character at a time.
    """

    def __init__(self, params: ISANParams, alphabet: Alphabet, manifest: dict | None = None,
                 source: str | None = None, table=None, path: str | None = None, threads: int | None = None,
                 device: str = "cpu", dtype: str = "float32", kernels: str | None = None):
        if params.V != len(alphabet) or params.K not in (alphabet.K, len(alphabet)):
            raise IsanError(f"params have K={params.K}, V={params.V} but the alphabet has {alphabet.K} inputs and "
                            f"{len(alphabet)} outputs")
        #: the parameters as stored (K inputs); ``params`` and ``params32`` are read by output id
        self.input_params = params
        if params.K != len(alphabet):
            # a token alphabet with K < V inputs (bytes: 70 inputs, 256 outputs): every output id gets its
            # input's (W, b), so that the engine reads one id sequence (the text's output ids) everywhere
            params = expand_inputs(params, alphabet.input_map)
        self.params32 = params.astype(np.float32)
        self.params = params.astype(np.float64)  # reference path dtype
        self.alphabet = alphabet
        self.manifest = dict(manifest or {})
        from isan.engine.bundle import normalizer_view

        self.normalizer: Normalizer = from_manifest({**self.manifest, "alphabet": normalizer_view(alphabet)},
                                                    f"{source or 'the model'}/manifest.json")
        self.source = source
        self.table = table
        self._composed = None
        if table is not None:
            from isan.engine.composed import ComposedPath

            self._composed = ComposedPath(table, self.params32, symbols=alphabet.symbols)
        self.path = path or ("composed" if table is not None else "chunked")
        if self.path not in PATHS:
            raise IsanError(f"path must be one of {', '.join(PATHS)}; got {self.path!r}")
        if self.path == "composed" and table is None:
            raise TableFormatError(f"{source or 'this model'} has no trie table for the composed path; "
                                   "build one with `isan export CHECKPOINT_DIR BUNDLE` (tables are on by default)")
        from isan.engine.kernels import default_threads, native

        self.threads = int(threads) if threads else default_threads()
        if self.threads < 1:
            raise IsanError(f"threads must be >= 1; got {threads}")
        self._streams_model = None
        self._jumps = {}  # the batched kernel's composed tables by dtype (jumps path), built on first use
        self._fallback = None
        native()  # says once if the compiled kernels are missing
        self.backend = "numpy"
        from isan.engine.kernels.backends import get_backend

        #: the kernels' backend (:mod:`isan.engine.kernels.backends`): the compiled kernels on the
        #: CPU; the torch backend on a GPU (``device="cuda"``) or for ``dtype="float64"``
        self.kernels = get_backend(kernels, device, dtype)
        if self.kernels.name == "torch":
            if self.path == "reference":
                raise IsanError(f"the reference path is numpy's float64 on the CPU, not device {self.kernels.device!r} "
                                f"({self.kernels.dtype}): use path auto or chunked there (dtype float64 is the float64 "
                                "reference on the device), or device cpu for the reference path")
            # every text and batch goes chunk-parallel through the torch runner (the composed
            # path's sequential table jumps are a CPU kernel)
            self.path = "chunked" if self.path in ("composed", "jumps") else self.path

    # ---- construction -----------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, path_mode: str = "auto", progress_bar: bool = True, device: str = "cpu",
             dtype: str = "float32", kernels: str | None = None) -> "Engine":
        """Load a bundle directory written by ``isan export``.

        Args:
            path_mode: ``"auto"`` (composed when the bundle has a table or a table recipe, else
                chunked), ``"composed"`` (error without a table), ``"chunked"`` (chunk-parallel,
                no table needed), ``"jumps"`` (chunk-parallel by the table's composed jumps; error
                without a table) or ``"reference"``. On the composed path, texts of
                CHUNKED_MIN_CHARS characters or more are scored chunk-parallel (by composed jumps
                when they make enough chunks: :meth:`_batch_plan`).
            progress_bar: show a progress bar if a table recipe must be composed on first use.
            device: ``"cpu"`` (the compiled kernels), ``"cuda"``/``"cuda:N"`` (the torch backend on
                that GPU: every text and batch chunk-parallel there) or ``"auto"`` (CUDA when torch
                sees a GPU); see :mod:`isan.engine.kernels.backends`.
            dtype: ``"float32"`` or ``"float64"`` (the torch backend's exact reference arithmetic).
            kernels: the backend by name (``"native"``, ``"numpy"``, ``"torch"``; default: native
                on the CPU in float32, else torch).
        Raises:
            BackendUnavailableError: a GPU asked for where torch or CUDA is missing.
            BundleFormatError: missing, corrupt or mismatched files (the message says how to rebuild).
            TableFormatError: the bundle's table is corrupt or belongs to another model.
        """
        if path_mode not in ("auto",) + PATHS:
            raise IsanError(f"path must be auto or one of {', '.join(PATHS)}; got {path_mode!r}")
        from isan.engine.kernels.backends import get_backend

        backend = get_backend(kernels, device, dtype)  # a missing GPU or torch is said before the bundle is read
        manifest, params, alphabet = load_isan_bundle(path)
        table = None
        if path_mode in ("auto", "composed", "jumps") and backend.name != "torch":
            table = find_table(Path(path), manifest, params, alphabet, progress_bar=progress_bar)
        elif path_mode in ("composed", "jumps"):
            raise IsanError(f"the {path_mode} path runs on the CPU's kernels; on the torch backend (device "
                            f"{backend.device}, {dtype}) texts go chunk-parallel by its runner: use path auto or chunked")
        return cls(params, alphabet, manifest, source=str(path), table=table,
                   path=None if path_mode == "auto" else path_mode, device=device, dtype=dtype, kernels=backend.name)

    @classmethod
    def default(cls, path_mode: str = "auto", device: str = "cpu", dtype: str = "float32",
                kernels: str | None = None) -> "Engine":
        """The default model shipped in the package (ISAN d=216 trained on text8-10M); the keywords
        are :meth:`load`'s."""
        return cls.load(default_model_path(), path_mode=path_mode, device=device, dtype=dtype, kernels=kernels)

    def with_path(self, path: str) -> "Engine":
        """The same model on another computation path (one of :data:`PATHS`)."""
        return Engine(self.input_params, self.alphabet, self.manifest, self.source, self.table, path, self.threads,
                      self.kernels.device, self.kernels.dtype, self.kernels.name)

    @property
    def device(self) -> str:
        """Where the kernels run: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""
        return self.kernels.device

    def _streams(self):
        """The weights in the compiled kernels' layout (built on first use, ~30 ms)."""
        if self._streams_model is None:
            from isan.engine.kernels.streams import StreamModel

            self._streams_model = StreamModel.from_params(self.params32)
        return self._streams_model

    # ---- basic facts --------------------------------------------------------------------
    @property
    def _units(self) -> dict:
        return {"unit": self.alphabet.unit, "V": len(self.alphabet)}

    @property
    def d(self) -> int:
        return self.params.d

    @property
    def params_sha256(self) -> str:
        return self.manifest.get("params_sha256") or self.params32.sha256()

    def describe(self) -> dict:
        from isan.engine.kernels import native_status

        k = native_status()
        out = {"kind": "isan", "d": self.d, "alphabet": alphabet_label(self.alphabet), "unit": self.alphabet.unit,
               "path": self.path, "backend": self.backend, "source": self.source,
               "params_sha256": self.params_sha256, "normalizer": self.normalizer.id,
               "kernels": {"compiled": k["available"], "isa": k["isa"], "threads": self.threads,
                           **self.kernels.describe()}}
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

    def prepare(self, text: str | Sequence[int] | np.ndarray, normalize: str | Normalizer | None = "auto",
                unknown: str = "error", replacement: str | None = None, state: State | None = None) -> Prepared:
        """Normalise ``text`` and map it to ids (see :func:`isan.engine.normalize.prepare`).

        Args:
            normalize: ``"auto"`` (the model's declared normaliser), ``"none"`` (raw text) or a
                normaliser name (``"text8"``, ``"text8-v1"``).
            state: the state the text continues (its ``last_symbol`` matters to squeezing).
        """
        return prepare(text, self.alphabet, resolve(normalize, self.normalizer), unknown, replacement,
                       context=state.last_symbol if state is not None else "")

    def _state(self, state: State | None) -> State:
        """``state`` or the initial state, checked: the right size, finite and in range."""
        if state is None:
            return self.initial_state()
        h = state.h
        if h.shape != (self.d,):
            raise IsanError(f"the state has shape {h.shape}; this model's state is ({self.d},)")
        if not np.abs(h).max(initial=0.0) <= MAX_STATE_ABS:
            raise StateDivergedError(f"the given state is out of range (max |h| = {np.abs(h).max():.3g} > "
                                     f"{MAX_STATE_ABS:g}, or not finite); start from engine.initial_state()",
                                     offset=None, cause="state out of range")
        return state

    def _diverged(self, ids: np.ndarray, h: np.ndarray, where: str, detected_at: int | None = None,
                  base_offset: int = 0) -> None:
        raise_diverged(self.params.W, self.params.b, ids, h, where, detected_at=detected_at,
                       base_offset=base_offset, symbols=self.alphabet.symbols)

    def _check_output(self, ids: np.ndarray, h: np.ndarray, bits: np.ndarray | None, h_final: np.ndarray,
                      where: str) -> None:
        """Raise StateDivergedError (located by the float64 reference) if ``bits`` are not finite
        or the final state is out of range."""
        bad = check_bits(bits) if bits is not None else None
        if bad is not None or check_states(np.asarray(h_final)[None, :]) is not None:
            self._diverged(ids, h, where, detected_at=bad)

    # ---- scoring ------------------------------------------------------------------------
    def score(self, text: str | np.ndarray, state: State | None = None, per_char: bool = False,
              unknown: str = "error", replacement: str | None = None, normalize: str | None = "auto",
              path: str | None = None, threads: int | None = None) -> ScoreResult:
        """Bits of each character of ``text`` given ``state`` (default: the initial state).

        ``bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]`` (docs/ARCHITECTURE.md, 'The model and its
        conventions').

        Args:
            normalize: ``"auto"`` (the model's declared normaliser), ``"none"`` (raw text) or a
                normaliser name; the result's ``normalization`` reports what it changed.
            unknown, replacement: characters still outside the alphabet after normalisation.
            path: this call's computation path (default: the engine's). On the composed path a
                text of CHUNKED_MIN_CHARS characters or more is scored chunk-parallel; the
                result's ``scoring`` says which path ran.
            threads: threads for the compiled kernels (default: the engine's).
        Returns:
            ScoreResult with chars, bits, bpc, per_char_bits and per_char_offsets (if asked),
            the normalisation report and the new state, whose running totals include this text.
            A non-empty chunk that normalises to nothing (a newline after a space) scores zero
            characters when a ``state`` is given (streaming); without one it is an EmptyTextError.
        Raises:
            EmptyTextError: nothing to score (empty, or empty after normalisation and skipping).
            AlphabetError: a character outside the alphabet (with unknown="error").
            StateDivergedError: the model's state leaves its range (``.offset``, ``.input_offset``).
        """
        state, prep, empty = prepare_one(self, text, state, normalize, unknown, replacement, per_char)
        if empty is not None:
            return empty
        ids = prep.ids
        try:
            bits, h, scoring = self._score_ids(ids, state.h, path, threads)
        except StateDivergedError as e:
            raise in_input_terms(e, prep, self.alphabet.symbols) from None
        total = float(bits.sum())
        new = State(h, state.chars + len(ids), state.bits + total, prep.last_symbol)
        return ScoreResult(len(ids), total, bits if per_char else None, new, prep.report,
                           prep.offsets if per_char else None, prep.text if per_char else None, scoring,
                           **self._units)

    def _path_for(self, n: int, path: str | None) -> str:
        """The path a text of n characters takes: the call's or the engine's, with long texts on
        the composed path going chunk-parallel (``"batched"``: the kernel chosen by
        :meth:`_batch_plan`)."""
        forced = path is not None
        path = path or self.path
        if path not in PATHS:
            raise IsanError(f"path must be one of {', '.join(PATHS)}; got {path!r}")
        if path in ("composed", "jumps"):
            if self._composed is None:
                raise TableFormatError(f"this engine has no trie table for the {path} path; use path='chunked'")
            if path == "composed" and n >= CHUNKED_MIN_CHARS and not forced:
                return "batched"
        return path

    def _score_ids(self, ids: np.ndarray, h: np.ndarray, path: str | None = None,
                   threads: int | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
        """(bits (T,) float64, final state (d,) float64, scoring report); raises StateDivergedError."""
        chosen = self._path_for(len(ids), path)
        if chosen in ("chunked", "jumps", "batched"):
            bits, finals, rep = self._chunked([ids], h[None], threads=threads,
                                              kernel="auto" if chosen == "batched" else chosen)
            return bits[0], finals[0].astype(np.float64), self._chunked_report(rep)
        if chosen == "composed":
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging state is reported below
                bits, hf = self._composed.score(ids, h.astype(np.float32), threads=threads or self.threads)
            hf = hf.astype(np.float64)
            self._check_output(ids, h, bits, hf, "composed")
            return bits, hf, {"path": "composed"}
        bits, hf = self._score_ref(ids, h)
        return bits, hf, {"path": "reference"}

    def _jump_table(self, dtype: str = "float32"):
        """The trie table as a :class:`~isan.engine.kernels.jumps.JumpTable` for the batched kernel,
        packed on first use from the table's own composed matrices (a float16 table is composed
        again in float64 from its keys, so that the float32 kernel stays exact);
        ``dtype="float16"`` stores the packed matrices in half precision (not exact: measured in
        ``isan bench engine``)."""
        if dtype not in self._jumps:
            from isan.engine.kernels.jumps import JumpTable
            from isan.trie_tables.codes import decode_code

            t = self.table
            keys = [()] * t.n_entries
            for code, e in zip(t.sorted_codes.tolist(), t.entry_of_sorted.tolist()):
                keys[e] = decode_code(int(code), self.params.K)
            if t.header.get("dtype", "float32") == "float32":
                self._jumps[dtype] = JumpTable.from_composed(self._streams(), keys, t.Ac, t.R, t.offsets, dtype)
            else:
                self._jumps[dtype] = JumpTable.build(self.params32, keys, stream=self._streams(), dtype=dtype)
        return self._jumps[dtype]

    def _batch_plan(self, lengths: Sequence[int], threads: int, cut: bool = True, kernel: str = "auto"):
        """How a chunk-parallel batch of texts of these lengths runs: (kernel, model, chunks, keywords
        of :func:`~isan.engine.kernels.chunked.score_texts_chunked`). ``kernel``: ``"chunked"`` (one
        character a step, :mod:`~isan.engine.kernels.streams`), ``"jumps"`` (composed jumps,
        :mod:`~isan.engine.kernels.jumps`; ``"jumps-f16"``: float16 matrices, not exact, for the
        benchmark) or ``"auto"``: jumps when the engine has a trie table and the batch makes at
        least ``MIN_ROWS_PER_THREAD`` rows a thread for them (queues by key need many rows: measured
        there), else chunked. Both are exact (``"jumps-f16"`` is not). ``cut=False``: one row a text.
        On the torch backend every batch runs its per-symbol runner (``"torch"``), cut for the device
        (:mod:`isan.engine.kernels.torch.plan`)."""
        from isan.engine.kernels.chunked import plan_chunks
        from isan.engine.kernels.jumps import MIN_ROWS_PER_THREAD, ROWS_PER_THREAD

        lengths = [int(n) for n in lengths]
        if self.kernels.name == "torch":  # one runner for everything: the torch backend's per-symbol rows
            from isan.engine.kernels.torch import plan

            rtol = plan.rtol(self.kernels.dtype)
            chunks = plan.chunks(lengths, self.device, threads, self.kernels.dtype, self.forget_bound_chars(rtol=rtol)) \
                if cut else [1] * len(lengths)
            return "torch", self._streams(), chunks, {"runner": self.kernels.streams, "path": "chunked", "rtol": rtol}
        planned_chunks = plan_chunks(lengths, target_rows=ROWS_PER_THREAD * threads, min_chunk=self.min_chunk()) \
            if cut else [1] * len(lengths)
        if kernel == "auto":
            enough = sum(planned_chunks) >= MIN_ROWS_PER_THREAD * threads
            kernel = "jumps" if self._composed is not None and enough else "chunked"
        if kernel in ("jumps", "jumps-f16"):
            model = self._jump_table("float16" if kernel == "jumps-f16" else "float32")
            return kernel, model, planned_chunks, {"runner": self.kernels.jumps, "path": kernel}
        return kernel, self._streams(), planned_chunks, {"runner": self.kernels.streams}

    def min_chunk(self) -> int:
        """The shortest chunk chunk-parallel scoring cuts on the CPU kernels, in characters: MIN_CHUNK
        (1,024), or, for a certified model whose certificate proves forgetting only after more
        characters (``forget_bound_chars()``: 1,064 for text8-d216-distil), that many rounded up to a
        multiple of 256, so that every chunk provably corrects itself (:class:`ProvenForgetting`)."""
        from isan.engine.kernels.chunked import certified_min_chunk

        return certified_min_chunk(self.forget_bound_chars())

    def _chunk_fallback(self, lengths: Sequence[int] | None = None, chunks: Sequence[int] | None = None):
        """What chunk-parallel scoring does with a chunk whose correction does not converge: a
        certified model forgets any start-state error within ``forget_bound_chars()`` characters, so
        where every chunk is at least that long (the plan's chunks are :meth:`min_chunk` or longer;
        chunk counts a caller gives are checked: ``lengths`` and ``chunks``) none can need the float64
        fallback (:class:`ProvenForgetting`); otherwise (no certificate, shorter chunks, or the torch
        backend, whose chunks and tolerance are the device's) :class:`Float64Fallback`, which redoes
        in float64 a chunk whose correction does not settle."""
        if self._fallback is None:
            from isan.engine.kernels.chunked import Float64Fallback

            self._float64_fallback = Float64Fallback(self.params)
            bound = None if self.kernels.name == "torch" else self.forget_bound_chars()
            self._fallback = ProvenForgetting(bound) if bound is not None else self._float64_fallback
        if isinstance(self._fallback, ProvenForgetting) and chunks is not None:
            if any(c > 1 and n // c < self._fallback.bound for n, c in zip(lengths, chunks)):
                return self._float64_fallback  # a caller's chunks shorter than the proof: checked instead
        return self._fallback

    def score_ids(self, ids_list: Sequence[np.ndarray], hs: np.ndarray, *, chunks: str | Sequence[int] = "auto",
                  want_bits: bool = True, threads: int | None = None, kernel: str = "auto",
                  where: str | None = None):
        """Score texts already in ids, chunk-parallel, all as rows of one batch on the engine's
        backend: the one batched call under :meth:`score`, :meth:`score_batch`, :meth:`advance`,
        the server's rounds and corpus scoring (:func:`isan.engine.kernels.chunked.score_texts_chunked`).

        Args:
            ids_list: B int arrays of symbol ids (output ids), each non-empty.
            hs: (B, d) the state before each text.
            chunks: ``"auto"`` (long texts cut by the backend's plan, :meth:`_batch_plan`),
                ``"none"`` (one row a text) or the chunk count of each text (a corpus cuts each
                document by its own length, so that its bits do not depend on its batch).
            want_bits: False to advance the states only (no readout).
            threads: kernel threads (default: the engine's).
            kernel: ``"auto"``, ``"chunked"``, ``"jumps"`` or ``"jumps-f16"`` (:meth:`_batch_plan`;
                the torch backend has one kernel and ignores it).
            where: the path an error names (default: the kernel's name).
        Returns:
            (bits per text: B float64 arrays (empty without want_bits), final states (B, d) float32
            or the backend's state dtype, :class:`~isan.engine.kernels.chunked.ChunkedReport`).
        Raises:
            StateDivergedError: a state leaves the range; located exactly by the float64 reference,
                naming the offset in its text, with ``text_index`` the text.
        """
        from isan.engine.kernels.chunked import score_texts_chunked

        threads = threads or self.threads
        lengths = [len(x) for x in ids_list]
        kernel, model, planned, kw = self._batch_plan(lengths, threads, chunks == "auto", kernel)
        plan = planned if isinstance(chunks, str) else list(chunks)
        bits, finals, rep, div = score_texts_chunked(
            model, ids_list, np.asarray(hs, dtype=np.float64),
            chunks=plan, threads=threads, want_bits=want_bits, fallback=self._chunk_fallback(lengths, plan), **kw)
        if div:
            i, off, h_start, t = div[0]
            try:
                raise_diverged(self.params.W, self.params.b, np.asarray(ids_list[i])[off:], h_start, where or kernel,
                               detected_at=t, base_offset=off, symbols=self.alphabet.symbols)
            except StateDivergedError as e:
                e.text_index = i
                raise
        return bits, finals, rep

    def _chunked(self, ids_list: list[np.ndarray], hs: np.ndarray, want_bits: bool = True,
                 threads: int | None = None, cut: bool = True, kernel: str = "auto"):
        """:meth:`score_ids` with the long texts cut (``cut``) or one row a text."""
        return self.score_ids(ids_list, hs, chunks="auto" if cut else "none", want_bits=want_bits, threads=threads,
                              kernel=kernel)

    def _chunked_report(self, rep) -> dict:
        out = rep.to_json()
        if self.kernels.name != "native":  # say where it ran
            out.update(self.kernels.describe())
        if isinstance(self._fallback, ProvenForgetting):  # say why no chunk can fall back
            out["forget_bound_chars"] = self._fallback.bound
        return out

    def certificate(self) -> dict | None:
        """The model's stability certificate (:func:`isan.engine.certificate.check_certificate`,
        recomputed from the bundle's files on first use and kept); None without one, or when it
        does not hold."""
        if not hasattr(self, "_certificate"):
            from isan.engine.certificate import check_certificate

            c = None
            if self.source and self.manifest.get("certificate"):
                p = self.input_params
                c = check_certificate(self.source, self.manifest, p.W, p.b, p.h0)
            self._certificate = c if c is not None and c["holds"] else None
        return self._certificate

    def forget_bound_chars(self, rtol: float | None = None, margin: float | None = None) -> int | None:
        """Characters after which any start-state error is within chunk-parallel scoring's stopping
        rule, proven by the certificate: ``cond(P) rho^t (2 state_bound) <= rtol / margin``
        (two states within the bound differ by at most twice it). None without a certificate."""
        from isan.engine.kernels.chunked import DEFAULT_MARGIN, DEFAULT_RTOL

        c = self.certificate()
        if c is None:
            return None
        rtol, margin = rtol or DEFAULT_RTOL, margin or DEFAULT_MARGIN
        start = c["cond_P"] * 2.0 * max(c["state_bound"], 1.0) * margin / rtol
        return max(1, int(np.ceil(np.log(start) / -np.log(c["rho"]))))

    def _score_ref(self, ids: np.ndarray, h: np.ndarray, block: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        """The float64 reference (as :func:`isan.engine.reference.score_ref`), checking every state."""
        p = self.params
        ids = np.asarray(ids)
        bits = np.empty(len(ids))
        for s in range(0, len(ids), block):
            x = ids[s : s + block]
            H = states_ref(p, x, h)
            bad = check_states(H)
            if bad is not None:
                self._diverged(x, h, "reference", detected_at=bad, base_offset=s)
            S = np.vstack([h[None, :], H[:-1]])  # states before each character
            lp = log_softmax(logits_ref(p, S))
            bits[s : s + len(x)] = -lp[np.arange(len(x)), x] * LOG2E
            h = H[-1]
        bad = check_bits(bits)
        if bad is not None:  # in-range states give finite bits; this guards the promise
            raise StateDivergedError(f"non-finite bits at character offset {bad} (reference path)", offset=bad,
                                     cause="non-finite bits")
        return bits, h

    def score_batch(self, texts: Sequence[str | np.ndarray], states: Sequence[State] | None = None,
                    per_char: bool = False, unknown: str = "error", replacement: str | None = None,
                    group: str | None = None, normalize: str | None = "auto",
                    threads: int | None = None) -> list[ScoreResult]:
        """Score many independent texts together (docs/guide/tables-and-speed.md: group work, never gather).

        Args:
            group: ``"auto"`` (the default on the composed path: every text a row of a compiled
                chunk-parallel kernel, long texts cut into chunks so that the rows keep both cores
                busy; composed jumps when the batch makes enough rows for them, else one character a
                step: :meth:`_batch_plan`), ``"chunked"`` (the same with the per-symbol kernel:
                the default on the chunked and reference paths), ``"symbol"`` (the per-symbol
                kernel without cutting), ``"jumps"`` (composed jumps grouped by table key,
                :mod:`isan.engine.kernels.jumps`: the default on the jumps path) or ``"entry"``
                (numpy: composed table jumps shared by streams needing the same entry).
            threads: threads for the compiled kernels (default: the engine's).
            normalize, unknown, replacement: as for :meth:`score`.
        Returns:
            one ScoreResult per text, equal to scoring each alone within float32 tolerance.
        Raises:
            EmptyTextError, AlphabetError, StateDivergedError (naming the text of the batch).
        """
        states, preps = prepare_batch(self, texts, states, normalize, unknown, replacement)
        ids = [p.ids for p in preps]
        group = group or {"jumps": "jumps", "composed": "auto"}.get(self.path, "chunked")
        if group not in ("auto", "chunked", "symbol", "jumps", "entry"):
            raise IsanError(f"group must be auto, chunked, symbol, jumps or entry; got {group!r}")
        if group in ("entry", "jumps") and self._composed is None:
            raise TableFormatError(f"group='{group}' needs a trie table; use group='chunked'")
        hs = np.stack([s.h for s in states]) if states else np.zeros((0, self.d))
        scoring = None
        if group == "entry":
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging state is reported below
                bits, finals = self._composed.score_batch(ids, hs, group="entry")
            scoring = {"path": "batched, grouped by entry"}
        else:
            try:
                kernel = {"jumps": "jumps", "auto": "auto"}.get(group, "chunked")
                bits, finals, rep = self._chunked(ids, hs, threads=threads, cut=group != "symbol", kernel=kernel)
            except StateDivergedError as e:
                i = getattr(e, "text_index", 0)
                raise with_prefix(in_input_terms(e, preps[i], self.alphabet.symbols), f"text {i} of the batch: ") from None
            scoring = self._chunked_report(rep)
        out = []
        for i, (s, b, hf, prep) in enumerate(zip(states, bits, finals, preps)):
            if group == "entry":  # the compiled kernels check every state and bit themselves
                try:
                    self._check_output(prep.ids, s.h, b, hf, f"batched ({group})")
                except StateDivergedError as e:
                    raise with_prefix(in_input_terms(e, prep, self.alphabet.symbols), f"text {i} of the batch: ") from None
            total = float(b.sum())
            out.append(ScoreResult(len(b), total, b if per_char else None,
                                   State(hf.astype(np.float64), s.chars + len(b), s.bits + total, prep.last_symbol),
                                   prep.report, prep.offsets if per_char else None, prep.text if per_char else None,
                                   scoring, **self._units))
        return out

    def advance(self, text: str | np.ndarray, state: State | None = None, unknown: str = "error",
                replacement: str | None = None, normalize: str | None = "auto", path: str | None = None,
                threads: int | None = None) -> State:
        """Ingest text without scoring it (no readout); totals are left unchanged.

        Raises:
            AlphabetError, StateDivergedError (as :meth:`score`).
        """
        state = self._state(state)
        prep = self.prepare(text, normalize, unknown, replacement, state)
        if len(prep.ids) == 0:
            return state
        try:
            h = self._advance_ids(prep.ids, state.h, path=path, threads=threads)
        except StateDivergedError as e:
            raise in_input_terms(e, prep, self.alphabet.symbols) from None
        return State(h, state.chars, state.bits, prep.last_symbol)

    def _advance_ids(self, ids: np.ndarray, h: np.ndarray, block: int = 4096, path: str | None = None,
                     threads: int | None = None) -> np.ndarray:
        chosen = self._path_for(len(ids), path)
        if chosen in ("chunked", "jumps", "batched"):
            _, finals, _ = self._chunked([ids], h[None], want_bits=False, threads=threads,
                                         kernel="auto" if chosen == "batched" else chosen)
            return finals[0].astype(np.float64)
        if chosen == "composed":
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging state is reported below
                hf = self._composed.advance(ids, h.astype(np.float32), threads=threads or self.threads).astype(np.float64)
            self._check_output(ids, h, None, hf, "composed")
            return hf
        for s in range(0, len(ids), block):  # blocks keep memory O(block d)
            x = ids[s : s + block]
            H = states_ref(self.params, x, h)
            bad = check_states(H)
            if bad is not None:
                self._diverged(x, h, "reference", detected_at=bad, base_offset=s)
            h = H[-1]
        return h

    # ---- next-character distribution ----------------------------------------------------
    def logits(self, state: State | None = None) -> np.ndarray:
        """Logits (V,) float64 for the next character: ``W_ro h + b_ro``."""
        h = self._state(state).h
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
               seed: int | None = None, state: State | None = None, normalize: str | None = "auto") -> Sample:
        """Generate ``n`` characters after ``prompt`` (normalised as ``normalize`` says).
        Deterministic for a given seed.

        Args:
            temperature: >= 0; logits are divided by it; below 0.01 (0 included) greedy (:func:`isan.engine.sampling.greedy`).
            top_k: sample only among the k most likely characters (None: all).
        Raises:
            StateDivergedError: the prompt or the generated text drives the state out of range.
        """
        from isan.engine.sampling import check_sampling_args, sample_ids

        check_sampling_args(n, temperature, top_k, len(self.alphabet))
        state = self._state(state)
        prep = self.prepare(prompt, normalize, "error", None, state)
        if len(prep.ids):
            try:
                state = State(self._advance_ids(prep.ids, state.h), state.chars, state.bits, prep.last_symbol)
            except StateDivergedError as e:
                raise in_input_terms(e, prep, self.alphabet.symbols) from None
        p = self.params
        symbols = self.alphabet.symbols
        drawn: list[int] = []

        def step(h, x):
            drawn.append(x)
            h = p.W[x] @ h + p.b[x]
            if not np.abs(h).max() <= MAX_STATE_ABS:
                raise StateDivergedError(
                    f"the model's state diverges at generated character {len(drawn) - 1} ({symbols[x]!r}, sampling; "
                    f"state overflow (|h| > {MAX_STATE_ABS:g})); the generated text repeats a letter or pair whose "
                    "repeats diverge (`isan model check` lists them): lower the temperature or use top_k",
                    offset=len(drawn) - 1, cause=f"state overflow (|h| > {MAX_STATE_ABS:g})")
            return h

        ids, bits = sample_ids(lambda h: p.W_ro @ h + p.b_ro, step, state.h.copy(), n, temperature, top_k, seed)
        return Sample(prompt, self.alphabet.decode(ids), bits, seed, temperature, top_k, prep.text, prep.report)

    # ---- attribution --------------------------------------------------------------------
    def attribute(self, text: str, by: str = "char", state: State | None = None, unknown: str = "error",
                  replacement: str | None = None, tol: float = 1e-6, normalize: str | None = "auto") -> Attribution:
        """Exact attribution of each logit to the initial state and to each character or word.

        ``kappa[t, s] = W_ro (W[x_t] ... W[x_{s+1}]) b[x_s]`` with ``b[x_0] := h`` (paper eqs. 4-6).
        Word sources (``by="word"``) are maximal runs of non-space or of space characters;
        their kappa comes from the composed bias of the word carried forward (section 3.4).

        Raises:
            AttributionCheckError: ``b_ro + sum_s kappa[t, s]`` differs from the logits by more
                than ``tol * max(1, max |logits|)`` (never expected; it guards the promise).
            TextTooLongError: more than MAX_ATTRIBUTION_CHARS characters (memory is O(T^2 V)).
            StateDivergedError: the state leaves its range inside the text.
        """
        if by not in ("char", "word"):
            raise IsanError(f"by must be 'char' or 'word'; got {by!r}")
        state = self._state(state)
        prep = self.prepare(text, normalize, unknown, replacement, state)
        ids, text = prep.ids, prep.text
        if len(ids) == 0:
            raise EmptyTextError("the text to attribute is empty (after normalisation); give at least one character")
        if len(ids) > MAX_ATTRIBUTION_CHARS:
            raise TextTooLongError(f"attribution of {len(ids)} characters needs O(T^2) memory; give at most "
                                   f"{MAX_ATTRIBUTION_CHARS}, or attribute with a window (memory O(T N); "
                                   "isan.engine.analysis.attribution.windowed_attribution, `isan analyze attribute "
                                   "--window N`)")
        h = state.h
        p = self.params
        H = states_ref(p, ids, h)
        bad = check_states(H)
        if bad is not None:
            try:
                self._diverged(ids, h, "attribution", detected_at=bad)
            except StateDivergedError as e:
                raise in_input_terms(e, prep, self.alphabet.symbols) from None
        if by == "char" or self.alphabet.kind == "words":
            spans = [(i, i + 1) for i in range(len(ids))]
            kappa = kappa_ref(p, ids, h)
        else:
            spans = word_spans(ids, text, self.alphabet)
            kappa = segment_kappa_ref(p, ids, spans, h)
        logits = H @ p.W_ro.T + p.b_ro
        err = float(np.abs(p.b_ro + kappa.sum(axis=1) - logits).max())
        if err > tol * max(1.0, float(np.abs(logits).max())):
            raise AttributionCheckError(f"b_ro + sum kappa differs from the logits by {err:.3g}")
        if self.alphabet.kind == "chars":
            sources = ["<h0>"] + [text[i:j] for i, j in spans]
        else:
            sources = ["<h0>"] + [self.alphabet.decode(ids[i:j]) for i, j in spans]
        return Attribution(text, by, sources, [(0, 0)] + spans, kappa, logits, p.b_ro.copy(), err, self.alphabet,
                           prep.report, prep.offsets, ids)

    # ---- diagnostics ----------------------------------------------------------------------
    def check_divergence(self, max_chars: int = 2000, beam: int = 16, search_chars: int = 200) -> dict:
        """Whether any input can make this model's state diverge (``isan model check``).

        Returns :func:`isan.engine.divergence.repeat_divergence`'s report (every repeated letter
        and pair decided by its spectral radius, with the characters until the state leaves the
        range) plus ``"certificate"`` (:func:`isan.engine.certificate.check_certificate`, recomputed
        from the bundle's files; None without one) and ``"adversarial"``
        (:func:`isan.engine.divergence.adversarial_search`: the worst text a beam search finds).
        """
        from isan.engine.certificate import check_certificate
        from isan.engine.divergence import adversarial_search, repeat_divergence

        p, labels = self.input_params, self.alphabet.input_labels
        out = repeat_divergence(p, labels, max_chars=max_chars)
        out["certificate"] = check_certificate(self.source, self.manifest, p.W, p.b, p.h0) if self.source else None
        out["adversarial"] = adversarial_search(p, labels, beam=beam, chars=search_chars)
        return out


def prepare_one(engine, text, state, normalize, unknown: str, replacement: str | None, per_char: bool):
    """(state, prepared text, None) for ``score`` of every engine, or the empty result of a streamed
    chunk that left nothing to score (a chunk of squeezed spaces) in the last place; a text that is
    empty otherwise is an EmptyTextError."""
    streaming = state is not None
    state = engine._state(state)
    prep = engine.prepare(text, normalize, unknown, replacement, state)
    if len(prep.ids):
        return state, prep, None
    if streaming and len(text):
        return state, prep, ScoreResult(0, 0.0, np.zeros(0) if per_char else None, state, prep.report,
                                        np.zeros(0, dtype=np.int64) if per_char else None, "" if per_char else None,
                                        **engine._units)
    raise EmptyTextError("the text is empty (after normalisation and removing unknown characters); "
                         "give at least one character")


def prepare_batch(engine, texts, states, normalize, unknown: str, replacement: str | None):
    """The states and prepared texts of a batch (``score_batch`` of every engine): each text's
    state checked (default: the initial state), each text normalised from its state; an error names
    the text of the batch, and a text left empty is an EmptyTextError."""
    states = [engine._state(s) for s in states] if states is not None else [engine.initial_state()] * len(texts)
    if len(states) != len(texts):
        raise IsanError(f"got {len(texts)} texts but {len(states)} states")
    preps = []
    for i, (t, s) in enumerate(zip(texts, states)):
        try:
            preps.append(engine.prepare(t, normalize, unknown, replacement, s))
        except IsanError as e:
            raise with_prefix(e, f"text {i} of the batch: ") from None
    for i, p in enumerate(preps):
        if len(p.ids) == 0:
            raise EmptyTextError(f"text {i} of the batch is empty (after normalisation)")
    return states, preps


class ProvenForgetting:
    """The fallback of chunk-parallel scoring for a certified model: never needed, because every
    start-state error provably dies within ``bound`` characters, fewer than a chunk has. Called
    anyway, it raises (a bug, not a property of the text)."""

    def __init__(self, bound: int):
        self.bound = bound

    def __call__(self, ids, h):
        raise RuntimeError(f"a certified model's chunk did not forget its start within {self.bound} characters; "
                           "please report this as a bug of isan")


def word_spans(ids: np.ndarray, text: str, alphabet) -> list[tuple[int, int]]:
    """Word sources as spans of symbol positions: maximal runs of non-space or of space symbols
    (characters: of the text; bytes: the space byte; pairs: a pair is a space only if both its
    characters are); a word model's symbols are its words, each its own source."""
    if alphabet.kind == "chars":
        return [m.span() for m in re.finditer(r"[^ ]+| +", text)]
    if alphabet.kind == "words":
        return [(k, k + 1) for k in range(len(ids))]
    labels = np.array([alphabet.decode([int(i)]).strip() == "" for i in range(len(alphabet))])
    space = labels[np.asarray(ids)]
    cuts = np.flatnonzero(np.diff(space.astype(np.int8))) + 1
    bounds = [0, *cuts.tolist(), len(ids)]
    return [(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]


def find_table(bundle: Path, manifest: dict, params: ISANParams, alphabet: Alphabet, progress_bar: bool = True):
    """The bundle's trie table: ``table/`` inside it, or its ``table_recipe.json`` composed into the
    cache on first use; None if it has neither. A broken table raises, never silently falls back."""
    from isan.trie_tables.build import RECIPE, cached_table
    from isan.trie_tables.format import load_table

    from isan.engine.bundle import table_view

    sha = manifest["params_sha256"]
    params, keys = table_view(params, alphabet)  # tables are keyed by output ids (tokens: private-use characters)
    if (bundle / "table").exists():
        return load_table(bundle / "table", sha, keys, params.d)
    if (bundle / RECIPE).exists():
        return cached_table(bundle / RECIPE, params, keys, sha, progress_bar=progress_bar)
    mode = (manifest.get("table") or {}).get("mode")
    if mode in ("full", "recipe"):  # the manifest promises a table that is not there
        where = bundle / ("table" if mode == "full" else RECIPE)
        raise TableFormatError(f"{where} is missing, but {bundle / 'manifest.json'} lists a {mode} table; rebuild it "
                               f"with `isan table build --model {bundle} --table-mode {mode}`, or score without it "
                               "with --path chunked")
    return None


def verify_all(bundle: str | Path) -> dict:
    """``isan verify``: :func:`isan.engine.bundle.verify_bundle` (every file hashed), plus the table
    a recipe composes into the cache and the ONNX graphs cached for a bundle that ships none.

    Returns the report of verify_bundle with ``cached_table`` and ``onnx`` ("ok", a problem, or
    None when there is nothing to check); ``ok`` covers them all.
    """
    from isan.engine.bundle import verify_bundle

    bundle = Path(bundle)
    r = verify_bundle(bundle)
    r.setdefault("cached_table", None)
    if r["format_version"] is None:
        return r
    from isan.engine.bundle import read_manifest

    m = read_manifest(bundle, verify="none")
    from isan.trie_tables.build import RECIPE

    if m["kind"] == "isan" and (bundle / RECIPE).is_file() and not (bundle / "table").exists():
        import hashlib
        import json

        from isan.trie_tables.build import cache_dir, read_recipe
        from isan.trie_tables.format import load_table

        try:
            recipe = read_recipe(bundle / RECIPE)
            key = hashlib.sha256(json.dumps([m["params_sha256"], recipe["keys"], recipe.get("dtype")]).encode()
                                 ).hexdigest()[:20]
            path = cache_dir() / "tables" / key
            if (path / "header.json").exists():
                from isan.engine.bundle import key_alphabet, manifest_alphabet

                load_table(path, m["params_sha256"], key_alphabet(manifest_alphabet(m)), m["d"], verify=True)
                r["cached_table"] = "ok"
            else:
                r["cached_table"] = None  # not composed yet: nothing to check
        except TableFormatError as e:
            r["cached_table"] = f"{e} (it is rebuilt on the next use)"
            r["problems"].append(r["cached_table"])
    files = m.get("files") or {}
    graphs = [f for f in ("model.onnx", "sequence.onnx") if f in files]
    if graphs:
        bad = [f"{f}: {r['checked'][f]}" for f in graphs if r["checked"].get(f) != "ok"]
        r["onnx"] = "ok" if not bad else "; ".join(bad)
    elif "onnx" not in m and m["kind"] != "ngram":
        from isan.engine.runners.onnx_graphs import check_cached_graphs, onnx_cache_path

        path = onnx_cache_path(m)
        if (path / "graphs.json").exists():
            problem = check_cached_graphs(path, m["params_sha256"])
            r["onnx"] = "ok" if problem is None else f"{problem} (rebuilt on the next use)"
            if problem:
                r["problems"].append(r["onnx"])
    r["ok"] = not r["problems"]
    return r


def load_engine(model: str | Path | None = None, path: str = "auto", backend: str = "numpy", device: str = "cpu",
                dtype: str = "float32"):
    """Load a bundle (``None``: the default model) with the chosen computation path and backend.

    Args:
        path: ``"auto"`` (ISAN bundles: composed when the bundle has a table, else chunked; other
            models: their runner's own path), ``"composed"`` (long texts and batches chunk-parallel
            by the kernel :meth:`Engine._batch_plan` chooses), ``"chunked"`` (chunk-parallel
            through the compiled per-symbol kernel, ISAN bundles only), ``"jumps"`` (always
            chunk-parallel by composed jumps, ISAN bundles with a table) or ``"reference"``.
        backend: ``"numpy"`` or ``"onnx"`` (onnxruntime over the bundle's ONNX graphs; the
            provider that runs is reported in ``describe()``, never silently swapped).
        device: ``"cpu"``, ``"cuda"`` (``"cuda:N"``) or ``"auto"``. The numpy backend scores ISAN
            bundles on a GPU with the torch backend of the kernels (:meth:`Engine.load`); the onnx
            backend picks onnxruntime's provider. Never ignored: a device no backend can honour is
            an error.
        dtype: ``"float32"`` or ``"float64"`` (ISAN bundles on the torch backend; float64 is the
            exact reference on the device).
    Returns:
        an :class:`Engine` for ISAN bundles on the numpy backend, else an engine with the same
        scoring API (``score``, ``score_batch``, ``advance``, ``top_k``, ``sample``, ``describe``).
    Raises:
        BundleFormatError, TableFormatError, IsanError: with a message that says how to fix it.
    """
    from isan.engine.bundle import read_manifest

    if backend not in ("numpy", "onnx"):
        raise IsanError(f"backend must be numpy or onnx; got {backend!r}")
    if path not in ("auto",) + PATHS:
        raise IsanError(f"path must be auto or one of {', '.join(PATHS)}; got {path!r}")
    src = default_model_path() if model is None else Path(model)
    if backend == "onnx":
        if dtype != "float32":
            raise IsanError(f"the onnx backend computes in float32; dtype {dtype!r} needs the numpy backend")
        from isan.engine.runners.onnx import load_onnx_engine

        return load_onnx_engine(src, device=device, path_mode=path)
    kind = read_manifest(src, verify="none")["kind"]  # the loader below verifies
    if kind != "isan" and (device != "cpu" or dtype != "float32"):
        raise IsanError(f"device {device!r} and dtype {dtype!r} run ISAN bundles (this is a {kind!r} bundle): "
                        "use device cpu, or --backend onnx for onnxruntime's providers")
    if kind != "isan":
        if path in ("composed", "chunked", "jumps"):
            raise IsanError(f"the {path} path runs ISAN bundles only (this is a {kind!r} bundle); "
                            "use --path auto or reference")
        if kind == "ngram":
            from isan.engine.runners.ngram import load_ngram_engine

            return load_ngram_engine(src)
        if kind in ("linear", "linear_nlro", "isan_nobias"):
            from isan.engine.runners.linear import load_linear_engine

            return load_linear_engine(src)
        from isan.engine.runners.occam import OCCAM_KINDS
        from isan.engine.runners.reservoir import RESERVOIR_KINDS

        if kind in RESERVOIR_KINDS:  # ESN and NPM baselines (Cernansky et al. 2008)
            from isan.engine.runners.recurrent import RunnerEngine
            from isan.engine.runners.reservoir import load_reservoir_bundle

            runner = load_reservoir_bundle(src)
            return RunnerEngine(runner, runner.alphabet, runner.manifest, source=str(src), path="reference")
        if kind in OCCAM_KINDS:  # the Occam-gated LSTM (Raiman and Sidor)
            from isan.engine.runners.recurrent import RunnerEngine, load_params_bundle
            from isan.engine.runners.occam import NumpyOccamRunner, OccamParams

            m, p, alphabet = load_params_bundle(src, OCCAM_KINDS, OccamParams)
            return RunnerEngine(NumpyOccamRunner(p), alphabet, m, source=str(src), path="reference")
        from isan.engine.runners.recurrent import load_baseline_engine

        return load_baseline_engine(src)
    return Engine.load(src, path_mode=path, device=device, dtype=dtype)
