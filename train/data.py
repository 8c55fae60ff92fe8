"""Training data: text files and text8 with the project's text8-10M split, in any token alphabet.

text8-10M (``../shared/data/text8_head/README.md``): characters [0, 9M) train,
[9M, 9.5M) valid, [9.5M, 10M) test; nothing from 10M on is used.

Token alphabets (:mod:`isan.tokens`): a :class:`Corpus` holds **output ids** (the classes the model
predicts); the model reads ``corpus.input_map[ids]`` (K inputs; None: the identity). Kinds:

- ``chars``: one character a symbol (text8's 27 for text8; the file's characters otherwise);
- ``bytes``: UTF-8 bytes, 256 outputs; inputs are the K - 1 most frequent bytes of the TRAIN part plus
  one ``other`` (``inputs`` = K, 70 by default, as the paper's Billion Word Benchmark ISAN (ICML Sec 3.2));
- ``pairs``: pairs of characters of the chars alphabet (text8's for text8; 27^2 = 729 for text8);
  an odd-length split is padded with a space;
- ``words``: whitespace-separated words; the vocabulary is every word of the data (train, valid and
  test), most frequent first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isan.alphabet import Alphabet
from isan.data import TEXT8_SPLITS, read_text, read_text8_split
from isan.errors import IsanError
from isan.tokens import ByteAlphabet, PairAlphabet, WordAlphabet

#: ``--alphabet`` choices
ALPHABET_KINDS = ("chars", "bytes", "pairs", "words")


@dataclass(frozen=True)
class Corpus:
    """Encoded splits: int64 arrays of output ids and the alphabet (any kind of :mod:`isan.tokens`)."""

    alphabet: object
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray | None = None
    name: str = "text"

    @property
    def unit(self) -> str:
        """What one id is: char, byte, pair or word (bits are per this unit)."""
        return getattr(self.alphabet, "unit", "char")

    @property
    def input_map(self) -> np.ndarray | None:
        """Output id -> input id, int64 (V,), or None for the identity."""
        return getattr(self.alphabet, "input_map", None)

    @property
    def K(self) -> int:
        """Input symbols of a model trained on this corpus."""
        return int(getattr(self.alphabet, "K", len(self.alphabet)))

    @property
    def V(self) -> int:
        """Output classes of a model trained on this corpus."""
        return len(self.alphabet)


def _alphabet_for(kind: str, train_text: str, all_text: str, base: Alphabet | None, inputs: int):
    if kind == "chars":
        return base or Alphabet.from_text(all_text)
    if kind == "bytes":
        if not 2 <= inputs <= 256:
            raise IsanError(f"--inputs must be in [2, 256] for a byte alphabet; got {inputs}")
        return ByteAlphabet.from_data(train_text, inputs)
    if kind == "pairs":
        return PairAlphabet(base or Alphabet.from_text(all_text))
    if kind == "words":
        return WordAlphabet.from_text(all_text)
    raise IsanError(f"unknown alphabet kind {kind!r}; choose one of {', '.join(ALPHABET_KINDS)}")


def load_corpus(data: str | Path, dataset: str = "text8", alphabet=None, valid_fraction: float = 0.1,
                kind: str = "chars", inputs: int = 70, valid_data: str | Path | None = None) -> Corpus:
    """Load and encode a corpus.

    Args:
        data: path of text8 / text8.zip / text8_head.txt (``dataset="text8"``), or any text file.
        dataset: ``"text8"`` (the text8-10M split) or ``"text"`` (first 1-valid_fraction train,
            the rest valid, as the usual Tiny Shakespeare split; for bytes the cut is by bytes).
        alphabet: an alphabet to use as is (any kind); by default one of ``kind`` is built.
        kind: chars, bytes, pairs or words (see the module docstring).
        inputs: K, the input symbols of a byte alphabet (the K - 1 most frequent train bytes + other).
        valid_data: with ``dataset="text"``, a second file: then all of ``data`` is train and this
            file is valid (no test split).

    Returns:
        A :class:`Corpus` of output ids.

    Raises:
        AlphabetError: a symbol outside ``alphabet``, naming it and its offset.
        IsanError: an unknown dataset or kind, or ``valid_data`` with text8.
    """
    if dataset == "text8":
        if valid_data is not None:
            raise IsanError("--valid-data goes with --dataset text (text8 has its own valid split)")
        parts = {s: read_text8_split(data, s) for s in TEXT8_SPLITS}
        base = Alphabet.text8() if kind in ("chars", "pairs") else None
        alphabet = alphabet or _alphabet_for(kind, parts["train"], "".join(parts.values()), base, inputs)
        enc = {s: alphabet.encode(t) for s, t in parts.items()}
        return Corpus(alphabet, enc["train"], enc["valid"], enc["test"], name="text8-10M")
    if dataset != "text":
        raise IsanError(f"unknown dataset {dataset!r}; choose text8 or text")
    text = read_text(data)
    if valid_data is not None:
        vtext = read_text(valid_data)
        alphabet = alphabet or _alphabet_for(kind, text, text + "\n" + vtext, None, inputs)
        return Corpus(alphabet, alphabet.encode(text), alphabet.encode(vtext), None,
                      name=f"{Path(data).name}+{Path(valid_data).name}")
    if kind == "bytes" or getattr(alphabet, "kind", None) == "bytes":
        raw = text.encode("utf-8")
        cut = int(len(raw) * (1 - valid_fraction))
        if alphabet is None:  # the frequent bytes of the train part only
            alphabet = _alphabet_for("bytes", raw[:cut], "", None, inputs)
        ids = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
        return Corpus(alphabet, ids[:cut], ids[cut:], None, name=Path(data).name)
    alphabet = alphabet or _alphabet_for(kind, text, text, None, inputs)
    ids = alphabet.encode(text)
    cut = int(len(ids) * (1 - valid_fraction))
    return Corpus(alphabet, ids[:cut], ids[cut:], None, name=Path(data).name)
