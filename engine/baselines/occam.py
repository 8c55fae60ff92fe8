"""Numpy reference of the Occam-gated LSTM (Raiman and Sidor 2015; torch module
:mod:`isan.train.occam`), float64, one symbol at a time, no torch.

The LSTM of :mod:`isan.engine.baselines.recurrent` with a scalar gate on its input::

    g_t = s(p[x_t] + q . h_{t-1} [+ Q[x_t] . h_{t-1}])        (s = logistic sigmoid)
    z   = g_t E[x_t] + b_in + W_hh h_{t-1}                    blocks i, f, g, o of d
    c_t = s(z_f) c_{t-1} + s(z_i) tanh(z_g);   h_t = s(z_o) tanh(c_t)
    bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]          (the state before x_t predicts it)

Tensors (names of the torch module's state dict, float32 in a checkpoint): E (K, 4d), b_in (4d,),
W_hh (4d, d), p (K,), q (d,), Q (K, d) for the second-order gate only, W_ro (V, d), b_ro (V,),
h0 (d,), c0 (d,). A state is ``concat(h, c)`` (2 d,), as for the LSTM baseline, so
:class:`NumpyOccamRunner` has the runner protocol of :class:`isan.engine.baselines.recurrent.NumpyBaselineRunner`.
An Occam bundle would be a baseline-style bundle with ``kind`` "occam" (the lead's export wires it);
ONNX: the same graph as the LSTM's plus the gate, not written yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isan.errors import BundleFormatError
from isan.engine.baselines.recurrent import NumpyBaselineRunner, RunnerParams, bits_from_logits, sigmoid

OCCAM_KINDS = ("occam", "occam_nopenalty", "occam2", "occam_strong", "occam_sched_flat", "occam_sched_linear",
               "occam_sched_quadratic")


def occam_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The tensors (name -> shape) of an Occam LSTM with ``config`` (``OccamLSTM.config()``)."""
    if config.get("kind") not in OCCAM_KINDS:
        raise BundleFormatError(f"unknown Occam kind {config.get('kind')!r}; expected one of {OCCAM_KINDS}")
    try:
        K, V, d = int(config["K"]), int(config["V"]), int(config["d"])
    except (KeyError, TypeError, ValueError):
        raise BundleFormatError(f"Occam config {config!r} lacks integer K, V and d") from None
    gate = config.get("gate", "first")
    if gate not in ("first", "second"):
        raise BundleFormatError(f"Occam config gate {gate!r}; expected first or second")
    shapes = {"E": (K, 4 * d), "b_in": (4 * d,), "W_hh": (4 * d, d), "p": (K,), "q": (d,), "W_ro": (V, d),
              "b_ro": (V,), "h0": (d,), "c0": (d,)}
    if gate == "second":
        shapes["Q"] = (K, d)
    return shapes


@dataclass(frozen=True)
class OccamParams(RunnerParams):
    """Immutable Occam LSTM weights (float64, read-only) and config."""

    shapes = staticmethod(occam_shapes)

    @property
    def state_names(self) -> list[str]:
        return ["h", "c"]

    @property
    def state_size(self) -> int:
        return 2 * self.d

    def initial_state(self) -> np.ndarray:
        return np.concatenate([self.tensors["h0"], self.tensors["c0"]])

    def readout(self, state: np.ndarray) -> np.ndarray:
        h = np.asarray(state)[..., : self.d]
        return h @ self.tensors["W_ro"].T + self.tensors["b_ro"]


def occam_step_ref(p: OccamParams, state: np.ndarray, x: int) -> tuple[np.ndarray, float]:
    """One step: flat state (2d,) and symbol x -> (new flat state (2d,), gate g in (0, 1))."""
    t, d = p.tensors, p.d
    h, c = state[:d], state[d:]
    zg = t["p"][x] + t["q"] @ h
    if "Q" in t:
        zg += t["Q"][x] @ h
    g = float(sigmoid(np.float64(zg)))
    z = g * t["E"][x] + t["b_in"] + t["W_hh"] @ h
    c = sigmoid(z[d:2 * d]) * c + sigmoid(z[:d]) * np.tanh(z[2 * d:3 * d])
    return np.concatenate([sigmoid(z[3 * d:]) * np.tanh(c), c]), g


def occam_states_ref(p: OccamParams, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat states after each symbol (T, 2d), gates (T,)) from ``state`` before ids[0]."""
    out = np.empty((len(ids), p.state_size))
    gates = np.empty(len(ids))
    s = np.asarray(state, dtype=np.float64)
    for i, x in enumerate(np.asarray(ids, dtype=np.int64).tolist()):
        s, gates[i] = occam_step_ref(p, s, x)
        out[i] = s
    return out, gates


def occam_score_ref(p: OccamParams, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bits (T,) float64, final flat state (2d,))."""
    ids = np.asarray(ids, dtype=np.int64)
    state = np.asarray(state, dtype=np.float64)
    if len(ids) == 0:
        return np.zeros(0), state.copy()
    S, _ = occam_states_ref(p, ids, state)
    before = np.vstack([state[None, :], S[:-1]])
    return bits_from_logits(p.readout(before), ids), S[-1].copy()


def _occam_states(p: OccamParams, ids: np.ndarray, state: np.ndarray) -> np.ndarray:
    return occam_states_ref(p, ids, state)[0]


class NumpyOccamRunner(NumpyBaselineRunner):
    """The runner protocol of :class:`isan.engine.baselines.recurrent.NumpyBaselineRunner` over an Occam LSTM."""

    score_ref = staticmethod(occam_score_ref)
    states_ref = staticmethod(_occam_states)
