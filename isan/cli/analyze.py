"""``isan analyze``: the paper's studies, one subcommand each, and ``all`` to regenerate results/paper.

Thin: each subcommand loads the model and the text, calls :mod:`isan.engine.analysis.studies`, and
writes ``OUT/<study>.json`` and the figure (PNG) beside it; ``all`` also writes ``OUT/paper.json``
(every study's numbers) and ``OUT/command.txt``. Every study of a text8 model also runs the models of
``--compare`` (default: the shipped default model, :data:`isan.engine.paths.DEFAULT_MODEL`, beside the paper's
model, text8-d216-unconstrained) and shows them side by side (issue #34 item 17; the default since #45 item 6).
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path

import click

from isan.cli.helpers import (DEFAULT_TEXT8, POSITIVE_FLOAT, POSITIVE_INT, SEED, IntList, UserError, emit_json,
                              friendly)
from isan.engine.paths import DEFAULT_MODEL
from isan.errors import IsanError

log = logging.getLogger("isan.analyze")

DEFAULT_OUT = "results/paper"
BASELINES = ("rnn-3.2e5", "gru-3.2e5", "isan-3.2e5")
PAREN_CKPT = "results/paper/models/parentheses"


def compare_paths(paths, model=None) -> list[Path]:
    """The bundles shown beside the analysed model (issue #34 item 17: in every figure; default: the shipped
    default model, :func:`~isan.engine.paths.default_model_path`, #45 item 6); ``none`` shows none, and the
    analysed model itself is never compared with itself."""
    from isan.engine.paths import default_model_path, paper_model_path

    if tuple(paths or ()) == ("none",):
        return []
    if not paths:
        paths = (default_model_path(),) if default_model_path().is_dir() else ()
    own = (paper_model_path() if model is None else Path(model)).resolve()
    return [Path(q) for q in paths if Path(q).resolve() != own]


def _compare_models(paths, model=None) -> dict:
    """{bundle name: (params, symbols)} of the models :func:`compare_paths` names."""
    out = {}
    for q in compare_paths(paths, model):
        _, p, sym, path = load_analysed_model(q)
        out[Path(path).name] = (p, sym)
    return out


def load_analysed_model(model):
    """(manifest, params, symbols, path) of the bundle ``model`` (default: the paper's model)."""
    from isan.engine.bundle import load_isan_bundle
    from isan.engine.paths import paper_model_path

    path = paper_model_path() if model is None else Path(model)
    manifest, p, alphabet = load_isan_bundle(path)
    return manifest, p, tuple(alphabet.symbols), path


def _split(data, split):
    from isan.data import read_text8_split

    return read_text8_split(data, split)


def _write(out, name, result, quiet=False):
    from isan.atomic import write_json_atomic
    from isan.engine.analysis.studies import finite

    result = finite(result)
    if out is not None:
        path = Path(out) / f"{name}.json"
        write_json_atomic(path, result)
        log.info("wrote %s", path)
    if not quiet:
        emit_json(result)
    return result


def common(fn):
    fn = click.option("--model", default=None, help="ISAN bundle directory (default: the paper's model, isan/models/text8-d216-unconstrained).")(fn)
    fn = click.option("--out", default=DEFAULT_OUT, show_default=True, type=click.Path(file_okay=False),
                      help="Folder for the figure and the JSON of its numbers.")(fn)
    return fn


def compare_option(fn):
    return click.option("--compare", "compare", multiple=True, default=None,
                        help="ISAN bundles analysed beside the model, side by side in the figure and under "
                             f"'compare' in the JSON (default: isan/models/{DEFAULT_MODEL}, the shipped default "
                             "model; 'none': no other).")(fn)


def data_option(fn):
    return click.option("--data", default=DEFAULT_TEXT8, show_default=True,
                        help="text8, text8.zip or text8_head.txt (its text8-10M splits are read).")(fn)


@click.group("analyze", short_help="The paper's analyses for any ISAN bundle: figures, numbers.")
def analyze():
    """The paper's analyses (Foerster et al. 2017) for any ISAN bundle: figures and their numbers.

    `isan analyze all --out results/paper` regenerates every figure, OUT/paper.json and OUT/command.txt.
    """


@analyze.command("stack", short_help="Figure 2: the prediction stack after the last character.")
@common
@click.option("--text", default=None, help="Text (default: the paper's 'the annual revenue').")
@compare_option
@friendly
def stack_cmd(model, out, text, compare):
    """Figure 2: the full prediction stack after the last character of --text."""
    from isan.engine.analysis import studies

    _, p, sym, path = load_analysed_model(model)
    _write(out, "stack", studies.study_stack(p, sym, text or studies.FIG2_TEXT, out, label=path.name,
                                             compare=_compare_models(compare, model)))


@analyze.command("contributions", short_help="Figure 3: contributions to two logits, a word removed.")
@common
@click.option("--text", default=None, help="Text (default: 'the annual reve').")
@click.option("--word", default="annual", show_default=True, help="The word removed in the counterfactual.")
@click.option("--chars", default="nr", show_default=True, help="The two characters whose logits are shown.")
@compare_option
@friendly
def contributions_cmd(model, out, text, word, chars, compare):
    """Figure 3: contributions to two logits, and the prediction with one word's kappa removed."""
    from isan.engine.analysis import studies

    _, p, sym, path = load_analysed_model(model)
    if len(chars) != 2:
        raise UserError("--chars must be two characters, e.g. nr")
    _write(out, "contributions", studies.study_contributions(p, sym, text or studies.FIG3_TEXT, word, tuple(chars), out,
                                                             label=Path(path).name,
                                                             compare=_compare_models(compare, model)))


@analyze.command("decay", short_help="Figure 4a-c: kappa decay, place in the word, history.")
@common
@data_option
@click.option("--window", type=POSITIVE_INT, default=50, show_default=True, help="Sources kept exactly per position.")
@click.option("--max-chars", type=POSITIVE_INT, default=None, help="Only the first N characters of the test split.")
@compare_option
@friendly
def decay_cmd(model, out, data, window, max_chars, compare):
    """Figure 4a-c over the test split: kappa decay, position in the word (both readings of the caption:
    the last space's kappa, every space's kappa), truncated history."""
    from isan.engine.analysis import studies

    if window < 1:
        raise UserError("--window must be at least 1")
    _, p, sym, path = load_analysed_model(model)
    _write(out, "decay", studies.study_decay(p, sym, _split(data, "test")[:max_chars], window, out, label=path.name,
                                             compare=_compare_models(compare, model)))


@analyze.command("words", short_help="Figure 5: word-level kappa over a sentence.")
@common
@click.option("--text", default=None, help="A sentence (default: a fixed one with 'annual revenue').")
@compare_option
@friendly
def words_cmd(model, out, text, compare):
    """Figure 5: word-level kappa over a sentence and predictions from fewer and fewer words."""
    from isan.engine.analysis import studies

    _, p, sym, path = load_analysed_model(model)
    _write(out, "words", studies.study_words(p, sym, text or studies.FIG5_TEXT, out_dir=out, label=path.name,
                                             compare=_compare_models(compare, model)))


@analyze.command("word-embedding", short_help="ICLR workshop Fig 6: t-SNE of word-level kappa.")
@common
@data_option
@click.option("--words", "n_words", type=click.IntRange(50, 20_000), default=4000, show_default=True,
              help="How many of the train split's most frequent words.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True, help="t-SNE's seed.")
@compare_option
@friendly
def word_embedding_cmd(model, out, data, n_words, seed, compare):
    """ICLR workshop Fig. 6: t-SNE of word-level kappa (kappa_word at the space after each word) for
    the most frequent words, and how number, profession and -tion words cluster."""
    from isan.engine.analysis import studies

    _, p, sym, path = load_analysed_model(model)
    _write(out, "word_embedding", studies.study_word_embedding(p, sym, _split(data, "train"), n_words, seed=seed,
                                                               out_dir=out, label=path.name,
                                                               compare=_compare_models(compare, model)))


@analyze.command("basis", short_help="Figures 6-7: the input biases and the readout subspace.")
@common
@data_option
@compare_option
@friendly
def basis_cmd(model, out, data, compare):
    """Figures 6-7: the input biases in the readout subspace and its complement."""
    from isan.engine.analysis import studies

    _, p, sym, path = load_analysed_model(model)
    _write(out, "basis", studies.study_basis(p, sym, _split(data, "train"), out, label=path.name,
                                             compare=_compare_models(compare, model)))


@analyze.command("ngram", short_help="Figure 8: readout biases against unigrams and bigrams.")
@common
@data_option
@compare_option
@friendly
def ngram_cmd(model, out, data, compare):
    """Figure 8: softmax(b_ro) against unigrams, softmax(W_ro b_x + b_ro) against bigrams."""
    from isan.engine.analysis import studies

    _, p, sym, path = load_analysed_model(model)
    _write(out, "ngram", studies.study_ngram(p, sym, _split(data, "train"), out, label=path.name,
                                             compare=_compare_models(compare, model)))


def _pca_models(model, baselines, compare=()):
    """name -> (kind, params, symbols) for the ISAN, the ISANs of ``compare`` (:func:`compare_paths`)
    and each baseline bundle (an ISAN bundle is allowed too)."""
    from isan.engine.baselines.recurrent import load_baseline_bundle
    from isan.engine.bundle import load_isan_bundle, read_manifest

    _, p, sym, path = load_analysed_model(model)
    models = {f"isan ({path.name})": ("isan", p, sym)}
    for name, (q, sq) in _compare_models(compare, model).items():
        models[f"isan ({name})"] = ("isan", q, sq)
    for b in baselines:
        bpath = Path(b)
        try:
            kind = read_manifest(bpath).get("kind")
            if kind == "isan":
                _, params, alphabet = load_isan_bundle(bpath)
            else:
                _, params, alphabet = load_baseline_bundle(bpath)
        except IsanError as e:
            raise UserError(f"{b}: {e} (the Fig 1b bundles are built by `bash train/studies/paper_baselines.sh`)") from None
        models[bpath.name] = (kind, params, tuple(alphabet.symbols))
    return models


@analyze.command("pca", short_help="Figure 1b: PCA spectrum of the states, against baselines.")
@common
@data_option
@click.option("--baseline", "baselines", multiple=True,
              default=tuple(f"results/paper/models/{b}" for b in BASELINES), show_default=True,
              help="Bundles to compare (RNN, GRU, LSTM or ISAN); repeat the option.")
@click.option("--max-chars", type=POSITIVE_INT, default=None, help="Only the first N characters of the test split.")
@compare_option
@friendly
def pca_cmd(model, out, data, baselines, max_chars, compare):
    """Figure 1b: the PCA spectrum of hidden states on the test split, the ISAN against baselines."""
    from isan.engine.analysis import studies

    models = _pca_models(model, baselines, compare)
    _write(out, "pca", studies.study_pca(models, _split(data, "test")[:max_chars], out))


def _shown(path: Path) -> str:
    """``path`` as a command line shows it: relative to the working directory where it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def sample_models(model, prompt, n, betas, seeds, compare=()):
    """Samples of ``model`` (default: the paper's model, as every other study; `isan sample` alone samples
    the shipped default) and, under "compare", of each bundle :func:`compare_paths` names."""
    from isan.cli.helpers import load_engine
    from isan.engine.paths import paper_model_path

    def one(path):
        engine = load_engine(path)
        rows = []
        for beta in betas:
            for seed in seeds:
                s = engine.sample(prompt, n=n, temperature=1.0 / beta, seed=seed)
                rows.append({"inverse_temperature": beta, "seed": seed, "prompt": s.prompt, "text": s.text})
        return {"prompt": prompt, "chars": n, "samples": rows,
                "commands": [f"isan sample --model {shlex.quote(_shown(path))} --prompt {shlex.quote(prompt)} -n {n} "
                             f"--inverse-temperature {b} --seed {s}" for b in betas for s in seeds]}

    path = paper_model_path() if model is None else Path(model)
    out = one(path)
    others = compare_paths(compare, model)
    if others:
        out["label"] = path.name
        out["compare"] = {q.name: one(q) for q in others}
    return out


@analyze.command("samples", short_help="Section 3.1: samples at inverse temperatures 1.5 and 2.")
@common
@click.option("--prompt", default="annual reve", show_default=True)
@click.option("-n", "n", type=POSITIVE_INT, default=120, show_default=True)
@click.option("--inverse-temperature", "betas", type=POSITIVE_FLOAT, multiple=True, default=(1.5, 2.0), show_default=True)
@click.option("--seed", "seeds", type=SEED, multiple=True, default=(0, 1, 2), show_default=True)
@compare_option
@friendly
def samples_cmd(model, out, prompt, n, betas, seeds, compare):
    """Section 3.1: samples at inverse temperatures 1.5 and 2.0 after 'annual reve'."""
    if any(b <= 0 for b in betas):
        raise UserError("--inverse-temperature must be positive")
    _write(out, "samples", sample_models(model, prompt, n, betas, seeds, compare))


def _parentheses(checkpoint, out, chars, seed, seeds=tuple(range(10))):
    import numpy as np

    from isan.engine.analysis import studies
    from isan.export.runs import read_checkpoint
    from isan.params import ISANParams
    from isan.train.tasks.parentheses import ParenthesesTask

    cfg, tensors = read_checkpoint(checkpoint)
    tcfg = cfg.get("task") or {}
    if tcfg.get("task") != "parentheses":
        raise UserError(f"{checkpoint} is not a parentheses run (train one with `isan train parentheses --d 35 --out DIR`)")
    task = ParenthesesTask(kinds=tcfg["kinds"], max_count=tcfg["max_count"], delay=tcfg["delay"])
    if task.delay != 1:
        raise UserError("the analysis expects the paper's delay of one step")
    p = ISANParams(**tensors)
    ids = task.sample(chars, seed)
    counts = task.counts(ids)  # after each symbol
    target = np.zeros_like(counts)
    target[1:] = counts[:-1]  # the state after symbol s reports the counts after s - 1
    sym = tuple(task.alphabet.symbols)
    streams = {}
    for s in seeds:  # issue #26: the same measures over more fresh streams
        ids_s = task.sample(chars, s)
        c_s = task.counts(ids_s)
        t_s = np.zeros_like(c_s)
        t_s[1:] = c_s[:-1]
        streams[s] = (ids_s, t_s, c_s)
    res = studies.study_parentheses(p, sym, ids, target, counts, task.kinds, task.levels, hold=len(sym) - 1,
                                    out_dir=out, seed_streams=streams, model=str(checkpoint))
    res.update({"checkpoint": str(checkpoint), "seed": seed, "task": task.config(), "more_seeds": list(seeds)})
    # the training run's own validation numbers, for reference
    logf = Path(checkpoint) / "train_log.jsonl"
    if logf.is_file():
        import json

        valid = [json.loads(line) for line in logf.read_text().splitlines() if '"valid"' in line]
        if valid:
            best = min(valid, key=lambda v: v.get("valid_mse", float("inf")))
            res["training_best_valid"] = {k: best.get(k) for k in ("epoch", "valid_mse", "valid_accuracy", "valid_exact")}
    return res


@analyze.command("parentheses", short_help="Section 4, Figure 9: the counting task's readout basis.")
@click.option("--checkpoint", default=PAREN_CKPT, show_default=True,
              help="Training run directory of `isan train parentheses --d 35`.")
@click.option("--out", default=DEFAULT_OUT, show_default=True, type=click.Path(file_okay=False))
@click.option("--chars", type=click.IntRange(min=200), default=20_000, show_default=True, help="Symbols of the fresh test stream.")
@click.option("--seed", type=SEED, default=12345, show_default=True)
@click.option("--seeds", type=IntList(min=0), default="0,1,2,3,4,5,6,7,8,9", show_default=True,
              help="More fresh streams (seeds, comma-separated) for accuracy and the start-up transient.")
@friendly
def parentheses_cmd(checkpoint, out, chars, seed, seeds):
    """Section 4, Figure 9: the counting task in the readout basis plus a sparse basis of its complement."""
    _write(out, "parentheses", _parentheses(checkpoint, out, chars, seed, seeds))


@analyze.command("attribute", short_help="Attribution to a chosen target, windowed for long texts.")
@click.option("--text", default=None, help="The text (default: the first --max-chars of the test split).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True)
@click.option("--max-chars", type=POSITIVE_INT, default=2000, show_default=True)
@click.option("--model", default=None, help="ISAN bundle directory (default: the paper's model, isan/models/text8-d216-unconstrained).")
@click.option("--target", type=click.Choice(["logit", "logprob", "logit_diff"]), default="logprob", show_default=True,
              help="The scalar attributed at each position.")
@click.option("--char", "char", default="next", show_default=True,
              help="The target character, or 'next' (the character that follows in the text).")
@click.option("--other", default=None, help="With --target logit_diff: the subtracted character.")
@click.option("--window", type=POSITIVE_INT, default=None,
              help="Keep the last N sources exact and sum everything older into one 'history' source "
                   "(memory T (N+1) V instead of T^2 V).")
@click.option("--top", type=POSITIVE_INT, default=3, show_default=True, help="Sources listed per position.")
@click.option("--json", "as_json", is_flag=True, help="Print the contributions as JSON.")
@friendly
def attribute_cmd(text, data, max_chars, model, target, char, other, window, top, as_json):
    """Attribution to a chosen target: a character's logit or log-probability, or the difference of two
    logits, optionally windowed for long texts. The sum identity is checked on every call."""
    import numpy as np

    from isan.engine.analysis import attribution
    from isan.engine.analysis.studies import encode

    _, p, sym, _ = load_analysed_model(model)
    text = _split(data, "test")[:max_chars] if text is None else text
    ids = encode(text, sym)
    if len(ids) == 0:
        raise UserError("the text is empty")
    if target == "logit_diff" and other is None:
        raise UserError("--target logit_diff needs --other")
    if window is None:
        if len(ids) > 3000:
            raise UserError(f"{len(ids)} characters need {8 * len(ids) ** 2 * len(sym) / 1e9:.1f} GB without "
                            "--window; give --window N")
        window = len(ids) + 1  # every source exact: no history beyond the start state
    if window < 1:
        raise UserError("--window must be at least 1")
    if char == "next":
        from isan.engine.reference import states_ref

        last = states_ref(p.astype(np.float64), ids, p.h0.astype(np.float64))[-1] @ p.W_ro.T + p.b_ro
        c = attribution.next_classes(ids, last[None])
    else:
        c = char
    wa = attribution.windowed_attribution(p, ids, window, target=target, char=c, other=other, symbols=sym)
    ta = wa.target
    if as_json:
        emit_json({"chars": len(ids), "window": window, "target": target,
                   "sources": ["history"] + [f"lag {k}" for k in range(window)],
                   "classes": [sym[i] for i in ta.classes], "base": ta.base.tolist(), "value": ta.value.tolist(),
                   "contributions": np.round(ta.contributions, 6).tolist(),
                   "max_abs_error": wa.max_abs_error, "target_max_abs_error": ta.max_abs_error})
        return
    click.echo(f"target {target}; window {window}; check max |b_ro + sum kappa - logits| = {wa.max_abs_error:.2e}, "
               f"max |base + sum contributions - target| = {ta.max_abs_error:.2e}")
    for t in range(len(ids)):
        row = ta.contributions[t]
        order = [int(i) for i in np.argsort(-np.abs(row))[:top] if row[i] != 0]
        parts = ", ".join(("history" if i == 0 else f"{t - i + 1}:{sym[ids[t - i + 1]]!r}") + f" {row[i]:+.2f}"
                          for i in order)
        click.echo(f"{t:5d} {sym[ids[t]]!r} -> {sym[ta.classes[t]]!r} {ta.value[t]:+.3f} = base {ta.base[t]:+.2f} + {parts} ...")


def naive_bayes_study(train: str, test: str, sym, max_window: int = 10) -> dict:
    """Table 1's Naive Bayes control over the last 1..``max_window`` symbols of ``sym``: bits on ``test``
    after counting ``train``, with where the paper states it."""
    from isan.engine.analysis import studies
    from isan.engine.analysis.naive_bayes import naive_bayes_bits

    r = naive_bayes_bits(studies.encode(train, sym), studies.encode(test, sym), len(sym), max_window)
    r["paper"] = ("ICML Sec 3.1 (ICLR workshop version Sec 4.1): 'a Naive Bayes model on the task, at 3.3 bits / "
                  "char' (the model is not defined there)")
    return r


@analyze.command("naive-bayes", short_help="Table 1's Naive Bayes control over the last k characters.")
@click.option("--out", default=DEFAULT_OUT, show_default=True, type=click.Path(file_okay=False))
@data_option
@click.option("--max-window", type=POSITIVE_INT, default=10, show_default=True, help="Largest number of previous characters.")
@friendly
def naive_bayes_cmd(out, data, max_window):
    """Table 1's Naive Bayes control (ICML Sec 3.1): test bits/char with the previous k characters as
    independent features, k = 1..max-window (train-split counts, add-0.5)."""
    from isan.alphabet import Alphabet

    sym = tuple(Alphabet.text8().symbols)
    _write(out, "naive_bayes", naive_bayes_study(_split(data, "train"), _split(data, "test"), sym, max_window))


@analyze.command("all", short_help="Every study: figures, OUT/<study>.json, OUT/paper.json.")
@common
@data_option
@click.option("--checkpoint", default=PAREN_CKPT, show_default=True, help="The parentheses training run.")
@click.option("--baseline", "baselines", multiple=True,
              default=tuple(f"results/paper/models/{b}" for b in BASELINES), show_default=True)
@click.option("--skip", multiple=True, help="Studies to leave out (e.g. --skip pca).")
@compare_option
@friendly
def all_cmd(model, out, data, checkpoint, baselines, skip, compare):
    """Every study: figures, OUT/<study>.json, OUT/paper.json and OUT/command.txt."""
    from isan.atomic import write_bytes_atomic
    from isan.engine.analysis import studies

    t0 = time.perf_counter()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest, p, sym, path = load_analysed_model(model)
    test, train = _split(data, "test"), _split(data, "train")
    cmp = _compare_models(compare, model)  # issue #34 item 17: every model study, side by side
    lab = dict(label=Path(path).name, compare=cmp)
    steps = {
        "stack": lambda: studies.study_stack(p, sym, out_dir=out_dir, **lab),
        "contributions": lambda: studies.study_contributions(p, sym, out_dir=out_dir, **lab),
        "decay": lambda: studies.study_decay(p, sym, test, out_dir=out_dir, **lab),
        "words": lambda: studies.study_words(p, sym, out_dir=out_dir, **lab),
        "words_paper": lambda: studies.study_words(p, sym, studies.FIG5_PAPER_FRAGMENT, keep=(1, 2, 3, None),
                                                   out_dir=out_dir, fig_name="fig5_words_paper_fragment.png", **lab),
        "word_embedding": lambda: studies.study_word_embedding(p, sym, train, out_dir=out_dir, **lab),
        "basis": lambda: studies.study_basis(p, sym, train, out_dir=out_dir, **lab),
        "ngram": lambda: studies.study_ngram(p, sym, train, out_dir=out_dir, **lab),
        "pca": lambda: studies.study_pca(_pca_models(model, baselines, compare), test, out_dir=out_dir),
        "samples": lambda: sample_models(model, "annual reve", 120, (1.5, 2.0), (0, 1, 2), compare),
        "attribution": lambda: studies.study_attribution(p, sym, test[:2001]),
        "parentheses": lambda: _parentheses(checkpoint, out_dir, 20_000, 12345),
        "naive_bayes": lambda: naive_bayes_study(train, test, sym),
    }
    bad = [s for s in skip if s not in steps]
    if bad:
        raise UserError(f"unknown studies {bad}; choose from {', '.join(steps)}")
    results = {"model": {"path": str(path), "params_sha256": manifest.get("params_sha256"), "d": p.d}}
    if cmp:
        results["compare"] = {}
        for q in compare_paths(compare, model):
            mq, pq, _, _ = load_analysed_model(q)
            results["compare"][q.name] = {"path": str(q), "params_sha256": mq.get("params_sha256"), "d": pq.d}
    for name, fn in steps.items():
        if name in skip:
            continue
        t1 = time.perf_counter()
        click.echo(f"{name} ...", err=True)
        results[name] = _write(out_dir, name, fn(), quiet=True)
        click.echo(f"{name}: {time.perf_counter() - t1:.1f} s", err=True)
    results["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out_dir, "paper", results, quiet=True)
    argv = ["isan", "analyze", "all"] + sys.argv[sys.argv.index("all") + 1 :] if "all" in sys.argv else ["isan", "analyze", "all"]
    write_bytes_atomic(out_dir / "command.txt", (" ".join(shlex.quote(a) for a in argv) + "\n").encode())
    click.echo(f"wrote {out_dir}/paper.json and the figures in {results['seconds']} s")
