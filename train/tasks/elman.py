"""Elman's grammar (Elman 1991, "Distributed representations, simple recurrent networks, and
grammatical structure"): a seeded sentence generator, a grammaticality checker, the grammar's true
next-word distribution, the entropy of a test stream, and the NNL metric of Čerňanský, Makula and
Beňušková (2008, eq. 7).

The language (24 symbols with the end-of-sentence marker ``.``)::

    S   -> NP VP .
    NP  -> PropN | N | N RC
    VP  -> V (NP)
    RC  -> who VP | who NP V           (subject relative | object relative, the object gapped)
    N   -> boy | girl | cat | dog | boys | girls | cats | dogs
    PropN -> John | Mary
    V   -> chase | feed | see | hear | walk | live | chases | feeds | sees | hears | walks | lives

with number agreement (a verb agrees with its subject: the head noun for a main clause and for a
subject relative, the relative clause's own noun phrase for an object relative) and argument
structure (chase and feed require a direct object, see and hear take one optionally, walk and live
take none; an object relative needs a verb that can take an object, since its object is the gap).

Probabilities. Elman (1991) does not publish them, nor does Čerňanský et al. (2008); the choices
here (documented, seeded, and all in :class:`ElmanConfig`):

* a noun phrase is singular or plural with probability 1/2 each; a singular one is a proper noun
  (John or Mary) with probability 2 ``p_propn`` = 0.4, so ``p_propn`` = 0.2 of all noun phrases are
  proper nouns; a common noun is uniform over the 4 stems;
* a common noun takes a relative clause with probability ``p_rc`` = 0.45 while fewer than
  ``max_depth`` = 3 clauses are open (deeper noun phrases take none); a relative clause is a
  subject relative with probability 1/2, else an object relative (its noun phrase's number is
  again 1/2 each);
* a verb is uniform over the 6 stems allowed in its slot (all 6 in a verb phrase, the 4 that can
  take an object in an object relative), in the form its subject's number asks for; an optional
  object is present with probability 1/2.

With these, a sentence has 5.5 symbols on average (the end marker included), so 10,000 sentences
are about 55,000 symbols, as in the paper.

The grammar is held as a probabilistic context-free grammar with the agreement and the depth in
the nonterminals' names (:func:`build_grammar`). It has no left recursion, so the true next-word
distribution of any prefix is exact: a belief over the parser's stacks (leftmost derivations) is
pushed through the prefix (:class:`NextWordOracle`). Sentences are independent, so the true
distribution of a stream restarts at every ``.``.

NNL (eq. 7 of Čerňanský et al. 2008): ``NNL = -(1/T) sum_t log_|A| P(x_t | x_<t)``, the mean negative
log-likelihood in base |A| = 24, i.e. bits per symbol divided by log2 |A| (:func:`nnl_from_bits`).
The entropy H of a test stream is the NNL of the true distribution on it (:func:`stream_entropy`):
no model of the grammar can do better on average.

Text form: words separated by single spaces, ``.`` a word of its own (for
:class:`isan.tokens.WordAlphabet`): ``"boy who dogs chase sees girl . Mary lives ."``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

END = "."
NOUNS = ("boy", "girl", "cat", "dog")
PROPER = ("John", "Mary")
VERBS = {"chase": "required", "feed": "required", "see": "optional", "hear": "optional",
         "walk": "none", "live": "none"}


def _plural(n: str) -> str:
    return n + "s"


def _third(v: str) -> str:
    return v + "s"


#: the 24 symbols in id order (the alphabet's order is fixed, so ids mean the same in every run)
SYMBOLS = (tuple(NOUNS) + tuple(_plural(n) for n in NOUNS) + PROPER + tuple(VERBS)
           + tuple(_third(v) for v in VERBS) + ("who", END))
assert len(SYMBOLS) == 24


@dataclass(frozen=True)
class ElmanConfig:
    """The grammar's probabilities (see the module docstring)."""

    p_propn: float = 0.2
    p_rc: float = 0.45
    p_subject_rc: float = 0.5
    p_object: float = 0.5  # an optional object is present
    max_depth: int = 3


def elman_alphabet():
    """The 24-word :class:`isan.tokens.WordAlphabet` in :data:`SYMBOLS` order."""
    from isan.tokens import WordAlphabet

    return WordAlphabet(SYMBOLS)


# ------------------------------------------------------------------------------------------ grammar
Rule = tuple[float, tuple[str, ...]]


def _is_terminal(sym: str) -> bool:
    return sym in _TERMINALS


_TERMINALS = frozenset(SYMBOLS)


def build_grammar(cfg: ElmanConfig = ElmanConfig()) -> dict[str, list[Rule]]:
    """The PCFG: nonterminal -> [(probability, right-hand side)], start symbol ``S``.

    Nonterminals carry number (sg / pl) and depth (open relative clauses): ``NP_sg_0``, ``VP_pl_1``,
    ``RC_sg_0``, ``NPany_1``; preterminals ``N_sg``, ``V_<class>_<num>``, ``VT_<num>``.
    """
    g: dict[str, list[Rule]] = {}
    classes = {c: [v for v, k in VERBS.items() if k == c] for c in ("required", "optional", "none")}
    for num in ("sg", "pl"):
        g[f"N_{num}"] = [(1 / len(NOUNS), (n if num == "sg" else _plural(n),)) for n in NOUNS]
        for c, vs in classes.items():
            g[f"V_{c}_{num}"] = [(1 / len(vs), (_third(v) if num == "sg" else v,)) for v in vs]
        trans = [v for v, k in VERBS.items() if k != "none"]
        g[f"VT_{num}"] = [(1 / len(trans), (_third(v) if num == "sg" else v,)) for v in trans]
    g["PropN"] = [(1 / len(PROPER), (p,)) for p in PROPER]
    nv = len(VERBS)
    for k in range(cfg.max_depth + 1):
        g[f"NPany_{k}"] = [(0.5, (f"NP_sg_{k}",)), (0.5, (f"NP_pl_{k}",))]
        for num in ("sg", "pl"):
            # number is drawn first (1/2 each); a singular noun phrase is a proper noun with
            # probability 2 p_propn, so that p_propn of all noun phrases are proper nouns
            rules: list[Rule] = []
            common = 1.0
            if num == "sg":
                rules.append((_p_propn_sg(cfg), ("PropN",)))
                common = 1.0 - rules[0][0]
            p_rc = cfg.p_rc if k < cfg.max_depth else 0.0
            rules.append((common * (1 - p_rc), (f"N_{num}",)))
            if p_rc > 0:
                rules.append((common * p_rc, (f"N_{num}", f"RC_{num}_{k}")))
            g[f"NP_{num}_{k}"] = rules
            g[f"VP_{num}_{k}"] = [
                (len(classes["required"]) / nv, (f"V_required_{num}", f"NPany_{k}")),
                (len(classes["optional"]) / nv * cfg.p_object, (f"V_optional_{num}", f"NPany_{k}")),
                (len(classes["optional"]) / nv * (1 - cfg.p_object), (f"V_optional_{num}",)),
                (len(classes["none"]) / nv, (f"V_none_{num}",)),
            ]
            if k < cfg.max_depth:
                po = 1 - cfg.p_subject_rc
                g[f"RC_{num}_{k}"] = [
                    (cfg.p_subject_rc, ("who", f"VP_{num}_{k + 1}")),
                    (po * 0.5, ("who", f"NP_sg_{k + 1}", "VT_sg")),
                    (po * 0.5, ("who", f"NP_pl_{k + 1}", "VT_pl")),
                ]
    g["S"] = [(0.5, ("NP_sg_0", "VP_sg_0", END)), (0.5, ("NP_pl_0", "VP_pl_0", END))]
    for lhs, rules in g.items():  # a malformed grammar is a bug, not data
        s = sum(p for p, _ in rules)
        if abs(s - 1) > 1e-12:
            raise AssertionError(f"rules of {lhs} sum to {s}")
    return g


def _p_propn_sg(cfg: ElmanConfig) -> float:
    """P(proper noun | singular NP): with number 1/2 each, p_propn of all noun phrases are proper."""
    return min(1.0, 2 * cfg.p_propn)


@lru_cache(maxsize=8)
def _grammar(cfg: ElmanConfig) -> dict:
    return build_grammar(cfg)


@lru_cache(maxsize=8)
def _closures(cfg: ElmanConfig) -> dict[str, tuple[tuple[float, tuple[str, ...]], ...]]:
    """For each nonterminal X: every way to rewrite X (leftmost) until a terminal leads, with its
    probability: [(p, (terminal, rest...))]. Finite because the grammar has no left recursion."""
    g = _grammar(cfg)
    memo: dict[str, tuple] = {}

    def close(x: str):
        if x in memo:
            return memo[x]
        out: dict[tuple[str, ...], float] = {}
        for p, rhs in g[x]:
            if _is_terminal(rhs[0]):
                out[rhs] = out.get(rhs, 0.0) + p
            else:
                for q, seq in close(rhs[0]):
                    key = seq + rhs[1:]
                    out[key] = out.get(key, 0.0) + p * q
        memo[x] = tuple((p, s) for s, p in out.items())
        return memo[x]

    for x in g:
        close(x)
    return memo


# ------------------------------------------------------------------------------------- generation
def generate_sentence(rng: np.random.Generator, cfg: ElmanConfig = ElmanConfig()) -> list[str]:
    """One sentence (a list of words ending with ``.``), by a leftmost derivation from ``S``."""
    g = _grammar(cfg)
    cdfs = _cdfs(cfg)
    out: list[str] = []
    stack = ["S"]
    while stack:
        x = stack.pop()
        if _is_terminal(x):
            out.append(x)
            continue
        rules = g[x]
        # the draw of rng.choice(len(rules), p=...): one uniform double against the normalised cdf
        i = bisect.bisect_right(cdfs[x], rng.random()) if len(rules) > 1 else 0
        stack.extend(reversed(rules[i][1]))
    return out


@lru_cache(maxsize=8)
def _cdfs(cfg: ElmanConfig) -> dict[str, list[float]]:
    out = {}
    for x, rules in _grammar(cfg).items():
        c = np.cumsum([p for p, _ in rules])
        out[x] = (c / c[-1]).tolist()
    return out


def generate(n_sentences: int, seed: int, cfg: ElmanConfig = ElmanConfig()) -> list[list[str]]:
    """``n_sentences`` sentences from ``np.random.default_rng(seed)`` (the same seed, the same text)."""
    rng = np.random.default_rng(seed)
    return [generate_sentence(rng, cfg) for _ in range(n_sentences)]


def to_text(sentences: list[list[str]]) -> str:
    """Words joined by single spaces (``.`` a word of its own), ending with a newline."""
    return " ".join(w for s in sentences for w in s) + "\n"


#: the seeds of the study's data (train and an independent test set)
TRAIN_SEED, TEST_SEED, VALID_SEED = 1991, 2008, 17


def study_data(n_train: int = 10_000, n_test: int = 10_000, n_valid: int = 1_000,
               cfg: ElmanConfig = ElmanConfig()) -> dict[str, list[list[str]]]:
    """The study's sentences: train, valid (for the trained models' early stopping) and test."""
    return {"train": generate(n_train, TRAIN_SEED, cfg), "valid": generate(n_valid, VALID_SEED, cfg),
            "test": generate(n_test, TEST_SEED, cfg)}


def encode(sentences: list[list[str]]) -> np.ndarray:
    """The id stream (int64) of sentences in :data:`SYMBOLS` order."""
    index = {w: i for i, w in enumerate(SYMBOLS)}
    return np.array([index[w] for s in sentences for w in s], dtype=np.int64)


# ------------------------------------------------------------------------------ exact inference
class NextWordOracle:
    """The grammar's true next-word distribution.

    A belief is ``{stack: probability}`` over the leftmost-derivation stacks consistent with the words
    seen so far in the sentence (top of the stack last); :meth:`distribution` gives P(next word) and
    :meth:`advance` conditions on one word. Exact: the grammar has no left recursion and finite depth.
    """

    def __init__(self, cfg: ElmanConfig = ElmanConfig()):
        self.cfg = cfg
        self.closures = _closures(cfg)
        self.index = {w: i for i, w in enumerate(SYMBOLS)}

    def start(self) -> dict[tuple[str, ...], float]:
        return {("S",): 1.0}

    def _expand(self, belief: dict) -> dict[tuple[str, ...], float]:
        """Rewrite every stack until a terminal is on top (an empty stack: the sentence ended)."""
        out: dict[tuple[str, ...], float] = {}
        for stack, w in belief.items():
            if not stack or _is_terminal(stack[-1]):
                out[stack] = out.get(stack, 0.0) + w
                continue
            rest = stack[:-1]
            for p, seq in self.closures[stack[-1]]:
                key = rest + tuple(reversed(seq))
                out[key] = out.get(key, 0.0) + w * p
        return out

    def distribution(self, belief: dict) -> np.ndarray:
        """P(next word | the sentence so far), float64 (24,), summing to 1."""
        e = self._expand(belief)
        p = np.zeros(len(SYMBOLS))
        for stack, w in e.items():
            if stack:
                p[self.index[stack[-1]]] += w
        s = p.sum()
        if s <= 0:
            raise ValueError("no word can follow: the belief is empty (an ungrammatical prefix)")
        return p / s

    def advance(self, belief: dict, word: str) -> dict:
        """The belief after ``word`` (unnormalised mass of the prefix is renormalised to 1);
        an empty dict if ``word`` cannot come next."""
        e = self._expand(belief)
        out = {s[:-1]: w for s, w in e.items() if s and s[-1] == word}
        z = sum(out.values())
        return {s: w / z for s, w in out.items()} if z > 0 else {}


@lru_cache(maxsize=8)
def _prefix_cache(cfg: ElmanConfig) -> dict:
    return {}


def true_distributions(words: list[str] | np.ndarray, cfg: ElmanConfig = ElmanConfig()) -> np.ndarray:
    """(T, 24): the true P(x_t | x_<t) along a stream of whole sentences (restarting after each ``.``).

    Distributions are cached by sentence prefix, so a 55k-symbol stream takes about a second.
    """
    if isinstance(words, np.ndarray):
        words = [SYMBOLS[i] for i in words.tolist()]
    oracle = NextWordOracle(cfg)
    cache = _prefix_cache(cfg)
    out = np.empty((len(words), len(SYMBOLS)))
    prefix: tuple[str, ...] = ()
    belief = oracle.start()
    for t, w in enumerate(words):
        if prefix not in cache:
            cache[prefix] = (oracle.distribution(belief), belief)
        out[t] = cache[prefix][0]
        key = prefix + (w,)
        if key in cache:
            belief = cache[key][1]
        else:
            belief = oracle.advance(belief, w)
            if not belief:
                raise ValueError(f"ungrammatical at symbol {t} ({w!r}) after {' '.join(prefix)!r}")
        prefix = () if w == END else key
        if w == END:
            belief = oracle.start()
    return out


# ------------------------------------------------------------------------------------ the checker
def is_grammatical(sentence: list[str], cfg: ElmanConfig = ElmanConfig()) -> bool:
    """True iff ``sentence`` (ending with ``.``) has a derivation in the grammar with depth at most
    ``cfg.max_depth`` (exactly: the belief over derivations stays non-empty and can end there)."""
    if not sentence or sentence[-1] != END or any(w not in _TERMINALS for w in sentence):
        return False
    oracle = NextWordOracle(cfg)
    b = oracle.start()
    for w in sentence:
        b = oracle.advance(b, w)
        if not b:
            return False
    return () in b  # the derivation is complete exactly at the end marker


def check_grammatical(sentence: list[str], cfg: ElmanConfig = ElmanConfig()) -> None:
    """Raise ValueError naming the first word at which ``sentence`` leaves the grammar."""
    oracle = NextWordOracle(cfg)
    b = oracle.start()
    for i, w in enumerate(sentence):
        b = oracle.advance(b, w)
        if not b:
            raise ValueError(f"word {i} ({w!r}) cannot follow {' '.join(sentence[:i])!r}")
    if () not in b:
        raise ValueError(f"{' '.join(sentence)!r} is unfinished")


def is_grammatical_plain(sentence: list[str], max_depth: int = 3) -> bool:
    """An independent checker: a hand-written recursive-descent parser of the grammar (no
    probabilities), used to test the oracle and the generator against each other."""
    sg = set(NOUNS) | set(PROPER)
    pl = {_plural(n) for n in NOUNS}
    cls = {}
    for v, c in VERBS.items():
        cls[v] = (c, "pl")
        cls[_third(v)] = (c, "sg")

    def np_(i: int, k: int):
        """All (end, number) of a noun phrase starting at i at depth k."""
        if i >= len(sentence):
            return []
        w = sentence[i]
        if w in PROPER:
            return [(i + 1, "sg")]
        if w not in sg and w not in pl:
            return []
        num = "sg" if w in sg else "pl"
        out = [(i + 1, num)]
        if k < max_depth:
            out += [(e, num) for e in rc(i + 1, num, k)]
        return out

    def vp(i: int, num: str, k: int):
        if i >= len(sentence) or sentence[i] not in cls:
            return []
        c, vnum = cls[sentence[i]]
        if vnum != num:
            return []
        out = []
        if c in ("optional", "none"):
            out.append(i + 1)
        if c in ("required", "optional"):
            out += [e for e, _ in np_(i + 1, k)]
        return out

    def rc(i: int, num: str, k: int):
        if i >= len(sentence) or sentence[i] != "who":
            return []
        out = list(vp(i + 1, num, k + 1))
        for e, n2 in np_(i + 1, k + 1):
            if e < len(sentence) and sentence[e] in cls:
                c, vnum = cls[sentence[e]]
                if c != "none" and vnum == n2:
                    out.append(e + 1)
        return out

    for e, num in np_(0, 0):
        for e2 in vp(e, num, 0):
            if e2 == len(sentence) - 1 and sentence[e2] == END:
                return True
    return False


# ----------------------------------------------------------------------------------- the metrics
def nnl_from_bits(bits_per_symbol: float, alphabet_size: int = len(SYMBOLS)) -> float:
    """NNL (eq. 7): mean negative log-likelihood in base |A| = bits per symbol / log2 |A|."""
    return float(bits_per_symbol) / math.log2(alphabet_size)


def nnl(probs_of_next: np.ndarray, alphabet_size: int = len(SYMBOLS)) -> float:
    """NNL of the probabilities a model gave the symbols that came: -mean(log_|A| p)."""
    p = np.asarray(probs_of_next, dtype=np.float64)
    return float(-np.mean(np.log(p)) / math.log(alphabet_size))


def stream_entropy(ids: np.ndarray, cfg: ElmanConfig = ElmanConfig()) -> dict:
    """The entropy of a stream of whole sentences under the grammar's true distribution:
    ``{"nnl": H in base |A|, "bits_per_symbol": H in bits, "symbols": T}``."""
    P = true_distributions(ids, cfg)
    p = P[np.arange(len(ids)), ids]
    bits = float(-np.mean(np.log2(p)))
    return {"nnl": nnl_from_bits(bits), "bits_per_symbol": bits, "symbols": int(len(ids))}
