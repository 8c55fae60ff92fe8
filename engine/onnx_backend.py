"""The ONNX backend: onnxruntime over a bundle's ``model.onnx`` and ``sequence.onnx``.

numpy and onnxruntime only (never torch); onnxruntime is imported when a runner is loaded,
so the engine works without it (``pip install 'isan[onnx]'``, or ``isan[gpu]`` for CUDA).

Graphs and the logits convention are described in :mod:`isan.export.onnx_export`: the graph
logits are the readout *after* each token. Scoring follows DESIGN.md section 2,
``bits_t = -log2 softmax(readout of the state before x_t)[x_t]``: the first character of a
text is predicted from the incoming state by ``W_ro h + b_ro`` computed here in float64 from
``weights.safetensors`` (the same tensors for the ISAN and the baselines), every later one
from the graph's logits after the previous character. Texts run through ``sequence.onnx`` in
chunks (default 4096 characters) carrying the state, so memory stays bounded.

A state is a flat float64 vector: ``h`` (d,), or for the LSTM ``concat(h, c)`` (2 d,). Inside
onnxruntime the state is float32; it is returned as float64 without rounding, so carrying it
between calls gives the same numbers as one long call.

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

from isan.errors import BundleFormatError, IsanError
from isan.engine.baseline_ref import LOG2E, RunnerEngine, bits_from_logits, log_softmax

log = logging.getLogger(__name__)

ONNX_FORMAT = "isan-onnx"
ONNX_FORMAT_VERSION = "1"
STEP_FILE = "model.onnx"
SEQUENCE_FILE = "sequence.onnx"
DEFAULT_CHUNK = 4096
DEVICES = ("cpu", "cuda", "auto")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


class BackendUnavailableError(IsanError, RuntimeError):
    """The requested backend or device cannot run here (onnxruntime missing, no CUDA provider)."""


def _ort():
    try:
        import onnxruntime
    except ImportError:
        raise BackendUnavailableError("the onnx backend needs onnxruntime: pip install 'isan[onnx]' "
                                      "(or 'isan[gpu]' for CUDA), or use --backend numpy") from None
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
            "(pip install 'isan[gpu]') with a CUDA GPU, or use device 'cpu'")
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
        self.K = len(manifest["alphabet"])
        self.state_names = ["h", "c"] if self.kind == "lstm" else ["h"]
        self.state_size = len(self.state_names) * self.d
        self._step = step_session
        self._seq = seq_session
        self.provider = provider
        if chunk < 1:
            raise IsanError(f"chunk must be >= 1; got {chunk}")
        self.chunk = int(chunk)

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
        if kind == "isan":
            from isan.engine.bundle import load_isan_bundle

            _, p, _ = load_isan_bundle(path)  # validates shapes and params_sha256
            W_ro, b_ro, init = p.W_ro, p.b_ro, p.h0
        else:
            from isan.engine.baseline_ref import BASELINE_KINDS, load_baseline_bundle

            if kind not in BASELINE_KINDS:
                raise BundleFormatError(f"{path} holds a {kind!r} model; the onnx backend runs isan, "
                                        f"{', '.join(BASELINE_KINDS)}")
            _, p, _ = load_baseline_bundle(path)
            W_ro, b_ro, init = p.tensors["W_ro"], p.tensors["b_ro"], p.initial_state()
        io = expected_io(kind)
        sessions = {}
        for which, fname in (("step", STEP_FILE), ("sequence", SEQUENCE_FILE)):
            sessions[which] = _open_session(path / fname, which, manifest, io[which], providers, threads)
        used = {s.get_providers()[0] for s in sessions.values()}
        provider = CUDA if used == {CUDA} else CPU
        if device == "cuda" and provider != CUDA:
            raise BackendUnavailableError(
                f"device 'cuda' was asked for but onnxruntime could not start the CUDA provider (sessions run on "
                f"{sorted(used)}); check the CUDA/cuDNN libraries of onnxruntime-gpu, or use device 'cpu'")
        if device == "auto" and CUDA in providers and provider != CUDA:
            log.warning("CUDA provider is installed but did not start; running on CPU")
        log.info("loaded %s ONNX graphs of %s on %s", kind, path, provider)
        return cls(path, manifest, W_ro, b_ro, init, sessions["step"], sessions["sequence"], provider, chunk)

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
            L, s = self.sequence(x[None, :], s)
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
            _, s = self.sequence(ids[None, start:start + self.chunk], s)
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
            before = np.concatenate([prev[active][:, None, :], L[:, :-1]], axis=1)  # (A, steps, V)
            lp = log_softmax(before.astype(np.float64))
            b = -np.take_along_axis(lp, X[:, :, None], axis=2)[:, :, 0] * LOG2E
            for j, i in enumerate(active):
                bits[i][pos:pos + steps] = b[j]
            S[active] = S_new
            prev[active] = L[:, -1]
            pos += steps
        return [(bits[i], S[i].astype(np.float64) if lens[i] else init[i].copy()) for i in range(n)]


def _open_session(file: Path, which: str, manifest: dict, names: tuple[list[str], list[str]], providers: list[str],
                  threads: int | None):
    """An InferenceSession of one graph, validated against the bundle. Raises BundleFormatError."""
    ort = _ort()
    bundle = file.parent
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
    """The :class:`isan.engine.Engine` API over a bundle's ONNX graphs (``--backend onnx``).

    Args:
        path_mode: "auto" or "reference" (the graphs run per character); "composed" is an error
            because trie-table jumps are a numpy-backend path.
    Raises:
        BundleFormatError, BackendUnavailableError, IsanError (see :meth:`OnnxRunner.load`).
    """
    from isan.alphabet import Alphabet

    if path_mode == "composed":
        raise IsanError("--path composed runs trie-table jumps in numpy; use --backend numpy, or --path auto")
    if path_mode not in ("auto", "reference"):
        raise IsanError(f"path must be auto, composed or reference; got {path_mode!r}")
    runner = OnnxRunner.load(path, device=device, chunk=chunk)
    return RunnerEngine(runner, Alphabet.from_list(runner.manifest["alphabet"]), runner.manifest,
                        source=str(path), path="onnx-sequence")
