"""The ``isan`` command line (click). Thin: it parses options, calls library functions, formats.

Every command takes ``--help``. Errors in the input (unknown characters, missing or
corrupt files, empty text, a diverging model state) print one ``Error:`` line and exit with
status 2; no traceback. JSON output never holds NaN or inf.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click

from isan.errors import IsanError

DEFAULT_TEXT8 = "../shared/data/text8_head/text8_head.txt"


class UserError(click.ClickException):
    exit_code = 2


def friendly(fn):
    """Turn library errors into one-line CLI errors (exit 2) instead of tracebacks."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (IsanError, FileExistsError, FileNotFoundError) as e:
            raise UserError(str(e)) from None
        except PermissionError as e:
            raise UserError(f"permission denied: {e.filename or e}") from None
        except ModuleNotFoundError as e:
            extra = {"torch": "train", "onnx": "onnx", "onnxruntime": "onnx", "fastapi": "serve",
                     "uvicorn": "serve", "matplotlib": "plot"}.get((e.name or "").split(".")[0])
            if extra:
                raise UserError(f"this command needs {e.name}: pip install 'isan[{extra}]'") from None
            raise

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log progress messages to stderr.")
@click.version_option(package_name="isan")
def main(verbose: bool) -> None:
    """isan: score, sample, attribute, export and train Input Switched Affine Networks."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


# --------------------------------------------------------------------------------------- train
@main.command()
@click.argument("model", default="isan")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Run directory (checkpoints, log); an existing run there is resumed.")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8, text8.zip, text8_head.txt, or any text file with --dataset text.")
@click.option("--dataset", type=click.Choice(["text8", "text"]), default="text8", show_default=True, help="text8: the text8-10M split; text: first 90% train, last 10% valid.")
@click.option("--params", type=float, default=1.28e6, show_default=True, help="Parameter budget; the largest hidden size within it is used.")
@click.option("--d", "--hidden", "d", type=int, default=None,
              help="Hidden size (overrides --params); under torchrun write --hidden (torchrun reads --d as its own).")
@click.option("--batch-size", type=int, default=256, show_default=True, help="Parallel streams B.")
@click.option("--bptt", type=int, default=64, show_default=True, help="Truncated BPTT length T.")
@click.option("--lr", type=float, default=2e-3, show_default=True)
@click.option("--lr-decay", type=float, default=0.5, show_default=True, help="Rate factor when valid bpc does not improve.")
@click.option("--weight-decay", type=float, default=0.0, show_default=True)
@click.option("--clip", type=float, default=1.0, show_default=True, help="Gradient norm clipping.")
@click.option("--max-epochs", type=int, default=30, show_default=True)
@click.option("--max-chars", type=float, default=None, help="Budget in training characters seen.")
@click.option("--max-steps", type=int, default=None, help="Stop after this many optimizer steps.")
@click.option("--patience", type=int, default=2, show_default=True, help="Evaluations without improvement before early stopping.")
@click.option("--eval-every", type=float, default=1.0, show_default=True, help="Epochs between validation evaluations.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--threads", type=int, default=None, help="torch CPU threads.")
@click.option("--init-scale", type=float, default=None,
              help="irnn only: the recurrent matrix starts at this multiple of the identity (Le et al. 2015; default 1).")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--orders", default="2,3,4,5,6,7,8", show_default=True,
              help="ngram only: orders to try; the best on valid is kept.")
@click.option("--alphabet", "alphabet", type=click.Choice(["chars", "bytes", "pairs", "words"]), default="chars",
              show_default=True,
              help="Tokens: characters; UTF-8 bytes (256 outputs, --inputs inputs); pairs of characters "
                   "(27^2 for text8); whitespace words. Bits (bpc in the logs) are per token.")
@click.option("--inputs", type=int, default=70, show_default=True,
              help="bytes only: input symbols K, the K-1 most frequent bytes of the train part plus one 'other'.")
@click.option("--valid-data", default=None, type=click.Path(dir_okay=False),
              help="With --dataset text: all of --data is train and this file is valid.")
@click.option("--distributed", is_flag=True,
              help="Data-parallel training under torchrun (gloo on CPU, nccl on CUDA); "
                   "torchrun --nproc_per_node N -m isan.train.ddp MODEL ... adds it.")
@click.option("--stable-rho", type=float, default=None,
              help="isan only: a certified stable ISAN, W_x = P^-1 U_x P with ||U_x||_2 <= RHO < 1 after every step; "
                   "no input can make its state diverge (the export writes the certificate).")
@click.option("--stable-basis", is_flag=True, help="With --stable-rho: learn the basis P (else P = I).")
@click.option("--stable-exact-every", type=int, default=1, show_default=True,
              help="With --stable-rho: project onto the bound every N steps (N > 1 is faster; the bound then "
                   "holds at those steps and for the evaluated, saved and exported weights).")
@click.option("--state-dropout", type=float, default=0.0, show_default=True,
              help="isan only: dropout on the states before the readout (the recurrence stays exact).")
@click.option("--ema", type=float, default=0.0, show_default=True,
              help="Decay of an exponential moving average of the weights, evaluated beside them and saved as "
                   "best when better (e.g. 0.999; 0: none).")
@click.option("--lr-schedule", type=click.Choice(["plateau", "cosine"]), default="plateau", show_default=True,
              help="plateau: times --lr-decay when valid does not improve; cosine: from --lr to --lr-min x lr over "
                   "the budget (--max-chars, --max-steps or --max-epochs; a resume that raises it stretches the curve).")
@click.option("--lr-min", type=float, default=0.02, show_default=True, help="cosine: the final rate as a fraction of --lr.")
@friendly
def train(model, out_dir, data, dataset, params, d, batch_size, bptt, lr, lr_decay, weight_decay, clip, max_epochs,
          max_chars, max_steps, patience, eval_every, seed, device, threads, init_scale, progress, orders,
          alphabet, inputs, valid_data, distributed, stable_rho, stable_basis, stable_exact_every, state_dropout,
          ema, lr_schedule, lr_min):
    """Train MODEL (default: isan) on text8-10M or a text file; resumes a run found in --out.

    MODEL: isan, rnn, irnn, gru, lstm, linear, linear_nlro, isan_nobias, or ngram (interpolated
    Kneser-Ney, counted in numpy; --out is then the bundle directory). Writes a checkpoint
    directory for `isan export`. Several processes or machines: run it under torchrun with
    --distributed (see isan.train.ddp).
    """
    if model == "ngram":
        if alphabet != "chars" or valid_data or distributed:
            raise click.UsageError("ngram trains on characters in one process (no --alphabet, --valid-data, --distributed)")
        from isan.engine.ngram import train_ngram

        info = train_ngram(data, out_dir, orders=tuple(int(o) for o in orders.split(",")), dataset=dataset)
        click.echo(json.dumps(info))
        return
    if init_scale is not None and model != "irnn":
        raise click.UsageError("--init-scale applies to irnn only")
    if stable_basis and not stable_rho:
        raise click.UsageError("--stable-basis goes with --stable-rho RHO")
    from isan.train.loop import TrainConfig, Trainer

    cfg = TrainConfig(model=model, d=d, params=None if d else params, data=data, dataset=dataset,
                      batch_size=batch_size, bptt=bptt, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                      clip=clip, max_epochs=max_epochs, max_chars=int(max_chars) if max_chars else None,
                      max_steps=max_steps, patience=patience, eval_every=eval_every, seed=seed, device=device,
                      threads=threads, init_scale=init_scale, alphabet=alphabet, inputs=inputs,
                      valid_data=valid_data, stable_rho=stable_rho, stable_basis=stable_basis,
                      stable_exact_every=stable_exact_every, state_dropout=state_dropout, ema=ema,
                      lr_schedule=lr_schedule, lr_min=lr_min)
    overrides = {"max_epochs": max_epochs, "max_chars": cfg.max_chars, "max_steps": max_steps,
                 "patience": patience, "threads": threads, "device": device}
    dist = None
    if distributed:
        from isan.train.ddp import init_from_env

        dist = init_from_env(device)
    try:
        tr = Trainer(cfg, out_dir, progress_bar=progress, overrides=overrides, dist=dist)
        verb = "resuming" if tr.resumed else "training"
        if tr.main:
            where = f" on {dist.world} processes ({dist.backend})" if dist else ""
            click.echo(f"{verb} {tr.cfg.model} with {tr.n_params:,} parameters ({json.dumps(tr.model.config())}) "
                       f"in {out_dir}{where}", err=True)
        p = tr.run()
    finally:
        if dist is not None:
            from isan.train.ddp import shutdown

            shutdown()
    if tr.main:
        click.echo(json.dumps({"out": str(out_dir), "n_params": tr.n_params, "unit": tr.unit,
                               "best_valid_bpc": p.best_valid_bpc, "best_epoch": p.best_epoch, "steps": p.step,
                               "chars_seen": p.chars_seen, "stop_reason": p.stop_reason}))


# --------------------------------------------------------------------------------------- shared options
def model_options(fn):
    fn = click.option("--model", "model", default=None, help="Bundle directory (default: the shipped text8 model).")(fn)
    fn = click.option("--path", "path_mode", type=click.Choice(["auto", "composed", "chunked", "reference"]),
                      default="auto", show_default=True,
                      help="composed: trie-table jumps (texts of 10,000+ characters go chunk-parallel); chunked: "
                           "chunk-parallel batches in the compiled kernels; reference: per-character float64 numpy.")(fn)
    fn = click.option("--threads", type=int, default=None,
                      help="Threads for the compiled kernels (default: the CPUs this process may use; ISAN_NUM_THREADS).")(fn)
    fn = click.option("--backend", type=click.Choice(["numpy", "onnx"]), default="numpy", show_default=True,
                      help="numpy engine, or onnxruntime over the bundle's ONNX graphs (isan export --onnx).")(fn)
    fn = click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True,
                      help="onnx backend: onnxruntime's CPU or CUDA provider (auto: CUDA when present).")(fn)
    return fn


def emit_json(obj) -> None:
    """Print one JSON document; NaN or inf would be a bug, so it raises instead of printing them."""
    click.echo(json.dumps(obj, allow_nan=False))


def normalize_option(fn):
    from isan.engine.normalize import choices

    return click.option("--normalize", "normalize", type=click.Choice(choices()), default="auto", show_default=True,
                        help="Text normalisation: auto (the model's declared normaliser; text8 models: "
                             "lower-case, digits spelled out, other characters to spaces), none (raw text), "
                             "or a named normaliser.")(fn)


def unknown_options(fn):
    fn = click.option("--unknown", type=click.Choice(["error", "skip", "replace"]), default="error", show_default=True,
                      help="What to do with characters outside the model's alphabet.")(fn)
    fn = click.option("--replacement", default=None, help="Symbol used with --unknown replace.")(fn)
    return fn


def load_engine(model, path_mode="auto", backend="numpy", device="cpu", threads=None):
    from isan.engine import load_engine as _load

    if threads is not None and threads < 1:
        raise UserError(f"--threads must be at least 1; got {threads}")
    engine = _load(model, path=path_mode, backend=backend, device=device)
    if threads is not None and hasattr(engine, "threads"):
        engine.threads = threads
    logging.getLogger("isan").info("engine: %s", engine.describe())
    return engine


def input_file(file) -> Path:
    """The path of an input file, or a UserError that says what is wrong with it."""
    p = Path(file)
    if p.is_dir():
        raise UserError(f"{file} is a directory; give a text file (or '-' for standard input)")
    if not p.exists():
        raise UserError(f"{file} does not exist")
    if not p.is_file():
        raise UserError(f"{file} is not a regular file")
    return p


def read_input(file, text8_split):
    if text8_split:
        from isan.engine.data import read_text8_split

        if file in (None, "-"):
            raise UserError("--text8-split needs the path of text8, text8.zip or text8_head.txt")
        return read_text8_split(file, text8_split)
    if file in (None, "-"):
        return sys.stdin.read()
    p = input_file(file)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{file} is not UTF-8 text ({e})") from None


# --------------------------------------------------------------------------------------- score
@main.command()
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
def score(file, model, path_mode, threads, backend, device, unknown, replacement, as_json, per_char, text8_split,
          text_split, normalize):
    """Score FILE (or stdin, '-') in bits: total bits and bits per character (bpc).

    The text first goes through the model's normaliser (--normalize auto); the report says how
    many characters were read, scored, changed and dropped. The prediction for each character
    comes from the state before it, starting at h0. With --per-char each scored character is
    listed with the offset of the input character it came from.
    """
    engine = load_engine(model, path_mode, backend, device, threads)
    if not (per_char or text_split or text8_split) and engine.alphabet.unit == "char":
        # a file of any size in bounded memory: read and scored in blocks, the state carried across
        from isan.engine.blocks import read_blocks, score_blocks

        source = sys.stdin.buffer if file in (None, "-") else input_file(file)
        r = score_blocks(engine, read_blocks(source), unknown=unknown, replacement=replacement, normalize=normalize)
        print_score(r, as_json)
        return
    text = read_input(file, text8_split)
    if text_split:
        if text8_split:
            raise UserError("give --text8-split or --text-split, not both")
        cut = int(len(text) * 0.9)
        text = text[:cut] if text_split == "train" else text[cut:]
    r = engine.score(text, per_char=per_char, unknown=unknown, replacement=replacement, normalize=normalize)
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


# --------------------------------------------------------------------------------------- sample
@main.command()
@click.option("--prompt", default="", help="Text to condition on (consumed before sampling).")
@click.option("-n", "n", type=int, default=200, show_default=True, help="Characters to generate.")
@click.option("--temperature", type=float, default=None, help="Logits are divided by it (default 1).")
@click.option("--inverse-temperature", "inverse_temperature", type=float, default=None,
              help="Logits are multiplied by it (the paper's section 3.1 samples at 1.5 and 2); instead of --temperature.")
@click.option("--top-k", type=int, default=None, help="Sample among the k most likely characters only.")
@click.option("--seed", type=int, default=None, help="Random seed; the same seed gives the same text.")
@click.option("--json", "as_json", is_flag=True)
@model_options
@normalize_option
@friendly
def sample(prompt, n, temperature, inverse_temperature, top_k, seed, as_json, model, path_mode, threads, backend,
           device, normalize):
    """Generate text after --prompt (the prompt goes through the model's normaliser first)."""
    if temperature is not None and inverse_temperature is not None:
        raise UserError("give --temperature or --inverse-temperature, not both")
    if inverse_temperature is not None:
        if not inverse_temperature > 0:
            raise UserError(f"--inverse-temperature must be positive; got {inverse_temperature}")
        temperature = 1.0 / inverse_temperature
    temperature = 1.0 if temperature is None else temperature
    engine = load_engine(model, path_mode, backend, device, threads)
    s = engine.sample(prompt, n=n, temperature=temperature, top_k=top_k, seed=seed, normalize=normalize)
    if as_json:
        emit_json(s.to_json())
    else:
        click.echo(s.prompt + s.text)


# --------------------------------------------------------------------------------------- attribute
@main.command()
@click.option("--text", required=True, help="The text to attribute.")
@click.option("--by", type=click.Choice(["char", "word"]), default="word", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the attribution as JSON.")
@click.option("--full", is_flag=True, help="With --json: include the whole kappa tensor (T, S, V) and the logits.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a heatmap PNG (like the paper's Figure 2).")
@click.option("--top", type=int, default=3, show_default=True, help="Sources listed per position in the text output.")
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
        from isan.engine.plot import plot_attribution

        plot_attribution(a, plot)
    if as_json:
        emit_json(a.to_json(full=full))
        return
    contrib = a.next_char_contributions()
    click.echo(f"sources: {len(a.sources)} ({by}s and <h0>); check max |b_ro + sum kappa - logits| = {a.max_abs_error:.2e}")
    n = a.normalization or {}
    if n.get("changed") or n.get("dropped") or n.get("skipped") or n.get("replaced"):
        click.echo(f"normalized {n['normalizer']}: {n['chars_read']} characters read, {n['chars_scored']} attributed "
                   f"({n['changed']} changed, {n['dropped']} dropped, {n['skipped']} skipped, {n['replaced']} replaced)")
    for t, ch in enumerate(a.text):
        nxt = a.text[t + 1] if t + 1 < len(a.text) else None
        label = repr(nxt) if nxt is not None else f"{a.alphabet.symbols[int(a.logits[t].argmax())]!r} (predicted)"
        order = [int(i) for i in abs(contrib[t]).argsort()[::-1][:top] if contrib[t][i] != 0]
        parts = ", ".join(f"{a.sources[i]!r} {contrib[t][i]:+.2f}" for i in order)
        click.echo(f"{t:4d} {ch!r} -> {label:16s} {parts}")
    if plot:
        click.echo(f"wrote {plot}")


# --------------------------------------------------------------------------------------- export
def table_options(fn):
    fn = click.option("--table-budget", default="16MB", show_default=True, help="Memory budget of the trie table (e.g. 8MB, 128MB); see `isan bench budgets`.")(fn)
    fn = click.option("--table-max-len", type=int, default=12, show_default=True, help="Longest substring in the table.")(fn)
    fn = click.option("--table-dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True)(fn)
    fn = click.option("--table-corpus", default=None, help="Text to mine (default: the model's training data, train split).")(fn)
    fn = click.option("--table-dataset", type=click.Choice(["text8", "text"]), default=None, help="How to split --table-corpus.")(fn)
    return fn


@main.command()
@click.argument("checkpoint_dir")
@click.argument("out_dir", type=click.Path())
@click.option("--which", type=click.Choice(["best", "latest"]), default="best", show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace OUT_DIR if it exists.")
@click.option("--onnx", "with_onnx", is_flag=True, help="Also write model.onnx (one step) and sequence.onnx.")
@click.option("--arpa", "arpa", is_flag=True,
              help="For an n-gram bundle: write it as an ARPA file at OUT_DIR (the format KenLM and SRILM read).")
@click.option("--table/--no-table", default=True, show_default=True, help="Build the composed trie table into OUT_DIR/table.")
@click.option("--table-mode", type=click.Choice(["full", "recipe"]), default=None,
              help="full (the default): write table/; recipe: write only the chosen keys, composed into the cache "
                   "on first use.")
@table_options
@click.option("--dry-run", is_flag=True, help="Only print the planned table's size and expected average match length.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--normalizer", "normalizer", default="auto", show_default=True,
              help="The text normalisation the model declares: auto (text8 for models trained on text8, else none), "
                   "none, or text8.")
@friendly
def export(checkpoint_dir, out_dir, which, overwrite, with_onnx, arpa, table, table_mode, table_budget, table_max_len,
           table_dtype, table_corpus, table_dataset, dry_run, progress, normalizer):
    """Write the runtime bundle of a training run: manifest.json, weights.safetensors, table/ (and ONNX).

    CHECKPOINT_DIR is a run directory of `isan train`; it may also be an existing bundle, or the
    word `default` for the shipped model, to copy it with ONNX graphs added (`--onnx`). An n-gram
    bundle (`isan train ngram`) exports with `--arpa` to an ARPA file (OUT_DIR is then the file).
    Atomic: an interrupted export leaves no directory at OUT_DIR.
    """
    from isan.engine import default_model_path

    src = default_model_path() if checkpoint_dir == "default" else Path(checkpoint_dir)
    if arpa:
        from isan.engine.ngram import load_ngram
        from isan.export.arpa import write_arpa

        if Path(out_dir).exists() and not overwrite:
            raise UserError(f"{out_dir} already exists; pass --overwrite to replace it")
        _, ngram, alphabet = load_ngram(src)
        emit_json(write_arpa(ngram, alphabet, out_dir))
        return
    if (src / "manifest.json").exists() and not dry_run:
        from isan.export.checkpoint import export_from_bundle

        if table_mode is not None or not table:
            raise UserError(f"{src} is already a bundle: it is copied with its table as it is, so --table-mode and "
                            f"--no-table do not apply; change its table with `isan table build --model BUNDLE "
                            f"--table-mode full|recipe --overwrite`")
        if not with_onnx:
            raise UserError(f"{src} is already a bundle; add --onnx to copy it with ONNX graphs")
        path = export_from_bundle(src, out_dir, overwrite=overwrite, onnx=True)
        m = json.loads((Path(path) / "manifest.json").read_text())
        click.echo(json.dumps({"bundle": str(path), "kind": m["kind"], "d": m["d"], "params_sha256": m["params_sha256"],
                               "onnx": m.get("onnx"), "files": sorted(p.name for p in Path(path).iterdir())}))
        return
    checkpoint_dir = str(src)
    if dry_run:
        from isan.export.tables import dry_run as plan

        click.echo(json.dumps(plan(checkpoint_dir, table_corpus, table_dataset, table_budget, table_max_len, table_dtype)))
        return
    from isan.export import export_bundle

    path = export_bundle(checkpoint_dir, out_dir, which=which, overwrite=overwrite, onnx=with_onnx, table=table,
                         table_budget=table_budget, table_max_len=table_max_len, table_dtype=table_dtype,
                         table_corpus=table_corpus, table_dataset=table_dataset, table_mode=table_mode or "full",
                         progress_bar=progress, normalizer=None if normalizer == "auto" else normalizer)
    m = json.loads((Path(path) / "manifest.json").read_text())
    emit_json({"bundle": str(path), "kind": m["kind"], "d": m["d"], "params_sha256": m["params_sha256"],
               "normalizer": m.get("normalizer"), "table": m.get("table"),
               "files": sorted(p.name for p in Path(path).iterdir())})


# --------------------------------------------------------------------------------------- table
@main.group()
def table():
    """Inspect and build composed trie tables."""


@table.command("info")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--json", "as_json", is_flag=True)
@friendly
def table_info(model, as_json):
    """Entries, bytes, dtype, length histogram and expected average match length of a model's table."""
    engine = load_engine(model, "composed")
    info = engine.table.info()
    if as_json:
        click.echo(json.dumps(info))
        return
    click.echo(f"table        {info['path']}")
    click.echo(f"entries      {info['entries']:,}")
    click.echo(f"bytes        {info['bytes']:,} ({info['bytes'] / 2**20:.1f} MiB of matrices, as budgeted; "
               f"{info['bytes_on_disk']:,} on disk with the index, trie and header)")
    click.echo(f"dtype        {info['dtype']}   d {info['d']}   max length {info['max_len']}")
    click.echo(f"avg match    {info['expected_avg_match_length']} characters (expected, {info['build'].get('avg_match_length_on', '?')})")
    click.echo("lengths      " + "  ".join(f"{k}:{v}" for k, v in info["length_histogram"].items()))


@table.command("build")
@click.option("--model", required=True, help="Bundle directory to add table/ to.")
@table_options
@click.option("--table-mode", type=click.Choice(["full", "recipe"]), default="full", show_default=True,
              help="full: write table/; recipe: write only the chosen keys, composed into the cache on first use.")
@click.option("--overwrite", is_flag=True, help="Replace an existing table/ or table recipe.")
@click.option("--dry-run", is_flag=True)
@friendly
def table_build(model, table_budget, table_max_len, table_dtype, table_corpus, table_dataset, table_mode, overwrite,
                dry_run):
    """Mine a corpus and build MODEL/table (atomically).

    The corpus is --table-corpus (relative to the working directory), else the one recorded in
    MODEL's manifest (relative to the bundle), so this works from any directory.
    """
    from isan.export.tables import build_bundle_table, dry_run as plan

    if dry_run:
        emit_json(plan(model, table_corpus, table_dataset, table_budget, table_max_len, table_dtype))
        return
    emit_json(build_bundle_table(model, table_corpus, table_dataset, budget=table_budget, max_len=table_max_len,
                                 dtype=table_dtype, overwrite=overwrite, progress_bar=True, mode=table_mode))


# --------------------------------------------------------------------------------------- model
@main.group("model")
def model_group():
    """Diagnose a model."""


@model_group.command("check")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--max-chars", type=int, default=2000, show_default=True,
              help="Characters every repeated run is stepped from h0 before slow ones go on in jumps.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def model_check(model, max_chars, as_json):
    """Can any input make the model's state diverge? The certificate, repeats, and a search.

    A certified model (isan train --stable-rho) carries a proof that no input can: it is
    recomputed here from the bundle's own weights. Every model is also checked exactly for
    repeats: a letter x, or a pair xy, repeated diverges if and only if the spectral radius of
    W[x] (of W[y] W[x]) is above 1; for each such run the number of characters from h0 until
    max |h| passes the engine's limit is found, the point where scoring stops with exit status 2.
    Last, a beam search over letters looks for the text that makes |h| largest.
    """
    engine = load_engine(model, "reference")
    if not hasattr(engine, "check_divergence"):
        raise UserError(f"`isan model check` needs an ISAN bundle; this is a {engine.describe().get('kind')} model")
    r = engine.check_divergence(max_chars=max_chars)
    if as_json:
        emit_json(r)
        return
    c = r["certificate"]
    if c is None:
        click.echo("certificate: none (train with `isan train --stable-rho RHO` for a model that cannot diverge)")
    elif c["holds"]:
        click.echo(f"certificate: holds, rho = {c['rho']:.6f} (max over symbols of ||P W_x P^-1||_2, recomputed in "
                   f"float64; cond(P) = {c['cond_P']:.3g}): for every input, max |h_i| <= {c['state_bound']:.4g}, "
                   f"and a start-state error shrinks at least as cond(P) rho^t")
    else:
        click.echo(f"certificate: DOES NOT HOLD: {c['problem']}")
    sr = r["spectral_radius"]
    worst = max(sr["letters"], key=sr["letters"].get)
    click.echo(f"spectral radius: letters up to {sr['max_letter']:.4f} ({worst!r}), pairs up to "
               f"{sr['max_pair']:.4f}; above 1: {r['diverging_letters']} of {r['n_letters_checked']} letters, "
               f"{r['diverging_pairs']} of {r['n_pairs_checked']} ordered pairs")

    def fmt(x, name):
        n = x["after_chars"]
        return f"{x[name]!r} {n:,}" if n is not None else f"{x[name]!r} >{r['max_total_chars']:,}"

    click.echo(f"repeats from h0 that leave the range max |h| <= {r['limit']:g} (characters until then):")
    click.echo(f"  letters ({len(r['letters'])}): " + (", ".join(fmt(x, "symbol") for x in r["letters"]) or "none"))
    pairs = r["pairs"]
    more = f", ... ({len(pairs) - 20} more; --json lists all)" if len(pairs) > 20 else ""
    click.echo(f"  pairs ({len(pairs)}): " + (", ".join(fmt(x, "pair") for x in pairs[:20]) or "none") + more)
    click.echo(f"  the other {r['converging']} repeats converge; their largest fixed point has max |h_i| = "
               f"{r['largest_fixed_point']:.4g}")
    a = r["adversarial"]
    verdict = (f"leaves the range after {a['chars']} characters" if a["diverged"]
               else f"max |h_i| = {a['max_abs_h']:.4g} at most (searched {a['searched_chars']} characters)")
    click.echo(f"adversarial search (beam {a['beam']}): {verdict}; text ...{a['text'][-40:]!r}")
    click.echo(f"({r['seconds'] + a['seconds']:.1f} s)")


# --------------------------------------------------------------------------------------- verify
@main.command("verify")
@click.argument("bundle", required=False, default=None)
@click.option("--json", "as_json", is_flag=True)
@friendly
def verify(bundle, as_json):
    """Check every file of BUNDLE (default: the shipped model) against the sha256 its manifest records.

    Also checks the manifest's own hash, the trie table (every section, and the cached table of
    a recipe), and the ONNX graphs (in the bundle, or cached on first use). Exit status 2 if
    anything is damaged.
    """
    from isan.engine.core import default_model_path, verify_all

    r = verify_all(Path(bundle) if bundle else default_model_path())
    if as_json:
        emit_json(r)
    else:
        for name, status in r["checked"].items():
            click.echo(f"{status if status == 'ok' else 'BAD'}\t{name}" + ("" if status == "ok" else f"\t{status}"))
        for key in ("table", "cached_table", "onnx"):
            if r.get(key) is not None:
                click.echo(f"{'ok' if r[key] == 'ok' else 'BAD'}\t{key}" + ("" if r[key] == "ok" else f"\t{r[key]}"))
        for name in r["unlisted"]:
            click.echo(f"note\t{name}\tnot listed in the manifest")
        if r.get("warning"):
            click.echo(f"warning: {r['warning']}")
    if not r["ok"]:
        raise UserError(f"{len(r['problems'])} problem(s); first: {r['problems'][0]}")
    if not as_json:
        click.echo(f"{r['bundle']}: ok")

# --------------------------------------------------------------------------------------- bench
@main.group()
def bench():
    """Benchmarks: medians over repeats, ratios against a baseline run in the same process."""


@bench.command("engine")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True,
              help="text8 file: scoring runs on the characters after text8-10M (from offset 10,000,000).")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--threads", type=int, default=None, help="Threads for the compiled kernels (default: all this process may use).")
@click.option("--peers/--no-peers", default=True, show_default=True,
              help="Also run onnxruntime's LSTM of equal parameters and KenLM (where installed).")
@click.option("--quick", is_flag=True, help="Small sizes (60,000 characters of long text): a check that it runs, not a measurement.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_engine_cmd(model, data, repeats, threads, peers, quick, progress, out):
    """Long-text (2.5M unseen characters, chunk-parallel), streaming (1,000-character chunks, float32
    and float16 tables), batched (256 x 2,000) and ingestion throughput against the per-character
    reference in the same process, with onnxruntime's LSTM and KenLM as peers; start-up, memory,
    exactness and where the time goes."""
    from isan.engine.bench import QUICK_SIZES, bench_engine, markdown, write_json

    if threads is not None and threads < 1:
        raise UserError(f"--threads must be at least 1; got {threads}")
    result = bench_engine(model, data, repeats=repeats, threads=threads, peers=peers, progress=progress,
                          log=lambda m: click.echo(m, err=True), sizes=QUICK_SIZES if quick else None)
    click.echo(markdown(result))
    if out:
        write_json(result, out)
        click.echo(f"\nwrote {out}")


@bench.command("budgets")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file: mined on train, timed on test.")
@click.option("--budgets", default="8MB,16MB,32MB,128MB", show_default=True)
@click.option("--dtypes", default="float32,float16", show_default=True)
@click.option("--chars", type=int, default=200_000, show_default=True, help="Test characters streamed per timing.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--threads", type=int, default=None, help="Threads for the second column (default: all this process may use).")
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_budgets_cmd(model, data, budgets, dtypes, chars, repeats, threads, out):
    """Streaming through the table (1,000-character calls) against its size and storage type:
    longer matches against jumps that read from memory rather than the L3 cache."""
    from isan.engine.bench import bench_budgets, markdown_budgets, write_json
    from isan.engine.data import read_text8_split

    result = bench_budgets(model, read_text8_split(data, "train"), read_text8_split(data, "test"),
                           [b.strip() for b in budgets.split(",") if b.strip()], repeats=repeats, chars=chars,
                           dtypes=tuple(d.strip() for d in dtypes.split(",") if d.strip()), threads=threads,
                           log=lambda m: click.echo(m, err=True))
    click.echo(markdown_budgets(result))
    if out:
        write_json(result, out)
        click.echo(f"\nwrote {out}")


@bench.command("train")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file; chunks of the train split are used.")
@click.option("--budgets", default=None, help="Comma-separated parameter budgets (default: Table 1's).")
@click.option("--models", default=None, help="Comma-separated models (default: Table 1's five, the ISAN first).")
@click.option("--batch", type=int, default=32, show_default=True, help="Streams B (the Table 1 protocol's).")
@click.option("--steps", type=int, default=5, show_default=True, help="Optimizer steps per timing.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--reference/--no-reference", default=True, show_default=True,
              help="Also time the baselines' per-step loop (forward_reference).")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's).")
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_train_cmd(data, budgets, models, batch, steps, repeats, reference, threads, out):
    """Training throughput (chars/s of forward+backward+Adam) of each Table 1 model at each budget (needs torch)."""
    try:
        from isan.train.bench import bench_train, markdown_train
    except ImportError as e:
        raise IsanError(f"`isan bench train` needs torch ({e}); pip install torch==2.13.0 -e '.[train]'") from None
    import numpy as np

    from isan.alphabet import Alphabet
    from isan.engine.bench import write_json
    from isan.engine.data import read_text8_split
    from isan.train.models import MODELS

    chosen = {}  # only what was given; bench_train's defaults are Table 1's budgets and models
    if models is not None:
        names = tuple(m.strip() for m in models.split(",") if m.strip())
        unknown = [m for m in names if m not in MODELS]
        if unknown or not names:
            raise click.BadParameter(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}", param_hint="--models")
        chosen["models"] = names
    if budgets is not None:
        try:
            chosen["budgets"] = [(b.strip(), float(b)) for b in budgets.split(",") if b.strip()]
        except ValueError:
            raise click.BadParameter(f"{budgets!r} is not a comma-separated list of numbers", param_hint="--budgets") from None
    ids = Alphabet.text8().encode(read_text8_split(data, "train")[:2_000_000]).astype(np.int64)
    result = bench_train(ids, **chosen, batch=batch, steps=steps, repeats=repeats, reference=reference,
                         threads=threads, log=lambda m: click.echo(m, err=True))
    if out:
        write_json(result, out)
    click.echo(markdown_train(result))
    if out:
        click.echo(f"\nwrote {out}")


@bench.command("onnx")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file; the test split is used.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--batch", type=int, default=64, show_default=True, help="Streams in the batched measurement.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True)
@click.option("--out", default=None, help="Write the JSON results here (nothing is written without it).")
@friendly
def bench_onnx_cmd(data, repeats, batch, device, out):
    """onnxruntime: ISAN d=216 vs an LSTM of equal parameters (548 units): step latency, streaming, batched."""
    from isan.engine.bench import bench_onnx, markdown_onnx, write_json
    from isan.engine.data import read_text8_split

    result = bench_onnx(read_text8_split(data, "test"), repeats=repeats, batch=batch, device=device,
                        log=lambda m: click.echo(m, err=True))
    if out:
        write_json(result, out)
    click.echo(markdown_onnx(result))
    if out:
        click.echo(f"\nwrote {out}")


@bench.command("serve")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8 file: texts from the valid and test splits.")
@click.option("--clients", type=int, default=100, show_default=True, help="HTTP clients posting at once.")
@click.option("--text-chars", type=int, default=1000, show_default=True, help="Characters per HTTP request.")
@click.option("--duration", type=float, default=10.0, show_default=True, help="Seconds of HTTP load.")
@click.option("--streams", type=int, default=1000, show_default=True, help="WebSocket streams open at once.")
@click.option("--chunks", type=int, default=5, show_default=True, help="Chunks each stream sends.")
@click.option("--chunk-chars", default="1-400", show_default=True,
              help="Characters per chunk: N, or MIN-MAX for sizes drawn uniformly (seeded by --seed).")
@click.option("--big-chars", type=int, default=1_000_000, show_default=True, help="Characters of the memory and cancel probes' requests.")
@click.option("--big-requests", type=int, default=4, show_default=True, help="Concurrent big requests in the memory probe.")
@click.option("--slow-conns", type=int, default=500, show_default=True,
              help="Connections of the slow-body probe (each sends 14 of the 1,000 bytes it declares).")
@click.option("--cancel-clients", type=int, default=12, show_default=True,
              help="Clients of the cancel probe (each sends up to 500,000 characters and leaves).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the stream texts and chunk sizes.")
@click.option("--only", default="http,stream,memory,cancel,slow", show_default=True,
              help="Which measurements, comma-separated.")
@click.option("--server-args", default="", help='Options for isan-serve, e.g. "--no-batching --threads 1".')
@click.option("--out", default=None, help="Also write the results as JSON here.")
@friendly
def bench_serve_cmd(model, data, clients, text_chars, duration, streams, chunks, chunk_chars, big_chars, big_requests,
                    slow_conns, cancel_clients, seed, only, server_args, out):
    """isan-serve under load (a real server process on localhost): HTTP requests/s and latency, WebSocket
    chunk latency and memory, memory under concurrent big requests, the work dropped when a client leaves,
    and connections that send their body slowly; every answer is checked against the library's offline bits."""
    import shlex

    from isan.engine.serve.loadgen import markdown, run_bench, write_json

    which = tuple(w.strip() for w in only.split(",") if w.strip())
    bad = [w for w in which if w not in ("http", "stream", "memory", "cancel", "slow")]
    if bad:
        raise click.BadParameter(f"unknown measurement(s) {bad}; choose from http, stream, memory, cancel, slow",
                                 param_hint="--only")
    result = run_bench(model=model, data=data, clients=clients, text_chars=text_chars, duration_s=duration,
                       streams=streams, chunks=chunks, chunk_chars=chunk_chars, big_chars=big_chars,
                       big_requests=big_requests, slow_conns=slow_conns, cancel_clients=cancel_clients, seed=seed,
                       server_args=shlex.split(server_args), which=which,
                       progress=lambda m: click.echo(m, err=True))
    click.echo(markdown(result))
    if out:
        write_json(result, out)
        click.echo(f"\nwrote {out}")


# ------------------------------------------------------------------------ command groups in other modules
if __name__ == "__main__":  # pragma: no cover
    # `python -m isan.cli`: run the module proper (isan.cli), whose command groups below import it back
    from isan.cli import main as _main

    sys.exit(_main())
else:
    from isan.cli_analyze import analyze  # the paper's studies (isan/cli_analyze.py)

    main.add_command(analyze)
    from isan.cli_studies import study  # the related work's baselines (isan/cli_studies.py)

    main.add_command(study)
