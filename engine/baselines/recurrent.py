"""Numpy reference of the recurrent baselines (rnn, irnn, gru, lstm), and an engine over any runner.

The twin of :mod:`isan.train.baselines` (torch) and of the baselines' ONNX graphs
(:mod:`isan.export.onnx_export`), in float64, one character at a time, no torch:

* the input term of symbol x is ``a = E[x]`` (one-hot input) or ``W_ih @ emb[x] + b_ih``
  (embedding input), shape (G d,), with G = 1 (rnn, irnn), 3 (gru), 4 (lstm);
* rnn ``h' = tanh(a + W_hh h)``, irnn ``h' = relu(a + W_hh h)``;
  gru (blocks r, z, n) ``n = tanh(a_n + r * (U_n h + b_hn))``, ``h' = (1 - z) n + z h``;
  lstm (blocks i, f, g, o) ``c' = s(f) c + s(i) tanh(g)``, ``h' = s(o) tanh(c')``;
* ``logits = W_ro h + b_ro`` and, as for the ISAN (docs/ARCHITECTURE.md, 'The model and its
  conventions'), ``bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]``: the state *before* x_t predicts it.

A state is one flat float64 vector: ``h`` (d,), or for the LSTM ``concat(h, c)`` (2 d,).

:class:`RunnerEngine` gives any runner (this module's :class:`NumpyBaselineRunner`, or
:class:`isan.engine.baselines.onnx.OnnxRunner`) the public API of :class:`isan.engine.Engine`
(score, score_batch, advance, logits, distribution, top_k, sample, describe), so the CLI and
the server serve baseline bundles and the ONNX backend unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from isan.alphabet import Alphabet
from isan.errors import BundleFormatError, IsanError, StateDivergedError
from isan.engine.guard import MAX_STATE_ABS, check_bits, raise_diverged
from isan.engine.reference import LOG2E, log_softmax
from isan.params import load_tensors, tensors_sha256
#: gates per kind (rows of W_hh are G blocks of d); must equal isan.train.baselines.GATES
GATES = {"rnn": 1, "irnn": 1, "gru": 3, "lstm": 4}
BASELINE_KINDS = tuple(GATES)


def baseline_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The tensors (name -> shape) of a baseline with ``config`` (``model`` of the manifest).

    Raises:
        BundleFormatError: unknown kind, missing sizes or input mode.
    """
    kind = config.get("kind")
    if kind not in GATES:
        raise BundleFormatError(f"unknown baseline kind {kind!r}; expected one of {', '.join(GATES)}")
    try:
        K, V, d = int(config["K"]), int(config["V"]), int(config["d"])
    except (KeyError, TypeError, ValueError):
        raise BundleFormatError(f"baseline config {config!r} lacks integer K, V and d; re-run `isan export`") from None
    G = GATES[kind]
    mode = config.get("input", "onehot")
    if mode == "onehot":
        shapes = {"E": (K, G * d)}
    elif mode == "embedding":
        e = config.get("emb")
        if not isinstance(e, int) or e < 1:
            raise BundleFormatError(f"baseline config {config!r}: input='embedding' needs an integer emb")
        shapes = {"emb": (K, e), "W_ih": (G * d, e), "b_ih": (G * d,)}
    else:
        raise BundleFormatError(f"baseline config {config!r}: input must be 'onehot' or 'embedding'")
    shapes.update({"W_hh": (G * d, d), "W_ro": (V, d), "b_ro": (V,), "h0": (d,)})
    if kind == "gru":
        shapes["b_hn"] = (d,)
    if kind == "lstm":
        shapes["c0"] = (d,)
    return shapes


def baseline_sha256(tensors: dict[str, np.ndarray]) -> str:
    """The ``params_sha256`` of a baseline bundle: every tensor, in sorted name order, as float32."""
    return tensors_sha256(tensors, tuple(sorted(tensors)))


def validated_tensors(kind: str, shapes: dict[str, tuple[int, ...]], tensors: dict[str, np.ndarray],
                      dtype=np.float64) -> dict[str, np.ndarray]:
    """Read-only copies of exactly the tensors in ``shapes``, in ``dtype``.

    Raises:
        BundleFormatError: missing, unexpected, misshaped or non-finite tensors.
    """
    missing = sorted(set(shapes) - set(tensors))
    extra = sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise BundleFormatError(f"{kind} weights: missing tensors {missing}, unexpected {extra}; "
                                f"expected {sorted(shapes)}. Re-run `isan export`")
    out = {}
    for name, shape in shapes.items():
        a = np.array(tensors[name], dtype=dtype, copy=True)
        if a.shape != shape:
            raise BundleFormatError(f"{kind} tensor {name} has shape {a.shape}; expected {shape}")
        if not np.all(np.isfinite(a)):
            raise BundleFormatError(f"tensor {name} holds non-finite values; re-export a good checkpoint")
        a.setflags(write=False)
        out[name] = a
    return out


@dataclass(frozen=True)
class RunnerParams:
    """Immutable weights of a bundle the numpy runner plays (float64 by default; arrays read-only)
    and their architecture. Subclasses name the expected tensors with ``shapes(config)``.

    Build with :meth:`from_tensors` (which validates names, shapes and finiteness).
    """

    kind: str
    K: int
    V: int
    d: int
    config: dict
    tensors: dict

    @staticmethod
    def shapes(config: dict) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    @classmethod
    def from_tensors(cls, config: dict, tensors: dict[str, np.ndarray], dtype=np.float64):
        """Validate and wrap. Raises BundleFormatError on missing, extra, misshaped or non-finite tensors."""
        out = validated_tensors(config["kind"], cls.shapes(config), tensors, dtype)
        return cls(config["kind"], int(config["K"]), int(config["V"]), int(config["d"]), dict(config), out)


@dataclass(frozen=True)
class BaselineParams(RunnerParams):
    """Immutable baseline weights (float64 by default; arrays read-only) and their architecture."""

    shapes = staticmethod(baseline_shapes)

    @property
    def G(self) -> int:
        return GATES[self.kind]

    @property
    def state_names(self) -> list[str]:
        return ["h", "c"] if self.kind == "lstm" else ["h"]

    @property
    def state_size(self) -> int:
        """Length of the flat state vector: d, or 2 d for the LSTM."""
        return len(self.state_names) * self.d

    def input_table(self) -> np.ndarray:
        """The input term of every symbol, (K, G d): ``E``, or ``emb @ W_ih.T + b_ih``."""
        t = self.tensors
        if "E" in t:
            return t["E"]
        return t["emb"] @ t["W_ih"].T + t["b_ih"]

    def initial_state(self) -> np.ndarray:
        """The learned initial state as a flat vector (S,): h0, or concat(h0, c0)."""
        t = self.tensors
        return np.concatenate([t["h0"], t["c0"]]) if self.kind == "lstm" else t["h0"].copy()

    def readout(self, state: np.ndarray) -> np.ndarray:
        """Logits ``W_ro h + b_ro`` of a flat state (..., S) -> (..., V) (the h part only)."""
        h = np.asarray(state)[..., : self.d]
        return h @ self.tensors["W_ro"].T + self.tensors["b_ro"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function, elementwise, in ``x``'s dtype (as ``tanh``: no overflow)."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def baseline_step_ref(p: BaselineParams, state: np.ndarray, a: np.ndarray) -> np.ndarray:
    """One step: flat state (S,) and input term a (G d,) (a row of :meth:`BaselineParams.input_table`)
    -> the new flat state (S,)."""
    d, W_hh = p.d, p.tensors["W_hh"]
    h = state[:d]
    if p.kind == "rnn":
        return np.tanh(a + W_hh @ h)
    if p.kind == "irnn":
        return np.maximum(a + W_hh @ h, 0.0)
    gh = W_hh @ h
    if p.kind == "gru":
        r = sigmoid(a[:d] + gh[:d])
        z = sigmoid(a[d:2 * d] + gh[d:2 * d])
        n = np.tanh(a[2 * d:] + r * (gh[2 * d:] + p.tensors["b_hn"]))
        return (1.0 - z) * n + z * h
    g = a + gh  # lstm: blocks i, f, g, o
    c = sigmoid(g[d:2 * d]) * state[d:] + sigmoid(g[:d]) * np.tanh(g[2 * d:3 * d])
    return np.concatenate([sigmoid(g[3 * d:]) * np.tanh(c), c])


def baseline_states_ref(p: BaselineParams, ids: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Flat states after each character: ids (T,) int, state (S,) before ids[0] -> (T, S)."""
    table = p.input_table()
    out = np.empty((len(ids), p.state_size))
    s = np.asarray(state, dtype=np.float64)
    for t, x in enumerate(ids):
        s = baseline_step_ref(p, s, table[x])
        out[t] = s
    return out


def bits_from_logits(logits_before: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """bits (T,) float64 = -log2 softmax(logits_before[t])[ids[t]]; logits_before (T, V)."""
    lp = log_softmax(np.asarray(logits_before, dtype=np.float64))
    return -lp[np.arange(len(ids)), ids] * LOG2E


def baseline_score_ref(p: BaselineParams, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bits of each character and the final flat state: (bits (T,) float64, state (S,) float64).

    ``bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]`` (the first from ``state``).
    """
    ids = np.asarray(ids, dtype=np.int64)
    state = np.asarray(state, dtype=np.float64)
    if len(ids) == 0:
        return np.zeros(0), state.copy()
    S = baseline_states_ref(p, ids, state)
    before = np.vstack([state[None, :], S[:-1]])
    return bits_from_logits(p.readout(before), ids), S[-1]


def load_baseline_bundle(path: str | Path) -> tuple[dict, BaselineParams, Alphabet]:
    """(manifest, float64 BaselineParams, alphabet) of a baseline bundle directory.

    Raises:
        BundleFormatError: not a baseline bundle, missing ``model`` config, weights that do not
            match the manifest (sizes or params_sha256).
    """
    return load_params_bundle(path, tuple(GATES), BaselineParams)


def load_params_bundle(path: str | Path, kinds: tuple[str, ...], params_cls):
    """(manifest, ``params_cls.from_tensors(config, weights)``, alphabet) of a non-ISAN bundle.

    Raises:
        BundleFormatError: the kind is not in ``kinds``, the ``model`` config is missing or of
            another kind, or the weights do not match the manifest (sizes or params_sha256).
    """
    from isan.engine.bundle import WEIGHTS, read_manifest

    path = Path(path)
    m = read_manifest(path)
    if m["kind"] not in kinds:
        raise BundleFormatError(f"{path} holds a {m['kind']!r} model, not one of {', '.join(kinds)}")
    config = m.get("model")
    if not isinstance(config, dict) or config.get("kind", m["kind"]) != m["kind"]:
        raise BundleFormatError(f"{path}/manifest.json lacks the 'model' config of its {m['kind']} model; "
                                "re-run `isan export`")
    t = load_tensors(path / WEIGHTS)
    if baseline_sha256(t) != m["params_sha256"]:
        raise BundleFormatError(f"{path}: weights do not match the manifest's params_sha256 (corrupt or edited); "
                                "re-run `isan export`")
    p = params_cls.from_tensors(config, t)
    from isan.engine.bundle import manifest_alphabet

    alphabet = manifest_alphabet(m, path / "manifest.json")
    if p.K != alphabet.K or p.V != len(alphabet) or p.d != m["d"]:
        raise BundleFormatError(f"{path}: the model has K={p.K}, V={p.V}, d={p.d} but the manifest says "
                                f"{alphabet.K} inputs, {len(alphabet)} outputs and d={m['d']}; re-run `isan export`")
    return m, p, alphabet


def expand_baseline_inputs(p: "BaselineParams", input_map) -> "BaselineParams":
    """The baseline read by output id (as :func:`isan.params.expand_inputs` for the ISAN): the
    input term of output y is that of its input ``input_map[y]`` (rows of ``E`` or ``emb``)."""
    if input_map is None:
        return p
    t = dict(p.tensors)
    key = "E" if "E" in t else "emb"
    t[key] = np.ascontiguousarray(t[key][np.asarray(input_map, dtype=np.int64)])
    t[key].setflags(write=False)
    return type(p)(p.kind, len(input_map), p.V, p.d, {**p.config, "K": len(input_map)}, t)


class NumpyBaselineRunner:
    """The runner protocol over :class:`BaselineParams` (numpy, float64, one character at a time).

    Runner protocol (also implemented by :class:`isan.engine.baselines.onnx.OnnxRunner`):
    ``kind, K, V, d, state_size, state_names, backend, provider``, ``initial_state()``,
    ``readout(state)``, ``score_ids(ids, state)``, ``advance_ids(ids, state)``,
    ``score_batch(ids_list, states)``; states are flat float64 vectors (S,).
    """

    backend = "numpy"
    provider = "numpy"

    def __init__(self, params: BaselineParams):
        self.params = params
        self.kind, self.K, self.V, self.d = params.kind, params.K, params.V, params.d
        self.state_names = params.state_names
        self.state_size = params.state_size

    def initial_state(self) -> np.ndarray:
        return self.params.initial_state()

    def readout(self, state: np.ndarray) -> np.ndarray:
        return self.params.readout(np.asarray(state, dtype=np.float64))

    #: the reference functions this runner wraps (subclasses swap them for other architectures)
    score_ref = staticmethod(baseline_score_ref)
    states_ref = staticmethod(baseline_states_ref)

    def score_ids(self, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bits (T,) float64, state after ids (S,) float64)."""
        return self.score_ref(self.params, ids, state)

    def advance_ids(self, ids: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The state after ids (S,) float64, without readouts."""
        if len(ids) == 0:
            return np.array(state, dtype=np.float64)
        return self.states_ref(self.params, np.asarray(ids, dtype=np.int64), state)[-1]

    def score_batch(self, ids_list: Sequence[np.ndarray], states: Sequence[np.ndarray] | None = None):
        states = states if states is not None else [self.initial_state()] * len(ids_list)
        return [self.score_ids(x, s) for x, s in zip(ids_list, states)]


class RunnerEngine:
    """The public API of :class:`isan.engine.Engine` over a runner (numpy baseline or ONNX).

    Immutable and shareable; states are :class:`isan.engine.State` values whose ``h`` is the
    runner's flat float64 state vector (the LSTM's is ``concat(h, c)``, length 2 d).
    Attribution needs the ISAN's affine structure and the numpy engine: it raises here.

    Text goes through the manifest's declared normaliser as in the numpy engine (``normalize``
    argument, :mod:`isan.engine.normalize`), and no call returns NaN or inf: non-finite bits or
    states (and, for an ISAN, states beyond :data:`isan.engine.guard.MAX_STATE_ABS`) raise
    :class:`~isan.errors.StateDivergedError`.
    """

    def __init__(self, runner, alphabet: Alphabet, manifest: dict | None = None, source: str | None = None,
                 path: str = "sequence"):
        from isan.engine.normalize import from_manifest

        if runner.K != len(alphabet) or runner.V != len(alphabet):
            raise IsanError(f"the model has K={runner.K}, V={runner.V} but the alphabet has {len(alphabet)} outputs "
                            "(a runner reads output ids: expand its inputs first)")
        self.runner = runner
        self.alphabet = alphabet
        self.manifest = dict(manifest or {})
        from isan.engine.bundle import normalizer_view

        self.normalizer = from_manifest({**self.manifest, "alphabet": normalizer_view(alphabet)},
                                        f"{source or 'the model'}/manifest.json")
        self.source = source
        self.path = path
        #: the runtime that scores: ``"numpy"`` or ``"onnx"`` (onnxruntime)
        self.runtime = runner.backend
        self.kind = runner.kind
        self.table = None
        #: states beyond this are out of range (ISANs: the guard's bound; other models: only non-finite)
        self.state_limit = MAX_STATE_ABS if self.kind == "isan" else np.inf

    @property
    def backend(self) -> str:
        """Deprecated alias of :attr:`runtime` (``"numpy"`` or ``"onnx"``), kept for a release."""
        import warnings

        warnings.warn("RunnerEngine.backend is deprecated: use RunnerEngine.runtime", DeprecationWarning, stacklevel=2)
        return self.runtime

    @property
    def d(self) -> int:
        return self.runner.d

    @property
    def params_sha256(self) -> str | None:
        return self.manifest.get("params_sha256")

    @property
    def units(self) -> dict:
        """The result fields every score carries: ``{"unit", "V"}``."""
        return {"unit": self.alphabet.unit, "V": len(self.alphabet)}

    @property
    def _scoring(self) -> dict:
        """How the bits were computed (``ScoreResult.scoring``): this runner's path, backend and provider."""
        return {"path": self.path, "backend": self.runtime, "provider": self.runner.provider}

    def describe(self) -> dict:
        from isan.tokens import alphabet_label

        a = self.alphabet
        return {"kind": self.kind, "d": self.d, "unit": a.unit, "alphabet": alphabet_label(a), "path": self.path,
                "backend": self.runtime, "provider": self.runner.provider, "source": self.source,
                "params_sha256": self.params_sha256, "state": self.runner.state_names,
                "normalizer": self.normalizer.id}

    def initial_state(self):
        from isan.engine.results import State

        return State(self.runner.initial_state())

    def encode(self, text: str, unknown: str = "error", replacement: str | None = None) -> np.ndarray:
        return self.alphabet.encode(text, unknown=unknown, replacement=replacement)

    def _ids(self, text, unknown: str, replacement: str | None) -> np.ndarray:
        return self.alphabet.as_ids(text, unknown, replacement)

    def prepare(self, text, normalize="auto", unknown: str = "error", replacement: str | None = None, state=None):
        """As :meth:`isan.engine.Engine.prepare`: normalised ids, input offsets and the report."""
        from isan.engine.normalize import prepare, resolve

        return prepare(text, self.alphabet, resolve(normalize, self.normalizer), unknown, replacement,
                       context=state.last_symbol if state is not None else "")

    def check_state(self, state):
        state = state or self.initial_state()
        if state.h.shape != (self.runner.state_size,):
            raise IsanError(f"this {self.kind} model's state has {self.runner.state_size} values "
                            f"({'+'.join(self.runner.state_names)}); got one of shape {state.h.shape}")
        if not (np.all(np.isfinite(state.h)) and np.abs(state.h).max(initial=0.0) <= self.state_limit):
            raise StateDivergedError("the given state is out of range (not finite, or too large); start from "
                                     "engine.initial_state()", offset=None, cause="state out of range")
        return state

    def _check(self, ids: np.ndarray, state_h: np.ndarray, bits: np.ndarray | None, final: np.ndarray) -> None:
        """Raise StateDivergedError if bits are not finite or the final state is out of range."""
        bad = check_bits(bits) if bits is not None else None
        if bad is None and np.all(np.isfinite(final)) and np.abs(final).max(initial=0.0) <= self.state_limit:
            return
        wb = getattr(self.runner, "isan_Wb", None)
        if wb is not None:  # an ISAN: locate the first out-of-range state with the float64 reference
            raise_diverged(wb[0], wb[1], ids, state_h, f"{self.runtime} {self.path}", detected_at=bad,
                           symbols=self.alphabet.symbols)
        cause = "non-finite bits" if bad is not None else "non-finite state"
        where = f"at character offset {bad}" if bad is not None else "by the end of the text"
        raise StateDivergedError(f"the {self.kind} model's state diverges {where} ({cause}, {self.runtime} backend); "
                                 "the model cannot score this text meaningfully", offset=bad, cause=cause)

    def score(self, text, state=None, per_char: bool = False, unknown: str = "error", replacement: str | None = None,
              normalize: str | None = "auto"):
        """As :meth:`isan.engine.Engine.score`. Raises EmptyTextError, AlphabetError, StateDivergedError."""
        from isan.engine.results import ScoreResult, State, in_input_terms

        from isan.engine.prepare import prepare_one
        state, prep, empty = prepare_one(self, text, state, normalize, unknown, replacement, per_char)
        if empty is not None:
            return empty
        ids = prep.ids
        try:
            bits, s = self.runner.score_ids(ids, state.h)
            self._check(ids, state.h, bits, s)
        except StateDivergedError as e:
            raise in_input_terms(e, prep, self.alphabet.symbols) from None
        total = float(bits.sum())
        return ScoreResult(len(ids), total, bits if per_char else None,
                           State(s, state.chars + len(ids), state.bits + total, prep.last_symbol), prep.report,
                           prep.offsets if per_char else None, prep.text if per_char else None, self._scoring,
                           **self.units)

    def score_batch(self, texts, states=None, per_char: bool = False, unknown: str = "error",
                    replacement: str | None = None, group: str | None = None, normalize: str | None = "auto"):
        """As :meth:`isan.engine.Engine.score_batch` (``group`` is ignored: the runner batches streams)."""
        from isan.engine.results import ScoreResult, State, in_input_terms, with_prefix

        from isan.engine.prepare import prepare_batch
        states, preps = prepare_batch(self, texts, states, normalize, unknown, replacement)
        ids = [p.ids for p in preps]
        out = []
        results = self.runner.score_batch(ids, [s.h for s in states])
        for i, (s, (b, sf), prep) in enumerate(zip(states, results, preps)):
            try:
                self._check(prep.ids, s.h, b, sf)
            except StateDivergedError as e:
                raise with_prefix(in_input_terms(e, prep, self.alphabet.symbols), f"text {i} of the batch: ") from None
            total = float(b.sum())
            out.append(ScoreResult(len(b), total, b if per_char else None,
                                   State(sf, s.chars + len(b), s.bits + total, prep.last_symbol), prep.report,
                                   prep.offsets if per_char else None, prep.text if per_char else None,
                                   self._scoring, **self.units))
        return out

    def advance(self, text, state=None, unknown: str = "error", replacement: str | None = None,
                normalize: str | None = "auto"):
        """Ingest text without scoring it; totals are left unchanged."""
        from isan.engine.results import State, in_input_terms

        state = self.check_state(state)
        prep = self.prepare(text, normalize, unknown, replacement, state)
        if len(prep.ids) == 0:
            return state
        try:
            s = self.runner.advance_ids(prep.ids, state.h)
            self._check(prep.ids, state.h, None, s)
        except StateDivergedError as e:
            raise in_input_terms(e, prep, self.alphabet.symbols) from None
        return State(s, state.chars, state.bits, prep.last_symbol)

    def logits(self, state=None) -> np.ndarray:
        """Logits (V,) float64 for the next character."""
        return np.asarray(self.runner.readout(self.check_state(state).h), dtype=np.float64)

    def distribution(self, state=None, temperature: float = 1.0) -> np.ndarray:
        if not temperature > 0:
            raise IsanError(f"temperature must be > 0; got {temperature}")
        return np.exp(log_softmax(self.logits(state) / temperature))

    def top_k(self, state=None, k: int = 5) -> list[dict]:
        lp = log_softmax(self.logits(state))
        order = np.argsort(-lp, kind="stable")[:k]
        return [{"symbol": self.alphabet.symbols[i], "prob": float(np.exp(lp[i])), "bits": float(-lp[i] * LOG2E)}
                for i in order]

    def sample(self, prompt: str = "", n: int = 200, temperature: float = 1.0, top_k: int | None = None,
               seed: int | None = None, state=None, normalize: str | None = "auto"):
        """As :meth:`isan.engine.Engine.sample` (same random draws for the same seed and logits)."""
        from isan.engine.results import Sample, State, in_input_terms
        from isan.engine.sampling import check_sampling_args, sample_ids

        check_sampling_args(n, temperature, top_k, len(self.alphabet))
        state = self.check_state(state)
        prep = self.prepare(prompt, normalize, "error", None, state)
        if len(prep.ids):
            try:
                s = self.runner.advance_ids(prep.ids, state.h)
                self._check(prep.ids, state.h, None, s)
            except StateDivergedError as e:
                raise in_input_terms(e, prep, self.alphabet.symbols) from None
            state = State(s, state.chars, state.bits, prep.last_symbol)
        runner, limit, drawn = self.runner, self.state_limit, []

        def step(s, x):
            drawn.append(x)
            s = runner.advance_ids(np.array([x], dtype=np.int64), s)
            if not (np.all(np.isfinite(s)) and np.abs(s).max(initial=0.0) <= limit):
                raise StateDivergedError(f"the {self.kind} model's state diverges at generated character "
                                         f"{len(drawn) - 1} (sampling); lower the temperature or use top_k",
                                         offset=len(drawn) - 1, cause="state out of range")
            return s

        ids, bits = sample_ids(runner.readout, step, state.h.copy(), n, temperature, top_k, seed)
        return Sample(prompt, self.alphabet.decode(ids), bits, seed, temperature, top_k, prep.text, prep.report)

    def attribute(self, *args, **kwargs):
        raise IsanError(f"attribution needs an ISAN bundle on the numpy backend; this is a {self.kind} model "
                        f"on the {self.runtime} backend")


def load_baseline_engine(path: str | Path) -> RunnerEngine:
    """A baseline bundle on the numpy reference backend. Raises BundleFormatError (see load_baseline_bundle)."""
    m, p, alphabet = load_baseline_bundle(path)
    if p.K != len(alphabet):
        p = expand_baseline_inputs(p, alphabet.input_map)
    return RunnerEngine(NumpyBaselineRunner(p), alphabet, m, source=str(path), path="reference")
