"""Character n-gram language model with interpolated modified Kneser-Ney smoothing (numpy only).

The non-neural reference row of the Table 1 reproduction. Counting is vectorised: every n-gram
of the text becomes an exact integer code and ``np.unique`` counts them (as
:mod:`isan.trie_tables.codes` does for substrings), so the 9M-character text8-10M train split
counts to order 8 in seconds.

Model (Chen & Goodman 1998, "interpolated modified Kneser-Ney"), for order N and a context h of
n - 1 characters (h' is h without its oldest character)::

    p_n(w | h) = max(a_n(h w) - D_n(a_n(h w)), 0) / S_n(h) + gamma_n(h) p_{n-1}(w | h')
    gamma_n(h) = (D_n1 N1(h) + D_n2 N2(h) + D_n3+ N3+(h)) / S_n(h),    S_n(h) = sum_w a_n(h w)
    p_0(w) = 1 / K

* ``a_N`` are the raw counts of the N-grams; for n < N, ``a_n(h w)`` is the continuation count
  ``N1+(. h w)``, the number of distinct characters seen before ``h w``;
* ``N1(h), N2(h), N3+(h)``: how many w have ``a_n(h w)`` = 1, = 2, >= 3;
* discounts per order from the count-of-counts ``n_k`` (number of n-grams with ``a_n = k``):
  ``Y = n1 / (n1 + 2 n2)``, ``D1 = 1 - 2 Y n2 / n1``, ``D2 = 2 - 3 Y n3 / n2``,
  ``D3+ = 3 - 4 Y n4 / n3``, each clipped to [0, k] (0.5, 1.0, 1.5 when a count-of-count is 0);
* a context never seen at order n (``S_n(h) = 0``) backs off fully: ``p_n(w | h) = p_{n-1}(w | h')``.

Every ``p_n(. | h)`` sums to 1 over the alphabet (because ``D(a) <= a``), so every prediction does.

Scoring convention (docs/ARCHITECTURE.md, 'The model and its conventions'): each character is
predicted from the preceding ``N - 1`` characters; the first characters of a text have fewer
(``t`` of them at position t), and use the orders their context allows (no begin-of-text symbol).
There is no end symbol.

State: the last ``N - 1`` character ids before the next prediction, oldest first, padded on the
left with -1 where the text had fewer characters; as a :class:`isan.engine.State` its ``h`` is
that vector as float64 (length N - 1; the initial state is all -1).

Bundle (kind ``"ngram"``, format ``isan-bundle`` version 1, ``d`` = the order N):
``manifest.json`` (read by :func:`isan.engine.bundle.read_manifest`), ``counts.safetensors``
with ``codes_n`` (uint64, strictly increasing) and ``counts_n`` (uint32, > 0) for n = 1..N (the
table of ``a_n``), and ``train_log.jsonl`` when written by :func:`train_ngram`.
``params_sha256`` is the sha256 over the stored arrays in sorted name order (name, dtype,
shape, raw little-endian bytes: :func:`ngram_sha256`). N-gram code (big-endian, distinct from
the trie tables' codes): ``code(x_0 .. x_{n-1}) = sum_j (x_j + 1) << (b (n - 1 - j))`` with
``b = ceil(log2(K + 1))`` bits per symbol, so the context of ``h w`` is ``code >> b``, its last
character ``(code & (2^b - 1)) - 1``, and sorted codes are grouped by context.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from isan.errors import BundleFormatError, IsanError

log = logging.getLogger(__name__)

NGRAM_KIND = "ngram"
COUNTS_FILE = "counts.safetensors"
TRAIN_LOG = "train_log.jsonl"
DEFAULT_ORDERS = tuple(range(2, 9))
LN2 = float(np.log(2.0))
SMOOTHING = "interpolated modified Kneser-Ney"
_DEFAULT_DISCOUNTS = (0.5, 1.0, 1.5)


# ---- codes and counting --------------------------------------------------------------------------
def bits_per_symbol(K: int) -> int:
    """Bits of one symbol in an n-gram code: ``ceil(log2(K + 1))`` (5 for text8's 27 symbols)."""
    return int(np.ceil(np.log2(K + 1)))


def max_order(K: int) -> int:
    """The highest order whose codes fit in 63 bits (12 for K = 27)."""
    return 63 // bits_per_symbol(K)


def ngram_codes(ids: np.ndarray, K: int, n: int, prev: np.ndarray | None = None) -> np.ndarray:
    """Codes of every n-gram of ``ids``: uint64 (len(ids) - n + 1,), the one starting at each position.

    Args:
        ids: (T,) int symbol ids in [0, K).
        prev: the codes of the (n-1)-grams of the same ids (speeds up counting order by order).
    """
    b = np.uint64(bits_per_symbol(K))
    x = np.asarray(ids).astype(np.uint64) + np.uint64(1)
    m = len(x) - n + 1
    if m <= 0 or n < 1:
        return np.zeros(0, dtype=np.uint64)
    if prev is None:
        c = x[:m].copy()
        for j in range(1, n):
            c = (c << b) | x[j : j + m]
        return c
    return (prev[:m] << b) | x[n - 1 : n - 1 + m]


def check_ids(ids, K: int, what: str = "ids") -> np.ndarray:
    """``ids`` as int64 after checking they are a 1-D integer array in [0, K) (IsanError naming ``what``)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise IsanError(f"{what} must be a 1-D integer array; got dtype {ids.dtype} and shape {ids.shape}")
    if len(ids) and (ids.min() < 0 or ids.max() >= K):
        raise IsanError(f"{what} must lie in [0, {K}); got values in [{ids.min()}, {ids.max()}]")
    return ids.astype(np.int64, copy=False)


def modified_kn_discounts(counts: np.ndarray) -> tuple[float, float, float]:
    """(D1, D2, D3+) from the count-of-counts of one order's table (Chen & Goodman's estimates),
    each clipped to [0, k]; the defaults (0.5, 1.0, 1.5) where a count-of-count is 0."""
    n1, n2, n3, n4 = (int(np.count_nonzero(counts == k)) for k in (1, 2, 3, 4))
    if min(n1, n2, n3, n4) == 0:
        return _DEFAULT_DISCOUNTS
    Y = n1 / (n1 + 2 * n2)
    D = (1 - 2 * Y * n2 / n1, 2 - 3 * Y * n3 / n2, 3 - 4 * Y * n4 / n3)
    return tuple(float(np.clip(v, 0.0, k)) for v, k in zip(D, (1, 2, 3)))


# ---- the model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Order:
    codes: np.ndarray  # (M,) uint64 n-gram codes, sorted
    counts: np.ndarray  # (M,) float64 a_n
    ctx: np.ndarray  # (C,) uint64 context codes, sorted
    S: np.ndarray  # (C,) float64 sum_w a_n(h w)
    gamma_num: np.ndarray  # (C,) float64 D1 N1 + D2 N2 + D3 N3+
    disc: np.ndarray  # (4,) float64 discount of a count 0, 1, 2, >= 3


@dataclass(frozen=True, eq=False)
class KneserNeyModel:
    """An immutable interpolated modified Kneser-Ney character model of order N (see the module doc).

    Build with :func:`isan.train.ngram.fit`, :meth:`from_tables` or :func:`load_ngram`. Thread-safe (read-only arrays).
    """

    K: int
    order: int
    tables: tuple  # ((codes uint64, counts int64), ...) for n = 1..order
    discounts: tuple  # ((D1, D2, D3+), ...) for n = 1..order
    _orders: tuple = field(repr=False, compare=False, default=())

    @classmethod
    def from_tables(cls, K: int, tables: Sequence[tuple[np.ndarray, np.ndarray]]) -> "KneserNeyModel":
        """The model whose order-n table of ``a_n`` is ``tables[n-1]`` (codes uint64 sorted, counts > 0)."""
        order = len(tables)
        if not 1 <= order <= max_order(K):
            raise IsanError(f"order must be in [1, {max_order(K)}] for an alphabet of {K} symbols; got {order}")
        b = np.uint64(bits_per_symbol(K))
        orders, tabs, discs = [], [], []
        for codes, counts in tables:
            codes = np.ascontiguousarray(codes, dtype=np.uint64)
            counts = np.ascontiguousarray(counts, dtype=np.int64)
            codes.setflags(write=False)
            counts.setflags(write=False)
            D = modified_kn_discounts(counts)
            disc = np.array((0.0,) + D)
            a = counts.astype(np.float64)
            ctx_all = codes >> b
            if len(codes):
                starts = np.flatnonzero(np.r_[True, ctx_all[1:] != ctx_all[:-1]])
                ctx = ctx_all[starts]
                S = np.add.reduceat(a, starts)
                gamma_num = np.add.reduceat(disc[np.minimum(counts, 3)], starts)
            else:
                ctx, S, gamma_num = (np.zeros(0, dtype=np.uint64), np.zeros(0), np.zeros(0))
            orders.append(_Order(codes, a, ctx, S, gamma_num, disc))
            tabs.append((codes, counts))
            discs.append(D)
        return cls(int(K), order, tuple(tabs), tuple(discs), tuple(orders))

    @property
    def n_ngrams(self) -> int:
        """Stored n-grams (entries of all count tables)."""
        return int(sum(len(c) for c, _ in self.tables))

    # ---- probabilities ----------------------------------------------------------------------
    def prob(self, hist: np.ndarray, w: np.ndarray) -> np.ndarray:
        """p(w | hist) for many (history, symbol) pairs.

        Args:
            hist: (P, order-1) int ids, oldest first, -1 padding on the left only.
            w: (P,) int symbol ids in [0, K).
        Returns:
            (P,) float64 probabilities.
        """
        hist = np.asarray(hist)
        w = np.asarray(w, dtype=np.int64)
        P, N = len(w), self.order
        b = np.uint64(bits_per_symbol(self.K))
        wc = w.astype(np.uint64) + np.uint64(1)
        p = np.full(P, 1.0 / self.K)
        ctx = np.zeros(P, dtype=np.uint64)
        valid = np.ones(P, dtype=bool)
        for n in range(1, N + 1):
            L = n - 1  # context length
            if L > 0:
                col = hist[:, N - 1 - L]
                valid &= col >= 0
                ctx = ctx | ((np.maximum(col, 0).astype(np.uint64) + np.uint64(1)) << (b * np.uint64(L - 1)))
            o = self._orders[n - 1]
            if len(o.ctx) == 0:
                continue
            i = np.minimum(np.searchsorted(o.ctx, ctx), len(o.ctx) - 1)
            found = valid & (o.ctx[i] == ctx)
            hw = (ctx << b) | wc
            j = np.minimum(np.searchsorted(o.codes, hw), len(o.codes) - 1)
            a = np.where(found & (o.codes[j] == hw), o.counts[j], 0.0)
            disc = o.disc[np.minimum(a, 3).astype(np.int64)]
            p_n = (np.maximum(a - disc, 0.0) + o.gamma_num[i] * p) / o.S[i]
            p = np.where(found, p_n, p)
        return p

    def distribution(self, history: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Next-character probabilities (K,) float64 after ``history`` (the state; None: the start)."""
        h = self.check_history(history)
        return self.prob(np.broadcast_to(h, (self.K, self.order - 1)), np.arange(self.K))

    def initial_history(self) -> np.ndarray:
        """The state at the start of a text: (order-1,) int64, all -1."""
        return np.full(self.order - 1, -1, dtype=np.int64)

    def check_history(self, history) -> np.ndarray:
        """A state as int64 (order-1,). Raises IsanError unless it holds ids in [0, K) after a run
        of -1 padding (floats must be whole numbers)."""
        if history is None:
            return self.initial_history()
        a = np.asarray(history, dtype=np.float64).reshape(-1)
        if a.shape != (self.order - 1,) or not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise IsanError(f"an order-{self.order} n-gram state is {self.order - 1} whole numbers "
                            f"(the last ids, -1 padded); got {np.asarray(history)!r}")
        h = a.astype(np.int64)
        pad = h < 0
        if np.any(h < -1) or np.any(h >= self.K) or np.any(np.diff(pad.astype(np.int8)) > 0):
            raise IsanError(f"an n-gram state holds ids in [0, {self.K}) after left padding of -1; got {h.tolist()}")
        return h

    def _windows(self, ids: np.ndarray, history) -> np.ndarray:
        full = np.concatenate([self.check_history(history), ids])
        if self.order == 1:
            return np.zeros((len(ids), 0), dtype=np.int64)
        return np.lib.stride_tricks.sliding_window_view(full, self.order - 1)[: len(ids)]

    def bits(self, ids: np.ndarray, history=None, chunk: int = 1 << 18) -> np.ndarray:
        """Bits of every character: (T,) float64, ``-log2 p(ids[t] | preceding order-1 characters)``.

        Args:
            ids: (T,) int ids in [0, K).
            history: the state before ids[0] (None: the start of a text, see the module doc).
        Raises:
            IsanError: ids outside [0, K) or a malformed history.
        """
        ids = check_ids(ids, self.K)
        hist = self._windows(ids, history)
        out = np.empty(len(ids))
        for s in range(0, len(ids), chunk):  # bounded temporaries on long texts
            out[s : s + chunk] = -np.log2(self.prob(hist[s : s + chunk], ids[s : s + chunk]))
        return out

    def history_after(self, ids: np.ndarray, history=None) -> np.ndarray:
        """The state after ``ids``: the last order-1 ids of history + ids, -1 padded: (order-1,) int64."""
        if self.order == 1:
            return np.zeros(0, dtype=np.int64)
        full = np.concatenate([self.check_history(history), np.asarray(ids, dtype=np.int64)])
        return full[len(full) - (self.order - 1):].copy()

    def bpc(self, ids: np.ndarray) -> float:
        """Mean bits per character of ``ids`` scored from the start."""
        return float(self.bits(ids).mean())


# ---- bundle --------------------------------------------------------------------------------------
def ngram_sha256(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over arrays in sorted name order: name, dtype, shape and raw little-endian bytes."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        h.update(name.encode() + b"\0" + a.dtype.str.encode() + b"\0" + str(a.shape).encode() + b"\0")
        h.update(a.tobytes())
    return h.hexdigest()


def load_ngram(path: str | Path):
    """(manifest, KneserNeyModel, alphabet) of an n-gram bundle.

    Raises:
        BundleFormatError: not an n-gram bundle, or a missing, corrupt or edited counts file
            (the message says how to rebuild it).
    """
    from safetensors.numpy import load_file

    from isan.alphabet import Alphabet
    from isan.engine.bundle import read_manifest

    path = Path(path)
    m = read_manifest(path)
    fix = f"rebuild it with `isan train ngram --out {path}`"
    if m["kind"] != NGRAM_KIND:
        raise BundleFormatError(f"{path} holds a {m['kind']!r} model, not an n-gram model")
    alphabet = Alphabet.from_list(m["alphabet"])
    K, order = len(alphabet), m["d"]
    if not isinstance(order, int) or not 1 <= order <= max_order(K):
        raise BundleFormatError(f"{path}/manifest.json: order d={order!r} is not in [1, {max_order(K)}]; {fix}")
    f = path / COUNTS_FILE
    if not f.is_file():
        raise BundleFormatError(f"{f} does not exist; {fix}")
    try:
        arrays = load_file(str(f))
    except Exception as e:  # safetensors raises SafetensorError / OSError / ValueError
        raise BundleFormatError(f"{f} is not a valid safetensors file ({e}); {fix}") from None
    expect = {f"{k}_{n}" for n in range(1, order + 1) for k in ("codes", "counts")}
    if set(arrays) != expect:
        raise BundleFormatError(f"{f} holds {sorted(arrays)}; an order-{order} model needs {sorted(expect)}; {fix}")
    if ngram_sha256(arrays) != m["params_sha256"]:
        raise BundleFormatError(f"{path}: counts do not match the manifest's params_sha256 (corrupt or edited); {fix}")
    b = bits_per_symbol(K)
    tables = []
    for n in range(1, order + 1):
        codes, counts = arrays[f"codes_{n}"], arrays[f"counts_{n}"]
        if codes.dtype != np.uint64 or counts.dtype != np.uint32 or codes.ndim != 1 or codes.shape != counts.shape:
            raise BundleFormatError(f"{f}: codes_{n}/counts_{n} must be uint64/uint32 vectors of one length; {fix}")
        top = codes >> np.uint64(b * (n - 1))
        low = codes & np.uint64((1 << b) - 1)
        if (len(codes) and (np.any(np.diff(codes) == 0) or np.any(codes[1:] < codes[:-1])
                            or top.min() < 1 or top.max() > K or low.min() < 1 or low.max() > K
                            or counts.min() < 1)):
            raise BundleFormatError(f"{f}: the order-{n} table is not sorted, holds codes outside the alphabet "
                                    f"or counts < 1; {fix}")
        tables.append((codes, counts.astype(np.int64)))
    return m, KneserNeyModel.from_tables(K, tables), alphabet


# ---- engine --------------------------------------------------------------------------------------
class NGramRunner:
    """The runner protocol of :class:`isan.engine.baselines.recurrent.NumpyBaselineRunner` over a
    :class:`KneserNeyModel`, so :class:`~isan.engine.baselines.recurrent.RunnerEngine` serves it.

    States are float64 vectors (order-1,): the last ids, -1 padded on the left (module doc).
    ``readout(state)`` returns natural-log probabilities (V,), which are their own log-softmax.
    """

    backend = "numpy"
    provider = "numpy"
    kind = NGRAM_KIND
    state_names = ["history"]

    def __init__(self, model: KneserNeyModel):
        self.model = model
        self.K = self.V = model.K
        self.d = model.order
        self.state_size = model.order - 1

    def initial_state(self) -> np.ndarray:
        return self.model.initial_history().astype(np.float64)

    def readout(self, state: np.ndarray) -> np.ndarray:
        """ln p(w | state) for every w: (V,) float64 (use as logits)."""
        return np.log(self.model.distribution(state))

    def score_ids(self, ids: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bits (T,) float64, the state after ids (order-1,) float64)."""
        ids = np.asarray(ids, dtype=np.int64)
        return self.model.bits(ids, state), self.model.history_after(ids, state).astype(np.float64)

    def advance_ids(self, ids: np.ndarray, state: np.ndarray) -> np.ndarray:
        return self.model.history_after(np.asarray(ids, dtype=np.int64), state).astype(np.float64)

    def score_batch(self, ids_list: Sequence[np.ndarray], states: Sequence[np.ndarray] | None = None):
        states = states if states is not None else [self.initial_state()] * len(ids_list)
        return [self.score_ids(x, s) for x, s in zip(ids_list, states)]


def load_ngram_engine(path: str | Path):
    """An n-gram bundle with the scoring API of :class:`isan.engine.Engine` (``isan score --model``):
    a :class:`isan.engine.baselines.recurrent.RunnerEngine` whose State.h is the -1 padded history.

    Raises:
        BundleFormatError: see :func:`load_ngram`.
    """
    from isan.engine.baselines.recurrent import RunnerEngine

    m, model, alphabet = load_ngram(path)
    return RunnerEngine(NGramRunner(model), alphabet, m, source=str(path), path="reference")
