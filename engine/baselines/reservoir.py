"""Numpy reference scorers of the untrained-network baselines (Čerňanský, Makula and Beňušková 2008):
echo state networks (``kind="esn"``: ESN and ESN+) and neural prediction machines (``kind="npm"``:
NPM-U, NPM-U+ over an untrained network, NPM-T over a trained one), and their bundles.

Both run one recurrent network over the symbols, in float64, one symbol at a time, no torch::

    h_t = tanh(E[x_t] + W_hh h_{t-1})        E (K, n): the input term of each symbol (W_in's columns,
                                             plus the bias b for an NPM's network); h_0 = h0 (n,)

and predict ``x_t`` from the state *before* it (docs/ARCHITECTURE.md, 'The model and its
conventions'), like every model here:

* ESN (eqs. 2-5): a linear readout ``o = W_out h + b_out`` (V,), clipped below at ``o_min``
  (0.001) and normalised: ``P(a | h) = max(o_a, o_min) / sum_b max(o_b, o_min)``.
* NPM (eq. 1): the state's context is its nearest centroid (squared Euclidean distance, ties to the
  lower index) among ``centroids`` (M, n); ``P(a | c) = (N(c, a) + gamma) / (N(c) + V gamma)``
  from the training counts ``counts`` (M, V) and gamma (1/|A| in the paper).

``readout(state)`` returns natural-log probabilities, which are valid logits (their softmax is the
distribution), so :class:`isan.engine.baselines.recurrent.RunnerEngine` and every consumer of logits
works unchanged. ``bits_t = -log2 P(x_t | h_{t-1})``; NNL = bits / log2 |A| (eq. 7).

Bundle (directory, written atomically; see :func:`write_reservoir_bundle`)::

    manifest.json         {"format": "isan-bundle", "format_version": 3, "kind": "esn" | "npm",
                           "alphabet": alphabet JSON (isan.tokens.alphabet_to_json; a plain list of
                           characters also loads), "unit": "word" (the alphabet's unit), "d": n,
                           "params_sha256": hex, "n_params": int,
                           "model": config (below), "normalizer": {"name": "none", "version": 1},
                           "training": {...}, "metrics": {...},
                           "files": {name: {"bytes", "sha256"}}, "manifest_sha256": hex}
    weights.safetensors   float32 tensors (metadata {"format": "isan-bundle", "kind": kind}):
                           esn: E (K, n), W_hh (n, n), h0 (n,), W_out (V, n), b_out (V,)
                           npm: E (K, n), W_hh (n, n), h0 (n,), centroids (M, n), counts (M, V)

``model`` (the config): ``{"kind", "variant" ("esn", "esn+", "npm-u", "npm-u+", "npm-t", "npm-u+eq6",
"npm-t-ekf"; the paper's ESN with output feedback, isan.train.reservoir.PaperESN, has no bundle yet), "K", "V",
"d", "o_min" (esn), "contexts" M and "gamma" (npm)}``. ``params_sha256`` is the sha256 of every
tensor in sorted name order as float32 (:func:`isan.engine.baselines.recurrent.baseline_sha256`);
``files`` and ``manifest_sha256`` are as in :mod:`isan.engine.bundle` (format version 2), so an
edited manifest, a swapped weights file or a truncated one is refused by :func:`load_reservoir_bundle`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from isan.errors import BundleFormatError
from isan.engine.baselines.recurrent import RunnerParams, validated_tensors

RESERVOIR_KINDS = ("esn", "npm")
VARIANTS = {"esn": ("esn", "esn+"), "npm": ("npm-u", "npm-u+", "npm-t", "npm-u+eq6", "npm-t-ekf")}
REBUILD = "rebuild it with `isan study elman export` (or restore the bundle from a good copy)"
LOG2E = 1.0 / math.log(2.0)


def reservoir_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The tensors (name -> shape) of an ESN or NPM bundle with ``config``.

    Raises:
        BundleFormatError: unknown kind or variant, missing or non-integer sizes.
    """
    kind = config.get("kind")
    if kind not in RESERVOIR_KINDS:
        raise BundleFormatError(f"unknown reservoir kind {kind!r}; expected one of {', '.join(RESERVOIR_KINDS)}")
    if config.get("variant") not in VARIANTS[kind]:
        raise BundleFormatError(f"{kind} config variant {config.get('variant')!r}; expected one of {VARIANTS[kind]}")
    try:
        K, V, d = int(config["K"]), int(config["V"]), int(config["d"])
        M = int(config["contexts"]) if kind == "npm" else 0
    except (KeyError, TypeError, ValueError):
        raise BundleFormatError(f"{kind} config {config!r} lacks integer K, V, d (and contexts); {REBUILD}") from None
    shapes = {"E": (K, d), "W_hh": (d, d), "h0": (d,)}
    if kind == "esn":
        shapes.update({"W_out": (V, d), "b_out": (V,)})
        o_min = config.get("o_min")
        if not isinstance(o_min, (int, float)) or not 0 < o_min < 1:
            raise BundleFormatError(f"esn config needs 0 < o_min < 1; got {o_min!r}; {REBUILD}")
    else:
        shapes.update({"centroids": (M, d), "counts": (M, V)})
        gamma = config.get("gamma")
        if not isinstance(gamma, (int, float)) or not gamma > 0:
            raise BundleFormatError(f"npm config needs gamma > 0; got {gamma!r}; {REBUILD}")
    return shapes


@dataclass(frozen=True)
class ReservoirParams(RunnerParams):
    """Immutable ESN / NPM weights (float64, read-only arrays) and their config."""

    shapes = staticmethod(reservoir_shapes)

    @property
    def state_names(self) -> list[str]:
        return ["h"]

    @property
    def state_size(self) -> int:
        return self.d

    @property
    def variant(self) -> str:
        return self.config["variant"]

    def initial_state(self) -> np.ndarray:
        return self.tensors["h0"].copy()

    def log_probs(self, H: np.ndarray) -> np.ndarray:
        """Natural-log P(next symbol) of states H (..., n) -> (..., V)."""
        H = np.asarray(H, dtype=np.float64)
        t = self.tensors
        if self.kind == "esn":
            o = H @ t["W_out"].T + t["b_out"]
            o = np.maximum(o, float(self.config["o_min"]))
            return np.log(o) - np.log(o.sum(axis=-1, keepdims=True))
        c = nearest_context(t["centroids"], H)
        gamma = float(self.config["gamma"])
        counts = t["counts"][c]
        return np.log(counts + gamma) - np.log(counts.sum(axis=-1, keepdims=True) + self.V * gamma)

    readout = log_probs


def nearest_context(centroids: np.ndarray, H: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (squared Euclidean; ties to the lower index) of each state.

    centroids (M, n), H (..., n) -> int64 (...)."""
    H = np.asarray(H)
    if H.dtype != np.float32 or centroids.dtype != np.float32:  # float32 only when both are
        H, centroids = H.astype(np.float64, copy=False), np.asarray(centroids, dtype=np.float64)
    flat = H.reshape(-1, H.shape[-1])
    out = np.empty(len(flat), dtype=np.int64)
    cc = (centroids ** 2).sum(1)
    for i in range(0, len(flat), 8192):  # bounded memory: (8192, M) distances at a time
        blk = flat[i:i + 8192]
        d2 = cc[None, :] - 2.0 * blk @ centroids.T  # + |h|^2, the same for every centroid
        out[i:i + 8192] = np.argmin(d2, axis=1)
    return out.reshape(H.shape[:-1])


def reservoir_states_ref(E: np.ndarray, W_hh: np.ndarray, ids: np.ndarray, h: np.ndarray) -> np.ndarray:
    """States after each symbol: ``h_t = tanh(E[x_t] + W_hh h_{t-1})``; ids (T,), h (n,) -> (T, n)."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.empty((len(ids), E.shape[1]))
    h = np.asarray(h, dtype=np.float64)
    WT = np.ascontiguousarray(W_hh.T)
    for t, x in enumerate(ids.tolist()):
        h = np.tanh(E[x] + h @ WT)
        out[t] = h
    return out


def reservoir_score_ref(p: ReservoirParams, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bits (T,) float64, state after ids (n,) float64); ``bits_t = -log2 P(x_t | h_{t-1})``."""
    ids = np.asarray(ids, dtype=np.int64)
    state = np.asarray(state, dtype=np.float64)
    if len(ids) == 0:
        return np.zeros(0), state.copy()
    S = reservoir_states_ref(p.tensors["E"], p.tensors["W_hh"], ids, state)
    before = np.vstack([state[None, :], S[:-1]])
    lp = p.log_probs(before)
    return -lp[np.arange(len(ids)), ids] * LOG2E, S[-1].copy()


class NumpyReservoirRunner:
    """The runner protocol of :class:`isan.engine.baselines.recurrent.NumpyBaselineRunner` over an ESN or
    NPM: ``kind, K, V, d, state_size, state_names, backend, provider``, ``initial_state()``,
    ``readout(state)`` (log-probabilities as logits), ``score_ids``, ``advance_ids``,
    ``score_batch``; states are flat float64 vectors (n,).

    A loaded bundle's runner also has ``manifest`` and ``alphabet`` (see :func:`load_reservoir_bundle`).
    """

    backend = "numpy"
    provider = "numpy"

    def __init__(self, params: ReservoirParams, manifest: dict | None = None, alphabet=None):
        self.params = params
        self.kind, self.K, self.V, self.d = params.kind, params.K, params.V, params.d
        self.variant = params.variant
        self.state_names = params.state_names
        self.state_size = params.state_size
        self.manifest = manifest
        self.alphabet = alphabet

    def initial_state(self) -> np.ndarray:
        return self.params.initial_state()

    def readout(self, state: np.ndarray) -> np.ndarray:
        return self.params.log_probs(np.asarray(state, dtype=np.float64))

    def score_ids(self, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return reservoir_score_ref(self.params, ids, state)

    def advance_ids(self, ids: np.ndarray, state: np.ndarray) -> np.ndarray:
        if len(ids) == 0:
            return np.array(state, dtype=np.float64)
        t = self.params.tensors
        return reservoir_states_ref(t["E"], t["W_hh"], np.asarray(ids, dtype=np.int64), state)[-1]

    def score_batch(self, ids_list: Sequence[np.ndarray], states: Sequence[np.ndarray] | None = None):
        states = states if states is not None else [self.initial_state()] * len(ids_list)
        return [self.score_ids(x, s) for x, s in zip(ids_list, states)]

    def score_text(self, text: str) -> dict:
        """``{"tokens", "unit", "bits", "bits_per_token", "nnl"}`` of ``text`` from the initial state
        (NNL in base |A| = V, eq. 7 of Čerňanský et al. 2008). Needs a loaded bundle's alphabet."""
        if self.alphabet is None:
            raise ValueError("score_text needs the runner of a loaded bundle (it has the alphabet)")
        ids = self.alphabet.encode(text)
        bits, _ = self.score_ids(ids, self.initial_state())
        total = float(bits.sum())
        n = int(len(ids))
        bpt = total / n if n else float("nan")
        return {"tokens": n, "unit": getattr(self.alphabet, "unit", "char"), "bits": total,
                "bits_per_token": bpt, "nnl": bpt / math.log2(self.V) if n else float("nan")}


# ------------------------------------------------------------------------------------- bundles
def write_reservoir_bundle(out_dir: str | Path, kind: str, config: dict, tensors: dict[str, np.ndarray], alphabet,
                           training: dict | None = None, metrics: dict | None = None,
                           overwrite: bool = False) -> Path:
    """Write an ESN / NPM bundle atomically (layout in the module docstring).

    Args:
        kind: ``"esn"`` or ``"npm"``; config: the ``model`` config (with ``variant``, K, V, d, ...).
        tensors: arrays by name (validated against :func:`reservoir_shapes`; stored as float32).
        alphabet: any alphabet with ``to_json()`` / ``to_list()`` (isan.tokens or isan.alphabet).
    Returns:
        the bundle path.
    """
    from isan.engine.bundle import write_bundle

    config = {**config, "kind": kind}
    shapes = reservoir_shapes(config)
    t32 = {n: np.ascontiguousarray(np.asarray(a, dtype=np.float32)) for n, a in tensors.items()}
    validated_tensors(kind, shapes, t32, np.float32)
    if len(alphabet) != config["V"] or config["K"] != config["V"]:
        raise ValueError(f"alphabet has {len(alphabet)} symbols; config has K={config['K']}, V={config['V']}")
    return write_bundle(out_dir, t32, alphabet, kind=kind, training=training, metrics=metrics,
                        extra={"model": config, "d": int(config["d"])}, overwrite=overwrite)


def load_reservoir_bundle(path: str | Path) -> NumpyReservoirRunner:
    """The numpy scorer of an ESN or NPM bundle (``runner.manifest``, ``runner.alphabet`` set).

    Checks the manifest's own hash, every listed file's size and sha256, the weights'
    ``params_sha256``, shapes and finiteness.

    Raises:
        BundleFormatError: not a reservoir bundle, an edited manifest, a corrupt or swapped file.
    Example:
        >>> r = load_reservoir_bundle("results/elman/bundles/esn-100")   # doctest: +SKIP
        >>> r.score_text("boy who dogs chase sees girl .")["nnl"]          # doctest: +SKIP
    """
    from isan.engine.baselines.recurrent import load_params_bundle

    # the manifest's schema and hash, every file's record, params_sha256, shapes, K and V against the alphabet
    m, p, alphabet = load_params_bundle(path, RESERVOIR_KINDS, ReservoirParams)
    return NumpyReservoirRunner(p, manifest=m, alphabet=alphabet)
