"""Word-level kappa as an embedding: the ICLR 2017 workshop version's Figure 6.

The paper (Foerster et al., "Intelligible Language Modeling with Input Switched Affine Networks",
ICLR 2017 workshop, section 4.3 and Fig. 6): "We can use the kappa_word^t as an embedding space.
Although the model was only trained on character level representations, the kappa_word^t show clear
semantic clustering under t-SNE ... Shown is an overview of the 4000 most common words".

kappa_word^t is the sum of the paper's kappa_s^t (eq. 6) over the characters s of one word. It is
independent of everything read before the word ("It is however independent of prior inputs",
section 4.2), so a word has one vector for each t after it. The paper does not say which t its
figure uses; we take the first t after the word, the space that ends it (``at=" "``): the word's
contribution to the prediction of the next word's first character,

    kappa_word = W_ro W[at] c_word,    c_word = sum_{s in word} (W[x_j] ... W[x_{s+1}]) b[x_s],

with c_word the composed bias of the word's characters (the bias of the word's composed affine
map), j its last character. ``at=None`` takes t = the word's last character (``W_ro c_word``).

Fast path :func:`word_kappa` (one composed bias a word, float64); reference
:func:`word_kappa_ref` (the sum of :func:`isan.engine.reference.kappa_ref` over the word's
characters); tested equal. :func:`neighbour_purity` measures the clustering without t-SNE: how
many of a group's nearest neighbours in kappa space are of the group, against chance.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from isan.errors import IsanError
from isan.params import ISANParams

#: word groups whose clustering is measured (those among the frequent words): the paper's
#: Fig. 6b "a region that is primarily filled with numbers", 6c "a variety of different professions";
#: and a control that shares spelling, not meaning (a suffix), since kappa at the space after a word
#: is dominated by its last characters
GROUPS = {
    "numbers": ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "twenty", "thirty", "forty", "fifty", "hundred", "thousand", "million", "billion"),
    "professions": ("actor", "actress", "writer", "singer", "poet", "composer", "painter", "philosopher", "author",
                    "journalist", "physicist", "mathematician", "musician", "director", "producer", "artist",
                    "scientist", "economist", "novelist", "historian", "teacher", "lawyer", "engineer", "architect",
                    "chemist", "astronomer", "politician", "physician", "player", "guitarist", "critic", "bishop",
                    "priest", "sculptor", "dramatist", "screenwriter", "comedian", "soldier", "pianist", "inventor",
                    "statesman", "diplomat", "explorer", "businessman", "biologist", "psychologist", "sociologist",
                    "theologian", "linguist", "footballer", "athlete", "cartoonist", "illustrator", "photographer"),
    "ending -tion (control: spelling)": None,  # every frequent word ending in "tion"
}


def frequent_words(text: str, n: int, min_len: int = 1) -> list[tuple[str, int]]:
    """The ``n`` most frequent space-separated words of ``text`` with their counts (ties by first
    occurrence's order in ``Counter.most_common``)."""
    if n < 1:
        raise IsanError(f"the number of words must be at least 1; got {n}")
    counts = Counter(w for w in text.split(" ") if len(w) >= min_len)
    if not counts:
        raise IsanError("the text has no words (nothing separated by spaces); give more text")
    return counts.most_common(n)


def _ids(word: str, index: dict) -> list[int]:
    try:
        return [index[c] for c in word]
    except KeyError as e:
        raise IsanError(f"the character {e.args[0]!r} of the word {word!r} is not in the model's alphabet") from None


def word_bias(p: ISANParams, words: list[str], symbols) -> np.ndarray:
    """c_word, the composed bias of each word's characters read from the zero state (the ``b`` of the
    word's composed affine map): (len(words), d) float64. Raises IsanError as :func:`word_kappa`."""
    from isan.engine.reference import states_ref

    p = p.astype(np.float64)
    index = {c: i for i, c in enumerate(symbols)}
    out = np.empty((len(words), p.d))
    for k, w in enumerate(words):
        if not w:
            raise IsanError("an empty word has no kappa; give words of one character or more")
        out[k] = states_ref(p, _ids(w, index), np.zeros(p.d))[-1]  # the state the word leaves from h = 0
    return out


def word_kappa(p: ISANParams, words: list[str], symbols, at: str | None = " ") -> np.ndarray:
    """kappa_word (module docstring) of every word: (len(words), V) float64, exact.

    Args:
        at: the character read after the word at which kappa is taken (default the space), or None
            for t = the word's last character.
    Raises:
        IsanError: an empty word, ``at`` not one character, or a character outside the alphabet.
    """
    if at is not None and len(at) != 1:
        raise IsanError(f"kappa_word is taken at one character after the word; got {at!r}: give one character")
    p = p.astype(np.float64)
    C = word_bias(p, words, symbols)  # (N, d)
    if at is None:
        return C @ p.W_ro.T
    x = _ids(at, {c: i for i, c in enumerate(symbols)})[0]
    return C @ (p.W_ro @ p.W[x]).T


def word_kappa_ref(p: ISANParams, words: list[str], symbols, at: str | None = " ") -> np.ndarray:
    """The same as :func:`word_kappa` from per-character kappa (:func:`kappa_ref`, paper eq. 6),
    summed over the word's characters (sources 1..len(word)) at the step that reads ``at``."""
    from isan.engine.reference import kappa_ref

    p = p.astype(np.float64)
    index = {c: i for i, c in enumerate(symbols)}
    out = np.empty((len(words), p.V))
    for k, w in enumerate(words):
        ids = np.asarray(_ids(w + (at or ""), index))
        kappa = kappa_ref(p, ids, np.zeros(p.d))
        out[k] = kappa[len(ids) - 1, 1 : len(w) + 1].sum(0)
    return out


def _nearest(X: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` nearest other rows of ``X`` (Euclidean) to each of ``rows``: (len(rows), k) indices."""
    sq = (X * X).sum(1)
    D = sq[rows][:, None] + sq[None, :] - 2.0 * X[rows] @ X.T  # squared distances
    D[np.arange(len(rows)), rows] = np.inf  # not itself
    return np.argpartition(D, k, axis=1)[:, :k]


def neighbour_purity(X: np.ndarray, members: np.ndarray, k: int = 10) -> dict:
    """How well the rows ``members`` (a boolean mask) of ``X`` cluster: for each member, the share
    of its ``k`` nearest other rows (Euclidean) that are members; averaged. Chance is the members'
    share of the other rows. Returns {"members", "k", "purity", "chance", "lift"} (lift =
    purity / chance)."""
    X = np.asarray(X, dtype=np.float64)
    members = np.asarray(members, dtype=bool)
    m, n = int(members.sum()), len(X)
    if m < 2 or n <= k:
        raise IsanError(f"neighbour purity needs at least 2 members and more than k = {k} rows; got {m} of {n}")
    purity = float(members[_nearest(X, np.flatnonzero(members), k)].mean())
    chance = (m - 1) / (n - 1)
    return {"members": m, "k": k, "purity": purity, "chance": chance, "lift": purity / chance}


def suffix_agreement(X: np.ndarray, words: list[str], k: int = 10, letters: int = 2) -> dict:
    """How much of the neighbourhood in ``X`` is spelling: the share of every word's ``k`` nearest
    other words (Euclidean) that end in the same ``letters`` letters as it, averaged over the words
    that have such a letter ending; chance is the same share over all other words. Returns
    {"letters", "k", "share", "chance"}."""
    X = np.asarray(X, dtype=np.float64)
    ends = np.array([w[-letters:] if len(w) >= letters else "" for w in words])
    n = len(X)
    if n <= k:
        raise IsanError(f"suffix agreement needs more than k = {k} words; got {n}")
    same = ends[_nearest(X, np.arange(n), k)] == ends[:, None]
    _, inverse, counts = np.unique(ends, return_inverse=True, return_counts=True)
    has = ends != ""
    return {"letters": letters, "k": k, "share": float(same[has].mean()),
            "chance": float(((counts[inverse] - 1) / (n - 1))[has].mean())}


def tsne(X: np.ndarray, seed: int = 0, perplexity: float = 30.0) -> np.ndarray:
    """A 2-D t-SNE embedding of the rows of ``X`` (scikit-learn's, PCA initialisation): (n, 2)."""
    from sklearn.manifold import TSNE

    X = np.asarray(X, dtype=np.float64)
    perplexity = min(perplexity, (len(X) - 1) / 3)
    return TSNE(n_components=2, perplexity=perplexity, init="pca", learning_rate="auto",
                random_state=seed).fit_transform(X)
