"""Text input shared by the engine, the CLI and training (numpy-free, torch-free).

text8-10M (``../shared/data/text8_head/README.md``): characters [0, 9M) train,
[9M, 9.5M) valid, [9.5M, 10M) test. Characters from 10M on are in no split; the speed benchmarks
score them as unseen text (``split="unseen"``), and training, tuning and tests never read them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from isan.errors import IsanError

TEXT8_SPLITS = {"train": (0, 9_000_000), "valid": (9_000_000, 9_500_000), "test": (9_500_000, 10_000_000)}
#: Text after the splits (2,549,837 characters in text8_head.txt): benchmark input only.
UNSEEN_FROM = 10_000_000


def read_text(path: str | Path) -> str:
    """Read a UTF-8 text file, or the single member of a .zip (e.g. the original text8.zip)."""
    path = Path(path)
    if not path.exists():
        raise IsanError(f"data file {path} does not exist")
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if not n.endswith("/")]
            if len(names) != 1:
                raise IsanError(f"{path} holds {len(names)} files; expected one (text8.zip holds 'text8')")
            return z.read(names[0]).decode("utf-8")
    return path.read_text(encoding="utf-8")


def read_text8_split(path: str | Path, split: str) -> str:
    """One split of text8-10M from text8, text8.zip or text8_head.txt, or ``"unseen"``: the
    characters after the splits (from 10,000,000 on; for speed benchmarks only).

    Raises IsanError if the file is shorter than 10M characters (or has nothing after them for
    ``"unseen"``) or the split is unknown.
    """
    if split not in TEXT8_SPLITS and split != "unseen":
        raise IsanError(f"unknown split {split!r}; choose one of {', '.join(TEXT8_SPLITS)} or unseen")
    text = read_text(path)
    if len(text) < TEXT8_SPLITS["test"][1]:
        raise IsanError(f"{path} has {len(text):,} characters; text8-10M needs at least 10,000,000")
    if split == "unseen":
        if len(text) <= UNSEEN_FROM:
            raise IsanError(f"{path} has no characters after the text8-10M splits (offset {UNSEEN_FROM:,})")
        return text[UNSEEN_FROM:]
    lo, hi = TEXT8_SPLITS[split]
    return text[lo:hi]


