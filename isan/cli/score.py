"""``isan score``, ``isan sample`` and ``isan attribute``."""

from __future__ import annotations

import sys

import click

from isan.cli.helpers import (NON_NEGATIVE_FLOAT, NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, SEED, UserError,
                              emit_json, friendly, load_engine, main, model_options, normalize_option, read_input,
                              unknown_options, input_file, warn_if_mostly_dropped)
from isan.engine.kernels.backends import default_backend


@main.command(short_help="Score FILE (or stdin) in bits: total and per character.")
@click.argument("file", required=False, default="-")
@model_options
@unknown_options
@click.option("--json", "as_json", is_flag=True, help='Print {"chars", "bits", "bpc"} as JSON.')
@click.option("--per-char", is_flag=True, help="Also give the bits of every character.")
@click.option("--text8-split", type=click.Choice(["train", "valid", "test", "unseen"]), default=None,
              help="Score one split of text8-10M from FILE (text8, text8.zip or text8_head.txt); unseen: the "
                   "characters after the splits (from offset 10,000,000), for speed measurements.")
@click.option("--text-split", type=click.Choice(["train", "valid"]), default=None,
              help="Score one part of FILE as `isan train --dataset text` splits it: the first 90% of its "
                   "characters (train) or the last 10% (valid; for ASCII text the same bytes as --alphabet bytes).")
@normalize_option
@friendly
def score(file, model, path_mode, threads, runtime, device, dtype, unknown, replacement, as_json, per_char,
          text8_split, text_split, normalize):
    """Score FILE (or stdin, '-') in bits: total bits and bits per character (bpc).

    The text first goes through the model's normaliser (--normalize auto); the report says how
    many characters were read, scored, changed and dropped, and a warning on stderr says when the
    normaliser dropped more than half of them. The prediction for each character
    comes from the state before it, starting at h0. With --per-char each scored character is
    listed with the offset of the input character it came from.
    """
    engine = load_engine(model, path_mode, runtime, device, threads, dtype)
    if not (per_char or text_split or text8_split) and engine.alphabet.unit == "char":
        # a file of any size in bounded memory: read and scored in blocks, the state carried across
        from isan.engine.blocks import read_blocks, score_blocks

        source = sys.stdin.buffer if file in (None, "-") else input_file(file)
        r = score_blocks(engine, read_blocks(source), unknown=unknown, replacement=replacement, normalize=normalize)
        warn_if_mostly_dropped(r.normalization)
        print_score(r, as_json)
        return
    text = read_input(file, text8_split)
    if text_split:
        if text8_split:
            raise UserError("give --text8-split or --text-split, not both")
        cut = int(len(text) * 0.9)
        text = text[:cut] if text_split == "train" else text[cut:]
    r = engine.score(text, per_char=per_char, unknown=unknown, replacement=replacement, normalize=normalize)
    warn_if_mostly_dropped(r.normalization)
    print_score(r, as_json, per_char)
    if per_char and not as_json:
        print_per_char(r, text)


def print_score(r, as_json: bool, per_char: bool = False) -> None:
    """Print a ScoreResult as JSON or as lines of text (without the per-character table)."""
    if as_json:
        emit_json(r.to_json(per_char))
        return
    if r.unit == "char":
        click.echo(f"chars  {r.chars}\nbits   {r.bits:.3f}\nbpc    {r.bpc:.4f}")
    else:  # a token model: bits per byte, pair or word, and per character of the text
        click.echo(f"{r.unit}s  {r.chars}\nchars  {r.text_chars}\nbits   {r.bits:.3f}\n"
                   f"bits/{r.unit}  {r.bits_per_token:.4f}\nbpc    {r.bpc:.4f}")
    n = r.normalization or {}
    if n and n.get("normalizer") != "none-v1" or n.get("skipped") or n.get("replaced"):
        click.echo(f"normalized  {n['normalizer']}: read {n['chars_read']:,}, scored {n['chars_scored']:,}, "
                   f"changed {n['changed']:,}, dropped {n['dropped']:,}"
                   + (f", skipped {n['skipped']:,}" if n.get("skipped") else "")
                   + (f", replaced {n['replaced']:,}" if n.get("replaced") else ""))


def print_per_char(r, text: str) -> None:
    """Print the per-character table: input offset, input character, scored symbol, bits."""
    click.echo("offset\tinput\tscored\tbits")
    if r.unit != "char":  # a token: the input from its offset to the next token's
        offs = r.per_char_offsets.tolist()
        for i, (off, b) in enumerate(zip(offs, r.per_char_bits)):
            end = offs[i + 1] if i + 1 < len(offs) else len(text)
            click.echo(f"{off}\t{text[off:max(end, off + 1)]!r}\t{r.unit}\t{b:.4f}")
        return
    for off, sym, b in zip(r.per_char_offsets.tolist(), r.text, r.per_char_bits):
        click.echo(f"{off}\t{text[off]!r}\t{sym!r}\t{b:.4f}")

@main.command(short_help="Generate text after --prompt.")
@click.option("--prompt", default="", help="Text to condition on (consumed before sampling).")
@click.option("-n", "n", type=NON_NEGATIVE_INT, default=200, show_default=True, help="Characters to generate.")
@click.option("--temperature", type=NON_NEGATIVE_FLOAT, default=None,
              help="Logits are divided by it (default 1; 0, or below 0.01: greedy, the most likely character each "
                   "step, as /v1/completions).")
@click.option("--inverse-temperature", "inverse_temperature", type=POSITIVE_FLOAT, default=None,
              help="Logits are multiplied by it (the paper's section 3.1 samples at 1.5 and 2); instead of --temperature.")
@click.option("--top-k", type=POSITIVE_INT, default=None, help="Sample among the k most likely characters only.")
@click.option("--seed", type=SEED, default=None,
              help="Random seed; the same seed gives the same text (default: a new one, reported: in the JSON, "
                   "or on stderr). Greedy sampling (--temperature below 0.01, or --top-k 1) uses none: the "
                   "JSON's seed is null.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"prompt", "text", "bits", "seed", "temperature", "top_k", ...} as JSON.')
@model_options
@normalize_option
@friendly
def sample(prompt, n, temperature, inverse_temperature, top_k, seed, as_json, model, path_mode, threads, runtime,
           device, dtype, normalize):
    """Generate text after --prompt (the prompt goes through the model's normaliser first)."""
    if temperature is not None and inverse_temperature is not None:
        raise UserError("give --temperature or --inverse-temperature, not both")
    if inverse_temperature is not None:  # above 0 (its type)
        temperature = 1.0 / inverse_temperature
        if temperature == float("inf"):
            raise click.BadParameter(f"{inverse_temperature:g} is too small (1 / it is infinite).",
                                     param_hint="'--inverse-temperature'")
    temperature = 1.0 if temperature is None else temperature
    if runtime == "numpy" and default_backend(device, dtype) != "native":  # the torch kernel backend: for scoring
        # name only the options given (their defaults are what sampling uses)
        given = [f"--device {device}"] * (device != "cpu") + [f"--dtype {dtype}"] * (dtype != "float32")
        raise UserError(f"isan sample draws one character a step on the CPU (numpy); {' and '.join(given)} "
                        f"{'is' if len(given) == 1 else 'are'} for scoring (isan score, isan corpus score)")
    engine = load_engine(model, path_mode, runtime, device, threads, dtype)
    from isan.engine.sampling import greedy, new_seed

    deterministic = greedy(temperature, top_k)[1] == 1  # the most likely character each step: no seed is used
    seed = None if deterministic else seed
    drawn_seed = seed is None and not deterministic
    if drawn_seed:  # pick one and report it, so that the sample can be drawn again (as the server does)
        seed = new_seed()
    s = engine.sample(prompt, n=n, temperature=temperature, top_k=top_k, seed=seed, normalize=normalize)
    if prompt:  # a prompt the model cannot read (another script) is one space to it: say so, as isan score does
        warn_if_mostly_dropped(s.normalization, what="prompt", done="read the prompt as")
    if as_json:
        emit_json(s.to_json())
    else:
        click.echo(s.prompt + s.text)
        if drawn_seed:
            click.echo(f"seed {seed} (--seed {seed} draws this sample again)", err=True)

@main.command(short_help="Exact attribution of each prediction to the text before it.")
@click.option("--text", required=True, help="The text to attribute.")
@click.option("--by", type=click.Choice(["char", "word"]), default="word", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the attribution as JSON.")
@click.option("--full", is_flag=True, help="With --json: include the whole kappa tensor (T, S, V) and the logits.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a heatmap PNG (like the paper's Figure 2).")
@click.option("--top", type=POSITIVE_INT, default=3, show_default=True, help="Sources listed per position in the text output.")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@unknown_options
@normalize_option
@friendly
def attribute(text, by, as_json, full, plot, top, model, unknown, replacement, normalize):
    """Exact attribution of each prediction to the initial state and the characters or words before it.

    kappa[t, s] = W_ro (W[x_t] ... W[x_{s+1}]) b[x_s] (Foerster et al. 2017, eqs. 4-6);
    b_ro + sum_s kappa[t, s] equals the logits, and this is checked on every call. For a chosen
    target (a logit, a log-probability, a difference of logits) or long texts (the last N sources
    exact, older ones summed), see `isan analyze attribute`.
    """
    engine = load_engine(model)
    a = engine.attribute(text, by=by, unknown=unknown, replacement=replacement, normalize=normalize)
    if plot:
        from isan.engine.analysis.plot import plot_attribution

        plot_attribution(a, plot)
    if as_json:
        emit_json(a.to_json(full=full))
        return
    contrib = a.next_char_contributions()
    # each source with the input offset it starts at, as the lens labels them (two spaces read alike)
    offs = a.input_offsets if a.input_offsets is not None else []
    labels = [repr(src) if i == 0 else f"{src!r} @{int(offs[start]) if start < len(offs) else start}"
              for i, (src, (start, _)) in enumerate(zip(a.sources, a.source_spans))]
    click.echo(f"sources: {len(a.sources)} ({by}s at their input offset, and <h0>); check max |b_ro + sum kappa - "
               f"logits| = {a.max_abs_error:.2e}")
    n = a.normalization or {}
    if n.get("changed") or n.get("dropped") or n.get("skipped") or n.get("replaced"):
        click.echo(f"normalized {n['normalizer']}: {n['chars_read']} characters read, {n['chars_scored']} attributed "
                   f"({n['changed']} changed, {n['dropped']} dropped, {n['skipped']} skipped, {n['replaced']} replaced)")
    for t, ch in enumerate(a.text):
        nxt = a.text[t + 1] if t + 1 < len(a.text) else None
        label = repr(nxt) if nxt is not None else f"{a.alphabet.symbols[int(a.logits[t].argmax())]!r} (predicted)"
        order = [int(i) for i in abs(contrib[t]).argsort()[::-1][:top] if contrib[t][i] != 0]
        parts = ", ".join(f"{labels[i]} {contrib[t][i]:+.2f}" for i in order)
        click.echo(f"{t:4d} {ch!r} -> {label:16s} {parts}")
    if plot:
        click.echo(f"wrote {plot}")
