"""Numpy reference of the linear controls (``linear``, ``linear_nlro``, ``isan_nobias``).

The twin of :mod:`isan.train.linear` (torch), in float64, one character at a time, no torch
(column vectors; DESIGN.md section 2):

* ``linear``:      ``h' = W h + E[x]``,   ``logits = W_ro h + b_ro``
* ``linear_nlro``: ``h' = W h + E[x]``,   ``logits = W_ro tanh(W_mlp h + b_mlp) + b_ro``
* ``isan_nobias``: ``h' = W[x] h``,       ``logits = W_ro h + b_ro``

and ``bits_t = -log2 softmax(logits(h_{t-1}))[x_t]``: the state *before* x_t predicts it.
A state is the flat float64 vector ``h`` (d,).

Bundles are written by :func:`isan.export.checkpoint.export_checkpoint`: ``weights.safetensors``
holds every tensor of the state dict in float32, the manifest's ``model`` field the config of
:meth:`isan.train.linear.LinearRNN.config` and ``params_sha256`` covers every tensor in sorted
name order (as for the baselines). :func:`load_linear_engine` gives such a bundle the scoring
API of :class:`isan.engine.Engine` through :class:`isan.engine.baseline_ref.RunnerEngine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from isan.alphabet import Alphabet
from isan.engine.baseline_ref import RunnerEngine, baseline_sha256, bits_from_logits
from isan.errors import BundleFormatError
from isan.params import load_tensors

LINEAR_KINDS = ("linear", "linear_nlro", "isan_nobias")


def linear_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The tensors (name -> shape) of a linear control with ``config`` (``model`` of the manifest).

    Raises:
        BundleFormatError: unknown kind or missing sizes.
    """
    kind = config.get("kind") if isinstance(config, dict) else None
    if kind not in LINEAR_KINDS:
        raise BundleFormatError(f"unknown linear model kind {kind!r}; expected one of {', '.join(LINEAR_KINDS)}")
    try:
        K, V, d = int(config["K"]), int(config["V"]), int(config["d"])
    except (KeyError, TypeError, ValueError):
        raise BundleFormatError(f"{kind} config {config!r} lacks integer K, V and d; re-run `isan export`") from None
    if kind == "isan_nobias":
        return {"W": (K, d, d), "W_ro": (V, d), "b_ro": (V,), "h0": (d,)}
    shapes = {"W": (d, d), "E": (K, d), "W_ro": (V, d), "b_ro": (V,), "h0": (d,)}
    if kind == "linear_nlro":
        try:
            m = int(config.get("readout_hidden") or d)
        except (TypeError, ValueError):
            raise BundleFormatError(f"linear_nlro config {config!r}: readout_hidden must be an integer") from None
        shapes.update({"W_mlp": (m, d), "b_mlp": (m,), "W_ro": (V, m)})
    return shapes


@dataclass(frozen=True)
class LinearParams:
    """Immutable weights of a linear control (float64 by default; arrays read-only).

    Build with :meth:`from_tensors`, which validates names, shapes and finiteness.
    """

    kind: str
    K: int
    V: int
    d: int
    config: dict
    tensors: dict

    @classmethod
    def from_tensors(cls, config: dict, tensors: dict[str, np.ndarray], dtype=np.float64) -> "LinearParams":
        """Validate and wrap. Raises BundleFormatError on missing, extra, misshaped or non-finite tensors."""
        shapes = linear_shapes(config)
        missing = sorted(set(shapes) - set(tensors))
        extra = sorted(set(tensors) - set(shapes))
        if missing or extra:
            raise BundleFormatError(f"{config['kind']} weights: missing tensors {missing}, unexpected {extra}; "
                                    f"expected {sorted(shapes)}. Re-run `isan export`")
        out = {}
        for name, shape in shapes.items():
            a = np.array(tensors[name], dtype=dtype, copy=True)
            if a.shape != shape:
                raise BundleFormatError(f"{config['kind']} tensor {name} has shape {a.shape}; expected {shape}")
            if not np.all(np.isfinite(a)):
                raise BundleFormatError(f"tensor {name} holds non-finite values; re-export a good checkpoint")
            a.setflags(write=False)
            out[name] = a
        return cls(config["kind"], int(config["K"]), int(config["V"]), int(config["d"]), dict(config), out)

    @property
    def state_size(self) -> int:
        return self.d

    def initial_state(self) -> np.ndarray:
        """The learned h0 (d,) (a copy)."""
        return self.tensors["h0"].copy()

    def readout(self, state: np.ndarray) -> np.ndarray:
        """Logits (..., V) of states (..., d)."""
        t = self.tensors
        h = np.asarray(state)
        if self.kind == "linear_nlro":
            h = np.tanh(h @ t["W_mlp"].T + t["b_mlp"])
        return h @ t["W_ro"].T + t["b_ro"]


def linear_step_ref(p: LinearParams, h: np.ndarray, x: int) -> np.ndarray:
    """One step: state (d,) and symbol id x -> the new state (d,)."""
    t = p.tensors
    if p.kind == "isan_nobias":
        return t["W"][x] @ h
    return t["W"] @ h + t["E"][x]


def linear_states_ref(p: LinearParams, ids: np.ndarray, h: np.ndarray) -> np.ndarray:
    """States after each character: ids (T,) int, h (d,) before ids[0] -> (T, d) float64."""
    out = np.empty((len(ids), p.d))
    h = np.asarray(h, dtype=np.float64)
    for i, x in enumerate(ids):
        h = linear_step_ref(p, h, x)
        out[i] = h
    return out


def linear_score_ref(p: LinearParams, ids: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bits of each character and the final state: (bits (T,) float64, h (d,) float64).

    ``bits_t = -log2 softmax(logits(h_{t-1}))[x_t]`` (the first from ``h``).
    """
    ids = np.asarray(ids, dtype=np.int64)
    h = np.asarray(h, dtype=np.float64)
    if len(ids) == 0:
        return np.zeros(0), h.copy()
    H = linear_states_ref(p, ids, h)
    before = np.vstack([h[None, :], H[:-1]])
    return bits_from_logits(p.readout(before), ids), H[-1]


def load_linear_bundle(path: str | Path) -> tuple[dict, LinearParams, Alphabet]:
    """(manifest, float64 LinearParams, alphabet) of a ``linear``/``linear_nlro``/``isan_nobias`` bundle.

    Raises:
        BundleFormatError: not such a bundle, missing ``model`` config, weights that do not match
            the manifest (sizes or params_sha256), corrupt weights.
    """
    from isan.engine.bundle import WEIGHTS, read_manifest

    path = Path(path)
    m = read_manifest(path)
    if m["kind"] not in LINEAR_KINDS:
        raise BundleFormatError(f"{path} holds a {m['kind']!r} model, not one of {', '.join(LINEAR_KINDS)}")
    config = m.get("model")
    if not isinstance(config, dict) or config.get("kind") != m["kind"]:
        raise BundleFormatError(f"{path}/manifest.json lacks the 'model' config of its {m['kind']} model; "
                                "re-run `isan export`")
    t = load_tensors(path / WEIGHTS)
    if baseline_sha256(t) != m["params_sha256"]:
        raise BundleFormatError(f"{path}: weights do not match the manifest's params_sha256 (corrupt or edited); "
                                "re-run `isan export`")
    p = LinearParams.from_tensors(config, t)
    alphabet = Alphabet.from_list(m["alphabet"])
    if p.K != len(alphabet) or p.V != len(alphabet) or p.d != m["d"]:
        raise BundleFormatError(f"{path}: the model has K={p.K}, V={p.V}, d={p.d} but the manifest says "
                                f"{len(alphabet)} symbols and d={m['d']}; re-run `isan export`")
    return m, p, alphabet


class NumpyLinearRunner:
    """The runner protocol of :class:`isan.engine.baseline_ref.NumpyBaselineRunner` over
    :class:`LinearParams` (numpy, float64, one character at a time).

    ``kind, K, V, d, state_size, state_names, backend, provider``, ``initial_state()``,
    ``readout(state)``, ``score_ids(ids, state)``, ``advance_ids(ids, state)``,
    ``score_batch(ids_list, states)``; states are flat float64 vectors (d,).
    """

    backend = "numpy"
    provider = "numpy"
    state_names = ["h"]

    def __init__(self, params: LinearParams):
        self.params = params
        self.kind, self.K, self.V, self.d = params.kind, params.K, params.V, params.d
        self.state_size = params.state_size

    def initial_state(self) -> np.ndarray:
        return self.params.initial_state()

    def readout(self, state: np.ndarray) -> np.ndarray:
        """Logits (V,) float64 of a state (d,)."""
        return self.params.readout(np.asarray(state, dtype=np.float64))

    def score_ids(self, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bits (T,) float64, state after ids (d,) float64)."""
        return linear_score_ref(self.params, ids, state)

    def advance_ids(self, ids: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The state after ids (d,) float64, without readouts."""
        if len(ids) == 0:
            return np.array(state, dtype=np.float64)
        return linear_states_ref(self.params, np.asarray(ids, dtype=np.int64), state)[-1]

    def score_batch(self, ids_list: Sequence[np.ndarray], states: Sequence[np.ndarray] | None = None):
        """[(bits, final state)] per stream, each as :meth:`score_ids`."""
        states = states if states is not None else [self.initial_state()] * len(ids_list)
        return [self.score_ids(x, s) for x, s in zip(ids_list, states)]


def load_linear_engine(path: str | Path) -> RunnerEngine:
    """A linear-control bundle on the numpy reference backend (``isan score --model BUNDLE``).

    Raises:
        BundleFormatError: see :func:`load_linear_bundle`.
    """
    m, p, alphabet = load_linear_bundle(path)
    return RunnerEngine(NumpyLinearRunner(p), alphabet, m, source=str(path), path="reference")
