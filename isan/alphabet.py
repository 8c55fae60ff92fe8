"""Alphabets: symbol <-> id maps and text encoding with an explicit unknown policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from isan.errors import AlphabetError

#: text8's 27 symbols: space and ``a``-``z`` (the paper writes space as ``_``).
TEXT8_SYMBOLS: tuple[str, ...] = tuple(" abcdefghijklmnopqrstuvwxyz")

UNKNOWN_POLICIES = ("error", "skip", "replace")


def validated_ids(ids, V: int) -> np.ndarray:
    """An id sequence (array, list or any iterable) as int64 (n,). Raises AlphabetError unless it is
    1-D with values in [0, V)."""
    a = np.asarray(ids if isinstance(ids, (np.ndarray, list, tuple)) else list(ids), dtype=np.int64)
    if a.ndim != 1 or (len(a) and a.view(np.uint64).max() >= V):  # a negative id is a huge uint64: one pass
        raise AlphabetError(f"ids must be a 1-D array of values in [0, {V})")
    return a


class IdsOrText:
    """:meth:`as_ids` of an alphabet with an ``encode(text, unknown, replacement)``."""

    def as_ids(self, text_or_ids, unknown: str = "error", replacement: str | None = None) -> np.ndarray:
        """Encode a string (see ``encode``), or validate an id sequence: int64 (n,).

        Raises:
            AlphabetError: unknown characters (per ``unknown``), or ids that are not a 1-D
                sequence of values in [0, len(alphabet)).
        """
        if isinstance(text_or_ids, str):
            return self.encode(text_or_ids, unknown, replacement)
        return validated_ids(text_or_ids, len(self))


class SameInputs:
    """The input side of an alphabet whose inputs are its outputs (characters, pairs, words):
    K = V, ``input_map`` None (the identity), ``input_labels`` = ``symbols``."""

    @property
    def K(self) -> int:
        """Input symbols: as many as the outputs."""
        return len(self)

    @property
    def input_map(self) -> None:
        """Output id -> input id: None, the identity (see :mod:`isan.tokens`)."""
        return None

    @property
    def input_labels(self) -> tuple[str, ...]:
        return tuple(self.symbols)


@dataclass(frozen=True)
class Alphabet(IdsOrText, SameInputs):
    """An ordered set of single-character symbols; ``symbols[i]`` is input symbol and output class i.

    Args:
        symbols: the symbols in id order, each a string of exactly one character, no repeats.

    Raises:
        AlphabetError: a symbol is not one character or appears twice.
    """

    symbols: tuple[str, ...]
    _index: dict = field(init=False, repr=False, compare=False)
    _lut: np.ndarray | None = field(init=False, repr=False, compare=False)
    _table: bytes | None = field(init=False, repr=False, compare=False)

    #: the interface shared with the token alphabets of :mod:`isan.tokens`
    kind = "chars"
    unit = "char"

    def __post_init__(self) -> None:
        symbols = tuple(self.symbols)
        object.__setattr__(self, "symbols", symbols)
        if not symbols:
            raise AlphabetError("an alphabet needs at least one symbol")
        index: dict[str, int] = {}
        for i, s in enumerate(symbols):
            if not isinstance(s, str) or len(s) != 1:
                raise AlphabetError(f"alphabet symbol {i} is {s!r}; every symbol must be one character")
            if s in index:
                raise AlphabetError(f"alphabet symbol {s!r} appears twice (ids {index[s]} and {i})")
            index[s] = i
        object.__setattr__(self, "_index", index)
        lut = None
        if all(ord(s) < 256 for s in symbols):
            lut = np.full(256, -1, dtype=np.int64)
            for s, i in index.items():
                lut[ord(s)] = i
        object.__setattr__(self, "_lut", lut)
        # up to 127 symbols: ids fit int8 (-1 is byte 255), and bytes.translate maps a text at once
        table = bytes(int(i) & 255 for i in lut) if lut is not None and len(symbols) < 128 else None
        object.__setattr__(self, "_table", table)

    @classmethod
    def text8(cls) -> "Alphabet":
        """The 27-symbol text8 alphabet (space, ``a``-``z``)."""
        return cls(TEXT8_SYMBOLS)

    @classmethod
    def from_text(cls, text: str) -> "Alphabet":
        """The sorted set of characters occurring in ``text``."""
        return cls(tuple(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.symbols)

    def tokenize(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 (n,), offsets int64 (n,): character i is token i). Raises AlphabetError for unknowns."""
        ids = self.encode(text)
        return ids, np.arange(len(ids), dtype=np.int64)

    def to_json(self) -> dict:
        return {"kind": "chars", "symbols": self.to_list()}

    def __contains__(self, ch: str) -> bool:
        return ch in self._index

    def id(self, ch: str) -> int:
        """The id of one symbol. Raises AlphabetError if it is not in the alphabet."""
        try:
            return self._index[ch]
        except KeyError:
            raise AlphabetError(f"{ch!r} is not in the alphabet {self.describe()}", char=ch) from None

    def describe(self) -> str:
        s = "".join(self.symbols)
        return repr(s if len(s) <= 80 else s[:77] + "...")

    def raw_ids(self, text: str) -> np.ndarray:
        """ids of every character, -1 where a character is not in the alphabet. int64 (len(text),)."""
        if self._lut is not None:  # every symbol is one byte of latin-1: a lookup table over the bytes
            try:
                raw = text.encode("latin-1")
            except UnicodeEncodeError:
                raw = None
            if raw is not None:
                if self._table is not None:
                    return np.frombuffer(raw.translate(self._table), dtype=np.int8).astype(np.int64)
                return self._lut[np.frombuffer(raw, dtype=np.uint8)]
        get = self._index.get
        return np.fromiter((get(c, -1) for c in text), dtype=np.int64, count=len(text))

    _raw_ids = raw_ids  # the former private name

    def encode(self, text: str, unknown: str = "error", replacement: str | None = None) -> np.ndarray:
        """Encode text to symbol ids.

        Args:
            text: the text.
            unknown: what to do with characters outside the alphabet: ``"error"`` (default),
                ``"skip"`` (drop them) or ``"replace"`` (map them to ``replacement``).
            replacement: the symbol used by ``unknown="replace"``; must be in the alphabet.

        Returns:
            int64 array of ids, shape (n,) with n = len(text) unless characters were skipped.

        Raises:
            AlphabetError: with ``unknown="error"``, naming the first unknown character and its
                offset; also for an unknown policy or a replacement outside the alphabet.
        """
        if unknown not in UNKNOWN_POLICIES:
            raise AlphabetError(f"unknown={unknown!r}; choose one of {', '.join(UNKNOWN_POLICIES)}")
        ids = self.raw_ids(text)
        bad = ids < 0
        if not bad.any():
            return ids
        if unknown == "error":
            offset = int(np.argmax(bad))
            ch = text[offset]
            raise AlphabetError(
                f"character {ch!r} (U+{ord(ch):04X}) at offset {offset} is not in the model's alphabet "
                f"{self.describe()}; clean the text, or pass unknown='skip' or unknown='replace' "
                f"(CLI: --unknown skip|replace --replacement ' ')",
                char=ch,
                offset=offset,
            )
        if unknown == "skip":
            return ids[~bad]
        if replacement is None:
            raise AlphabetError("unknown='replace' needs a replacement symbol (CLI: --replacement)")
        rid = self.id(replacement)
        ids = ids.copy()
        ids[bad] = rid
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """ids back to text. Raises AlphabetError for an id out of range."""
        n = len(self.symbols)
        a = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids))
        if a.size == 0:
            return ""
        if a.ndim != 1 or a.dtype.kind not in "iu":
            a = np.array([int(i) for i in a.ravel()], dtype=np.int64)
        bad = (a < 0) | (a >= n)
        if bad.any():
            raise AlphabetError(f"id {int(a[np.argmax(bad)])} is out of range for an alphabet of {n} symbols")
        codes = [ord(s) for s in self.symbols]
        if max(codes) < 256:  # one byte a character (latin-1 is code points 0-255): a quarter of the bytes
            return np.array(codes, dtype=np.uint8)[a].tobytes().decode("latin-1")
        return np.array(codes, dtype="<u4")[a].tobytes().decode("utf-32-le", "surrogatepass")

    def to_list(self) -> list[str]:
        return list(self.symbols)

    @classmethod
    def from_list(cls, symbols: Sequence[str]) -> "Alphabet":
        return cls(tuple(symbols))
