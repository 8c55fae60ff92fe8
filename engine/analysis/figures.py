"""The paper's figures drawn from the analyses' results (matplotlib, Agg backend; the ``plot`` extra).

One function per figure; each takes the numbers a study computed (never recomputes them) and
writes one PNG atomically (:func:`isan.atomic.atomic_path`), sized to stay under about 200 KB a model.
Each model's block is headed by its name, its committed test bpc and the paper's model's 1.58 bpc
(:func:`isan.engine.analysis.quality.model_title`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from isan.engine.analysis import quality

DPI = 100
#: Fig 4b's two readings of the caption's kappa^t_'_' (ICML Figure 4), as the panels name them: the one we adopt
#: (the caption names the kept sources by their character; the text's "less than 1 bit / char" is reached
#: only under it: results/paper/README.md, item 6) and the other
FIG4B_OURS = "our reading: the kappa of every space read so far"
FIG4B_OTHER = "the other reading: only the last space's kappa (the one that begins the word)"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: str | Path) -> Path:
    from isan.atomic import atomic_path

    out = Path(out)
    if not fig.get_constrained_layout():
        fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    _plt().close(fig)
    return out


def _show(c: str) -> str:
    return "_" if c == " " else c


def _diverging(ax, M, **kw):
    vmax = float(np.abs(M).max()) or 1.0
    return ax.imshow(M, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest", **kw)


def _per_model(blocks: list, width: float, height: float, draw):
    """A figure with one block of panels per model, one below the other (issue #34 item 17: each figure
    shows the analysed model and the models compared with it side by side): ``draw(container, data,
    label)`` fills a block; ``blocks`` is [(label, data), ...]. One block is drawn into the figure
    itself, several each into a subfigure; a block with a label is headed by :func:`quality.model_title`
    (the model's name, its committed test bpc, the paper's model's)."""
    plt = _plt()
    fig = plt.figure(figsize=(width, height * len(blocks)), layout="constrained")
    subs = [fig] if len(blocks) == 1 else list(fig.subfigures(len(blocks), 1))
    for sf, (label, data) in zip(subs, blocks):
        if label is not None:
            sf.suptitle(quality.model_title(label), fontsize=10)
        draw(sf, data, label)
    return fig


def fig2_stack(blocks: list, out) -> Path:
    """Figure 2: the full prediction stack of a text, one block per model (``blocks`` = [(label, stack)]).
    Top: one row per source (the start state, then each character labelled with its position), then
    the b_ro row and the logit row; each time step t is a block of V columns (one per output
    character), separated by grey lines, and the logit row is the sum of the rows above. Bottom: the
    softmax at each t, labelled with its most likely character. The last block is boxed."""
    T, S, _ = blocks[0][1].kappa.shape
    fig = _per_model(blocks, min(22, 2 + 0.75 * T), 0.22 * (S + 2) + 4.5, _fig2_block)
    return _save(fig, out)


def _fig2_block(sf, stack, label) -> None:
    plt = _plt()
    T, S, V = stack.kappa.shape
    M = np.vstack([stack.kappa.transpose(1, 0, 2).reshape(S, T * V), np.tile(stack.b_ro, T)[None],
                   stack.logits.reshape(1, T * V)])
    labels = stack.source_labels + ["b_ro", "logits"]
    ax, ax2 = sf.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [len(M), 7]})
    im = _diverging(ax, M)
    for t in range(1, T):
        ax.axvline(t * V - 0.5, color="0.6", lw=0.6)
        ax2.axvline(t * V - 0.5, color="0.6", lw=0.6)
    ax.axhline(S - 0.5, color="k", lw=1.0)
    ax.add_patch(plt.Rectangle(((T - 1) * V - 0.5, -0.5), V, len(M), fill=False, ec="C3", lw=1.5))
    ax.set_yticks(range(len(M)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_title(f"prediction stack of {stack.text.replace(' ', '_')!r}: logits = b_ro + sum of the kappa rows "
                 f"(max error {stack.max_abs_error:.1e})", fontsize=9)
    sf.colorbar(im, ax=[ax, ax2], fraction=0.02, pad=0.01, label="logit units (top pane)")
    x = np.arange(T * V)
    ax2.bar(x, stack.probs.reshape(-1), width=1.0, color="0.55")
    for t in range(T):
        top = int(stack.probs[t].argmax())
        ax2.bar([t * V + top], [stack.probs[t, top]], width=1.0, color="C3")
        ax2.annotate(_show(stack.symbols[top]), (t * V + top, stack.probs[t, top]), ha="center", va="bottom",
                     fontsize=8, color="C3")
    ax2.set_ylim(0, 1.15)
    ax2.set_ylabel("softmax")
    ax2.set_xticks([t * V + V / 2 for t in range(T)])
    ax2.set_xticklabels([f"{t}:{_show(c)}" for t, c in enumerate(stack.text)], fontsize=7)
    ax2.set_xlabel("time step t: the character read (each block: the V output characters a-z and _)")


def _fig3_row(ax, ax2, cf: dict) -> None:
    chars = list(cf["contributions"])
    labels = cf["source_labels"]
    S = len(labels)
    w = 0.4
    for i, c in enumerate(chars):
        ax.bar(np.arange(S) + (i - 0.5) * w, cf["contributions"][c][:S], w, label=f"logit of {_show(c)!r}")
    lo, hi = cf["removed_sources"]
    ax.axvspan(lo + 0.5, hi + 1.5, color="0.9", zorder=0, label=f"removed: {cf['removed'].replace(' ', '_')!r}")
    ax.set_xticks(range(S))
    ax.set_xticklabels(labels, fontsize=7, rotation=90)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_ylabel("kappa (logit units)")
    ax.set_title(f"contributions to the next character after {cf['text'].replace(' ', '_')!r}", fontsize=9)
    ax.legend(fontsize=7)
    full, wo = cf["full"], cf["without"]
    x = np.arange(len(chars))
    ax2.bar(x - 0.2, [full["probs"][c] for c in chars], 0.4, label="all sources")
    ax2.bar(x + 0.2, [wo["probs"][c] for c in chars], 0.4, label=f"without {cf['removed'].strip()!r}")
    ax2.set_xticks(x)
    ax2.set_xticklabels([repr(_show(c)) for c in chars])
    ax2.set_yscale("log")
    ax2.set_ylabel("probability")
    top_s = f"; top {_show(full['top'])!r} ({full['top_prob']:.2f})" if "top" in full else ""
    ax2.set_title(f"greedy: {full['greedy'].replace(' ', '_')!r} vs {wo['greedy'].replace(' ', '_')!r}{top_s}",
                  fontsize=8)
    ax2.legend(fontsize=7)


def fig3_contributions(cf: dict, out, label: str | None = None, others: dict | None = None) -> Path:
    """Figure 3: each source's contribution to two logits, and the prediction with and without a word;
    one row per model (``label`` for ``cf``, then ``others`` = {label: cf} side by side below it)."""
    rows = [(label, cf)] + list((others or {}).items())
    fig = _per_model(rows, 11, 4.4, lambda sf, c, lab: _fig3_row(*sf.subplots(1, 2, width_ratios=[3, 1.3]), c))
    return _save(fig, out)


def fig4_decay(blocks: list, out, min_count: int = 1000) -> Path:
    """Figure 4, one row per model (``blocks`` = [(label, (stats, fit))]): (a) mean ||kappa[t, t-k]||
    against the lag with two fitted rates; (b) bits by position in the word with all kappa, only every
    space's kappa and without them (our reading of the caption's kappa_'_', :data:`FIG4B_OURS`), and (b')
    the same with only the last space's kappa, the one that begins the word (the other reading); positions
    seen at least ``min_count`` times; (c) bits keeping the last n kappa."""
    fig = _per_model(blocks, 19, 4.2, lambda sf, data, label: _fig4_block(sf, *data, min_count=min_count))
    return _save(fig, out)


def _fig4_word_panel(ax, stats, lines, title: str, min_count: int) -> None:
    m = stats.word_counts >= min_count
    pos = stats.word_positions[m]
    for i, (name, mean, med, mk) in lines:
        if med is not None:
            ax.plot(pos, med[m], mk + "-", ms=3, color=f"C{i}", label=f"{name} (median)")
            ax.plot(pos, mean[m], mk + ":", ms=2, color=f"C{i}", alpha=0.6, label=f"{name} (mean)")
        else:
            ax.plot(pos, mean[m], mk + "-", ms=3, color=f"C{i}", label=name)
    ax.axhline(1.0, color="k", lw=0.5, ls="--")
    ax.set_xlabel("characters since the last space (0: after the space)")
    ax.set_ylabel("cross entropy (bits/char)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6)


def _fig4_block(sf, stats, fit: dict, min_count: int) -> None:
    axs = sf.subplots(1, 4)
    ax = axs[0]
    k = np.arange(len(stats.kappa_norm_mean))
    ax.semilogy(k, stats.kappa_norm_mean, "o", ms=3, label="mean ||kappa[t, t-k]||")
    b = fit["break_lag"]
    ax.semilogy(k[:b], np.exp(fit["intercept_fast"] + fit["rate_fast"] * k[:b]), "C1",
                label=f"rate {fit['rate_fast']:.3f}/char (k<{b})")
    ax.semilogy(k[b:], np.exp(fit["intercept_slow"] + fit["rate_slow"] * k[b:]), "C2",
                label=f"rate {fit['rate_slow']:.3f}/char (k>={b})")
    ax.set_xlabel("t - s (characters back)")
    ax.set_ylabel("logit units")
    ax.set_title("(a) size of a source's contribution", fontsize=9)
    ax.legend(fontsize=7)
    full = (0, ("all kappa", stats.word_bits_full, stats.word_median_full, "o"))
    if stats.word_bits_spaces_only is not None:
        _fig4_word_panel(axs[1], stats, (full, (3, ("only every space's kappa", stats.word_bits_spaces_only,
                                                    stats.word_median_spaces_only, "s")),
                                         (4, ("every space's kappa removed", stats.word_bits_no_spaces,
                                              stats.word_median_no_spaces, "^"))),
                         f"(b) {FIG4B_OURS}: median (solid, the paper's)\nand mean (dotted); positions seen >= "
                         f"{min_count:,} times", min_count)
    else:
        axs[1].axis("off")
    _fig4_word_panel(axs[2], stats, (full, (1, ("only the last space's kappa", stats.word_bits_space_only,
                                                stats.word_median_space_only, "s")),
                                     (2, ("the last space's kappa removed", stats.word_bits_no_space,
                                          stats.word_median_no_space, "^"))),
                     f"(b') {FIG4B_OTHER}", min_count)
    ax = axs[3]
    n = np.arange(len(stats.bits_keep_last))
    ax.plot(n, stats.bits_keep_last, "o-", ms=3, label="only the last n kappa (+ b_ro)")
    ax.axhline(stats.bits_full, color="k", ls="--", lw=0.8, label=f"all kappa: {stats.bits_full:.3f}")
    ax.set_xlabel("n (sources kept)")
    ax.set_ylabel("cross entropy (bits/char)")
    ax.set_ylim(min(stats.bits_full, stats.bits_keep_last.min()) - 0.1, min(5.0, stats.bits_keep_last.max()) + 0.1)
    ax.set_title("(c) truncated history", fontsize=9)
    ax.legend(fontsize=7)


def fig5_words(blocks: list, out) -> Path:
    """Figure 5, one block per model (``blocks`` = [(label, (word conditioning, symbols))]):
    ||kappa[t, word]|| over a sentence, and the probability of the next character given only the last
    k words."""
    T = len(blocks[0][1][0].text)
    fig = _per_model(blocks, max(8, 0.17 * T + 2), 6.5, lambda sf, data, label: _fig5_block(sf, data[0]))
    return _save(fig, out)


def _fig5_block(sf, wc) -> None:
    T = len(wc.text)
    ax, ax2 = sf.subplots(2, 1, sharex=True)
    labels = ["h0"] + [w.replace(" ", "_") for w in wc.words]
    im = ax.imshow(wc.norms.T, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_title("||kappa[t, word]|| (L2 over the logits)", fontsize=9)
    sf.colorbar(im, ax=[ax, ax2], fraction=0.02, pad=0.01)
    for a, k in enumerate(wc.keep):
        ax2.plot(range(T), wc.prob_next[a], "-o", ms=2, lw=1,
                 label=("all sources" if k is None else f"last {k} word{'s' if k > 1 else ''}")
                 + f" ({wc.bits_mean[a]:.2f} bits/char)")
    ax2.set_xticks(range(T))
    ax2.set_xticklabels([_show(c) for c in wc.text], fontsize=7)
    ax2.set_ylabel("P(next character)")
    ax2.set_xlabel("character read at t")
    ax2.legend(fontsize=7, ncol=3)


def _zoom_box(Y: np.ndarray, mask: np.ndarray, near: int = 15, points: int = 45) -> tuple[np.ndarray, float]:
    """The densest place of a group in the plane: the member with the most members among its
    ``near`` nearest points is the centre; the half-width holds its ``points`` nearest points."""
    members = np.flatnonzero(mask)
    D = np.abs(Y[members][:, None, :] - Y[None, :, :]).max(2)  # Chebyshev distances (members, all)
    order = np.argsort(D, axis=1)[:, 1 : near + 1]
    best = int(np.argmax(mask[order].sum(1)))
    r = float(np.sort(D[best])[min(points, len(Y) - 1)])
    return Y[members[best]], max(r, 1e-9)


def iclr_fig6_word_tsne(blocks: list, words: list[str], out, labels: int = 120) -> Path:
    """ICLR workshop Fig. 6, one row per model (``blocks`` = [(label, (Y, groups))], Y the t-SNE plane
    of ``words``): (a) t-SNE of kappa_word for every word, the groups coloured; then one zoom per group
    on its densest place (:func:`_zoom_box`), every word in it labelled (the ``labels`` most frequent),
    members in the group's colour."""
    n = len(blocks[0][1][1])
    fig = _per_model(blocks, 5.6 * (1 + n), 5.8,
                     lambda sf, data, label: _iclr_fig6_block(sf, data[0], words, data[1], labels))
    return _save(fig, out)


def _iclr_fig6_block(sf, Y: np.ndarray, words: list[str], groups: dict, labels: int) -> None:
    names = list(groups)
    axs = np.atleast_1d(sf.subplots(1, 1 + len(names)))
    colours = ["tab:red", "tab:blue", "tab:green", "tab:purple"]
    index = {w: i for i, w in enumerate(words)}
    ax = axs[0]
    ax.scatter(Y[:, 0], Y[:, 1], s=2, c="0.7", linewidths=0)
    for name, col in zip(names, colours):
        ix = [index[w] for w in groups[name]["members"]]
        g = groups[name]
        ax.scatter(Y[ix, 0], Y[ix, 1], s=9, c=col, linewidths=0,
                   label=f"{name}: {len(ix)} words, {g['kappa']['k']}-NN purity {g['kappa']['purity']:.2f} "
                         f"(chance {g['kappa']['chance']:.3f})")
    for i in range(min(25, len(words))):
        ax.annotate(words[i], Y[i], fontsize=6, color="0.25")
    ax.set_title(f"(a) t-SNE of kappa_word, the {len(words):,} most frequent words", fontsize=9)
    ax.legend(fontsize=6, loc="lower left", markerscale=2)
    ax.set_xticks([])
    ax.set_yticks([])
    for ax, name, col, tag in zip(axs[1 : 1 + len(names)], names, colours, "bcdef"):
        mask = np.zeros(len(words), dtype=bool)
        mask[[index[w] for w in groups[name]["members"]]] = True
        centre, r = _zoom_box(Y, mask)
        inside = np.flatnonzero((np.abs(Y - centre) <= r).all(1))
        ax.scatter(Y[inside, 0], Y[inside, 1], s=6, c=np.where(mask[inside], col, "0.6"), linewidths=0)
        for i in inside[:labels]:  # words are in order of frequency
            ax.annotate(words[i], Y[i], fontsize=7, color=col if mask[i] else "0.2")
        ax.set_xlim(centre[0] - r, centre[0] + r)
        ax.set_ylim(centre[1] - r, centre[1] + r)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"({tag}) zoom on {name}: {int(mask[inside].sum())} of {len(inside)} words here are members",
                     fontsize=9)


def fig6_7_basis(blocks: list, out) -> Path:
    """Figures 6-7 as the paper lays them out, one block per model (``blocks`` = [(label, (bias study,
    symbols))]): top row (Fig 6) ||b_x|| against log P(x) in (a) the full space, (b) the readout
    subspace, (c) its complement; bottom row (Fig 7) the cosine distances between the b_x in the same
    three."""
    fig = _per_model(blocks, 15, 9, lambda sf, data, label: _fig6_7_block(sf, *data))
    return _save(fig, out)


def _fig6_7_block(sf, bs: dict, symbols) -> None:
    axs = sf.subplots(2, 3)
    lp = np.asarray(bs["logprob"])
    names = {"full": "full space", "readout": "readout subspace P_par", "complement": "complement P_perp"}
    for ax, sub, tag in zip(axs[0], ("full", "readout", "complement"), "abc"):
        nr = np.asarray(bs["norms"][sub])
        ax.scatter(lp, nr, s=10)
        for i, c in enumerate(symbols):
            ax.annotate(_show(c), (lp[i], nr[i]), fontsize=8)
        r = bs["correlation"][sub]
        ax.set_title(f"Fig 6{tag}: {names[sub]}: r = {r:.2f}" if r is not None else names[sub], fontsize=9)
        ax.set_xlabel("unigram log P(x) (nats)")
        ax.set_ylabel("||b_x||")
    order = bs["order"]
    for ax, sub, tag in zip(axs[1], ("full", "readout", "complement"), "abc"):
        if sub not in bs["cosine"]:
            ax.axis("off")
            continue
        D = np.asarray(bs["cosine"][sub])
        im = ax.imshow(D, cmap="magma", vmin=0, vmax=2, interpolation="nearest")
        ax.set_xticks(range(len(order)))
        ax.set_xticklabels([_show(c) for c in order], fontsize=6)
        ax.set_yticks(range(len(order)))
        ax.set_yticklabels([_show(c) for c in order], fontsize=6)
        ax.set_title(f"Fig 7{tag}: cosine distance of b_x, {names[sub]}", fontsize=9)
        sf.colorbar(im, ax=ax, fraction=0.04)


def fig8_ngram(blocks: list, out) -> Path:
    """Figure 8 as the paper lays it out, one row per model (``blocks`` = [(label, n-gram study)]): (a)
    softmax(b_ro) against the unigram distribution, (b) softmax(W_ro b_'_' + b_ro) against
    P(x_t+1 | '_'), (c) per x, the correlation of softmax(W_ro b_x + b_ro) with P(x_t+1 | x) (y)
    against that of the unigram P(x) (x); and (d) every (x, next) pair pooled."""
    fig = _per_model(blocks, 19, 4.4, lambda sf, data, label: _fig8_block(sf, data))
    return _save(fig, out)


def _fig8_block(sf, ng: dict) -> None:
    sym = ng["symbols"]
    axs = sf.subplots(1, 4)
    ax = axs[0]
    u, m = np.asarray(ng["unigram"]["data"]), np.asarray(ng["unigram"]["model"])
    ax.scatter(u, m, s=10)
    for i, c in enumerate(sym):
        ax.annotate(_show(c), (u[i], m[i]), fontsize=8)
    hi = max(u.max(), m.max()) * 1.05
    ax.plot([0, hi], [0, hi], "k--", lw=0.6)
    ax.set_xlabel("unigram P(x) (train split)")
    ax.set_ylabel("softmax(b_ro)")
    ax.set_title(f"(a) r = {ng['unigram']['correlation']:.3f}, KL(unigram || model) = {ng['unigram']['kl_bits']:.2f} bits",
                 fontsize=9)
    ax = axs[1]
    sp = ng.get("space") or {}
    if sp:
        d_, m_ = np.asarray(sp["data"]), np.asarray(sp["model"])
        ax.scatter(d_, m_, s=10)
        for i, c in enumerate(sym):
            ax.annotate(_show(c), (d_[i], m_[i]), fontsize=8)
        hi = max(d_.max(), m_.max()) * 1.05
        ax.plot([0, hi], [0, hi], "k--", lw=0.6)
        ax.set_title(f"(b) after '_': r = {sp['correlation']:.3f}, KL = {sp['kl_bits']:.2f} bits", fontsize=9)
    ax.set_xlabel("P(x_t+1 | '_') (train split)")
    ax.set_ylabel("softmax(W_ro b_'_' + b_ro)")
    ax = axs[2]
    r = np.array([np.nan if v is None else v for v in ng["bigram"]["correlation"]], dtype=float)
    ub = ng.get("unigram_as_bigram_predictor")
    if ub:
        ru = np.array([np.nan if v is None else v for v in ub["correlation"]], dtype=float)
        ax.scatter(ru, r, s=10)
        for i, c in enumerate(sym):
            ax.annotate(_show(c), (ru[i], r[i]), fontsize=8)
        lo = float(np.nanmin(np.concatenate([r, ru]))) - 0.05
        ax.plot([lo, 1], [lo, 1], "k--", lw=0.6)
        ax.set_xlabel("corr(unigram P(x), P(x_t+1 | x))")
        ax.set_title(f"(c) model above the diagonal for {ub['model_better_for']} of {ub['of']} x", fontsize=9)
    ax.set_ylabel("corr(softmax(W_ro b_x + b_ro), P(x_t+1 | x))")
    ax = axs[3]
    B, M = np.asarray(ng["bigram"]["data"]), np.asarray(ng["bigram"]["model"])
    ax.scatter(B.ravel(), M.ravel(), s=3, alpha=0.5)
    ax.plot([0, 1], [0, 1], "k--", lw=0.6)
    ax.set_xlabel("bigram P(next | x)")
    ax.set_ylabel("softmax(W_ro b_x + b_ro)")
    ax.set_title(f"(d) every (x, next): r = {ng['bigram']['correlation_all']:.3f}; median per x "
                 f"{ng['bigram']['correlation_median']:.3f}", fontsize=9)


def fig1b_pca(spectra: dict, out, first: int = 210) -> Path:
    """Figure 1b: explained-variance ratio of the first components of the hidden states, per model; each
    model's committed test bpc in its legend entry (:func:`quality.model_bpc`), the paper's model's in the title."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, sp in spectra.items():
        r = np.asarray(sp["ratio"])[:first]
        bpc = quality.model_bpc(name)
        ax.semilogy(np.arange(1, len(r) + 1), np.maximum(r, 1e-12), label=f"{name} (d={len(sp['ratio'])}, "
                    f"{sp['dims_for']['0.9']} comps for 90%" + (f"; test {bpc})" if bpc else ")"))
    ax.set_xlabel("principal component")
    ax.set_ylabel("explained variance ratio")
    ax.set_title(f"PCA of hidden states on text8-10M's test split (legend: each model's test bpc)\n"
                 f"{quality.paper_bpc_note()}", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, out)


def fig9_parentheses(tb, Z: np.ndarray, ids: np.ndarray, symbols, effective: np.ndarray, ideal: np.ndarray,
                     out, steps: int = 48, H: np.ndarray | None = None, W_orig: np.ndarray | None = None,
                     w_label: str = "'['", title: str | None = None) -> Path:
    """Figure 9: the states of the parentheses ISAN in the task basis over a stretch of input, and each
    symbol's transition on the k-hot coordinates next to the exact delay-line solution; with ``H`` (the
    states in the original basis) and ``W_orig`` (one symbol's matrix as trained), a bottom row with the
    paper's panels (a) and (b): both in the original basis. ``title``: the heading that names the model
    (:func:`quality.parentheses_title`)."""
    plt = _plt()
    K = effective.shape[0]
    orig = H is not None and W_orig is not None
    fig = plt.figure(figsize=(3.1 * (K + 1), 12.5 if orig else 8))
    if title:
        fig.suptitle(title, fontsize=10)
    gs = fig.add_gridspec(3 if orig else 2, K + 1, height_ratios=[1.1, 1, 1.1] if orig else [1.1, 1])
    ax = fig.add_subplot(gs[0, :])
    im = _diverging(ax, Z[:steps].T)
    for _, (i, j) in tb.blocks.items():
        ax.axhline(j - 0.5, color="k", lw=0.8)
    ax.set_xticks(range(min(steps, len(Z))))
    ax.set_xticklabels([symbols[i] for i in ids[:steps]], fontsize=8)
    ax.set_ylabel("coordinate (readout | current | rest)", fontsize=8)
    ax.set_title("states in the task basis (each column: the state after the symbol below)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.02)
    n2 = effective.shape[1]
    for x in range(K):
        a = fig.add_subplot(gs[1, x])
        _diverging(a, effective[x])
        a.axhline(n2 / 2 - 0.5, color="k", lw=0.5)
        a.axvline(n2 / 2 - 0.5, color="k", lw=0.5)
        a.set_title(f"W'[{symbols[x]!r}] (code block, projected)", fontsize=8)
        a.set_xticks([])
        a.set_yticks([])
    a = fig.add_subplot(gs[1, K])
    _diverging(a, ideal)
    a.set_title("exact solution for '(' (projected)", fontsize=8)
    a.set_xticks([])
    a.set_yticks([])
    if orig:
        a = fig.add_subplot(gs[2, :2])
        im = _diverging(a, W_orig)
        a.set_title(f"(a) W[{w_label}] in the original basis", fontsize=9)
        fig.colorbar(im, ax=a, fraction=0.04)
        a = fig.add_subplot(gs[2, 2:])
        im = _diverging(a, H[:steps].T)
        a.set_xticks(range(min(steps, len(H))))
        a.set_xticklabels([symbols[i] for i in ids[:steps]], fontsize=8)
        a.set_ylabel("hidden unit", fontsize=8)
        a.set_title("(b) hidden states in the original basis (same stretch as the top panel)", fontsize=9)
        fig.colorbar(im, ax=a, fraction=0.02)
    return _save(fig, out)
