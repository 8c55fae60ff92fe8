"""Sampling shared by every engine: temperature, top-k, a seeded numpy Generator.

A temperature below :data:`GREEDY_BELOW` (0 included) is greedy, as ``/v1/completions`` has it:
the most likely symbol at each step (:func:`greedy`).
"""

from __future__ import annotations

import secrets
from typing import Callable

import numpy as np

from isan.engine.reference import LOG2E, log_softmax
from isan.errors import IsanError


#: temperatures below this (0 included) sample greedily, as ``/v1/completions`` does
GREEDY_BELOW = 0.01


def greedy(temperature: float, top_k: int | None) -> tuple[float, int | None]:
    """The (temperature, top_k) that sampling at ``temperature`` runs: below :data:`GREEDY_BELOW`
    (0 included) greedy, the most likely symbol each step, drawn as top-k 1 at temperature 1 (the
    logits divided by 0 would be infinite); otherwise the arguments as they are. A negative
    temperature is returned as it is, for :func:`check_sampling_args` to refuse."""
    if 0 <= temperature < GREEDY_BELOW:
        return 1.0, 1
    return temperature, top_k


def new_seed() -> int:
    """A fresh random seed for a caller that gave none, to report with the sample so that it can be
    drawn again: 53 bits, exact in every JSON reader."""
    return secrets.randbits(53)


def check_sampling_args(n: int, temperature: float, top_k: int | None, V: int) -> None:
    """Raise IsanError for n < 0, temperature < 0 (or NaN) or top_k outside [1, V]; temperature 0
    is greedy (:func:`greedy`)."""
    if n < 0:
        raise IsanError(f"n must be >= 0; got {n}")
    if top_k is not None and not 1 <= top_k <= V:
        raise IsanError(f"top_k must be in [1, {V}]; got {top_k}")
    if not temperature >= 0:
        raise IsanError(f"temperature must be >= 0 (0: greedy); got {temperature}")


def sample_ids(readout: Callable[[np.ndarray], np.ndarray], step: Callable[[np.ndarray, int], np.ndarray],
               h: np.ndarray, n: int, temperature: float = 1.0, top_k: int | None = None,
               seed: int | None = None) -> tuple[list[int], float]:
    """Draw ``n`` symbols, each from ``softmax(readout(h) / temperature)`` (restricted to the top k).

    Args:
        readout: state -> logits (V,); step: (state, symbol) -> next state.
        temperature: >= 0; below :data:`GREEDY_BELOW` (0 included) greedy (:func:`greedy`).
    Returns:
        (symbol ids, total bits of the drawn symbols under the unscaled model).
    """
    temperature, top_k = greedy(temperature, top_k)
    rng = np.random.default_rng(seed)
    out, bits = [], 0.0
    for _ in range(n):
        logits = np.asarray(readout(h), dtype=np.float64)
        z = logits / temperature
        if top_k is not None and top_k < len(z):
            cut = np.partition(z, -top_k)[-top_k]
            z = np.where(z >= cut, z, -np.inf)
        probs = np.exp(log_softmax(z))
        x = int(min(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right"), len(probs) - 1))
        bits -= log_softmax(logits)[x] * LOG2E
        out.append(x)
        h = step(h, x)
    return out, float(bits)
