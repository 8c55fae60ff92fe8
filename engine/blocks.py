"""Scoring a text of any length in bounded memory: read it in blocks, carry the state across them.

Scoring holds per-character arrays (ids, offsets, bits, states of the chunk-parallel pass: about
70 bytes a character), so a 50 MB file scored whole needs gigabytes. Here a text is read and scored
in blocks of ``block_chars`` characters; each block starts from the state the previous one ended in
(with its last symbol, so normalisation squeezes spaces across the cut as it would in one piece).
Because the dynamics are exact, the bits equal those of one call on the whole text up to float
rounding (the tests hold the total to a relative 1e-9); memory is bounded by the block, not the text.

Only character models stream this way: a token model's tokens (pairs, words) could straddle a cut,
so :func:`score_blocks` refuses them and callers score such texts whole.
"""

from __future__ import annotations

import codecs
import copy
import re
from collections import Counter
from pathlib import Path
from typing import IO, Iterable, Iterator

import numpy as np

from isan.errors import AlphabetError, IsanError, StateDivergedError

#: characters a block holds. A block is scored chunk-parallel; by composed jumps (issue 22) only when
#: it makes 512 chunks of at least 1,024 characters a thread, so 1M-character blocks (976 chunks)
#: stepped one character at a time: `isan score` of 2.5M unseen text8 characters ran at 1.98M
#: chars/s in 1M blocks, 2.47M in 2.5M blocks (2,441 chunks, jumps), peak RSS 184 against 250 MiB
#: (score_blocks in one process, best of 3; development runs). Memory stays bounded by the block.
DEFAULT_BLOCK_CHARS = 2_500_000
_READ_BYTES = 1 << 20
#: scored characters kept from earlier blocks to count a repeated letter or pair across a cut
TAIL_CHARS = 1 << 22


class NotUTF8Error(IsanError, ValueError):
    """The input's bytes are not UTF-8; ``byte_offset`` is the offset of the first bad byte."""

    def __init__(self, message: str, byte_offset: int | None = None):
        super().__init__(message)
        self.byte_offset = byte_offset


def read_blocks(source: str | Path | IO[bytes] | IO[str], block_chars: int = DEFAULT_BLOCK_CHARS) -> Iterator[str]:
    """Yield the text of a UTF-8 file (a path, or an open binary or text stream) in blocks.

    Args:
        source: a path, or a readable file object (bytes are decoded as UTF-8, incrementally, so a
            character split between two reads is kept whole).
        block_chars: characters a block holds (the last block may be shorter).
    Raises:
        NotUTF8Error: the bytes are not UTF-8 (``.byte_offset`` says where).
    """
    if block_chars < 1:
        raise IsanError(f"block_chars must be at least 1; got {block_chars}")
    if isinstance(source, (str, Path)):
        with open(source, "rb") as f:
            yield from read_blocks(f, block_chars)
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending, consumed = "", 0
    while True:
        raw = source.read(_READ_BYTES)
        if isinstance(raw, str):
            data, done = raw, not raw
        else:
            try:
                data, done = decoder.decode(raw, final=not raw), not raw
            except UnicodeDecodeError as e:
                held = len(decoder.getstate()[0]) if not raw else 0
                raise NotUTF8Error(f"the input is not UTF-8 text: {e.reason} at byte offset "
                                   f"{consumed - held + e.start}", byte_offset=consumed - held + e.start) from None
            consumed += len(raw)
        pending += data
        while len(pending) >= block_chars:
            yield pending[:block_chars]
            pending = pending[block_chars:]
        if done:
            break
    if pending:
        yield pending


def _shift(e: IsanError, input_base: int, scored_base: int) -> IsanError:
    """The same error with its offsets counted from the start of the whole text."""
    new = copy.copy(e)
    msg = str(e)
    if isinstance(e, AlphabetError) and e.offset is not None:
        new.offset = e.offset + input_base
        msg = msg.replace(f"at offset {e.offset} ", f"at offset {new.offset} ", 1)
    elif isinstance(e, StateDivergedError):
        if e.offset is not None:
            new.offset = e.offset + scored_base
        inp = getattr(e, "input_offset", None)
        if inp is not None:
            new.input_offset = inp + input_base
            msg = msg.replace(f"input offset {inp} (scored character {e.offset},",
                              f"input offset {new.input_offset} (scored character {new.offset},", 1)
        if e.offset is not None:
            msg = re.sub(rf"character offset {e.offset}\b", f"character offset {new.offset}", msg, count=1)
    new.args = (msg,) + tuple(e.args[1:])
    return new


def _merge_reports(reports: list[dict]) -> dict | None:
    if not reports:
        return None
    out = dict(reports[0])
    for key in ("chars_read", "chars_scored", "changed", "dropped", "skipped", "replaced"):
        out[key] = int(sum(r.get(key, 0) for r in reports))
    for key in ("most_changed", "most_dropped"):
        counts: Counter = Counter()
        for r in reports:
            for m in r.get(key, []):
                counts[m["char"]] += m["count"]
        # each block reports its own top five: a character is undercounted in the blocks where it
        # was not among them (the other counts are exact)
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        out[key] = [{"char": c, "count": n} for c, n in top]
    return out


def score_blocks(engine, blocks: Iterable[str], unknown: str = "error", replacement: str | None = None,
                 normalize: str | None = "auto", state=None):
    """Score a text given as consecutive blocks, carrying the state across them.

    Args:
        engine: an :class:`isan.engine.Engine` (or a runner engine) of a character model.
        blocks: the text's consecutive pieces (:func:`read_blocks`); empty pieces are skipped.
        state: where the text starts (default: the model's initial state).
    Returns:
        a :class:`isan.engine.ScoreResult` for the whole text (no per-character arrays), whose
        ``normalization`` sums the blocks' reports; ``scoring`` is the block's own report (one
        block, as :meth:`Engine.score` gives it) or ``{"path": "blocks", "blocks", "paths": {path: blocks}, "residual"}``.
    Raises:
        IsanError: a token model (its tokens could straddle a cut; score the text whole).
        EmptyTextError: nothing was scored.
        AlphabetError, StateDivergedError: with offsets counted from the start of the whole text.
    """
    from isan.engine.results import ScoreResult
    from isan.errors import EmptyTextError

    if engine.alphabet.unit != "char":
        raise IsanError(f"block-wise scoring is for character models; this model reads {engine.alphabet.unit}s")
    start = state if state is not None else engine.initial_state()
    cur = start
    reports, chars, bits, n_blocks, read = [], 0, 0.0, 0, 0
    scorings = []
    tail = np.zeros(0, dtype=np.int64)  # the last scored ids, to count a repeat that spans blocks
    for block in blocks:
        if not block:
            continue
        try:
            r = engine.score(block, state=cur, per_char=True, unknown=unknown, replacement=replacement,
                             normalize=normalize)
        except StateDivergedError as e:
            if e.offset is not None and len(tail):  # count the repeat from where it began
                from isan.engine.results import with_repeat_hint

                ids = engine.prepare(block, normalize, unknown, replacement, cur).ids[: e.offset + 1]
                e = copy.copy(e)
                e.args = (with_repeat_hint(str(e), np.concatenate([tail, ids]), len(tail) + e.offset,
                                           engine.alphabet.symbols),) + tuple(e.args[1:])
            raise _shift(e, read, chars) from None
        except AlphabetError as e:
            raise _shift(e, read, chars) from None
        if r.chars:
            tail = np.concatenate([tail, engine.alphabet.encode(r.text)])[-TAIL_CHARS:]
        read += len(block)
        n_blocks += 1
        cur = r.state
        chars += r.chars
        bits += r.bits
        reports.append(r.normalization)
        scorings.append(r.scoring)
    if chars == 0:
        raise EmptyTextError("the text is empty (after normalisation and removing unknown characters); "
                             "give at least one character")
    if n_blocks == 1:
        scoring = scorings[0]
    else:
        paths = Counter(str((sc or {}).get("path")) for sc in scorings)
        scoring = {"path": "blocks", "blocks": n_blocks, "paths": dict(paths)}
        residuals = [sc["residual"] for sc in scorings if sc and sc.get("residual") is not None]
        if residuals:
            scoring["residual"] = float(max(residuals))
    bits_total = float(np.float64(bits))
    return ScoreResult(chars, bits_total, None, cur, _merge_reports([r for r in reports if r]), None, None,
                       scoring, unit="char", V=len(engine.alphabet))
