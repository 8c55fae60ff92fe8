"""A part's texts normalised and mapped to ids together, with the string methods and numpy calls
that run in C over all of them at once.

:func:`isan.engine.normalize.prepare` takes one text a call: a part of 10,000 documents is
10,000 calls, each a dozen numpy calls on a short array, and most of a reader's time went there.
:func:`prepare_texts` does what ``prepare`` does for the two normalisers a corpus meets (``text8``
version 1 and ``none``) to every text of a part, in runs of about :data:`PASS_CHARS` characters:
the texts are joined and encoded one byte a character (``latin-1``; a character past U+00FF as
``?``: text8 makes both a space), mapped by ``bytes.translate`` (A-Z lower-cased, every other
character but a-z and the digits a space), the digits spelled out by ``bytes.replace``, the runs of
spaces squeezed (each text starts afresh, as ``prepare`` with ``context=""``) and the characters
mapped to ids (by arithmetic for text8's own alphabet, else by ``bytes.translate``). Where the offsets in the input do not step by one (a
squeezed space, a spelled-out digit) and what each text's report counts are worked out from the
few positions that changed, never from an index array as long as the text.

The ids, the offsets in the input and the reports are those of ``prepare`` to the last bit
(``tests/test_corpus_batch_prepare.py`` checks them against it); a text this module does not take
(empty, a byte-order mark at its start, a character outside the alphabet, an alphabet that is not
of characters or holds over 255 symbols) is left to ``prepare``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isan.engine.normalize import DIGIT_WORDS

#: the characters text8 normalises to
TEXT8_CHARS = " abcdefghijklmnopqrstuvwxyz"
#: a text is taken here only below this length (a count and a code point share one 64-bit sort key)
MAX_TEXT_CHARS = 1 << 21
#: characters prepared in one pass at most (a part's texts are taken in runs of about this many: the
#: arrays of a pass stay in the processor's cache, and the memory of one pass serves the next)
PASS_CHARS = 1 << 19

#: text8's mapping of a byte (a character up to U+00FF): a-z and 0-9 kept, A-Z lower-cased, else a space
_TEXT8_MAP = bytes(c if 97 <= c <= 122 or 48 <= c <= 57 else c + 32 if 65 <= c <= 90 else 32 for c in range(256))
_DIGITS = b"0123456789"
_WORD_LEN = np.array([len(w) for w in DIGIT_WORDS], dtype=np.int64)


@dataclass
class TextsPrepared:
    """Texts prepared together (:func:`prepare_texts`), in the order given.

    Attributes:
        ids: uint8 (total,): the texts' ids, concatenated.
        lengths: int64 (n,): ids of each text.
        steps_at, steps: int64: the positions in ``ids`` whose offset in the input is not one past
            the one before (a text's first, 0 from its start; after a squeezed space; within a
            spelled-out digit), and those steps.
        counts: int64 (n, 4): each text's ``chars_read``, ``chars_scored``, ``changed``, ``dropped``.
        changed_top, dropped_top: (text, code point, count), three int64 arrays: each text's five
            most frequent changed (dropped) input characters, most frequent first, ties by code point.
        normalizer: the normaliser's id (``"text8-v1"``, ``"none-v1"``).
    """

    ids: np.ndarray
    lengths: np.ndarray
    steps_at: np.ndarray
    steps: np.ndarray
    counts: np.ndarray
    changed_top: tuple
    dropped_top: tuple
    normalizer: str


def id_table(alphabet) -> bytes | None:
    """The ``bytes.translate`` table of ``alphabet``: each character up to U+00FF to its id, 255
    where it is not in the alphabet; None for an alphabet this module does not take (not of
    characters, or of over 255 symbols: 255 marks the unknown)."""
    if getattr(alphabet, "kind", None) != "chars" or len(alphabet) > 255:
        return None
    table = bytearray(b"\xff" * 256)
    for i, s in enumerate(alphabet.symbols):
        if ord(s) < 256:
            table[ord(s)] = i
    return bytes(table)


def _encoded(texts: list[str]) -> tuple[bytes, bool, np.ndarray]:
    """(the texts joined, one byte a character (``?`` for one past U+00FF); whether every
    character fitted; int64 (n + 1,) where each text starts, and the end)."""
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=starts[1:])
    joined = "".join(texts)
    if joined.isascii():
        return joined.encode("ascii"), True, starts
    try:
        return joined.encode("latin-1"), True, starts
    except UnicodeEncodeError:
        return joined.encode("latin-1", "replace"), False, starts


def _sums(pos: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """int64 (n,): how many of the sorted positions ``pos`` fall in each text (``starts``: n + 1 bounds)."""
    return np.diff(np.searchsorted(pos, starts)).astype(np.int64)


def _top(pos: np.ndarray, codes: np.ndarray, per_text: np.ndarray, top: int = 5) -> tuple:
    """(text, code point, count) int64 of each text's ``top`` most frequent characters at the
    sorted positions ``pos`` (``codes``: their code points; ``per_text``: how many a text has),
    most frequent first, ties by code point."""
    if not len(pos):
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    text = np.repeat(np.arange(len(per_text), dtype=np.int64), per_text)
    small = codes < 256
    counts = np.bincount(text[small] * 256 + codes[small], minlength=len(per_text) * 256)
    key = np.flatnonzero(counts)
    t, c, n = key >> 8, key & 255, counts[key]
    if not small.all():  # code points past U+00FF (few): counted by sorting
        keys, k = np.unique((text[~small] << 21) | codes[~small], return_counts=True)
        t, c, n = np.concatenate([t, keys >> 21]), np.concatenate([c, keys & ((1 << 21) - 1)]), np.concatenate([n, k])
    # one key a (text, character): the text, then the count falling, then the code point rising
    order = np.argsort((t << 42) | (((1 << 21) - 1 - n) << 21) | c, kind="stable")
    t, c, n = t[order], c[order], n[order]
    keep = np.arange(len(t)) - np.searchsorted(t, t, side="left") < top
    return t[keep], c[keep], n[keep]


@dataclass
class _Words:
    """Where the digits' words lie in the text with its digits spelled out (a digit a word)."""

    digits: np.ndarray  # int64: each digit's position in the input
    at: np.ndarray  # int64: its word's start in the spelled-out text
    inner: np.ndarray  # int64, sorted: the positions of the words' characters after their first
    extra: np.ndarray  # int64: characters the words add (a word's length - 1), summed up to each

    def shift(self, pos: np.ndarray) -> np.ndarray:
        """Characters the words of the digits before each input position (``pos``) add."""
        k = np.searchsorted(self.digits, pos, side="left")
        return np.where(k > 0, self.extra[np.maximum(k - 1, 0)], 0)


def _spell_digits(mapped: bytes) -> tuple[bytes, _Words | None]:
    """``mapped`` with each digit spelled out as its word (``DIGIT_WORDS``), and where the words are."""
    arr = np.frombuffer(mapped, dtype=np.uint8)
    digits = np.flatnonzero((arr >= 48) & (arr <= 57))
    if not len(digits):
        return mapped, None
    for d in range(10):
        mapped = mapped.replace(_DIGITS[d : d + 1], DIGIT_WORDS[d].encode("ascii"))
    more = _WORD_LEN[arr[digits] - 48] - 1
    extra = np.cumsum(more)
    at = digits + extra - more
    inner = np.repeat(at + 1 - (extra - more), more) + np.arange(int(extra[-1]))
    return mapped, _Words(digits, at, inner, extra)


def _steps(squeezed: np.ndarray, removed: np.ndarray, inner: np.ndarray | None, inner_at: np.ndarray | None,
           text_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the ids, steps) where the offsets in the input do not step by one.

    In the spelled-out text (``squeezed``: bool, its squeezed spaces, at ``removed``) a character
    steps 0 from the one before inside a word (``inner``: bool, None without digits; ``inner_at``:
    where), else 1; a kept one steps by its own step and those of the run of squeezed ones just
    before it, and a text's first (at ``text_at``) by 0.
    """
    size = len(squeezed)
    pos, out, step = [], [], []
    if len(removed):
        brk = removed[1:] != removed[:-1] + 1
        first, last = np.flatnonzero(np.insert(brk, 0, True)), np.flatnonzero(np.append(brk, True))
        after = removed[last] + 1  # the kept character after each run
        if inner is None:
            run_steps = last - first + 1
            own = np.ones(len(after), dtype=np.int64)
        else:
            cum = np.zeros(len(removed) + 1, dtype=np.int64)
            np.cumsum(~inner[removed], out=cum[1:])
            run_steps = cum[last + 1] - cum[first]
            own = (~inner[np.minimum(after, size - 1)]).astype(np.int64)
        ok = after < size
        pos.append(after[ok])
        out.append(after[ok] - last[ok] - 1)
        step.append(own[ok] + run_steps[ok])
    if inner is not None:  # the kept characters of a word after its first, unless a run is just before them
        skip = squeezed.copy()
        if len(removed):
            skip[pos[0]] = True
        k = inner_at[~skip[inner_at]]
        pos.append(k)
        out.append(k - np.searchsorted(removed, k))
        step.append(np.zeros(len(k), dtype=np.int64))
    pos, out, step = (np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in (pos, out, step))
    if inner is not None and len(removed):
        order = np.argsort(pos, kind="stable")
        pos, out, step = pos[order], out[order], step[order]
    keep = step != 1
    at = np.searchsorted(pos, text_at)  # a text's first is listed below, with its step 0
    hit = at < len(pos)
    hit[hit] = pos[at[hit]] == text_at[hit]
    keep[at[hit]] = False
    pos, out, step = pos[keep], out[keep], step[keep]
    at = np.searchsorted(pos, text_at)
    return np.insert(out, at, text_at - np.searchsorted(removed, text_at)), np.insert(step, at, 0)


def _ids_of(spelled: bytes, keep: np.ndarray | None, table: bytes) -> np.ndarray:
    """uint8: the ids of the kept characters (``keep``: bool, None for all) of text8's output."""
    out = np.frombuffer(spelled, dtype=np.uint8)
    if keep is not None:
        out = out[keep]
    if table[32] == 0 and table[97:123] == bytes(range(1, 27)):  # text8's own order: " " 0, a-z 1-26
        out = out - 96 if keep is None else np.subtract(out, 96, out=out)
        np.maximum(out.view(np.int8), 0, out=out.view(np.int8))
        return out
    return np.frombuffer(out.tobytes().translate(table), dtype=np.uint8).copy()


def _text8_pass(texts: list[str], table: bytes) -> TextsPrepared:
    """wikifil.pl's mapping (:data:`isan.engine.normalize.TEXT8_V1`) of the texts of one pass."""
    raw, exact, starts = _encoded(texts)
    spelled, words = _spell_digits(raw.translate(_TEXT8_MAP))
    text_at = starts[:-1] + (words.shift(starts[:-1]) if words is not None else 0)
    arr = np.frombuffer(spelled, dtype=np.uint8)
    space = arr == 32
    squeezed = np.empty_like(space)
    squeezed[0] = False
    np.logical_and(space[1:], space[:-1], out=squeezed[1:])
    squeezed[text_at] = False  # each text starts afresh: no space before it
    removed = np.flatnonzero(squeezed)
    ids = _ids_of(spelled, ~squeezed if len(removed) else None, table)
    bounds = np.append(text_at, len(arr))
    lengths = np.diff(bounds) - _sums(removed, bounds)
    # an input character is dropped when its one output character was squeezed (a word keeps its letters)
    inner = None
    if words is None:
        dropped = removed
    else:
        inner = np.zeros(len(arr), dtype=bool)
        inner[words.inner] = True
        in_word = inner.copy()
        in_word[words.at] = True
        dropped = removed[~in_word[removed]]
        k = np.searchsorted(words.at, dropped)  # the words before each: its input position
        dropped = dropped - np.where(k > 0, words.extra[np.maximum(k - 1, 0)], 0)
    a = np.frombuffer(raw, dtype=np.uint8)
    flags = (a != 32) & ((a < 97) | (a > 122))  # a character reaches text8 changed: anything but a-z and " "
    flags[dropped] = False
    changed = np.flatnonzero(flags)
    n_changed, n_dropped = _sums(changed, starts), _sums(dropped, starts)
    at, steps = _steps(squeezed, removed, inner, words.inner if words is not None else None, text_at)
    counts = np.stack([np.diff(starts), lengths, n_changed, n_dropped], axis=1)
    code = _code_points(a, exact, texts)
    return TextsPrepared(ids, lengths, at, steps, counts, _top(changed, code(changed), n_changed),
                         _top(dropped, code(dropped), n_dropped), "text8-v1")


def _code_points(arr: np.ndarray, exact: bool, texts: list[str]):
    """A function of sorted positions: their int64 code points in the texts joined (``arr``: one
    byte a character, ``exact`` when no character was past U+00FF)."""
    if exact:
        return lambda pos: arr[pos].astype(np.int64)
    wide = []

    def code(pos: np.ndarray) -> np.ndarray:
        if not wide:
            wide.append(np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype="<u4"))
        return wide[0][pos].astype(np.int64)

    return code


def _none_pass(texts: list[str], table: bytes) -> TextsPrepared:
    """The identity normaliser of texts whose characters are all in the alphabet (ASCII)."""
    raw, _, starts = _encoded(texts)
    read = np.diff(starts)
    z = np.zeros(0, dtype=np.int64)
    counts = np.stack([read, read, np.zeros_like(read), np.zeros_like(read)], axis=1)
    ids = np.frombuffer(raw.translate(table), dtype=np.uint8).copy()
    return TextsPrepared(ids, read, starts[:-1].copy(), np.zeros(len(read), dtype=np.int64), counts, (z, z, z),
                         (z, z, z), "none-v1")


def _passes(texts: list[str]) -> list[tuple[int, int]]:
    """The texts cut into runs of about :data:`PASS_CHARS` characters (a text at least a run)."""
    cum = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    cuts = np.searchsorted(cum, np.arange(PASS_CHARS, int(cum[-1]), PASS_CHARS), side="left") + 1
    edges = sorted({0, len(texts), *(int(c) for c in cuts if 0 < c < len(texts))})
    return list(zip(edges[:-1], edges[1:]))


def _joined(pieces: list[TextsPrepared]) -> TextsPrepared:
    """The preparations of consecutive runs of texts as one."""
    if len(pieces) == 1:
        return pieces[0]
    ids_at = np.cumsum([0] + [len(p.ids) for p in pieces[:-1]])
    texts_at = np.cumsum([0] + [len(p.lengths) for p in pieces[:-1]])

    def tops(which: str) -> tuple:
        got = [getattr(p, which) for p in pieces]
        return (np.concatenate([g[0] + t for g, t in zip(got, texts_at)]), np.concatenate([g[1] for g in got]),
                np.concatenate([g[2] for g in got]))

    return TextsPrepared(np.concatenate([p.ids for p in pieces]), np.concatenate([p.lengths for p in pieces]),
                         np.concatenate([p.steps_at + a for p, a in zip(pieces, ids_at)]),
                         np.concatenate([p.steps for p in pieces]), np.concatenate([p.counts for p in pieces]),
                         tops("changed_top"), tops("dropped_top"), pieces[0].normalizer)


def prepare_texts(texts: list[str], normalizer_id: str, table: bytes) -> tuple[np.ndarray, TextsPrepared | None]:
    """What :func:`~isan.engine.normalize.prepare` gives each of ``texts`` with the normaliser
    ``normalizer_id`` (``"text8-v1"`` or ``"none-v1"``) and an alphabet's :func:`id_table`, at once.

    Each text must be non-empty, under :data:`MAX_TEXT_CHARS` characters and not start with a
    byte-order mark. Returns (bool (n,): the texts taken here; their preparation, in order, or None
    when none was): under ``text8`` every text when the alphabet holds text8's 27 characters, else
    none; under ``none`` the ASCII texts whose characters are all in the alphabet (any other is
    left to ``prepare`` and its unknown policy).
    """
    taken = np.zeros(len(texts), dtype=bool)
    if normalizer_id == "text8-v1":
        if not texts or 255 in TEXT8_CHARS.encode("ascii").translate(table):
            return taken, None
        taken[:] = True
        return taken, _joined([_text8_pass(texts[a:b], table) for a, b in _passes(texts)])
    known = bytes(c for c in range(256) if table[c] != 255)
    idx = [i for i, t in enumerate(texts) if t.isascii() and not t.encode("ascii").translate(None, known)]
    if not idx:
        return taken, None
    taken[idx] = True
    take = [texts[i] for i in idx]
    return taken, _joined([_none_pass(take[a:b], table) for a, b in _passes(take)])
