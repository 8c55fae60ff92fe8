"""Sampling a character at a time, for ``POST /v1/sample`` streamed as Server-Sent Events.

:meth:`isan.engine.Engine.sample` generates all ``n`` characters in one call. The server wants
them in pieces (to send each piece as it is made, and to stop when the client leaves), with the
same characters for the same seed. :class:`StreamSampler` is that loop cut into pieces: the same
prompt reading (:meth:`~isan.engine.Engine.advance`, the engine's path), the same float64
recurrence ``h = W[x] h + b[x]``, the same draws from ``numpy.random.default_rng(seed)``
(:func:`isan.engine.sampling.sample_ids`), so ``StreamSampler(eng, prompt, n, seed=s)`` gives
``eng.sample(prompt, n, seed=s).text`` whatever the pieces. Engines other than
:class:`~isan.engine.Engine` are sampled whole with their own ``sample`` and handed out in pieces.

``inverse_temperature`` (beta) multiplies the logits instead of dividing them: beta = 0 samples
uniformly, which no temperature can.

Example:
    >>> s = StreamSampler(Engine.default(), "the cat", 50, seed=1)
    >>> s.next_piece(10) + s.next_piece(40) == Engine.default().sample("the cat", 50, seed=1).text
    True
"""

from __future__ import annotations

import secrets

import numpy as np

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.reference import LOG2E, log_softmax
from isan.errors import IsanError, StateDivergedError


class StreamSampler:
    """Generates ``n`` characters after ``prompt`` piece by piece (module docstring).

    Args:
        engine: the model; temperature / inverse_temperature: at most one (default temperature 1);
        top_k: sample among the k most likely characters (None: all); top_p: then among the most
        likely characters whose probabilities reach top_p (nucleus sampling; None or 1: all); seed: None draws one (see
        :attr:`seed`); state: the state to start from (None: the initial state).
    Attributes:
        seed: the seed used; prompt_text, normalization: the prompt as the model read it.
        text: the characters generated so far; bits: their bits under the unscaled model.
    Raises:
        IsanError: bad arguments; AlphabetError or StateDivergedError for a prompt the model cannot read.
    """

    def __init__(self, engine, prompt: str, n: int, temperature: float | None = None,
                 inverse_temperature: float | None = None, top_k: int | None = None, seed: int | None = None,
                 state=None, normalize: str = "auto", top_p: float | None = None):
        from isan.engine.core import Engine
        from isan.engine.sampling import check_sampling_args

        if temperature is not None and inverse_temperature is not None:
            raise IsanError('give "temperature" or "inverse_temperature", not both')
        if inverse_temperature is not None and not inverse_temperature >= 0:
            raise IsanError(f"inverse_temperature must be >= 0; got {inverse_temperature}")
        self.temperature = 1.0 if temperature is None and inverse_temperature is None else temperature
        self.inverse_temperature = inverse_temperature
        if self.inverse_temperature is None:  # temperature 0 (below 0.01) is greedy, as everywhere
            from isan.engine.sampling import greedy

            self.temperature, top_k = greedy(self.temperature, top_k)
        V = len(engine.alphabet)
        check_sampling_args(n, self.temperature if self.temperature is not None else 1.0, top_k, V)
        if top_p is not None and not 0 < top_p <= 1:
            raise IsanError(f"top_p must be in (0, 1]; got {top_p}")
        self.engine, self.n, self.top_k = engine, int(n), top_k
        self.top_p = top_p if top_p is not None and top_p < 1 else None
        self.seed = int(seed) if seed is not None else secrets.randbits(53)  # exact in every JSON reader
        self.prompt = prompt
        self.text = ""
        self.bits = 0.0
        self._whole: str | None = None
        start = state if state is not None else engine.initial_state()
        self.start = start
        tokens = getattr(engine.alphabet, "kind", "chars") != "chars"
        if not isinstance(engine, Engine) or tokens:
            # sampled whole, handed out in pieces; a token model (bytes, pairs, words) generates n tokens,
            # whose text is then what is handed out (n becomes its length in characters)
            temperature = self.temperature
            if self.top_p is not None:
                raise IsanError("top_p (nucleus sampling) needs an ISAN of characters on the numpy backend; leave "
                                "out top_p or give 1")
            if inverse_temperature is not None:
                if not isinstance(engine, Engine) or not inverse_temperature > 0:
                    raise IsanError("inverse_temperature needs an ISAN of characters on the numpy backend (and, for "
                                    "token models, beta > 0); give temperature")
                temperature = 1.0 / inverse_temperature
            smp = engine.sample(prompt, n=n, temperature=temperature, top_k=top_k, seed=self.seed,
                                **({"state": state} if state is not None else {}), normalize=normalize)
            self._whole, self._whole_bits = smp.text, float(smp.bits)
            if tokens:
                self.n = len(smp.text)
            self.prompt_text, self.normalization = smp.prompt_normalized, smp.normalization
            self.state = None
            return
        prep = engine.prepare(prompt, normalize, "error", None, start)
        self.prompt_text, self.normalization = prep.text, prep.report
        st = engine.advance(prep.ids, start, normalize="none") if len(prep.ids) else start
        self._h = np.array(st.h, dtype=np.float64)
        self._last = st.last_symbol
        self._rng = np.random.default_rng(self.seed)
        p = engine.params
        self._W, self._b, self._W_ro, self._b_ro = p.W, p.b, p.W_ro, p.b_ro
        self._symbols = engine.alphabet.symbols
        self.state = None

    @property
    def done(self) -> bool:
        return len(self.text) >= self.n

    def next_piece(self, k: int) -> str:
        """Generate up to ``k`` more characters (fewer at the end); raises StateDivergedError if the
        generated text drives the state out of range (the characters before it are kept)."""
        k = min(int(k), self.n - len(self.text))
        if k <= 0:
            return ""
        if self._whole is not None:
            piece = self._whole[len(self.text) : len(self.text) + k]
            self.text += piece
            if self.done:
                self.bits = self._whole_bits
            return piece
        out = []
        h, rng = self._h, self._rng
        V = len(self._symbols)
        try:
            for _ in range(k):
                logits = self._W_ro @ h + self._b_ro
                z = logits / self.temperature if self.inverse_temperature is None else logits * self.inverse_temperature
                if self.top_k is not None and self.top_k < len(z):
                    cut = np.partition(z, -self.top_k)[-self.top_k]
                    z = np.where(z >= cut, z, -np.inf)
                probs = np.exp(log_softmax(z))
                if self.top_p is not None:  # nucleus: the most likely characters whose mass reaches top_p
                    order = np.argsort(-probs, kind="stable")
                    keep = int(np.searchsorted(np.cumsum(probs[order]), self.top_p)) + 1
                    mask = np.zeros(V, dtype=bool)
                    mask[order[:keep]] = True
                    probs = np.where(mask, probs, 0.0)
                x = int(min(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right"), V - 1))
                self.bits -= float(log_softmax(logits)[x] * LOG2E)
                out.append(self._symbols[x])
                h = self._W[x] @ h + self._b[x]
                if not np.abs(h).max() <= MAX_STATE_ABS:
                    at = len(self.text) + len(out) - 1
                    cause = f"state overflow (|h| > {MAX_STATE_ABS:g})"
                    raise StateDivergedError(
                        f"the model's state diverges at generated character {at} ({self._symbols[x]!r}, sampling; "
                        f"{cause}); the generated text repeats a letter or pair whose repeats diverge (`isan model "
                        "check` lists them): lower the temperature or use top_k", offset=at, cause=cause)
        finally:
            piece = "".join(out)
            self.text += piece
            self._h = h
            if out:
                self._last = out[-1]
        return piece

    def final_state(self):
        """The state after the prompt and the generated text (totals: the start's plus the generated
        characters and their bits), or None for engines sampled whole."""
        if self._whole is not None:
            return None
        from isan.engine.results import State

        s = self.start
        return State(self._h, s.chars + len(self.text), s.bits + self.bits, self._last)

    def result(self) -> dict:
        out = {"prompt": self.prompt, "text": self.text, "chars": len(self.text), "bits": float(self.bits),
               "seed": self.seed, "temperature": self.temperature, "top_k": self.top_k}
        if self.inverse_temperature is not None:
            out["inverse_temperature"] = self.inverse_temperature
            t = 1.0 / self.inverse_temperature if self.inverse_temperature > 0 else float("inf")
            out["temperature"] = t if t < float("inf") else None  # beta 0 (or below 1/DBL_MAX): uniform
        out["prompt_normalized"] = self.prompt_text
        out["normalization"] = self.normalization
        return out
