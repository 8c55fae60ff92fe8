"""What the Engine computes in float64 numpy, one character at a time, with every state checked:
the reference path (:class:`ReferencePath`, an object the Engine owns), and exact attribution
(paper eqs. 4-6), sampling and the check of whether any input can make the state diverge
(functions of an :class:`~isan.engine.core.Engine`, ``engine``, which hands off to them)."""

from __future__ import annotations

import numpy as np

from isan.errors import AttributionCheckError, EmptyTextError, IsanError, StateDivergedError, TextTooLongError
from isan.engine.guard import MAX_STATE_ABS, MODEL_CHECK, check_bits, check_states, raise_diverged
from isan.engine.prepare import word_spans
from isan.engine.reference import LOG2E, kappa_ref, log_softmax, logits_ref, segment_kappa_ref, states_ref
from isan.engine.results import Attribution, Sample, State, in_input_terms

MAX_ATTRIBUTION_CHARS = 2000


class ReferencePath:
    """The reference path: float64 numpy, one character at a time, every state checked (the Engine
    owns one, :attr:`Engine.reference`; ``path="reference"``).

    Args:
        params: the model's parameters by output id, float64.
        symbols: the alphabet's symbols (errors name the character).
    """

    def __init__(self, params, symbols):
        self.params, self.symbols = params, symbols

    def check(self, H: np.ndarray, x: np.ndarray, h: np.ndarray, offset: int) -> None:
        """StateDivergedError (located exactly) if a state of ``H`` (the states after ``x`` from ``h``)
        is out of range; ``offset``: where ``x`` starts in the text."""
        bad = check_states(H)
        if bad is not None:
            raise_diverged(self.params.W, self.params.b, x, h, "reference", detected_at=bad, base_offset=offset,
                           symbols=self.symbols)

    def score(self, ids: np.ndarray, h: np.ndarray, block: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        """Bits of each character, as :func:`isan.engine.reference.score_ref`, in blocks of ``block``
        characters (memory O(block V)).

        Args:
            ids: (T,) symbol ids; h: (d,) float64 the state before them.
        Returns:
            (bits (T,) float64, final state (d,) float64).
        Raises:
            StateDivergedError: a state leaves the range, or (never expected) a bit is not finite.
        """
        p = self.params
        ids = np.asarray(ids)
        bits = np.empty(len(ids))
        for s in range(0, len(ids), block):
            x = ids[s : s + block]
            H = states_ref(p, x, h)
            self.check(H, x, h, s)
            S = np.vstack([h[None, :], H[:-1]])  # states before each character
            lp = log_softmax(logits_ref(p, S))
            bits[s : s + len(x)] = -lp[np.arange(len(x)), x] * LOG2E
            h = H[-1]
        bad = check_bits(bits)
        if bad is not None:  # in-range states give finite bits; this guards the promise
            raise StateDivergedError(f"non-finite bits at character offset {bad} (reference path)", offset=bad,
                                     cause="non-finite bits")
        return bits, h

    def advance(self, ids: np.ndarray, h: np.ndarray, block: int = 4096) -> np.ndarray:
        """The float64 state (d,) after ``ids`` from ``h`` (no readout), in blocks of ``block``
        characters (memory O(block d)); raises StateDivergedError."""
        for s in range(0, len(ids), block):
            x = ids[s : s + block]
            H = states_ref(self.params, x, h)
            self.check(H, x, h, s)
            h = H[-1]
        return h


def attribute(engine, text: str, by: str = "char", state=None, unknown: str = "error", replacement: str | None = None,
              tol: float = 1e-6, normalize: str | None = "auto") -> Attribution:
    """:meth:`isan.engine.Engine.attribute` for ``engine``, in float64: ``kappa[t, s] = W_ro (W[x_t] ...
    W[x_{s+1}]) b[x_s]`` with ``b[x_0] := h`` (paper eqs. 4-6); the Engine's docstring gives the
    sources, the check and the errors raised."""
    if by not in ("char", "word"):
        raise IsanError(f"by must be 'char' or 'word'; got {by!r}")
    state = engine.check_state(state)
    prep = engine.prepare(text, normalize, unknown, replacement, state)
    ids, text = prep.ids, prep.text
    if len(ids) == 0:
        raise EmptyTextError("the text to attribute is empty (after normalisation); give at least one character")
    if len(ids) > MAX_ATTRIBUTION_CHARS:
        raise TextTooLongError(f"attribution of {len(ids)} characters needs O(T^2) memory; give at most "
                               f"{MAX_ATTRIBUTION_CHARS}, or attribute with a window (memory O(T N); "
                               "isan.engine.analysis.attribution.windowed_attribution, `isan analyze attribute "
                               "--window N`)")
    h = state.h
    p = engine.params
    H = states_ref(p, ids, h)
    bad = check_states(H)
    if bad is not None:
        try:
            raise_diverged(engine.params.W, engine.params.b, ids, h, "attribution", detected_at=bad,
                           symbols=engine.alphabet.symbols)
        except StateDivergedError as e:
            raise in_input_terms(e, prep, engine.alphabet.symbols) from None
    if by == "char" or engine.alphabet.kind == "words":
        spans = [(i, i + 1) for i in range(len(ids))]
        kappa = kappa_ref(p, ids, h)
    else:
        spans = word_spans(ids, text, engine.alphabet)
        kappa = segment_kappa_ref(p, ids, spans, h)
    logits = H @ p.W_ro.T + p.b_ro
    err = float(np.abs(p.b_ro + kappa.sum(axis=1) - logits).max())
    if err > tol * max(1.0, float(np.abs(logits).max())):
        raise AttributionCheckError(f"b_ro + sum kappa differs from the logits by {err:.3g}")
    if engine.alphabet.kind == "chars":
        sources = ["<h0>"] + [text[i:j] for i, j in spans]
    else:
        sources = ["<h0>"] + [engine.alphabet.decode(ids[i:j]) for i, j in spans]
    return Attribution(text, by, sources, [(0, 0)] + spans, kappa, logits, p.b_ro.copy(), err, engine.alphabet,
                       prep.report, prep.offsets, ids)


def check_divergence(engine, max_chars: int = 2000, beam: int = 16, search_chars: int = 200) -> dict:
    """:meth:`isan.engine.Engine.check_divergence` (``isan model check``) for ``engine``; its
    docstring says what the report holds."""
    from isan.engine.certificate import check_certificate
    from isan.engine.divergence import adversarial_search, repeat_divergence

    p, labels = engine.input_params, engine.alphabet.input_labels
    out = repeat_divergence(p, labels, max_chars=max_chars)
    out["certificate"] = check_certificate(engine.source, engine.manifest, p.W, p.b, p.h0) if engine.source else None
    out["adversarial"] = adversarial_search(p, labels, beam=beam, chars=search_chars)
    return out


def sample(engine, prompt: str = "", n: int = 200, temperature: float = 1.0, top_k: int | None = None,
           seed: int | None = None, state=None, normalize: str | None = "auto") -> Sample:
    """:meth:`isan.engine.Engine.sample` for ``engine``, in float64; the Engine's docstring gives
    the arguments and the errors raised."""
    from isan.engine.sampling import check_sampling_args, sample_ids

    check_sampling_args(n, temperature, top_k, len(engine.alphabet))
    state = engine.check_state(state)
    prep = engine.prepare(prompt, normalize, "error", None, state)
    if len(prep.ids):
        try:
            state = State(engine.advance_ids(prep.ids, state.h), state.chars, state.bits, prep.last_symbol)
        except StateDivergedError as e:
            raise in_input_terms(e, prep, engine.alphabet.symbols) from None
    p = engine.params
    symbols = engine.alphabet.symbols
    drawn: list[int] = []

    def step(h, x):
        drawn.append(x)
        h = p.W[x] @ h + p.b[x]
        if not np.abs(h).max() <= MAX_STATE_ABS:
            raise StateDivergedError(
                f"the model's state diverges at generated character {len(drawn) - 1} ({symbols[x]!r}, sampling; "
                f"state overflow (|h| > {MAX_STATE_ABS:g})); the generated text repeats a letter or pair whose "
                f"repeats diverge (`{MODEL_CHECK}` lists them): lower the temperature or use top_k",
                offset=len(drawn) - 1, cause=f"state overflow (|h| > {MAX_STATE_ABS:g})")
        return h

    ids, bits = sample_ids(lambda h: p.W_ro @ h + p.b_ro, step, state.h.copy(), n, temperature, top_k, seed)
    return Sample(prompt, engine.alphabet.decode(ids), bits, seed, temperature, top_k, prep.text, prep.report)
