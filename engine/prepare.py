"""Text preparation shared by every engine: the state and the normalised ids of a text
(``score``) or of a batch (``score_batch``), and the word sources of attribution.

``engine`` below is any engine with ``_state``, ``initial_state``, ``prepare`` and ``_units``
(:class:`~isan.engine.core.Engine` and :class:`~isan.engine.baselines.recurrent.RunnerEngine`).
"""

from __future__ import annotations

import re

import numpy as np

from isan.errors import EmptyTextError, IsanError
from isan.engine.results import ScoreResult, with_prefix


def prepare_one(engine, text, state, normalize, unknown: str, replacement: str | None, per_char: bool):
    """(state, prepared text, None) for ``score`` of every engine, or the empty result of a streamed
    chunk that left nothing to score (a chunk of squeezed spaces) in the last place; a text that is
    empty otherwise is an EmptyTextError."""
    streaming = state is not None
    state = engine.check_state(state)
    prep = engine.prepare(text, normalize, unknown, replacement, state)
    if len(prep.ids):
        return state, prep, None
    if streaming and len(text):
        return state, prep, ScoreResult(0, 0.0, np.zeros(0) if per_char else None, state, prep.report,
                                        np.zeros(0, dtype=np.int64) if per_char else None, "" if per_char else None,
                                        **engine.units)
    raise EmptyTextError("the text is empty (after normalisation and removing unknown characters); "
                         "give at least one character")


def prepare_batch(engine, texts, states, normalize, unknown: str, replacement: str | None):
    """The states and prepared texts of a batch (``score_batch`` of every engine): each text's
    state checked (default: the initial state), each text normalised from its state; an error names
    the text of the batch, and a text left empty is an EmptyTextError."""
    states = [engine.check_state(s) for s in states] if states is not None else [engine.initial_state()] * len(texts)
    if len(states) != len(texts):
        raise IsanError(f"got {len(texts)} texts but {len(states)} states")
    preps = []
    for i, (t, s) in enumerate(zip(texts, states)):
        try:
            preps.append(engine.prepare(t, normalize, unknown, replacement, s))
        except IsanError as e:
            raise with_prefix(e, f"text {i} of the batch: ") from None
    for i, p in enumerate(preps):
        if len(p.ids) == 0:
            raise EmptyTextError(f"text {i} of the batch is empty (after normalisation)")
    return states, preps


def word_spans(ids: np.ndarray, text: str, alphabet) -> list[tuple[int, int]]:
    """Word sources as spans of symbol positions: maximal runs of non-space or of space symbols
    (characters: of the text; bytes: the space byte; pairs: a pair is a space only if both its
    characters are); a word model's symbols are its words, each its own source."""
    if alphabet.kind == "chars":
        return [m.span() for m in re.finditer(r"[^ ]+| +", text)]
    if alphabet.kind == "words":
        return [(k, k + 1) for k in range(len(ids))]
    labels = np.array([alphabet.decode([int(i)]).strip() == "" for i in range(len(alphabet))])
    space = labels[np.asarray(ids)]
    cuts = np.flatnonzero(np.diff(space.astype(np.int8))) + 1
    bounds = [0, *cuts.tolist(), len(ids)]
    return [(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]
