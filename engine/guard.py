"""The engine's promise that no NaN or inf (or meaningless overflowed number) reaches an output.

A state is *in range* while ``max |h_i| <= MAX_STATE_ABS``. On the text8-10M test split the
shipped model's states stay below 22 in absolute value (median of the per-state maximum: 3.6),
so the bound sits about 450 times above anything real text produces, and well inside the range
where float32 scoring keeps its accuracy (a float32 ulp at 1e4 is 1e-3). Letters whose matrix
has spectral radius above 1 ('z' 2.17, 'x' 1.54 in the shipped model) leave the range when
repeated: 'z' after about 10 repeats.

Every path (reference, composed, chunk-parallel, batched, ONNX) checks its states and bits; when
a check fails, :func:`raise_diverged` locates the first offending character with the float64
reference recurrence and raises :class:`~isan.errors.StateDivergedError` naming it.
"""

from __future__ import annotations

import numpy as np

from isan.errors import StateDivergedError

#: Largest |h_i| the engine accepts (see the module docstring for why).
MAX_STATE_ABS = 1e4

#: The command that lists the repeats that make a model diverge. Divergence messages name it in
#: backquotes; the CLI adds the ``--model`` it was given (:func:`isan.cli.helpers.friendly`).
MODEL_CHECK = "isan model check"


def first_out_of_range(W: np.ndarray, b: np.ndarray, ids: np.ndarray, h: np.ndarray,
                       limit: float = MAX_STATE_ABS) -> int | None:
    """Offset of the first character after which the float64 state leaves the range, else None.

    Args:
        W: (K, d, d); b: (K, d); ids: (T,) int; h: (d,) the state before ``ids[0]``.
    Returns:
        t such that ``max |h_t| > limit`` (h_t: the state after ``ids[t]``), first such t; None if none.
    """
    h = np.asarray(h, dtype=np.float64)
    if not np.all(np.isfinite(h)) or np.abs(h).max(initial=0.0) > limit:
        return 0
    W = np.asarray(W, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    for t, x in enumerate(np.asarray(ids).tolist()):
        h = W[x] @ h + b[x]
        if not np.abs(h).max() <= limit:  # also catches NaN
            return t
    return None


def raise_diverged(W: np.ndarray, b: np.ndarray, ids: np.ndarray, h: np.ndarray, where: str,
                   detected_at: int | None = None, cause: str | None = None, base_offset: int = 0,
                   symbols=None) -> None:
    """Locate the first out-of-range state with the float64 reference and raise StateDivergedError.

    Args:
        where: which path detected it (``"composed"``, ``"reference"``, ...), for the message.
        detected_at: offset where the fast path noticed it (used if the reference finds none).
        base_offset: added to offsets (when ``ids`` is a slice of a longer text).
        symbols: the alphabet's symbols (id order), to name a repeated letter or pair in the message.
    Raises:
        StateDivergedError: always.
    """
    stop = len(ids) if detected_at is None else min(len(ids), detected_at + 1)
    t = first_out_of_range(W, b, ids[:stop], h)
    if t is None:
        t = detected_at
        cause = cause or "non-finite bits"
    else:
        cause = cause or f"state overflow (|h| > {MAX_STATE_ABS:g})"
    off = None if t is None else int(t) + base_offset
    if off is not None:
        ids = np.asarray(ids)
        run = repeat_hint(ids, t, symbols)
        msg = (f"the model's state diverges at character offset {off} ({cause}, {where} path){run}; "
               f"the model cannot score this text meaningfully. `{MODEL_CHECK}` lists the letters and "
               "pairs whose repeats make this model diverge")
    else:
        msg = f"the model's state diverges ({cause}, {where} path); `{MODEL_CHECK}` lists the letters and pairs that do this"
    raise StateDivergedError(msg, offset=off, cause=cause)


def repeat_hint(ids: np.ndarray, t: int, symbols=None) -> str:
    """", after 15 repeats of 'z'"-style context: the letter or pair of letters repeated up to t."""
    if t is None or t >= len(ids):
        return ""
    ids = np.asarray(ids)
    best = ""
    for period in (1, 2):
        if t + 1 < 2 * period:
            continue
        unit = ids[t - period + 1 : t + 1]
        n = 0  # characters ending at t that repeat the unit
        while t - n >= 0 and ids[t - n] == unit[(period - 1 - n) % period]:
            n += 1
        reps = n // period
        if period == 2 and unit[0] == unit[1]:
            continue
        if reps >= (4 if period == 1 else 3):
            if symbols is not None:
                # the unit in reading order, starting where the run starts
                start = t - n + 1
                u = "".join(symbols[int(i)] for i in ids[start : start + period])
                name = repr(u)
            else:
                name = "symbol id " + "+".join(str(int(i)) for i in unit)
            best = f", after {n} characters repeating {name}"
            break
    return best


def check_states(H: np.ndarray) -> int | None:
    """Row index of the first state (rows of H, (..., d)) out of range or non-finite, else None."""
    H = np.asarray(H)
    if H.size == 0:
        return None
    m = np.abs(H.reshape(len(H), -1)).max(axis=1)
    bad = ~(m <= MAX_STATE_ABS)
    return int(np.argmax(bad)) if bad.any() else None


def check_bits(bits: np.ndarray) -> int | None:
    """Index of the first non-finite value of ``bits``, else None."""
    bits = np.asarray(bits)
    bad = ~np.isfinite(bits)
    return int(np.argmax(bad)) if bad.any() else None
