"""``isan train``: every model of train/, the n-gram, data parallelism."""

from __future__ import annotations

import json
import logging

import click

from isan.click_types import FiniteFloat, WholeNumber, count_text
from isan.cli.helpers import DEFAULT_TEXT8, NON_NEGATIVE_FLOAT, POSITIVE_FLOAT, POSITIVE_INT, SEED, IntList, friendly, main


class CharCount(WholeNumber):
    """A number of characters: a whole number (``36000000``, ``36e6``), finite, 0 or more, that fits in
    memory (:mod:`isan.train.synthetic_budget`); anything else is a usage error (exit 2) that says why."""

    name = "N"

    def __init__(self):
        super().__init__(min=0)

    def convert(self, value, param, ctx):
        from isan.train.synthetic_budget import synthetic_chars_problem

        if isinstance(value, str):
            number = count_text(value)
            if number is None:
                self.fail(f"{value!r} is not a number of characters (e.g. 36000000 or 36e6)", param, ctx)
            value = number
        problem = synthetic_chars_problem(value)
        if problem:
            self.fail(problem, param, ctx)
        return int(value)


@main.command(short_help="Train a model on text8-10M or a text file (resumes --out).")
@click.argument("model", default="isan")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Run directory (checkpoints, log); an existing run there is resumed.")
@click.option("--data", default=DEFAULT_TEXT8, show_default=True, help="text8, text8.zip, text8_head.txt, or any text file with --dataset text.")
@click.option("--dataset", type=click.Choice(["text8", "text"]), default="text8", show_default=True, help="text8: the text8-10M split; text: first 90% train, last 10% valid.")
@click.option("--params", type=POSITIVE_FLOAT, default=1.28e6, show_default=True,
              help="Parameter budget; the largest hidden size within it is used.")
@click.option("--d", "--hidden", "d", type=POSITIVE_INT, default=None,
              help="Hidden size (overrides --params); under torchrun write --hidden (torchrun reads --d as its own).")
@click.option("--batch-size", type=POSITIVE_INT, default=256, show_default=True, help="Parallel streams B.")
@click.option("--bptt", type=POSITIVE_INT, default=64, show_default=True, help="Truncated BPTT length T.")
@click.option("--lr", type=POSITIVE_FLOAT, default=2e-3, show_default=True, help="Learning rate (Adam).")
@click.option("--lr-decay", type=FiniteFloat(0, 1, min_open=True), default=0.5, show_default=True, help="Rate factor when valid bpc does not improve (1: none).")
@click.option("--weight-decay", type=NON_NEGATIVE_FLOAT, default=0.0, show_default=True)
@click.option("--clip", type=POSITIVE_FLOAT, default=1.0, show_default=True, help="Gradient norm clipping: the largest norm of a step's gradient.")
@click.option("--max-epochs", type=POSITIVE_INT, default=30, show_default=True)
@click.option("--max-chars", type=WholeNumber(min=1), default=None,
              help="Budget in training characters seen (e.g. 36000000 or 36e6; default: no limit).")
@click.option("--max-steps", type=POSITIVE_INT, default=None,
              help="Stop after this many optimizer steps, at least 1 (default: no limit).")
@click.option("--patience", type=POSITIVE_INT, default=2, show_default=True,
              help="Evaluations without improvement before early stopping.")
@click.option("--eval-every", type=POSITIVE_FLOAT, default=1.0, show_default=True, help="Epochs between validation evaluations.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the initial weights and the data order.")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--threads", type=POSITIVE_INT, default=None, help="torch CPU threads.")
@click.option("--init-scale", type=NON_NEGATIVE_FLOAT, default=None,
              help="irnn only: the recurrent matrix starts at this multiple of the identity (Le et al. 2015; default 1).")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--orders", type=IntList(min=1), default="2,3,4,5,6,7,8", show_default=True,
              help="ngram only: orders to try; the best on valid is kept.")
@click.option("--alphabet", "alphabet", type=click.Choice(["chars", "bytes", "pairs", "words"]), default="chars",
              show_default=True,
              help="Tokens: characters; UTF-8 bytes (256 outputs, --inputs inputs); pairs of characters "
                   "(27^2 for text8); whitespace words. Bits (bpc in the logs) are per token.")
@click.option("--inputs", type=click.IntRange(2, 256), default=70, show_default=True,
              help="bytes only: input symbols K, the K-1 most frequent bytes of the train part plus one 'other'.")
@click.option("--valid-data", default=None, type=click.Path(dir_okay=False),
              help="With --dataset text: all of --data is train and this file is valid.")
@click.option("--distributed", is_flag=True,
              help="Data-parallel training under torchrun (gloo on CPU, nccl on CUDA); "
                   "torchrun --nproc_per_node N -m isan.train.ddp MODEL ... adds it.")
@click.option("--stable-rho", type=FiniteFloat(0, 1, min_open=True, max_open=True), default=None,
              help="isan only: a certified stable ISAN, W_x = P^-1 U_x P with ||U_x||_2 <= RHO < 1 after every step; "
                   "no input can make its state diverge (the export writes the certificate).")
@click.option("--stable-basis", is_flag=True, help="With --stable-rho: learn the basis P (else P = I).")
@click.option("--stable-exact-every", type=POSITIVE_INT, default=1, show_default=True,
              help="With --stable-rho: project onto the bound every N steps (N > 1 is faster; the bound then "
                   "holds at those steps and for the evaluated, saved and exported weights).")
@click.option("--state-dropout", type=FiniteFloat(0, 1, max_open=True), default=0.0, show_default=True,
              help="isan only: dropout on the states before the readout (the recurrence stays exact).")
@click.option("--ema", type=FiniteFloat(0, 1, max_open=True), default=0.0, show_default=True,
              help="Decay of an exponential moving average of the weights, evaluated beside them and saved as "
                   "best when better (e.g. 0.999; 0: none).")
@click.option("--lr-schedule", type=click.Choice(["plateau", "cosine"]), default="plateau", show_default=True,
              help="plateau: times --lr-decay when valid does not improve; cosine: from --lr to --lr-min x lr over "
                   "the budget (--max-chars, --max-steps or --max-epochs; a resume that raises it stretches the curve).")
@click.option("--lr-min", type=FiniteFloat(0, 1), default=0.02, show_default=True, help="cosine: the final rate as a fraction of --lr.")
@click.option("--teacher", multiple=True, type=click.Path(file_okay=False),
              help="An exported ISAN bundle with the data's alphabet, trained on the same train split: distil "
                   "from its next-character distributions (with --distill). Given several times: an ensemble, "
                   "distilled as the mixture (mean) of their distributions.")
@click.option("--distill", type=FiniteFloat(0, 1), default=0.0, show_default=True,
              help="With --teacher: the loss is (1 - A) CE(next character) + A CE(teacher's distribution).")
@click.option("--synthetic-chars", type=CharCount(), default=0, show_default=True,
              help="With --teacher: sample this many characters of text from the teacher (the ensemble's "
                   "mixture), kept with its distributions in --out, and train on it beside the train split.")
@click.option("--structure", type=click.Choice(["dense", "dplr"]), default="dense", show_default=True,
              help="isan only: each symbol's map dense (d x d), or dplr: diag(a) + U V^T with U, V (d x R), "
                   "d (2R + 1) multiply-adds a step (issue #48; needs --d and --rank).")
@click.option("--rank", type=POSITIVE_INT, default=None, help="With --structure dplr: the rank R of U V^T.")
@friendly
def train(model, out_dir, data, dataset, params, d, batch_size, bptt, lr, lr_decay, weight_decay, clip, max_epochs,
          max_chars, max_steps, patience, eval_every, seed, device, threads, init_scale, progress, orders,
          alphabet, inputs, valid_data, distributed, stable_rho, stable_basis, stable_exact_every, state_dropout,
          ema, lr_schedule, lr_min, teacher, distill, synthetic_chars, structure, rank):
    """Train MODEL (default: isan) on text8-10M or a text file; resumes a run found in --out.

    MODEL: isan, rnn, irnn, gru, lstm, linear, linear_nlro, isan_nobias, or ngram (interpolated
    Kneser-Ney, counted in numpy; --out is then the bundle directory). Writes a checkpoint
    directory for `isan export`. Several processes or machines: run it under torchrun with
    --distributed (see isan.train.ddp).
    """
    if model == "ngram":
        if alphabet != "chars" or valid_data or distributed:
            raise click.UsageError("ngram trains on characters in one process (no --alphabet, --valid-data, --distributed)")
        from isan.train.ngram import train_ngram

        info = train_ngram(data, out_dir, orders=orders, dataset=dataset)
        click.echo(json.dumps(info))
        return
    if init_scale is not None and model != "irnn":
        raise click.UsageError("--init-scale applies to irnn only")
    if stable_basis and not stable_rho:
        raise click.UsageError("--stable-basis goes with --stable-rho RHO")
    if structure != "dense" or rank is not None:
        from isan.train.structured import structure_problem

        problem = structure_problem(structure, rank, model, d, stable_rho, stable_basis, ",".join(teacher) or None,
                                    alphabet, distributed)
        if problem:
            raise click.UsageError(problem)
    from isan.train.loop import TrainConfig, Trainer

    cfg = TrainConfig(model=model, d=d, params=None if d else params, data=data, dataset=dataset,
                      batch_size=batch_size, bptt=bptt, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                      clip=clip, max_epochs=max_epochs, max_chars=max_chars,
                      max_steps=max_steps, patience=patience, eval_every=eval_every, seed=seed, device=device,
                      threads=threads, init_scale=init_scale, alphabet=alphabet, inputs=inputs,
                      valid_data=valid_data, stable_rho=stable_rho, stable_basis=stable_basis,
                      stable_exact_every=stable_exact_every, state_dropout=state_dropout, ema=ema,
                      lr_schedule=lr_schedule, lr_min=lr_min, teacher=",".join(teacher) or None, distill=distill,
                      synthetic_chars=synthetic_chars, structure=structure, rank=rank)
    # on resume the saved config rules, except for the budget options given on this command line
    # (a default must not override: `--patience` defaulting to 2 ended a resumed run set to 1000)
    ctx = click.get_current_context()
    given = {name for name in ("max_epochs", "max_chars", "max_steps", "patience", "threads", "device")
             if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)}
    overrides = {k: v for k, v in {"max_epochs": max_epochs, "max_chars": cfg.max_chars, "max_steps": max_steps,
                                   "patience": patience, "threads": threads, "device": device}.items() if k in given}
    dist = None
    if distributed:
        from isan.train.ddp import init_from_env

        dist = init_from_env(device)
    try:
        if not progress:  # no bar: a line per validation instead, so a log shows the run is alive
            logging.getLogger("isan.train").setLevel(logging.INFO)
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
