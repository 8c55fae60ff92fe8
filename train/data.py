"""Training data: text files and text8 with the project's text8-10M split.

text8-10M (``../shared/data/text8_head/README.md``): characters [0, 9M) train,
[9M, 9.5M) valid, [9.5M, 10M) test; nothing from 10M on is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isan.alphabet import Alphabet
from isan.engine.data import TEXT8_SPLITS, read_text, read_text8_split
from isan.errors import IsanError

@dataclass(frozen=True)
class Corpus:
    """Encoded splits: int64 id arrays and the alphabet."""

    alphabet: Alphabet
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray | None = None
    name: str = "text"


def load_corpus(data: str | Path, dataset: str = "text8", alphabet: Alphabet | None = None,
                valid_fraction: float = 0.1) -> Corpus:
    """Load and encode a corpus.

    Args:
        data: path of text8 / text8.zip / text8_head.txt (``dataset="text8"``), or any text file.
        dataset: ``"text8"`` (the text8-10M split) or ``"text"`` (first 1-valid_fraction train,
            the rest valid, as the usual Tiny Shakespeare split).
        alphabet: defaults to text8's for text8 and to the file's characters otherwise.

    Raises:
        AlphabetError: a character outside ``alphabet``, naming it and its offset.
    """
    if dataset == "text8":
        alphabet = alphabet or Alphabet.text8()
        parts = {s: read_text8_split(data, s) for s in TEXT8_SPLITS}
        enc = {s: alphabet.encode(t) for s, t in parts.items()}
        return Corpus(alphabet, enc["train"], enc["valid"], enc["test"], name="text8-10M")
    if dataset == "text":
        text = read_text(data)
        alphabet = alphabet or Alphabet.from_text(text)
        ids = alphabet.encode(text)
        cut = int(len(ids) * (1 - valid_fraction))
        return Corpus(alphabet, ids[:cut], ids[cut:], None, name=Path(data).name)
    raise IsanError(f"unknown dataset {dataset!r}; choose text8 or text")
