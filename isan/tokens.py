"""Token alphabets beyond single characters: bytes, character pairs and words.

An ISAN has K input symbols (the rows of ``W`` and ``b``) and V output classes (the rows of ``W_ro``).
:class:`isan.alphabet.Alphabet` is the character alphabet (K = V, one character a symbol); this
module adds the three token alphabets of the paper and of the related work, with the same interface:

- :class:`ByteAlphabet`: UTF-8 bytes (the form of the paper's Billion Word Benchmark models, ICML Sec 3.2): V = 256 outputs, K inputs = the K - 1 most
  frequent bytes of the training data plus one ``other`` input for every remaining byte.
- :class:`PairAlphabet`: pairs of characters of a base alphabet (paper section 3.1): K = V = n^2;
  a text of odd length is padded with the base alphabet's ``pad`` character (space).
- :class:`WordAlphabet`: whitespace-separated words of a fixed vocabulary (Elman's grammar).

Every alphabet maps a text to **output ids** (the classes the model predicts, int64 (n,)); the model
consumes ``input_map[ids]`` (K classes). For characters and pairs ``input_map`` is the identity.
Bits are counted per token: ``unit`` names it (char, byte, pair, word).

The interface every alphabet has: ``kind``, ``unit``, ``symbols`` (V labels), ``K``, ``input_map``
(int64 (V,) or None for the identity), ``input_labels`` (K), ``__len__`` (= V), ``encode``,
``tokenize`` (ids and the character offset each token starts at), ``decode``, ``raw_ids``,
``as_ids``, ``id``, ``describe``, ``to_json`` / :func:`alphabet_from_json`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from isan.alphabet import UNKNOWN_POLICIES, Alphabet, IdsOrText, SameInputs, validated_ids
from isan.errors import AlphabetError

#: alphabet kinds, by the ``kind`` field of their JSON
KINDS = ("chars", "bytes", "pairs", "words")


def _check_policy(unknown: str) -> None:
    if unknown not in UNKNOWN_POLICIES:
        raise AlphabetError(f"unknown={unknown!r}; choose one of {', '.join(UNKNOWN_POLICIES)}")


def byte_label(b: int) -> str:
    """A readable label of one byte: the character for printable ASCII, else ``\\xNN``."""
    return chr(b) if 32 <= b < 127 else f"\\x{b:02x}"


@dataclass(frozen=True)
class ByteAlphabet:
    """UTF-8 bytes: 256 outputs; inputs are ``frequent`` bytes (ids 0..K-2) plus one ``other`` (id K-1).

    Args:
        frequent: the bytes that get an input of their own, most frequent first (distinct, 0..255).

    Raises:
        AlphabetError: a repeated or out-of-range byte, or more than 255 of them.
    """

    frequent: tuple[int, ...]
    _input_map: np.ndarray = field(init=False, repr=False, compare=False)

    kind = "bytes"
    unit = "byte"

    def __post_init__(self) -> None:
        freq = tuple(int(b) for b in self.frequent)
        object.__setattr__(self, "frequent", freq)
        if len(set(freq)) != len(freq) or any(not 0 <= b < 256 for b in freq) or len(freq) > 255:
            raise AlphabetError("frequent bytes must be distinct values in [0, 256), at most 255 of them")
        m = np.full(256, len(freq), dtype=np.int64)
        m[list(freq)] = np.arange(len(freq), dtype=np.int64)
        object.__setattr__(self, "_input_map", m)

    @classmethod
    def from_data(cls, data: bytes | str, K: int = 70) -> "ByteAlphabet":
        """The K - 1 most frequent bytes of ``data`` (ties by byte value) plus ``other``: K inputs."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        counts = np.bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
        order = sorted((b for b in range(256) if counts[b]), key=lambda b: (-counts[b], b))
        return cls(tuple(order[: K - 1]))

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(byte_label(b) for b in range(256))

    @property
    def K(self) -> int:
        return len(self.frequent) + 1

    @property
    def input_map(self) -> np.ndarray:
        return self._input_map

    @property
    def input_labels(self) -> tuple[str, ...]:
        return tuple(byte_label(b) for b in self.frequent) + ("<other>",)

    def __len__(self) -> int:
        return 256

    def id(self, sym: str) -> int:
        b = sym.encode("utf-8")
        if len(b) != 1:
            raise AlphabetError(f"{sym!r} is not one byte in UTF-8")
        return b[0]

    def describe(self) -> str:
        return f"bytes (256 outputs, {self.K} inputs)"

    def tokenize(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(byte ids int64 (n,), offset of the character each byte belongs to int64 (n,))."""
        raw = text.encode("utf-8", "surrogatepass")
        ids = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
        if len(raw) == len(text):
            return ids, np.arange(len(ids), dtype=np.int64)
        # a byte belongs to the character whose encoding it is part of: count lead bytes
        lead = (ids & 0xC0) != 0x80
        return ids, np.cumsum(lead) - 1

    def raw_ids(self, text: str) -> np.ndarray:
        return self.tokenize(text)[0]

    def encode(self, text: str, unknown: str = "error", replacement: str | None = None) -> np.ndarray:
        """Every text is UTF-8 bytes: nothing is unknown. int64 (n bytes,)."""
        _check_policy(unknown)
        return self.raw_ids(text)

    def as_ids(self, text_or_ids, unknown: str = "error", replacement: str | None = None) -> np.ndarray:
        if isinstance(text_or_ids, (str, bytes)):
            return self.encode(text_or_ids if isinstance(text_or_ids, str) else text_or_ids.decode("utf-8", "replace"))
        return validated_ids(text_or_ids, 256)

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes back to text; bytes that are not valid UTF-8 become U+FFFD."""
        a = validated_ids(ids, 256)
        return a.astype(np.uint8).tobytes().decode("utf-8", "replace")

    def to_list(self) -> list[str]:
        return list(self.symbols)

    def to_json(self) -> dict:
        return {"kind": self.kind, "frequent": list(self.frequent)}


@dataclass(frozen=True)
class PairAlphabet(IdsOrText, SameInputs):
    """Pairs of characters of ``base``: id ``i * n + j`` is ``base[i] + base[j]`` (K = V = n^2).

    Args:
        base: the character alphabet (n symbols).
        pad: the base symbol that pads a text of odd length (it is scored: the pad is part of the text).
    """

    base: Alphabet
    pad: str = " "

    kind = "pairs"
    unit = "pair"

    def __post_init__(self) -> None:
        if self.pad not in self.base:
            raise AlphabetError(f"pad {self.pad!r} is not in the base alphabet {self.base.describe()}")

    @property
    def n(self) -> int:
        return len(self.base)

    @property
    def symbols(self) -> tuple[str, ...]:
        s = self.base.symbols
        return tuple(a + b for a in s for b in s)

    def __len__(self) -> int:
        return self.n * self.n

    def id(self, sym: str) -> int:
        if len(sym) != 2:
            raise AlphabetError(f"{sym!r} is not a pair of characters")
        return self.base.id(sym[0]) * self.n + self.base.id(sym[1])

    def describe(self) -> str:
        return f"pairs of {self.base.describe()}"

    def _pairs(self, chars: np.ndarray) -> np.ndarray:
        if len(chars) % 2:
            chars = np.append(chars, self.base.id(self.pad))
        return chars[0::2] * self.n + chars[1::2]

    def raw_ids(self, text: str) -> np.ndarray:
        """Pair ids, -1 for a pair with a character outside the base alphabet. int64 (ceil(len/2),)."""
        c = self.base.raw_ids(text)
        if len(c) % 2:
            c = np.append(c, self.base.id(self.pad))
        a, b = c[0::2], c[1::2]
        return np.where((a < 0) | (b < 0), -1, a * self.n + b)

    def tokenize(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(pair ids, the offset of each pair's first character). Raises AlphabetError for unknown characters."""
        ids = self._pairs(self.base.encode(text))
        return ids, np.arange(0, 2 * len(ids), 2, dtype=np.int64)

    def encode(self, text: str, unknown: str = "error", replacement: str | None = None) -> np.ndarray:
        """Characters by ``base.encode`` (with its unknown policy), then paired. int64 (ceil(n/2),)."""
        return self._pairs(self.base.encode(text, unknown, replacement))

    def decode(self, ids: Iterable[int]) -> str:
        a = validated_ids(ids, len(self))
        chars = np.stack([a // self.n, a % self.n], axis=1).ravel()
        return self.base.decode(chars)

    def to_list(self) -> list[str]:
        return list(self.symbols)

    def to_json(self) -> dict:
        return {"kind": self.kind, "base": self.base.to_list(), "pad": self.pad}


@dataclass(frozen=True)
class WordAlphabet(IdsOrText, SameInputs):
    """Whitespace-separated words of a fixed vocabulary (K = V = len(words)).

    Args:
        words: the vocabulary in id order (non-empty strings without whitespace, no repeats).
        unk: a word of the vocabulary that ``unknown="replace"`` maps unknown words to by default.
    """

    words: tuple[str, ...]
    unk: str | None = None
    _index: dict = field(init=False, repr=False, compare=False)

    kind = "words"
    unit = "word"

    def __post_init__(self) -> None:
        words = tuple(self.words)
        object.__setattr__(self, "words", words)
        if not words:
            raise AlphabetError("a word alphabet needs at least one word")
        index: dict[str, int] = {}
        for i, w in enumerate(words):
            if not isinstance(w, str) or not w or any(c.isspace() for c in w):
                raise AlphabetError(f"word {i} is {w!r}; every word must be a non-empty string without whitespace")
            if w in index:
                raise AlphabetError(f"word {w!r} appears twice (ids {index[w]} and {i})")
            index[w] = i
        object.__setattr__(self, "_index", index)
        if self.unk is not None and self.unk not in index:
            raise AlphabetError(f"unk {self.unk!r} is not in the vocabulary")

    @classmethod
    def from_text(cls, text: str, unk: str | None = None) -> "WordAlphabet":
        """The words of ``text`` by descending frequency (ties alphabetical)."""
        counts = Counter(text.split())
        return cls(tuple(sorted(counts, key=lambda w: (-counts[w], w))) + ((unk,) if unk and unk not in counts else ()), unk)

    @property
    def symbols(self) -> tuple[str, ...]:
        return self.words

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, w: str) -> bool:
        return w in self._index

    def id(self, w: str) -> int:
        try:
            return self._index[w]
        except KeyError:
            raise AlphabetError(f"word {w!r} is not in the vocabulary ({len(self.words)} words)", char=w) from None

    def describe(self) -> str:
        s = " ".join(self.words)
        return f"words ({len(self.words)}: {s if len(s) <= 60 else s[:57] + '...'})"

    def _split(self, text: str) -> tuple[list[str], list[int]]:
        words, starts, i, n = [], [], 0, len(text)
        while i < n:
            while i < n and text[i].isspace():
                i += 1
            j = i
            while j < n and not text[j].isspace():
                j += 1
            if j > i:
                words.append(text[i:j])
                starts.append(i)
            i = j
        return words, starts

    def raw_ids(self, text: str) -> np.ndarray:
        get = self._index.get
        return np.array([get(w, -1) for w in text.split()], dtype=np.int64)

    def tokenize(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(word ids, offset of each word's first character); raises AlphabetError naming an unknown word."""
        words, starts = self._split(text)
        ids = np.array([self._index.get(w, -1) for w in words], dtype=np.int64)
        if (ids < 0).any():
            j = int(np.argmax(ids < 0))
            raise AlphabetError(f"word {words[j]!r} at offset {starts[j]} is not in the vocabulary "
                                f"({len(self.words)} words)", char=words[j], offset=starts[j])
        return ids, np.asarray(starts, dtype=np.int64)

    def encode(self, text: str, unknown: str = "error", replacement: str | None = None) -> np.ndarray:
        """Word ids, int64 (n words,); unknown words per ``unknown`` (replace: with ``replacement`` or ``unk``)."""
        _check_policy(unknown)
        if unknown == "error":
            return self.tokenize(text)[0]
        ids = self.raw_ids(text)
        if unknown == "skip":
            return ids[ids >= 0]
        rep = replacement if replacement is not None else self.unk
        if rep is None:
            raise AlphabetError("unknown='replace' needs a replacement word (or an alphabet with unk)")
        ids[ids < 0] = self.id(rep)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        a = validated_ids(ids, len(self))
        return " ".join(self.words[i] for i in a.tolist())

    def to_list(self) -> list[str]:
        return list(self.words)

    def to_json(self) -> dict:
        return {"kind": self.kind, "words": list(self.words), **({"unk": self.unk} if self.unk else {})}


def alphabet_label(alphabet) -> str:
    """How ``describe()`` of an engine names its alphabet: a character alphabet's symbols joined, a
    token alphabet's ``describe()``."""
    return "".join(alphabet.symbols) if alphabet.kind == "chars" else alphabet.describe()


def alphabet_to_json(alphabet) -> dict:
    """The JSON form of any alphabet (characters: ``{"kind": "chars", "symbols": [...]}``)."""
    if isinstance(alphabet, Alphabet):
        return {"kind": "chars", "symbols": alphabet.to_list()}
    return alphabet.to_json()


def alphabet_from_json(obj) -> "Alphabet | ByteAlphabet | PairAlphabet | WordAlphabet":
    """An alphabet from :func:`alphabet_to_json` (a plain list is a character alphabet).

    Raises:
        AlphabetError: an unknown kind or malformed fields.
    """
    if isinstance(obj, list):
        return Alphabet.from_list(obj)
    if not isinstance(obj, dict) or obj.get("kind") not in KINDS:
        raise AlphabetError(f"an alphabet must be a list of characters or an object with kind in {KINDS}")
    try:
        kind = obj["kind"]
        if kind == "chars":
            return Alphabet.from_list(obj["symbols"])
        if kind == "bytes":
            return ByteAlphabet(tuple(obj["frequent"]))
        if kind == "pairs":
            return PairAlphabet(Alphabet.from_list(obj["base"]), obj.get("pad", " "))
        return WordAlphabet(tuple(obj["words"]), obj.get("unk"))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, AlphabetError):
            raise
        raise AlphabetError(f"malformed {obj.get('kind')} alphabet: {e}") from None
