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

import copy
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from isan.alphabet import Alphabet
from isan.errors import IsanError, StateDivergedError, TableFormatError
from isan.params import ISANParams, expand_inputs
from isan.tokens import alphabet_label
from isan.engine.bundle import load_isan_bundle
from isan.engine.guard import MAX_STATE_ABS, check_bits, check_states, raise_diverged
from isan.engine.normalize import Normalizer, Prepared, from_manifest, prepare, resolve
from isan.engine.packed import Packed
import isan.engine.exact as exact
from isan.engine.exact import ReferencePath
from isan.engine.reference import LOG2E, log_softmax
from isan.engine.kernels.backends import Backend
from isan.engine.kernels.plan import Kernel, Plan
from isan.engine.paths import default_model_path, find_table
from isan.engine.planning import Planner
from isan.engine.prepare import prepare_batch, prepare_one
from isan.engine.results import Attribution, Sample, ScoreResult, State, in_input_terms, with_prefix
from isan.engine.route import PATH_ROUTES, Route, Routes, Way, check_path



class Engine:
    """An immutable ISAN with numpy inference; safe to share across threads.

    Construct with :meth:`load` (a bundle directory) or :meth:`default` (the shipped model).
    The reference path computes in float64 one character at a time.
    """

    def __init__(self, params: ISANParams, alphabet: Alphabet, manifest: dict | None = None,
                 source: str | None = None, table=None, path: str | None = None, threads: int | None = None,
                 device: str = "cpu", dtype: str = "float32", kernels: "str | Backend | None" = None):
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
        self._composed = None  # the sequential composed path (composed.py), with a table
        if table is not None:
            from isan.engine.composed import ComposedPath

            self._composed = ComposedPath(table, self.params32, symbols=alphabet.symbols)
        #: the reference path (float64 numpy, one character at a time)
        self.reference = ReferencePath(self.params, alphabet.symbols)
        from isan.engine.kernels import default_threads, native

        self.threads = int(threads) if threads else default_threads()
        if self.threads < 1:
            raise IsanError(f"threads must be >= 1; got {threads}")
        native()  # says once if the compiled kernels are missing
        #: the runtime that scores: ``"numpy"`` (this Engine: numpy and the compiled kernels) or
        #: ``"onnx"`` (:mod:`isan.engine.baselines.onnx`); ``kernels`` is the kernel backend
        self.runtime = "numpy"
        from isan.engine.kernels.backends import get_backend

        #: the kernels' backend (:mod:`isan.engine.kernels.backends`): the compiled kernels on the
        #: CPU; the torch backend on a GPU (``device="cuda"``) or for ``dtype="float64"``
        self.kernels = get_backend(kernels, device, dtype)
        self._planner = Planner(self.params32, self.params, self.input_params, table, self.kernels, source,
                                self.manifest)
        #: how texts and batches are scored (:class:`~isan.engine.route.Routes`), resolved once
        self.routes = Routes.resolve(path, table is not None, self.kernels.runs_tables, source or "this model",
                                     self.kernels.device, self.kernels.dtype)

    @property
    def path(self) -> str:
        """The computation path (one of :data:`~isan.engine.route.PATHS`), as resolved for the backend."""
        return self.routes.path

    # ---- construction -----------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, path_mode: str = "auto", progress_bar: bool = True, device: str = "cpu",
             dtype: str = "float32", kernels: "str | Backend | None" = None, **kernel_options) -> "Engine":
        """Load a bundle directory written by ``isan export``.

        Args:
            path_mode: ``"auto"`` (composed when the bundle has a table or a table recipe, else
                chunked), ``"composed"`` (error without a table), ``"chunked"`` (chunk-parallel,
                no table needed), ``"jumps"`` (chunk-parallel by the table's composed jumps; error
                without a table) or ``"reference"``. On the composed path, texts of
                :data:`~isan.engine.route.CHUNKED_MIN_CHARS` characters or more are scored
                chunk-parallel (by composed jumps when they make enough chunks: :meth:`plan`).
            progress_bar: show a progress bar if a table recipe must be composed on first use.
            device: ``"cpu"`` (the compiled kernels), ``"cuda"``/``"cuda:N"`` (the torch backend on
                that GPU: every text and batch chunk-parallel there) or ``"auto"`` (CUDA when torch
                sees a GPU); see :mod:`isan.engine.kernels.backends`.
            dtype: ``"float32"`` or ``"float64"`` (the torch backend's exact reference arithmetic).
            kernels: the backend by name (``"native"``, ``"numpy"``, ``"torch"``; default: native
                on the CPU in float32, else torch), or one already built; ``kernel_options`` are its own
                (:func:`~isan.engine.kernels.backends.get_backend`: torch's ``step`` and ``precision``).
        Raises:
            BackendUnavailableError: a GPU asked for where torch or CUDA is missing.
            BundleFormatError: missing, corrupt or mismatched files (the message says how to rebuild).
            TableFormatError: the bundle's table is corrupt or belongs to another model.
        """
        check_path(path_mode, auto=True)
        from isan.engine.kernels.backends import get_backend

        backend = get_backend(kernels, device, dtype, **kernel_options)  # a missing GPU or torch: said first
        manifest, params, alphabet = load_isan_bundle(path)
        table = None
        if (path_mode == "auto" or PATH_ROUTES[path_mode].needs_table) and backend.runs_tables:
            table = find_table(Path(path), manifest, params, alphabet, progress_bar=progress_bar)
        return cls(params, alphabet, manifest, source=str(path), table=table, kernels=backend,
                   path=None if path_mode == "auto" else path_mode, device=backend.device, dtype=backend.dtype)

    @classmethod
    def default(cls, path_mode: str = "auto", device: str = "cpu", dtype: str = "float32",
                kernels: "str | Backend | None" = None) -> "Engine":
        """The default model shipped in the package (ISAN d=216 trained on text8-10M); the keywords
        are :meth:`load`'s."""
        return cls.load(default_model_path(), path_mode=path_mode, device=device, dtype=dtype, kernels=kernels)

    def with_path(self, path: str, threads: int | None = None) -> "Engine":
        """The same model on another computation path (one of :data:`~isan.engine.route.PATHS`), with the same kernel
        backend object (its options and caches) and the same planner (the certificate and the kernel
        layouts it built); ``threads``: the kernels' threads (default: this engine's).

        Raises:
            IsanError, TableFormatError: as :class:`Engine` for the path or the threads.
        """
        other = copy.copy(self)  # the model, tables, backend and planner shared: an Engine is immutable
        if threads is not None:
            if int(threads) < 1:
                raise IsanError(f"threads must be >= 1; got {threads}")
            other.threads = int(threads)
        other.routes = Routes.resolve(path, self.table is not None, self.kernels.runs_tables,
                                      self.source or "this model", self.kernels.device, self.kernels.dtype)
        return other

    @property
    def device(self) -> str:
        """Where the kernels run: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""
        return self.kernels.device

    @property
    def backend(self) -> str:
        """Deprecated alias of :attr:`runtime` (``"numpy"``), kept for a release; the kernel backend is :attr:`kernels`."""
        warnings.warn("Engine.backend is deprecated: use Engine.runtime (the kernel backend is Engine.kernels)",
                      DeprecationWarning, stacklevel=2)
        return self.runtime

    @property
    def composed(self):
        """The sequential composed path over the trie table
        (:class:`~isan.engine.composed.ComposedPath`), or None without a table."""
        return self._composed

    def stream_model(self):
        """The weights in the compiled kernels' layout (:class:`~isan.engine.kernels.streams.StreamModel`;
        built on first use, ~30 ms)."""
        return self._planner.stream_model()

    def jump_table(self, dtype: str = "float32"):
        """The trie table as a :class:`~isan.engine.kernels.jumps.JumpTable` for the batched
        kernel (``dtype``: ``"float32"``, exact, or ``"float16"``, not exact; packed on first use).

        Raises:
            TableFormatError: the engine has no trie table.
        """
        if self.table is None:
            raise TableFormatError("this engine has no trie table for composed jumps; use path='chunked'")
        return self._planner.jump_table(dtype)

    def plan(self, lengths: Sequence[int], threads: int | None = None, cut: bool = True,
             kernel: "Kernel | str" = Kernel.AUTO, chunks: Sequence[int] | None = None) -> Plan:
        """The whole plan of a chunk-parallel batch of texts of these lengths: the kernel backend's,
        completed by the engine's planner (:meth:`isan.engine.planning.Planner.plan`).

        Args:
            lengths: characters (symbols) of each text.
            threads: kernel threads (default: the engine's).
            cut: False for one row a text.
            kernel: :class:`~isan.engine.kernels.plan.Kernel` or its name: ``"chunked"`` (one
                character a step, :mod:`~isan.engine.kernels.streams`), ``"jumps"`` (composed jumps,
                :mod:`~isan.engine.kernels.jumps`; ``"jumps-f16"``: float16 matrices, not exact, for
                the benchmark) or ``"auto"``: jumps when the engine has a trie table and the batch
                makes at least ``MIN_ROWS_PER_THREAD`` rows a thread for them, else chunked. The torch
                backend has one kernel (``"torch"``), cut for the device, and ignores it.
            chunks: each text's chunk count, instead of the backend's cut.
        Returns:
            :class:`~isan.engine.kernels.plan.Plan`: what :func:`~isan.engine.kernels.chunked.score_texts_chunked` runs.
        Raises:
            IsanError: an unknown kernel, or chunk counts that do not match ``lengths``.
        """
        how = chunks if chunks is not None else ("auto" if cut else "none")
        return self._planner.plan(lengths, threads or self.threads, how, kernel)

    # ---- basic facts --------------------------------------------------------------------
    @property
    def units(self) -> dict:
        """The result fields every score carries: ``{"unit", "V"}``."""
        return {"unit": self.alphabet.unit, "V": len(self.alphabet)}

    d = property(lambda self: self.params.d, doc="The state's size d.")

    @property
    def params_sha256(self) -> str:
        return self.manifest.get("params_sha256") or self.params32.sha256()

    def describe(self) -> dict:
        from isan.engine.kernels import native_status

        k = native_status()
        out = {"kind": "isan", "d": self.d, "alphabet": alphabet_label(self.alphabet), "unit": self.alphabet.unit,
               "path": self.path, "backend": self.runtime, "source": self.source,
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

    def check_state(self, state: State | None) -> State:
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
                text of :data:`~isan.engine.route.CHUNKED_MIN_CHARS` characters or more is scored chunk-parallel; the
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
            bits, h, scoring = self._run(self.route(len(ids), path), ids, state.h, threads, want_bits=True,
                                         checked=True)
        except StateDivergedError as e:
            raise in_input_terms(e, prep, self.alphabet.symbols) from None
        total = float(bits.sum())
        new = State(h, state.chars + len(ids), state.bits + total, prep.last_symbol)
        return ScoreResult(len(ids), total, bits if per_char else None, new, prep.report,
                           prep.offsets if per_char else None, prep.text if per_char else None, scoring,
                           **self.units)

    def route(self, n: int, path: str | None = None) -> Route:
        """The route of a text of ``n`` characters (:meth:`isan.engine.route.Routes.for_text`): a
        call's ``path`` as asked, else the engine's (on the composed path a text of
        :data:`~isan.engine.route.CHUNKED_MIN_CHARS` characters or more goes chunk-parallel)."""
        return self.routes.for_text(n, path)

    def _run(self, route: Route, ids: np.ndarray, h: np.ndarray, threads: int | None, want_bits: bool,
             block: int = 4096, checked: bool = False) -> tuple[np.ndarray | None, np.ndarray, dict]:
        """One text along ``route``: (bits (T,) float64 or None without ``want_bits``, final state (d,)
        float64, scoring report); ``block``: the reference path's characters a block; ``checked``:
        the ids were prepared here (:meth:`prepare`: each in the alphabet), so they are packed for
        the kernels without a second look. Raises StateDivergedError."""
        if route.way is Way.CHUNK_PARALLEL:
            batch = Packed.of([ids], below=len(self.alphabet) if checked else None)
            bits, finals, rep = self.score_ids(batch, h[None], chunks=route.chunks, want_bits=want_bits,
                                               threads=threads, kernel=route.kernel)
            return (bits[0] if want_bits else None), finals[0].astype(np.float64), self._planner.report(rep)
        if route.way is Way.COMPOSED:
            bits = None
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging state is reported below
                if want_bits:
                    bits, hf = self._composed.score(ids, h.astype(np.float32), threads=threads or self.threads)
                else:
                    hf = self._composed.advance(ids, h.astype(np.float32), threads=threads or self.threads)
            hf = hf.astype(np.float64)
            self._check_output(ids, h, bits, hf, "composed")
            return bits, hf, {"path": "composed"}
        if want_bits:
            return (*self.reference.score(ids, h, block), {"path": "reference"})
        return None, self.reference.advance(ids, h, block), {"path": "reference"}

    def min_chunk(self) -> int:
        """The shortest chunk chunk-parallel scoring cuts on the CPU kernels, in characters: MIN_CHUNK
        (1,024), or, for a certified model whose certificate proves forgetting only after more
        characters (``forget_bound_chars()``: 1,064 for text8-d216-distil), that many rounded up to a
        multiple of 256, so that every chunk provably corrects itself
        (:class:`~isan.engine.forgetting.ProvenForgetting`)."""
        return self._planner.min_chunk()

    def chunk_fallback(self, lengths: Sequence[int] | None = None, chunks: Sequence[int] | None = None):
        """What chunk-parallel scoring does with a chunk whose correction does not converge: a
        certified model forgets any start-state error within ``forget_bound_chars()`` characters, so
        where every chunk is at least that long (the plan's chunks are :meth:`min_chunk` or longer;
        chunk counts a caller gives are checked: ``lengths`` and ``chunks``) none can need the float64
        fallback (:class:`~isan.engine.forgetting.ProvenForgetting`); otherwise (no certificate,
        shorter chunks, or a backend whose chunks and tolerance are the device's)
        :class:`~isan.engine.kernels.chunked.Float64Fallback`, which redoes in float64 a chunk whose
        correction does not settle (the backend decides: :meth:`Backend.fallback`)."""
        return self._planner.fallback(lengths, chunks)

    def score_ids(self, ids_list: Sequence[np.ndarray], hs: np.ndarray, *, chunks: str | Sequence[int] = "auto",
                  want_bits: bool | str = True, threads: int | None = None, kernel: "Kernel | str" = Kernel.AUTO,
                  where: str | None = None):
        """Score texts already in ids, chunk-parallel, all as rows of one batch on the engine's
        backend: one batch of :func:`isan.engine.batches.score_batches` (the way every batch is
        scored), under :meth:`score`, :meth:`score_batch`, :meth:`advance` and the server's rounds.

        Args:
            ids_list: B int arrays of symbol ids (output ids), each non-empty, or a
                :class:`~isan.engine.packed.Packed` of them; hs: (B, d) the state before each, or
                (d,) the state before every one.
            chunks: ``"auto"`` (long texts cut by the backend's plan, :meth:`plan`),
                ``"none"`` (one row a text) or the chunk count of each text (a corpus cuts each
                document by its own length, so that its bits do not depend on its batch).
            want_bits: False to advance the states only (no readout); ``"totals"`` for each text's
                total bits alone (reduced on the device by a backend that can: no per-character bits).
            threads: kernel threads (default: the engine's).
            kernel: :class:`~isan.engine.kernels.plan.Kernel` or its name (:meth:`plan`; the torch
                backend has one kernel and ignores it).
            where: the path an error names (default: the kernel's name).
        Returns:
            (bits per text: a :class:`~isan.engine.packed.PackedBits` of B float64 arrays (none: B
            empty arrays; ``"totals"``: one (B,) float64 array), final
            states (B, d) float32 or the backend's state dtype, :class:`~isan.engine.kernels.chunked.ChunkedReport`).
        Raises:
            StateDivergedError: a state leaves the range; located exactly by the float64 reference,
                naming the offset in its text, with ``text_index`` the text.
        """
        from isan.engine.batches import score_batches

        if want_bits not in (True, False, "totals"):
            raise ValueError(f"want_bits must be True, False or 'totals'; got {want_bits!r}")
        want = "totals" if want_bits == "totals" else "bits" if want_bits else "none"
        how = chunks if isinstance(chunks, str) else np.asarray(chunks, dtype=np.int64)
        (res,) = score_batches(self, [(ids_list, np.asarray(hs))], want, chunks=how, kernel=kernel, threads=threads,
                               where=where)
        if res.values is None:
            return [np.zeros(0)] * len(res.finals), res.finals, res.report
        return res.values, res.finals, res.report

    def certificate(self) -> dict | None:
        """The model's stability certificate (:func:`isan.engine.certificate.check_certificate`,
        recomputed from the bundle's files on first use and kept); None without one, or when it
        does not hold."""
        return self._planner.certificate()

    def forget_bound_chars(self, rtol: float | None = None, margin: float | None = None) -> int | None:
        """Characters after which any start-state error is within chunk-parallel scoring's stopping
        rule, proven by the certificate: ``cond(P) rho^t (2 state_bound) <= rtol / margin``
        (two states within the bound differ by at most twice it). None without a certificate."""
        return self._planner.forget_bound_chars(rtol, margin)

    def score_batch(self, texts: Sequence[str | np.ndarray], states: Sequence[State] | None = None,
                    per_char: bool = False, unknown: str = "error", replacement: str | None = None,
                    group: str | None = None, normalize: str | None = "auto",
                    threads: int | None = None) -> list[ScoreResult]:
        """Score many independent texts together (docs/guide/tables-and-speed.md: group work, never gather).

        Args:
            group: ``"auto"`` (the default on the composed path: every text a row of a compiled
                chunk-parallel kernel, long texts cut into chunks so that the rows keep both cores
                busy; composed jumps when the batch makes enough rows for them, else one character a
                step: :meth:`plan`), ``"chunked"`` (the same with the per-symbol kernel:
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
        route = self.routes.for_batch(group)
        hs = np.stack([s.h for s in states]) if states else np.zeros((0, self.d))
        scoring = None
        if route.way is Way.ENTRY:
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging state is reported below
                bits, finals = self._composed.score_batch(ids, hs, group="entry")
            scoring = {"path": "batched, grouped by entry"}
        else:
            try:
                bits, finals, rep = self.score_ids(ids, hs, chunks=route.chunks, threads=threads, kernel=route.kernel)
            except StateDivergedError as e:
                i = getattr(e, "text_index", 0)
                raise with_prefix(in_input_terms(e, preps[i], self.alphabet.symbols), f"text {i} of the batch: ") from None
            scoring = self._planner.report(rep)
        out = []
        for i, (s, b, hf, prep) in enumerate(zip(states, bits, finals, preps)):
            if route.way is Way.ENTRY:  # the compiled kernels check every state and bit themselves
                try:
                    self._check_output(prep.ids, s.h, b, hf, "batched (entry)")
                except StateDivergedError as e:
                    raise with_prefix(in_input_terms(e, prep, self.alphabet.symbols), f"text {i} of the batch: ") from None
            total = float(b.sum())
            out.append(ScoreResult(len(b), total, b if per_char else None,
                                   State(hf.astype(np.float64), s.chars + len(b), s.bits + total, prep.last_symbol),
                                   prep.report, prep.offsets if per_char else None, prep.text if per_char else None,
                                   scoring, **self.units))
        return out

    def advance(self, text: str | np.ndarray, state: State | None = None, unknown: str = "error",
                replacement: str | None = None, normalize: str | None = "auto", path: str | None = None,
                threads: int | None = None) -> State:
        """Ingest text without scoring it (no readout); totals are left unchanged.

        Raises:
            AlphabetError, StateDivergedError (as :meth:`score`).
        """
        state = self.check_state(state)
        prep = self.prepare(text, normalize, unknown, replacement, state)
        if len(prep.ids) == 0:
            return state
        try:
            h = self.advance_ids(prep.ids, state.h, path=path, threads=threads)
        except StateDivergedError as e:
            raise in_input_terms(e, prep, self.alphabet.symbols) from None
        return State(h, state.chars, state.bits, prep.last_symbol)

    def advance_ids(self, ids: np.ndarray, h: np.ndarray, block: int = 4096, path: str | None = None,
                    threads: int | None = None) -> np.ndarray:
        """The state (d,) float64 after ids already prepared, from ``h`` (d,); raises StateDivergedError."""
        return self._run(self.route(len(ids), path), ids, h, threads, want_bits=False, block=block)[1]

    # ---- next-character distribution ----------------------------------------------------
    def logits(self, state: State | None = None) -> np.ndarray:
        """Logits (V,) float64 for the next character: ``W_ro h + b_ro``."""
        h = self.check_state(state).h
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
        return exact.sample(self, prompt, n, temperature, top_k, seed, state, normalize)

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
            TextTooLongError: more than :data:`~isan.engine.exact.MAX_ATTRIBUTION_CHARS` characters (memory is O(T^2 V)).
            StateDivergedError: the state leaves its range inside the text.
        """
        return exact.attribute(self, text, by, state, unknown, replacement, tol, normalize)

    # ---- diagnostics ----------------------------------------------------------------------
    def check_divergence(self, max_chars: int = 2000, beam: int = 16, search_chars: int = 200) -> dict:
        """Whether any input can make this model's state diverge (``isan model check``).

        Returns :func:`isan.engine.divergence.repeat_divergence`'s report (every repeated letter
        and pair decided by its spectral radius, with the characters until the state leaves the
        range) plus ``"certificate"`` (:func:`isan.engine.certificate.check_certificate`, recomputed
        from the bundle's files; None without one) and ``"adversarial"``
        (:func:`isan.engine.divergence.adversarial_search`: the worst text a beam search finds).
        """
        return exact.check_divergence(self, max_chars, beam, search_chars)
