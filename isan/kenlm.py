"""KenLM's Python API over an ISAN: code written for the ``kenlm`` module runs on isan unchanged.

    import isan.kenlm as kenlm            # instead of: import kenlm
    model = kenlm.Model()                 # the shipped model; or kenlm.Model("path/to/bundle")
    model.score("this is a sentence", bos=True, eos=True)       # log10 p(sentence </s> | <s>)
    model.perplexity("this is a sentence")
    for log10_prob, ngram_length, oov in model.full_scores("this is a sentence"): ...
    s, s2 = kenlm.State(), kenlm.State()
    model.BeginSentenceWrite(s)
    total = model.BaseScore(s, "this", s2) + model.BaseScore(s2, "is", s) + model.BaseScore(s, "</s>", s2)

The calls, their arguments and their units are KenLM's (``python/kenlm.pyx``, kenlm 0.3): log10
probabilities; a sentence is split into words on whitespace; ``perplexity`` is
``10 ** (-score / (words + 1))``, the ``+ 1`` for ``</s>``. What a character model makes of them:

* **Words are spelled out in characters.** An ISAN reads characters, so a word's log10 probability
  is that of its characters, preceded by the space that separates it from the word before
  (``BaseScore(s, "is", s2)`` after "this" is ``log10 p(" is" | "this")``). A sentence's score is
  therefore the log10 probability of its text with single spaces, ``"this is a sentence"``, plus
  the end of sentence. Words first go through the model's normaliser (the shipped text8 model:
  lower case, digits spelled out, punctuation to spaces), as ``isan score`` does.
* **<s> is h0.** The model has no sentence markers; ``bos=True`` (and ``BeginSentenceWrite``)
  starts from its learned initial state ``h0``, the start of a text. ``bos=False`` (and
  ``NullContextWrite``) starts from the state after one space from ``h0``: a word boundary with
  nothing known before it, the nearest thing to KenLM's null context.
* **</s> is the space that ends the last word.** text8 has no sentence ends, only word ends, so
  ``eos=True`` (and the word ``"</s>"`` in ``BaseScore``) adds ``log10 p(" " | sentence)``: that
  the last word is complete. ``score(s, eos=False)`` leaves the last word open.
* **ngram_length** counts the words the prediction conditions on, plus one (the word itself), and
  ``<s>`` as a word with ``bos=True``: an ISAN's state summarises its whole history, it never backs
  off, so this is the length KenLM would report if every n-gram were known.
* **oov** is True for a word that leaves no characters after normalisation (``"."`` for the text8
  model): it adds log10 probability 0.0 and leaves the state as it was. ``perplexity`` still counts
  it, as KenLM counts every whitespace-separated word it is given. A character outside the
  alphabet after normalisation (possible only with a model that declares no normaliser) raises
  :class:`isan.errors.AlphabetError`: KenLM maps an unknown word to ``<unk>``, an ISAN has none.
* ``Model.order`` is None: there is no n-gram order.

Model loading follows isan (a bundle directory, or None for the default model), not ARPA or KenLM
binaries; ``config`` is accepted and ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from isan.errors import IsanError

__all__ = ["Model", "LanguageModel", "State", "FullScoreReturn", "Config"]

LOG10_2 = math.log10(2.0)
EOS = "</s>"


class Config:
    """Accepted for KenLM compatibility (``kenlm.Model(path, config)``); it changes nothing here."""


class State:
    """A model state, as KenLM's: created empty, written by ``BeginSentenceWrite``,
    ``NullContextWrite`` and the ``out_state`` of ``BaseScore``. Holds an :class:`isan.engine.State`
    (``.state``; None until written). Equal states hash equally."""

    __slots__ = ("state", "words")

    def __init__(self):
        self.state = None
        self.words = 0  # words of context (ngram_length - 1), <s> counted

    def _key(self):
        s = self.state
        return None if s is None else (s.h.tobytes(), s.last_symbol, self.words)

    def __eq__(self, other):
        return isinstance(other, State) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"State(words={self.words}, last_symbol={getattr(self.state, 'last_symbol', None)!r})"


@dataclass(frozen=True)
class FullScoreReturn:
    """KenLM's ``FullScoreReturn``: ``log_prob`` (log10), ``ngram_length``, ``oov``."""

    log_prob: float
    ngram_length: int
    oov: bool


class Model:
    """An ISAN bundle behind KenLM's ``Model`` API (see the module docstring for the semantics).

    Args:
        path: an isan bundle directory; None: the shipped default model.
        config: ignored (KenLM compatibility).
    Raises:
        BundleFormatError: the bundle is missing or damaged (the message says how to rebuild it).
        IsanError: the bundle is not of a character model.
    """

    order = None

    def __init__(self, path=None, config: Config | None = None):
        from isan.engine import load_engine

        self.path = None if path is None else str(path)
        self.engine = load_engine(path)
        if self.engine.alphabet.unit != "char" or " " not in self.engine.alphabet.symbols:
            raise IsanError("isan.kenlm needs a character model whose alphabet has the space (words are "
                            "spelled out in characters, separated by spaces)")
        self._h0 = self.engine.initial_state()
        self._null = self.engine.advance(" ", state=self._h0, normalize="none")

    def __repr__(self):
        return f"<isan.kenlm.Model from {self.path or 'the default model'}>"

    # ---- states -----------------------------------------------------------------------------
    def BeginSentenceWrite(self, state: State) -> None:
        """Change the given state to a begin-of-sentence state (the model's h0)."""
        state.state, state.words = self._h0, 1

    def NullContextWrite(self, state: State) -> None:
        """Change the given state to a null context (the state after one space from h0)."""
        state.state, state.words = self._null, 0

    # ---- words ------------------------------------------------------------------------------
    def _spelling(self, word: str, state) -> str | None:
        """The characters a word is scored as after ``state`` (normalised, with the separating
        space), or None if nothing of it is left after normalisation."""
        prep = self.engine.prepare(word, state=state)
        core = prep.text.strip(" ")
        if not core:
            return None
        sep = "" if state.last_symbol in ("", " ") else " "
        return sep + core

    def _score(self, state, text: str) -> tuple[float, object]:
        r = self.engine.score(text, state=state, normalize="none")
        return -r.bits * LOG10_2, r.state

    def BaseFullScore(self, in_state: State, word: str, out_state: State) -> FullScoreReturn:
        """log10 p(word | in_state) as a :class:`FullScoreReturn`; writes the new state to ``out_state``.
        ``word`` "</s>" is the end of the sentence (a space after the last word)."""
        st = in_state.state if in_state.state is not None else self._null
        words = in_state.words if in_state.state is not None else 0
        if word == EOS:
            text, oov = " ", False
        else:
            text = self._spelling(word, st)
            oov = text is None
        if oov:
            out_state.state, out_state.words = st, words
            return FullScoreReturn(0.0, words + 1, True)
        logp, new = self._score(st, text)
        out_state.state, out_state.words = new, words + 1
        return FullScoreReturn(float(logp), words + 1, False)

    def BaseScore(self, in_state: State, word: str, out_state: State) -> float:
        """log10 p(word | in_state); writes the new state to ``out_state``."""
        return self.BaseFullScore(in_state, word, out_state).log_prob

    def full_scores(self, sentence: str, bos: bool = True, eos: bool = True):
        """Yield ``(log10 prob, ngram length, oov)`` for each whitespace-separated word of
        ``sentence``, then for ``</s>`` with ``eos``."""
        a, b = State(), State()
        (self.BeginSentenceWrite if bos else self.NullContextWrite)(a)
        for word in _words(sentence):
            r = self.BaseFullScore(a, word, b)
            a, b = b, a
            yield r.log_prob, r.ngram_length, r.oov
        if eos:
            r = self.BaseFullScore(a, EOS, b)
            yield r.log_prob, r.ngram_length, r.oov

    def score(self, sentence: str, bos: bool = True, eos: bool = True) -> float:
        """log10 p(sentence </s> | <s>): the sum of :meth:`full_scores`' probabilities."""
        return float(sum(p for p, _, _ in self.full_scores(sentence, bos=bos, eos=eos)))

    def perplexity(self, sentence: str) -> float:
        """``10 ** (-score(sentence) / (words + 1))``, KenLM's formula (the ``+ 1`` is ``</s>``)."""
        return float(10.0 ** (-self.score(sentence) / (len(_words(sentence)) + 1)))

    def __contains__(self, word: str) -> bool:
        """Whether the model can score ``word``: something of it is left after normalisation and
        every remaining character is in the alphabet."""
        try:
            prep = self.engine.prepare(word)
        except IsanError:
            return False
        return bool(prep.text.strip(" "))


#: KenLM's older name for Model
LanguageModel = Model


def _words(sentence) -> list[str]:
    if isinstance(sentence, bytes):
        sentence = sentence.decode("utf-8")
    if not isinstance(sentence, str):
        raise TypeError(f"Cannot convert {type(sentence)} to string")
    return sentence.split()

