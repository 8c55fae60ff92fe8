"""Sampling shared by every engine: temperature, top-k, a seeded numpy Generator."""

from __future__ import annotations

from typing import Callable

import numpy as np

from isan.engine.reference import LOG2E, log_softmax
from isan.errors import IsanError


def check_sampling_args(n: int, temperature: float, top_k: int | None, V: int) -> None:
    """Raise IsanError for n < 0, temperature <= 0 or top_k outside [1, V]."""
    if n < 0:
        raise IsanError(f"n must be >= 0; got {n}")
    if top_k is not None and not 1 <= top_k <= V:
        raise IsanError(f"top_k must be in [1, {V}]; got {top_k}")
    if not temperature > 0:
        raise IsanError(f"temperature must be > 0; got {temperature}")


def sample_ids(readout: Callable[[np.ndarray], np.ndarray], step: Callable[[np.ndarray, int], np.ndarray],
               h: np.ndarray, n: int, temperature: float = 1.0, top_k: int | None = None,
               seed: int | None = None) -> tuple[list[int], float]:
    """Draw ``n`` symbols, each from ``softmax(readout(h) / temperature)`` (restricted to the top k).

    Args:
        readout: state -> logits (V,); step: (state, symbol) -> next state.
    Returns:
        (symbol ids, total bits of the drawn symbols under the unscaled model).
    """
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
