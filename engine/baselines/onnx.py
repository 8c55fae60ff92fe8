"""The ONNX backend: onnxruntime over a bundle's ``model.onnx`` and ``sequence.onnx``.

numpy and onnxruntime only (never torch); onnxruntime is imported when a runner is loaded,
so the engine works without it (the ``onnx`` extra, or ``gpu`` for CUDA: the command that
installs one is ``isan.errors.install_hint("onnx")``).

Graphs and the logits convention are described in :mod:`isan.engine.baselines.onnx_graphs`: the graph
logits are the readout *after* each token. Scoring follows the convention of docs/ARCHITECTURE.md
('The model and its conventions'), ``bits_t = -log2 softmax(readout of the state before x_t)[x_t]``:
the first character of a text is predicted from the incoming state by ``W_ro h + b_ro`` computed
here in float64 from ``weights.safetensors`` (the same tensors for the ISAN and the baselines),
every later one from the graph's logits after the previous character. Texts run through
``sequence.onnx`` in chunks (default 4096 characters) carrying the state, so memory stays bounded.

A state is a flat float64 vector: ``h`` (d,), or for the LSTM ``concat(h, c)`` (2 d,). Inside
onnxruntime the state is float32; it is returned as float64 without rounding, so carrying it
between calls gives the same numbers as one long call.

Integrity and divergence: each graph's sha256 is checked against the bundle's manifest (or the
cache's record) after its metadata; a bundle that ships no graphs (the default model) gets them
built into the user cache on first use (:func:`isan.engine.baselines.onnx_graphs.cached_graphs`). Every
chunk's logits must be finite and its final state in range (for an ISAN, the guard's
``MAX_STATE_ABS``); otherwise :class:`~isan.errors.StateDivergedError` names the offset (an ISAN's
first out-of-range state is located exactly with the float64 reference). A state that leaves the
range and comes back inside one chunk without overflowing float32 is not seen on this path.

Example:
    >>> runner = OnnxRunner.load("bundle/", device="cpu")
    >>> bits, state = runner.score_ids(ids, runner.initial_state())
    >>> runner.provider
    'CPUExecutionProvider'
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from isan.errors import BackendUnavailableError, BundleFormatError, IsanError, StateDivergedError, install_hint
from isan.engine.baselines import onnx_graphs
from isan.engine.baselines.onnx_graphs import ONNX_FORMAT, SEQUENCE_FILE, STEP_FILE, cached_graphs
from isan.engine.baselines.recurrent import LOG2E, RunnerEngine, bits_from_logits, log_softmax
from isan.engine.guard import MAX_STATE_ABS, raise_diverged

log = logging.getLogger(__name__)

ONNX_FORMAT_VERSION = str(onnx_graphs.ONNX_FORMAT_VERSION)  # as the graphs' metadata writes it
DEFAULT_CHUNK = 4096
DEVICES = ("cpu", "cuda", "auto")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def _ort():
    try:
        import onnxruntime
    except ImportError:
        raise BackendUnavailableError(f"the onnx backend needs onnxruntime: {install_hint('onnx')} "
                                      f"(or {install_hint('gpu')} for CUDA), or use --runtime numpy") from None
    return onnxruntime


def _rebuild_hint(bundle: Path) -> str:
    return (f"re-create the graphs with `isan export CHECKPOINT_DIR {bundle} --onnx --overwrite` "
            f"(or isan.export.onnx_export.export_bundle_onnx('{bundle}'))")


def expected_io(kind: str) -> dict[str, tuple[list[str], list[str]]]:
    """Input and output names of both graphs: {"step": (inputs, outputs), "sequence": (...)}."""
    st = ["h", "c"] if kind == "lstm" else ["h"]
    return {"step": (["token"] + st, ["logits"] + [f"{s}_next" for s in st]),
            "sequence": (["tokens"] + st, ["logits"] + [f"{s}_last" for s in st])}


def _providers(device: str) -> list[str]:
    if device not in DEVICES:
        raise IsanError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    available = _ort().get_available_providers()
    if device == "cpu":
        return [CPU]
    if CUDA in available:
        return [CUDA, CPU]  # CPU takes only the nodes CUDA lacks; which one ran is checked after loading
    if device == "cuda":
        raise BackendUnavailableError(
            f"device 'cuda' was asked for but onnxruntime offers only {available}; install onnxruntime-gpu "
            f"({install_hint('gpu')}) with a CUDA GPU, or use device 'cpu'")
    return [CPU]


class OnnxRunner:
    """An immutable model on onnxruntime (sessions are thread-safe for ``run``).

    Attributes:
        kind: "isan", "rnn", "irnn", "gru" or "lstm"; K, V, d: sizes.
        state_names: ["h"] or ["h", "c"]; state_size: length of the flat state vector.
        provider: the execution provider that actually runs the graphs
            ("CPUExecutionProvider" or "CUDAExecutionProvider").
        manifest: the bundle manifest; path: the bundle directory.
    """

    backend = "onnx"

    def __init__(self, path: Path, manifest: dict, readout_W: np.ndarray, readout_b: np.ndarray, h_init: np.ndarray,
                 step_session, seq_session, provider: str, chunk: int = DEFAULT_CHUNK):
        self.path = path
        self.manifest = manifest
        self.kind = manifest["kind"]
        self.W_ro = np.array(readout_W, dtype=np.float64)  # (V, d)
        self.b_ro = np.array(readout_b, dtype=np.float64)  # (V,)
        self._init = np.array(h_init, dtype=np.float64)
        self.V, self.d = self.W_ro.shape
        from isan.engine.bundle import manifest_alphabet

        self.K = len(manifest_alphabet(manifest))  # the graphs read output ids (token inputs are expanded)
        self.state_names = ["h", "c"] if self.kind == "lstm" else ["h"]
        self.state_size = len(self.state_names) * self.d
        self._step = step_session
        self._seq = seq_session
        self.provider = provider
        if chunk < 1:
            raise IsanError(f"chunk must be >= 1; got {chunk}")
        self.chunk = int(chunk)
        #: (W, b) of an ISAN, to locate a diverging state with the float64 reference (None otherwise)
        self.isan_Wb = None
        self.state_limit = MAX_STATE_ABS if self.kind == "isan" else np.inf
        self.graphs_dir = path

    # ---- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, bundle_dir: str | Path, device: str = "cpu", chunk: int = DEFAULT_CHUNK,
             threads: int | None = None) -> "OnnxRunner":
        """Open a bundle's ONNX graphs.

        Args:
            device: "cpu" (default), "cuda" (error if onnxruntime has no CUDA provider or it
                fails to start) or "auto" (CUDA when it runs, else CPU; ``provider`` says which).
            chunk: characters per ``sequence.onnx`` call.
            threads: onnxruntime intra-op threads (None: its default).
        Raises:
            BundleFormatError: the bundle, its weights, or a graph is missing, corrupt, of another
                format version, or belongs to other weights (``params_sha256``); the message
                says to re-run ``isan export --onnx``.
            BackendUnavailableError: onnxruntime or the asked-for CUDA provider is missing.
        """
        from isan.engine.bundle import read_manifest

        path = Path(bundle_dir)
        providers = _providers(device)
        manifest = read_manifest(path)
        kind = manifest["kind"]
        isan_Wb = None
        if kind == "isan":
            from isan.engine.bundle import load_isan_bundle

            _, p, _ = load_isan_bundle(path)  # validates shapes and params_sha256
            W_ro, b_ro, init = p.W_ro, p.b_ro, p.h0
            isan_Wb = (p.W, p.b)
        else:
            from isan.engine.baselines.recurrent import BASELINE_KINDS, load_baseline_bundle

            if kind not in BASELINE_KINDS:
                raise BundleFormatError(f"{path} holds a {kind!r} model; the onnx backend runs isan, "
                                        f"{', '.join(BASELINE_KINDS)}")
            _, p, _ = load_baseline_bundle(path)
            W_ro, b_ro, init = p.tensors["W_ro"], p.tensors["b_ro"], p.initial_state()
        io = expected_io(kind)
        graphs_dir, expected = _graphs(path, manifest)
        sessions = {}
        for which, fname in (("step", STEP_FILE), ("sequence", SEQUENCE_FILE)):
            _check_graph_file(graphs_dir / fname, expected.get(fname), path)  # before onnxruntime parses it
            sessions[which] = _open_session(graphs_dir / fname, which, manifest, io[which], providers, threads,
                                            bundle=path)
        used = {s.get_providers()[0] for s in sessions.values()}
        provider = CUDA if used == {CUDA} else CPU
        if device == "cuda" and provider != CUDA:
            raise BackendUnavailableError(
                f"device 'cuda' was asked for but onnxruntime could not start the CUDA provider (sessions run on "
                f"{sorted(used)}); check the CUDA/cuDNN libraries of onnxruntime-gpu, or use device 'cpu'")
        if device == "auto" and CUDA in providers and provider != CUDA:
            log.warning("CUDA provider is installed but did not start; running on CPU")
        log.info("loaded %s ONNX graphs of %s (from %s) on %s", kind, path, graphs_dir, provider)
        runner = cls(path, manifest, W_ro, b_ro, init, sessions["step"], sessions["sequence"], provider, chunk)
        runner.isan_Wb = isan_Wb
        runner.graphs_dir = graphs_dir
        return runner

    def _check_chunk(self, ids: np.ndarray, state: np.ndarray, L: np.ndarray, s_after: np.ndarray, base: int) -> None:
        """Raise StateDivergedError if a chunk's logits are not finite or its final state is out of range.

        Args:
            ids: the chunk's ids (T,); state: the flat state before it; L: logits (T, V) after
            each id; s_after: the state after the chunk; base: the chunk's offset in the text.
        """
        bad_rows = ~np.isfinite(L).all(axis=-1)
        if not bad_rows.any() and np.all(np.isfinite(s_after)) and np.abs(s_after).max(initial=0.0) <= self.state_limit:
            return
        at = int(np.argmax(bad_rows)) if bad_rows.any() else None
        if self.isan_Wb is not None:
            raise_diverged(self.isan_Wb[0], self.isan_Wb[1], ids, np.asarray(state, dtype=np.float64)[: self.d],
                           "onnx", detected_at=at, base_offset=base)
        cause = "non-finite logits" if at is not None else "non-finite state"
        where = f"at character offset {base + at}" if at is not None else f"in the characters from offset {base}"
        raise StateDivergedError(f"the {self.kind} model's state diverges {where} ({cause}, onnx backend); the "
                                 "model cannot score this text meaningfully",
                                 offset=None if at is None else base + at, cause=cause)

    # ---- states and readout ------------------------------------------------------------------
    def initial_state(self) -> np.ndarray:
        """The learned initial state, flat float64 (S,): h0, or concat(h0, c0) for the LSTM."""
        return self._init.copy()

    def readout(self, state: np.ndarray) -> np.ndarray:
        """Logits float64 ``W_ro h + b_ro`` of flat states (..., S) -> (..., V)."""
        return np.asarray(state, dtype=np.float64)[..., : self.d] @ self.W_ro.T + self.b_ro

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.K):
            raise IsanError(f"ids must be in [0, {self.K}); got values in [{ids.min()}, {ids.max()}]")
        return ids

    def _check_states(self, states, B: int) -> np.ndarray:
        s = np.asarray(states, dtype=np.float32)
        if s.ndim == 1:
            s = s[None, :]
        if s.shape != (B, self.state_size):
            raise IsanError(f"states must have shape ({B}, {self.state_size}) "
                            f"({'+'.join(self.state_names)}); got {np.shape(states)}")
        return s

    def _feeds(self, tok_name: str, tokens: np.ndarray, states: np.ndarray) -> dict:
        feeds = {tok_name: np.ascontiguousarray(tokens, dtype=np.int64)}
        for i, n in enumerate(self.state_names):
            feeds[n] = np.ascontiguousarray(states[:, i * self.d:(i + 1) * self.d], dtype=np.float32)
        return feeds

    # ---- raw graphs --------------------------------------------------------------------------
    def step(self, tokens: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One step of B streams with ``model.onnx``.

        Args:
            tokens: int64 (B,); states: (B, S) (float32 or float64; flat states).
        Returns:
            (logits float32 (B, V): the readout *after* the tokens, predicting the next ones;
            new states float32 (B, S)).
        """
        tokens = self._check_ids(np.atleast_1d(tokens))
        states = self._check_states(states, len(tokens))
        out = self._step.run(None, self._feeds("token", tokens, states))
        return out[0], np.concatenate(out[1:], axis=1)

    def sequence(self, tokens: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One ``sequence.onnx`` call (no chunking): tokens int64 (B, T), states (B, S) ->
        (logits float32 (B, T, V), logits[:, t] the readout after tokens[:, t]; states (B, S) float32)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise IsanError(f"tokens must have shape (B, T) with T >= 1; got {tokens.shape}")
        states = self._check_states(states, tokens.shape[0])
        out = self._seq.run(None, self._feeds("tokens", tokens, states))
        return out[0], np.concatenate(out[1:], axis=1)

    # ---- scoring -----------------------------------------------------------------------------
    def score_ids(self, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bits of each character and the state after them.

        Args:
            ids: int64 (T,); state: flat state (S,) before ids[0].
        Returns:
            (bits float64 (T,), ``bits_t = -log2 softmax(readout before x_t)[x_t]``;
            the state after ids[-1], float64 (S,)).
        """
        ids = self._check_ids(ids)
        state = np.asarray(state, dtype=np.float64)
        s = self._check_states(state, 1)
        bits = np.empty(len(ids))
        prev = self.readout(state)  # predicts ids[0]
        for start in range(0, len(ids), self.chunk):
            x = ids[start:start + self.chunk]
            before = s
            L, s = self.sequence(x[None, :], s)
            self._check_chunk(x, before[0], L[0], s[0], start)
            bits[start:start + len(x)] = bits_from_logits(np.vstack([prev[None, :], L[0, :-1]]), x)
            prev = L[0, -1]
        return bits, (s[0].astype(np.float64) if len(ids) else state.copy())

    def advance_ids(self, ids: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The state (S,) float64 after ``ids`` (T,), without scoring."""
        ids = self._check_ids(ids)
        if len(ids) == 0:
            return np.array(state, dtype=np.float64)
        s = self._check_states(state, 1)
        for start in range(0, len(ids), self.chunk):
            x = ids[start:start + self.chunk]
            before = s
            L, s = self.sequence(x[None, :], s)
            self._check_chunk(x, before[0], L[0], s[0], start)
        return s[0].astype(np.float64)

    def score_batch(self, ids_list: Sequence[np.ndarray], states: Sequence[np.ndarray] | None = None
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Score many independent texts as one batch of streams (for throughput).

        Streams advance together through ``sequence.onnx``; each call spans at most ``chunk``
        characters and stops where the shortest active text ends, so no padding ever enters a
        state. Returns [(bits float64 (T_i,), state float64 (S,))], equal to :meth:`score_ids`
        of each text alone within float32 rounding.
        """
        ids_list = [self._check_ids(x) for x in ids_list]
        n = len(ids_list)
        if n == 0:
            return []
        init = [self.initial_state()] * n if states is None else [np.asarray(s, dtype=np.float64) for s in states]
        if len(init) != n:
            raise IsanError(f"got {n} texts but {len(init)} states")
        S = self._check_states(np.stack(init), n).copy()
        prev = self.readout(np.stack(init))  # (n, V) float64
        lens = np.array([len(x) for x in ids_list])
        bits = [np.empty(L) for L in lens]
        order = np.argsort(-lens, kind="stable")
        pos = 0
        while True:
            active = np.array([i for i in order if lens[i] > pos], dtype=np.int64)
            if len(active) == 0:
                break
            steps = int(min(self.chunk, lens[active].min() - pos))
            X = np.stack([ids_list[i][pos:pos + steps] for i in active])  # (A, steps)
            L, S_new = self.sequence(X, S[active])
            for j, i in enumerate(active):
                try:
                    self._check_chunk(X[j], S[i], L[j], S_new[j], pos)
                except StateDivergedError as e:
                    raise StateDivergedError(f"text {i} of the batch: {e}", offset=e.offset, cause=e.cause) from None
            before = np.concatenate([prev[active][:, None, :], L[:, :-1]], axis=1)  # (A, steps, V)
            lp = log_softmax(before.astype(np.float64))
            b = -np.take_along_axis(lp, X[:, :, None], axis=2)[:, :, 0] * LOG2E
            for j, i in enumerate(active):
                bits[i][pos:pos + steps] = b[j]
            S[active] = S_new
            prev[active] = L[:, -1]
            pos += steps
        return [(bits[i], S[i].astype(np.float64) if lens[i] else init[i].copy()) for i in range(n)]


def _check_graph_file(file: Path, want: dict | None, bundle: Path) -> None:
    """Refuse a graph whose size or sha256 differs from its record, before any parser reads it."""
    if want is None or not file.is_file():
        return
    from isan.jsonfile import file_sha256

    size = file.stat().st_size
    if want.get("bytes") is not None and size != want["bytes"]:
        raise BundleFormatError(f"{file} has {size:,} bytes, the manifest records {want['bytes']:,} (truncated or "
                                f"replaced); {_rebuild_hint(bundle)}")
    if file_sha256(file) != want["sha256"]:
        raise BundleFormatError(f"{file} does not match its sha256 in the manifest (corrupt or edited); "
                                f"{_rebuild_hint(bundle)}")


def _is_shipped(bundle: Path) -> bool:
    """Whether ``bundle`` is one of the models shipped inside the package (never written to)."""
    from isan.engine.paths import default_model_path

    try:
        return bundle.resolve().parent == default_model_path().resolve().parent
    except OSError:
        return False


def _graphs(bundle: Path, manifest: dict) -> tuple[Path, dict[str, dict]]:
    """Where a bundle's graphs are and their records ({file name: {"sha256", "bytes"}}).

    A bundle with graphs (or whose manifest says it has them) uses its own (a missing file is
    then an error naming the export command); a model shipped inside the package, which has none,
    gets them built into the user cache on first use.
    """
    has = (bundle / STEP_FILE).exists() or (bundle / SEQUENCE_FILE).exists() or "onnx" in manifest
    if has or not _is_shipped(bundle):
        expected = {}
        files = manifest.get("files") or {}
        info = manifest.get("onnx") or {}
        for which, fname in (("step", STEP_FILE), ("sequence", SEQUENCE_FILE)):
            rec = files.get(fname)
            if isinstance(rec, dict) and isinstance(rec.get("sha256"), str):
                expected[fname] = {"sha256": rec["sha256"], "bytes": rec.get("bytes")}
            elif isinstance(info.get(which), dict) and isinstance(info[which].get("sha256"), str):
                b = info[which].get("bytes")
                expected[fname] = {"sha256": info[which]["sha256"], "bytes": b if type(b) is int else None}
        return bundle, expected
    try:
        return cached_graphs(bundle, manifest), {}
    except ModuleNotFoundError as e:
        raise BackendUnavailableError(f"{bundle} ships no ONNX graphs, and building them on first use needs the onnx "
                                      f"package ({e.name}): {install_hint('onnx')}") from None


def _open_session(file: Path, which: str, manifest: dict, names: tuple[list[str], list[str]], providers: list[str],
                  threads: int | None, bundle: Path | None = None):
    """An InferenceSession of one graph, validated against the bundle. Raises BundleFormatError."""
    ort = _ort()
    bundle = file.parent if bundle is None else bundle
    if not file.is_file():
        raise BundleFormatError(f"{bundle} has no {file.name}; {_rebuild_hint(bundle)}")
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = int(threads)
    opts.log_severity_level = 3  # errors only: a fallback is reported by isan, not as a log line
    try:
        sess = ort.InferenceSession(str(file), sess_options=opts, providers=providers)
    except Exception as e:  # InvalidProtobuf, Fail, InvalidGraph, ... (onnxruntime's pybind types)
        msg = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        raise BundleFormatError(f"{file} is not a valid ONNX model ({msg}); {_rebuild_hint(bundle)}") from None
    meta = sess.get_modelmeta().custom_metadata_map
    if meta.get("format") != ONNX_FORMAT:
        raise BundleFormatError(f"{file} is not an isan ONNX graph (metadata format={meta.get('format')!r}); "
                                f"{_rebuild_hint(bundle)}")
    if meta.get("format_version") != ONNX_FORMAT_VERSION:
        raise BundleFormatError(f"{file} has isan ONNX format_version {meta.get('format_version')!r}; this isan reads "
                                f"{ONNX_FORMAT_VERSION}. {_rebuild_hint(bundle)}")
    if meta.get("graph") != which or meta.get("kind") != manifest["kind"]:
        raise BundleFormatError(f"{file} holds the {meta.get('kind')!r} {meta.get('graph')!r} graph; expected the "
                                f"{manifest['kind']!r} {which!r} graph. {_rebuild_hint(bundle)}")
    if meta.get("params_sha256") != manifest["params_sha256"]:
        raise BundleFormatError(
            f"{file} belongs to other weights (its params_sha256 {str(meta.get('params_sha256'))[:12]}... differs "
            f"from the manifest's {manifest['params_sha256'][:12]}...); {_rebuild_hint(bundle)}")
    ins = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]
    if (ins, outs) != (names[0], names[1]):
        raise BundleFormatError(f"{file} has inputs {ins} and outputs {outs}; expected {names[0]} and {names[1]}. "
                                f"{_rebuild_hint(bundle)}")
    d = int(manifest["d"])
    widths = {i.name: i.shape[-1] for i in sess.get_inputs()[1:]}
    if any(w != d for w in widths.values()):
        raise BundleFormatError(f"{file} takes states of width {widths}; the manifest says d={d}. {_rebuild_hint(bundle)}")
    return sess


def load_onnx_engine(path: str | Path, device: str = "cpu", path_mode: str = "auto",
                     chunk: int = DEFAULT_CHUNK) -> RunnerEngine:
    """The :class:`isan.engine.Engine` API over a bundle's ONNX graphs (``--runtime onnx``).

    Args:
        path_mode: "auto" or "reference" (the graphs run per character); "composed" is an error
            because trie-table jumps are a numpy-backend path.
    Raises:
        BundleFormatError, BackendUnavailableError, IsanError (see :meth:`OnnxRunner.load`).
    """
    if path_mode in ("composed", "chunked", "jumps"):
        raise IsanError(f"--path {path_mode} runs isan's own kernels; use --runtime numpy, or --path auto")
    if path_mode not in ("auto", "reference"):
        raise IsanError(f"path must be auto, composed, chunked or reference; got {path_mode!r}")
    runner = OnnxRunner.load(path, device=device, chunk=chunk)
    from isan.engine.bundle import manifest_alphabet

    return RunnerEngine(runner, manifest_alphabet(runner.manifest), runner.manifest,
                        source=str(path), path="onnx-sequence")
