"""Numpy reference of the linear controls (``linear``, ``linear_nlro``, ``isan_nobias``).

The twin of :mod:`isan.train.linear` (torch), in float64, one character at a time, no torch
(column vectors; docs/ARCHITECTURE.md, 'The model and its conventions'):

* ``linear``:      ``h' = W h + E[x]``,   ``logits = W_ro h + b_ro``
* ``linear_nlro``: ``h' = W h + E[x]``,   ``logits = W_ro tanh(W_mlp h + b_mlp) + b_ro``
* ``isan_nobias``: ``h' = W[x] h``,       ``logits = W_ro h + b_ro``

and ``bits_t = -log2 softmax(logits(h_{t-1}))[x_t]``: the state *before* x_t predicts it.
A state is the flat float64 vector ``h`` (d,).

Bundles are written by :func:`isan.export.checkpoint.export_checkpoint`: ``weights.safetensors``
holds every tensor of the state dict in float32, the manifest's ``model`` field the config of
:meth:`isan.train.linear.LinearRNN.config` and ``params_sha256`` covers every tensor in sorted
name order (as for the baselines). :func:`load_linear_engine` gives such a bundle the scoring
API of :class:`isan.engine.Engine` through :class:`isan.engine.baselines.recurrent.RunnerEngine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isan.alphabet import Alphabet
from isan.engine.baselines.recurrent import (
    NumpyBaselineRunner,
    RunnerEngine,
    RunnerParams,
    bits_from_logits,
    load_params_bundle,
)
from isan.errors import BundleFormatError

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
class LinearParams(RunnerParams):
    """Immutable weights of a linear control (float64 by default; arrays read-only)."""

    shapes = staticmethod(linear_shapes)

    @property
    def state_size(self) -> int:
        return self.d

    @property
    def state_names(self) -> list[str]:
        return ["h"]

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
    return load_params_bundle(path, tuple(LINEAR_KINDS), LinearParams)


class NumpyLinearRunner(NumpyBaselineRunner):
    """The runner protocol of :class:`isan.engine.baselines.recurrent.NumpyBaselineRunner` over
    :class:`LinearParams` (numpy, float64, one character at a time); states are (d,)."""

    score_ref = staticmethod(linear_score_ref)
    states_ref = staticmethod(linear_states_ref)


def load_linear_engine(path: str | Path) -> RunnerEngine:
    """A linear-control bundle on the numpy reference backend (``isan score --model BUNDLE``).

    Raises:
        BundleFormatError: see :func:`load_linear_bundle`.
    """
    m, p, alphabet = load_linear_bundle(path)
    return RunnerEngine(NumpyLinearRunner(p), alphabet, m, source=str(path), path="reference")
