"""The paper's studies, one function each: compute the numbers, draw the figure, return JSON-able numbers.

Each ``study_*`` takes an ISAN's parameters and its symbols (and the text it needs), writes one PNG
into ``out_dir`` when given, and returns a dict of plain floats, ints, strings and lists (no NaN or
inf: :func:`finite` turns them into None). ``isan analyze`` calls these; engine/ never imports
train/, so the parentheses study takes the task's symbols and counts from the caller. The studies of a
text8 model take ``compare`` = {label: (params, symbols)}: the same numbers for more models, under
"compare" in the JSON, and the figure with one block of panels per model (issue #34 item 17).

Paper: Foerster et al., "Input Switched Affine Networks: An RNN Architecture Designed for
Interpretability", ICML 2017 (arXiv:1611.09434).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from isan.engine.analysis import attribution, basis, decay, embedding, figures, parentheses, pca, quality, stack
from isan.errors import IsanError
from isan.params import ISANParams

log = logging.getLogger(__name__)

#: the paper's Figure 3 example: the next character after "_annual_reve" ('n' for revenue, 'r' for reverse)
FIG3_TEXT = "the annual reve"
FIG2_TEXT = "the annual revenue"
FIG5_TEXT = "the company said that its annual revenue rose by ten percent"
#: all of the paper's Fig 5 sentence that its text gives: "the words 'was' and 'higher' make large
#: contributions to the prediction of the characters in 'than'" (ICML Sec 3.4); the rest of the
#: sentence is only in the figure, which the extraction lacks (issue #26)
FIG5_PAPER_FRAGMENT = " was higher than"
#: the two readings of Fig 4b's "sets all kappa_s^t apart from kappa_'_'^t to zero" (ICML Figure 4 caption;
#: issue #34 item 16), as the decay study's JSON names them
FIG4B_READINGS = {"space_only": "only the kappa of the last space (the one that begins the word) and b_ro",
                  "no_space": "every kappa but the last space's",
                  "spaces_only": "only the kappa of every space read so far and b_ro",
                  "no_spaces": "every kappa but those of the spaces"}


def finite(obj):
    """A copy of ``obj`` with numpy scalars and arrays turned into Python values and NaN/inf into None."""
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return finite(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def encode(text: str, symbols) -> np.ndarray:
    """Ids of ``text`` (every character must be a symbol; raises IsanError naming the first that is not)."""
    index = {c: i for i, c in enumerate(symbols)}
    try:
        return np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
    except KeyError as e:
        raise IsanError(f"the character {e.args[0]!r} is not in the model's alphabet") from None


def _fig(out_dir, name):
    return None if out_dir is None else Path(out_dir) / name


def _timed(fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        out["seconds"] = round(time.perf_counter() - t0, 2)
        return out

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _each_model(one, p: ISANParams, symbols, label: str | None, compare: dict | None) -> tuple[dict, list]:
    """``one(params, symbols) -> (numbers, figure data)`` for the model and for every model of ``compare``
    ({label: (params, symbols)}; issue #34 item 17: every figure shows the models side by side).

    Returns the model's numbers, with "label" and "compare" ({label: numbers}) added when ``compare`` is
    given, and the figure's blocks [(label, figure data), ...], the model first."""
    out, data = one(p, symbols)
    blocks = [(label, data)]
    if compare:
        out["label"] = label
        out["compare"] = {}
        for lab, (q, sq) in compare.items():
            o, dq = one(q, sq)
            out["compare"][lab] = o
            blocks.append((lab, dq))
    return out, blocks


@_timed
def study_stack(p: ISANParams, symbols, text: str = FIG2_TEXT, out_dir=None, label: str | None = None,
                compare: dict | None = None) -> dict:
    """Figure 2: the prediction stack after the last character of ``text`` (from h0).

    ``compare`` = {label: (params, symbols)}: the same for more models, drawn below the first and
    returned under "compare" (see :func:`_each_model`).

    Returns {"text", "position", "top" (most likely next symbol), "top_prob", "max_abs_error" (of
    b_ro + sum kappa = logits), "largest_sources" (the 5 sources with the largest ||kappa||), "figure"}.
    """

    def one(q, sq):
        ids = encode(text, sq)
        st = stack.prediction_stack(q, ids, sq)
        t = len(ids) - 1
        norms = np.linalg.norm(st.kappa[t, : t + 2], axis=1)
        order = np.argsort(norms)[::-1][:5]
        return ({"text": text, "position": t, "top": st.top[t], "top_prob": float(st.probs[t].max()),
                 "max_abs_error": st.max_abs_error,
                 "largest_sources": [{"source": st.source_labels[i], "norm": float(norms[i])} for i in order],
                 "b_ro_norm": float(np.linalg.norm(st.b_ro))}, st)

    out, blocks = _each_model(one, p, symbols, label, compare)
    f = _fig(out_dir, "fig2_stack.png")
    if f:
        out["figure"] = figures.fig2_stack(blocks, f).name
    return finite(out)


@_timed
def _contributions(p: ISANParams, symbols, text: str, word: str, chars) -> dict:
    ids = encode(text, symbols)
    i = text.find(" " + word)
    if i < 0:
        raise IsanError(f"{word!r} (with a space before it) is not in {text!r}")
    first, last = i, i + len(word)
    cf = stack.counterfactual(p, ids, symbols, len(ids) - 1, first, last, chars=chars)
    cf.pop("stack")
    cf["word_contribution"] = {c: float(sum(cf["contributions"][c][first + 1 : last + 2])) for c in chars}
    return cf


def study_contributions(p: ISANParams, symbols, text: str = FIG3_TEXT, word: str = "annual", chars=("n", "r"),
                        out_dir=None, label: str | None = None, compare: dict | None = None) -> dict:
    """Figure 3: the contributions to two logits after the last character of ``text``, and the prediction
    with the kappa of ``word`` and the space before it removed (exact: the logits are a sum).

    ``compare`` = {label: (params, symbols)}: the same for more models, drawn side by side below the
    first (issue #26: the paper's example with the new default model too) and returned under "compare".

    Returns the dict of :func:`isan.engine.analysis.stack.counterfactual` without the stack, plus
    "word_contribution" (the removed characters' summed kappa on each of ``chars``' logits)."""
    cf = _contributions(p, symbols, text, word, chars)
    others = {k: _contributions(q, sq, text, word, chars) for k, (q, sq) in (compare or {}).items()}
    if others:
        cf["label"] = label
        cf["compare"] = others
    f = _fig(out_dir, "fig3_contributions.png")
    if f:
        cf["figure"] = figures.fig3_contributions(cf, f, label=label, others=others).name
    return finite(cf)


@_timed
def study_decay(p: ISANParams, symbols, text: str, window: int = 50, out_dir=None, segments: int = 128,
                label: str | None = None, compare: dict | None = None) -> dict:
    """Figure 4a-c over ``text`` (the test split), window N = ``window`` sources kept exactly; ``compare``
    as in :func:`study_stack`.

    Fig 4b is computed under both readings of the paper's caption (issue #34 item 16): only the last
    space's kappa kept (``bits_space_only``) or removed (``bits_no_space``), and every space's kappa kept
    (``bits_spaces_only``) or removed (``bits_no_spaces``).

    Returns {"positions", "kappa_norm_mean" (N,), "fit" (two rates, :func:`decay.fit_two_rates`),
    "bits_full", "bits_keep_last" (N + 1,), "keep_last_within" (the smallest n within 0.01 and 0.1
    bits/char of all sources), "word": {"positions", "bits_full", "bits_space_only", "bits_no_space",
    "bits_spaces_only", "bits_no_spaces", their "median_" versions, "counts"}, "max_abs_error",
    "segments", "warmup_error", "figure"}."""

    def one(q, sq):
        ids = encode(text, sq)
        space = sq.index(" ") if " " in sq else None
        with threadpool_limits(1, user_api="blas"):  # small GEMMs: one BLAS thread is faster
            st = decay.window_statistics(q, ids, window=window, segments=segments, space_id=space)
        fit = decay.fit_two_rates(st.kappa_norm_mean)
        gap = st.bits_keep_last - st.bits_full
        within = {str(tol): int(np.argmax(gap <= tol)) if (gap <= tol).any() else None for tol in (0.01, 0.1)}
        m = st.word_counts > 0
        res = {"text_chars": len(ids), "positions": st.positions, "window": window,
               "kappa_norm_mean": st.kappa_norm_mean, "history_norm_mean": st.history_norm_mean, "fit": fit,
               "bits_full": st.bits_full, "bits_keep_last": st.bits_keep_last, "keep_last_within": within,
               "word": {"positions": st.word_positions[m], "bits_full": st.word_bits_full[m],
                        "bits_space_only": st.word_bits_space_only[m], "bits_no_space": st.word_bits_no_space[m],
                        "median_bits_full": st.word_median_full[m],
                        "median_bits_space_only": st.word_median_space_only[m],
                        "median_bits_no_space": st.word_median_no_space[m],
                        "bits_spaces_only": st.word_bits_spaces_only[m], "bits_no_spaces": st.word_bits_no_spaces[m],
                        "median_bits_spaces_only": st.word_median_spaces_only[m],
                        "median_bits_no_spaces": st.word_median_no_spaces[m],
                        "readings": FIG4B_READINGS,
                        "counts": st.word_counts[m], "space_outside_window": st.space_outside_window},
               "max_abs_error": st.max_abs_error, "segments": st.segments, "warmup_error": st.warmup_error}
        return res, (st, fit)

    out, blocks = _each_model(one, p, symbols, label, compare)
    f = _fig(out_dir, "fig4_decay.png")
    if f:
        out["figure"] = figures.fig4_decay(blocks, f).name
    return finite(out)


@_timed
def study_words(p: ISANParams, symbols, text: str = FIG5_TEXT, keep=(1, 2, 3, 4, None), out_dir=None,
                fig_name: str = "fig5_words.png", label: str | None = None, compare: dict | None = None) -> dict:
    """Figure 5: word-level kappa norms over ``text`` and the next-character probabilities conditioned on
    the last k words only; ``compare`` as in :func:`study_stack`. Returns {"words", "keep", "bits_mean"
    per k, "prob_next" (len(keep), T), "norms" (T, W + 1), "max_abs_error", "figure"}."""

    def one(q, sq):
        wc = stack.word_conditioning(q, encode(text, sq), sq, keep=keep)
        return ({"text": text, "words": wc.words, "keep": ["all" if k is None else k for k in wc.keep],
                 "bits_mean": wc.bits_mean, "prob_next": wc.prob_next, "norms": wc.norms,
                 "max_abs_error": wc.max_abs_error}, (wc, sq))

    out, blocks = _each_model(one, p, symbols, label, compare)
    f = _fig(out_dir, fig_name)
    if f:
        out["figure"] = figures.fig5_words(blocks, f).name
    return finite(out)


@_timed
def study_word_embedding(p: ISANParams, symbols, train_text: str, n_words: int = 4000, at: str | None = " ",
                         k: int = 10, seed: int = 0, out_dir=None, label: str | None = None,
                         compare: dict | None = None) -> dict:
    """The ICLR workshop version's Figure 6: t-SNE of kappa_word for the ``n_words`` most frequent
    words of ``train_text`` (:mod:`embedding`), and how the word groups of :data:`embedding.GROUPS`
    cluster: the share of each member's ``k`` nearest neighbours that are members, in kappa space
    and in the t-SNE plane, against chance. ``compare`` as in :func:`study_stack`.

    Returns {"words", "at", "k", "max_abs_error" (fast path against per-character kappa on the first
    100 words), "groups": {name: {"members", "kappa", "tsne", "other_vectors"}}, "suffix" (the share
    of neighbours with the word's last two letters, :func:`embedding.suffix_agreement`), "figure"}."""
    words = [w for w, _ in embedding.frequent_words(train_text, n_words)]

    def one(q, sq):
        K = embedding.word_kappa(q, words, sq, at)
        err = float(np.abs(K[:100] - embedding.word_kappa_ref(q, words[:100], sq, at)).max())
        Y = embedding.tsne(K, seed=seed)
        # the same measure also on two other vectors a word leaves (no t-SNE): kappa at the word's last
        # character, and the composed bias c_word itself (state space; every kappa_word^t is a linear map of it)
        others = {"kappa at the last character": embedding.word_kappa(q, words, sq, None),
                  "c_word (state space)": embedding.word_bias(q, words, sq)}
        groups = {}
        for name, members in embedding.GROUPS.items():
            mask = np.array([w.endswith("tion") if members is None else w in members for w in words])
            if mask.sum() < 2:
                continue
            groups[name] = {"members": [w for w, m in zip(words, mask) if m],
                            "kappa": embedding.neighbour_purity(K, mask, k),
                            "tsne": embedding.neighbour_purity(Y, mask, k),
                            "other_vectors": {v: embedding.neighbour_purity(X, mask, k)["purity"]
                                              for v, X in others.items()}}
        return ({"words": len(words), "at": at, "k": k, "seed": seed, "max_abs_error": err, "groups": groups,
                 "suffix": {"kappa": embedding.suffix_agreement(K, words, k),
                            "tsne": embedding.suffix_agreement(Y, words, k)}}, (Y, groups))

    out, blocks = _each_model(one, p, symbols, label, compare)
    f = _fig(out_dir, "iclr_fig6_word_tsne.png")
    if f:
        out["figure"] = figures.iclr_fig6_word_tsne(blocks, words, f).name
    return finite(out)


def _counts(text: str):
    """symbols -> (unigram, bigram) of ``text`` (:func:`basis.unigram_bigram`), counted once per alphabet."""
    memo = {}

    def counts(symbols):
        key = tuple(symbols)
        if key not in memo:
            memo[key] = basis.unigram_bigram(encode(text, key), len(key))
        return memo[key]

    return counts


@_timed
def study_basis(p: ISANParams, symbols, train_text: str, out_dir=None, label: str | None = None,
                compare: dict | None = None) -> dict:
    """Figures 6-7 (section 3.5): the b_x in the readout subspace and its complement against the unigram
    log-probability of x in ``train_text``; see :func:`basis.bias_study`. ``compare`` as in
    :func:`study_stack`."""

    counts = _counts(train_text)

    def one(q, sq):
        uni, _ = counts(sq)
        res = finite(basis.bias_study(q, uni, sq))
        return res, (res, sq)

    out, blocks = _each_model(one, p, symbols, label, compare)
    f = _fig(out_dir, "fig6_7_basis.png")
    if f:
        out["figure"] = figures.fig6_7_basis(blocks, f).name
    return finite(out)


@_timed
def study_ngram(p: ISANParams, symbols, train_text: str, out_dir=None, label: str | None = None,
                compare: dict | None = None) -> dict:
    """Figure 8 (section 3.6): softmax(b_ro) against the unigram and softmax(W_ro b_x + b_ro) against the
    bigram of ``train_text``; see :func:`basis.ngram_agreement`. ``compare`` as in :func:`study_stack`."""

    counts = _counts(train_text)

    def one(q, sq):
        res = finite(basis.ngram_agreement(q, *counts(sq), sq))
        return res, res

    out, blocks = _each_model(one, p, symbols, label, compare)
    f = _fig(out_dir, "fig8_ngram.png")
    if f:
        out["figure"] = figures.fig8_ngram(blocks, f).name
    return finite(out)


@_timed
def study_pca(models: dict, text: str, out_dir=None, segments: int = 256) -> dict:
    """Figure 1b: the PCA spectrum of hidden states over ``text`` for each model.

    Args:
        models: name -> (kind, params, symbols): kind ``"isan"`` with :class:`ISANParams`, or a
            baseline kind with :class:`isan.engine.baselines.recurrent.BaselineParams`.
    Returns {name: {"kind", "d", "ratio" (first 250), "dims_for", "participation_ratio", "states",
    "warmup_error"}, "figure"}."""
    spectra = {}
    # small GEMMs: one BLAS thread is faster (docs/guide/tables-and-speed.md, 'Measured facts')
    with threadpool_limits(1, user_api="blas"):
        for name, (kind, params, symbols) in models.items():
            ids = encode(text, symbols)
            if kind == "isan":
                sp = pca.isan_states_spectrum(params, ids, segments=segments)
            else:
                sp = pca.baseline_states_spectrum(params, ids, segments=segments)
            sp["kind"], sp["d"] = kind, len(sp["ratio"])
            spectra[name] = sp
            log.info("pca %s: %s comps for 90%%", name, sp["dims_for"]["0.9"])
    out = {"models": {k: {**v, "ratio": v["ratio"][:250]} for k, v in spectra.items()}}
    f = _fig(out_dir, "fig1b_pca.png")
    if f:
        out["figure"] = figures.fig1b_pca(spectra, f).name
    return finite(out)


@_timed
def study_attribution(p: ISANParams, symbols, text: str, window: int = 50) -> dict:
    """The attribution options: windowed attribution of ``text[:-1]`` (last ``window`` sources exact, the
    rest one history source) with the log-probability of the character that follows as the target.

    Returns {"chars" (positions attributed), "window", "max_abs_error" (logits), "target_max_abs_error"
    (log-prob completeness), "quadrature_nodes", "memory_bytes": {"windowed", "full"} (float64 kappa
    of T (N + 1) V against T (T + 1) V), "history_share" (mean over positions of |history| / sum of |contributions|),
    "bits" (mean bits of the next character, from the attributed log-probabilities)}."""
    ids = encode(text, symbols)
    if len(ids) < 2:
        raise IsanError("the attribution study needs at least two characters")
    wa = attribution.windowed_attribution(p, ids[:-1], window, target="logprob", char=ids[1:])
    c = np.abs(wa.contributions)
    T, V = len(ids) - 1, len(symbols)
    return finite({"chars": T, "window": window, "max_abs_error": wa.max_abs_error,
                   "target_max_abs_error": wa.target.max_abs_error, "quadrature_nodes": wa.target.nodes,
                   "memory_bytes": {"windowed": 8 * T * (window + 1) * V, "full": 8 * T * (T + 1) * V},
                   "history_share": float((c[:, 0] / np.maximum(c.sum(1), 1e-300)).mean()),
                   "bits": float(-wa.target.value.mean() / math.log(2))})


@_timed
def parentheses_over_seeds(p64: ISANParams, tb, streams: dict, kinds: int, levels: int, skip: int = 100,
                           tols=(0.06, 0.25)) -> dict:
    """The counting task over several fresh streams (issue #26: one stream's 1.0000 was seed-lucky).

    For each seed: accuracy and exact as in :func:`study_parentheses`, the positions of the wrong
    outputs, and, in the basis ``tb`` (built once, from the main stream), the largest deviation of the
    code coordinates (readout and next-readout blocks) from exact 2-hot + 2-hot, over all states and
    from state ``skip`` on, and for each tolerance the first state from which every later state is
    within it (the start-up transient)."""
    from isan.engine.reference import states_ref

    n = kinds * levels
    per = {}
    for seed, (ids, target, counts) in streams.items():
        ids = np.asarray(ids, dtype=np.int64)
        H = states_ref(p64, ids, p64.h0)
        outputs = H @ p64.W_ro.T + p64.b_ro
        acc = parentheses.task_accuracy(outputs, target, kinds, levels)
        wrong = np.flatnonzero((parentheses.decode_counts(outputs, kinds, levels) != np.asarray(target)).any(-1))
        Z = states_ref(tb.params, ids, tb.params.h0)
        codes = np.zeros((len(ids), 2 * n))
        for blk, c in enumerate((target, counts)):
            for k in range(kinds):
                codes[np.arange(len(ids)), blk * n + k * levels + np.asarray(c)[:, k]] = 1.0
        dev = np.abs(Z[:, :2 * n] - codes).max(1)
        settle = {}
        for tol in tols:
            bad = np.flatnonzero(dev > tol)
            settle[f"{tol:g}"] = int(bad[-1] + 1) if len(bad) else 0
        per[str(seed)] = {"chars": int(len(ids)), "accuracy": acc["accuracy"], "exact": acc["exact"],
                          "wrong_positions": int(len(wrong)), "first_wrong": int(wrong[0]) if len(wrong) else None,
                          "last_wrong": int(wrong[-1]) if len(wrong) else None,
                          "code_max_dev_all": float(dev.max()), f"code_max_dev_from_{skip}": float(dev[skip:].max()),
                          "settled_from_state": settle}
    accs = np.array([v["accuracy"] for v in per.values()])
    lw = [v["last_wrong"] for v in per.values() if v["last_wrong"] is not None]
    return {"per_seed": per, "seeds": len(per), "accuracy_mean": float(accs.mean()), "accuracy_min": float(accs.min()),
            "accuracy_max": float(accs.max()), "seeds_perfect": int((accs == 1.0).sum()),
            "last_wrong_position_max": max(lw) if lw else None,
            "code_max_dev_all_max": max(v["code_max_dev_all"] for v in per.values()),
            f"code_max_dev_from_{skip}_max": max(v[f"code_max_dev_from_{skip}"] for v in per.values()),
            "settled_from_state_max": {f"{t:g}": max(v["settled_from_state"][f"{t:g}"] for v in per.values())
                                       for t in tols}}


def study_parentheses(p: ISANParams, symbols, ids: np.ndarray, target_counts: np.ndarray, counts: np.ndarray,
                      kinds: int, levels: int, hold: int, out_dir=None, skip: int = 100,
                      seed_streams: dict | None = None, model: str | None = None) -> dict:
    """Section 4, Figure 9: the parentheses ISAN in the task basis.

    Args:
        ids: (T,) a fresh input stream, read from h0.
        target_counts: (T, kinds) the counts the output read from the state after symbol s must
            report (the counts after symbol s - 1; zero before the start).
        counts: (T, kinds) the counts after each symbol (what the state must hold for the next step).
        hold: the symbol that changes no count (the noise symbol).
        skip: states left out of the k-hot measure at the start of the stream.
        seed_streams: optional {seed: (ids, target_counts, counts)}: more fresh streams, each read from
            h0, measured in the same basis (:func:`parentheses_over_seeds`; issue #26).
        model: where the model lies (its checkpoint), named in the figure's heading beside its width and size.
    Returns {"accuracy", "exact" (task), "same_outputs_max_abs" (rotated vs original model),
    "k_hot" (:func:`parentheses.k_hotness`), "blocks" (:func:`parentheses.block_structure`),
    "rest_rms", "figure"}.
    """
    from isan.engine.reference import states_ref

    p64 = p.astype(np.float64)
    ids = np.asarray(ids, dtype=np.int64)
    n = kinds * levels
    H = states_ref(p64, ids, p64.h0)
    outputs = H @ p64.W_ro.T + p64.b_ro
    acc = parentheses.task_accuracy(outputs, target_counts, kinds, levels)
    tb = parentheses.task_basis(p64, ids, hold)
    Z = states_ref(tb.params, ids, tb.params.h0)
    same = float(np.abs(Z @ tb.params.W_ro.T + tb.params.b_ro - outputs).max())

    def khot(c):
        out = np.zeros((len(c), n))
        for k in range(kinds):
            out[np.arange(len(c)), k * levels + np.asarray(c)[:, k]] = 1.0
        return out

    codes = np.concatenate([khot(target_counts), khot(counts)], axis=1)
    kh = parentheses.k_hotness(Z[skip:], codes[skip:], tb.blocks)
    ideal = parentheses.ideal_transitions(kinds, levels)
    bs = parentheses.block_structure(tb, ideal, levels)
    out = {"chars": len(ids), "accuracy": acc["accuracy"], "exact": acc["exact"], "same_outputs_max_abs": same,
           "k_hot": kh, "k_hot_skip": skip, "blocks": bs, "rest_rms": tb.fit_rmse, "d": p.d, "symbols": list(symbols)}
    if seed_streams:
        out["seeds"] = parentheses_over_seeds(p64, tb, seed_streams, kinds, levels, skip)
    f = _fig(out_dir, "fig9_parentheses.png")
    if f:
        eff = parentheses.effective_transitions(tb, levels)
        proj = parentheses.code_projector(2 * n, levels)
        wi = list(symbols).index("[") if "[" in symbols else 0
        title = quality.parentheses_title(p.d, p.n_params(), model)
        out["figure"] = figures.fig9_parentheses(tb, Z, ids, symbols, eff, ideal[0] @ proj, f, H=H,
                                                 W_orig=p64.W[wi], w_label=repr(symbols[wi]), title=title).name
    return finite(out)
