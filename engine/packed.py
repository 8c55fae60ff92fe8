"""A batch of texts in one array, and its results in one array: :class:`Packed`, :class:`PackedBits`.

Whoever reads the texts (a corpus reader, the server's scheduler, :meth:`Engine.score_batch
<isan.engine.Engine.score_batch>`) makes the batch once: every text's symbol ids in one contiguous
array (uint8 where every id fits, as it does for an alphabet of at most 256 symbols, else int32) and where each text starts
and how long it is. The kernels read the rows straight from it (a row of a kernel is
``ids[start : start + length]``), so no one joins a list of arrays on the way, and a selection of
the texts (a corpus's batch, its documents longest first) is a new pair of offset arrays over the
same ids. Results come back the same way: one flat float64 array of each character's bits and
the offsets of each text's (:class:`PackedBits`), or one total a text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def narrow_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` in uint8 where every id fits (< 256), else int32 (ids of any integer dtype)."""
    ids = np.asarray(ids)
    if ids.dtype in (np.uint8, np.int32):
        return ids
    if ids.size == 0:
        return ids.astype(np.uint8)
    # one pass: every id is in [0, 255] where no bit above the eighth is set in any (a negative sets them)
    if ids.dtype.kind in "iu" and int(np.bitwise_or.reduce(ids, axis=None)) & ~0xFF == 0:
        return ids.astype(np.uint8)
    return ids.astype(np.int32)


@dataclass(frozen=True)
class Packed:
    """B texts of symbol ids in one array: text i is ``ids[start[i] : start[i] + length[i]]``.

    Attributes:
        ids: (N,) the ids of every text, any integer dtype (uint8 or int32 as made here).
        start: (B,) int64 where each text starts in ``ids``.
        length: (B,) int64 its characters (at least 1 each where a kernel scores it).
    """

    ids: np.ndarray
    start: np.ndarray
    length: np.ndarray

    @classmethod
    def of(cls, texts: "Sequence[np.ndarray] | Packed", below: int | None = None) -> "Packed":
        """``texts`` (B int arrays or lists of ids) joined once, in order (a Packed as it is);
        ``below``: every id is known to be in ``[0, below)`` (ids a preparation checked), so they
        are narrowed without a look (uint8 where ``below <= 256``)."""
        if isinstance(texts, Packed):
            return texts
        if not isinstance(texts, (Sequence, np.ndarray)):
            texts = list(texts)
        lens = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        if not len(texts):
            return cls.from_lengths(np.zeros(0, np.uint8), lens)
        # one text: its own array (narrowed where it needs to be), not a copy of it
        ids = np.ascontiguousarray(texts[0]) if len(texts) == 1 else np.concatenate([np.asarray(t) for t in texts])
        if below is not None and below <= 256:
            ids = ids.astype(np.uint8, copy=False)
        else:
            ids = narrow_ids(ids)
        return cls.from_lengths(ids, lens)

    @classmethod
    def from_bounds(cls, ids: np.ndarray, bounds: np.ndarray) -> "Packed":
        """Texts end to end: text i is ``ids[bounds[i] : bounds[i + 1]]`` (``bounds``: (B + 1,) int)."""
        bounds = np.asarray(bounds, dtype=np.int64)
        return cls(ids, bounds[:-1], np.diff(bounds))

    @classmethod
    def from_lengths(cls, ids: np.ndarray, lengths: np.ndarray) -> "Packed":
        """Texts end to end from the start of ``ids``, of ``lengths`` characters each."""
        lengths = np.asarray(lengths, dtype=np.int64)
        start = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths) > 1:
            np.cumsum(lengths[:-1], out=start[1:])
        return cls(ids, start, lengths)

    def __len__(self) -> int:
        return len(self.length)

    @property
    def chars(self) -> int:
        """Characters of all its texts."""
        return int(self.length.sum())

    def text(self, i: int) -> np.ndarray:
        """Text i's ids (a view)."""
        a = int(self.start[i])
        return self.ids[a : a + int(self.length[i])]

    def texts(self) -> list[np.ndarray]:
        """Every text's ids (views), in order."""
        return [self.ids[a : a + n] for a, n in zip(self.start.tolist(), self.length.tolist())]

    def take(self, index: Sequence[int] | np.ndarray) -> "Packed":
        """The texts at ``index``, in that order, over the same ids (nothing copied but offsets)."""
        index = np.asarray(index, dtype=np.int64)
        return Packed(self.ids, self.start[index], self.length[index])

    def is_dense(self) -> bool:
        """Whether its texts lie end to end from ``ids[0]`` to ``ids[-1]`` in order (its bits can
        be written at the ids' own places)."""
        B = len(self)
        if B == 0:
            return len(self.ids) == 0
        return (self.start[0] == 0 and int(self.start[-1] + self.length[-1]) == len(self.ids)
                and bool(np.array_equal(self.start[1:], self.start[:-1] + self.length[:-1])))

    def dense(self, dtype=None) -> "Packed":
        """The same texts end to end, their ids in ``dtype`` (default: as they are): ``self`` where
        it is so already, else one copy of the ids its texts read."""
        dtype = np.dtype(dtype or self.ids.dtype)
        if self.is_dense():
            return self if self.ids.dtype == dtype else Packed(self.ids.astype(dtype), self.start, self.length)
        out = Packed.from_lengths(self.ids[:0], self.length)
        where = np.repeat(self.start - out.start, self.length) + np.arange(self.chars, dtype=np.int64)
        return Packed(self.ids[where].astype(dtype, copy=False), out.start, out.length)

    def check_ids(self, K: int) -> None:
        """Raise ValueError unless every id of the span its texts read (from the first start to
        the last end) is in ``[0, K)``."""
        ids = self.ids
        if len(self):
            ids = ids[int(self.start.min()) : int((self.start + self.length).max())]
        if ids.size == 0:
            return
        if ids.dtype == np.uint8 and K >= 256:
            return
        if int(ids.min()) < 0 or int(ids.max()) >= K:
            raise ValueError(f"symbol ids must be in [0, {K})")


class PackedBits(Sequence):
    """Each text's bits, as one flat array: text i's are ``bits[start[i] : start[i] + length[i]]``.

    A sequence of B (n_i,) float64 views, as a list of arrays would be; ``bits`` is the whole
    (N,) float64 array (each character's bits, eq. 2-3 of Foerster et al. 2017 in bits).
    """

    def __init__(self, bits: np.ndarray, start: np.ndarray, length: np.ndarray):
        self.bits, self.start, self.length = bits, np.asarray(start, np.int64), np.asarray(length, np.int64)

    def __len__(self) -> int:
        return len(self.length)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        a = int(self.start[i])
        return self.bits[a : a + int(self.length[i])]

    def totals(self) -> np.ndarray:
        """(B,) float64 each text's bits summed as ``Engine.score`` sums them (numpy's sum of the
        text's array), so that a text's total is the same bytes whether its characters' bits are
        kept or not."""
        return np.array([self.bits[a : a + n].sum() for a, n in zip(self.start.tolist(), self.length.tolist())],
                        dtype=np.float64)
