"""``isan study``: the related-work studies of issue #15 (thin: parse, call the library, report).

``isan study elman data|fig1|export|neural|kappa|table`` (:mod:`isan.train.studies.elman_study`,
:mod:`isan.train.studies.elman_neural`) and ``isan study occam gates|table`` (:mod:`isan.train.studies.occam_study`).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import click

from isan.cli.helpers import DEFAULT_TEXT8, NON_NEGATIVE_INT, POSITIVE_INT, IntList


def _setup(threads: int = 1) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:  # pragma: no cover - the numpy parts run without torch
        pass


@click.group(short_help="Related-work studies: Elman's grammar, the Occam-gated LSTM.")
def study() -> None:
    """Related-work studies: Elman's grammar (ESN, NPM, ISAN, LSTM) and the Occam-gated LSTM."""


@study.group(short_help="Elman's grammar: ESN, NPM, an ISAN and an LSTM (Fig 1).")
def elman() -> None:
    """Elman's grammar: ESN and NPM (Cernansky and others, 2008, Fig 1), an ISAN and an LSTM."""


@elman.command("data", short_help="Generate the sentences, check them, write entropy.json.")
@click.option("--out", default="results/elman", show_default=True, type=click.Path(file_okay=False))
@click.option("--data-dir", default="runs/elman/data", show_default=True, type=click.Path(file_okay=False),
              help="Where the (seeded, regenerable) train/valid/test text files go.")
def elman_data(out, data_dir):
    """Generate the sentences, check them, and write entropy.json (H of the test set)."""
    from isan.train.studies.elman_study import write_data

    s = write_data(Path(out), Path(data_dir))
    t = s["splits"]["test"]
    click.echo(f"test: {t['sentences']:,} sentences, {t['symbols']:,} symbols, H = {t['entropy']['nnl']:.4f} NNL "
               f"({t['entropy']['bits_per_symbol']:.4f} bits/word); grammatical {t['grammatical_oracle']:,}")


@elman.command("fig1", short_help="Train and score every model of Fig 1 (resumable).")
@click.option("--out", default="results/elman", show_default=True, type=click.Path(file_okay=False))
@click.option("--runs", type=POSITIVE_INT, default=10, show_default=True)
@click.option("--models", default="esn-paper,esn+-paper,npm-u,npm-u+eq6,npm-t-ekf", show_default=True,
              help="The paper's models as written (default; esn-paper also writes esn-paper-tf), or the first "
                   "study's variants: esn (dense, ridge), esn+ (transition ratios), npm-u+ (transition ratios), npm-t (Adam).")
@click.option("--sizes", type=IntList(min=1), default=None, help="Reservoir sizes, comma-separated (default: the study's).")
@click.option("--contexts", type=IntList(min=1), default=None, help="NPM context counts, comma-separated (default: the study's).")
@click.option("--log-name", default="fig1_runs.jsonl", show_default=True)
@click.option("--run-from", type=NON_NEGATIVE_INT, default=0, show_default=True,
              help="First run index (to split the runs over processes, each with its own --log-name).")
def elman_fig1(out, runs, models, sizes, contexts, log_name, run_from):
    """Train and score every model of Fig. 1; appends to OUT/fig1_runs.jsonl (resumable)."""
    from isan.train.studies import elman_study as S

    _setup()
    kw = {}
    if sizes:
        kw["esn_sizes"] = sizes
    if contexts:
        kw["contexts"] = contexts
    p = S.run_fig1(Path(out), runs=runs, models=tuple(m.strip() for m in models.split(",")), log_name=log_name,
                   run_from=run_from, **kw)
    click.echo(f"wrote {p}")


@elman.command("export", short_help="Write one ESN / NPM bundle per model and score it back.")
@click.option("--out", default="results/elman", show_default=True, type=click.Path(file_okay=False))
def elman_export(out):
    """Write one ESN / NPM bundle per model (run 0) and score each back through its loader."""
    from isan.train.studies.elman_study import export_bundles

    _setup()
    for r in export_bundles(Path(out)):
        click.echo(f"{r['bundle']}: NNL direct {r['nnl_direct']:.6f}, through the bundle {r['nnl_bundle']:.6f}")


@elman.command("neural", short_help="Score a word-alphabet model of `isan train` on the test set.")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--name", required=True, help="Name of the record (results/elman/neural/NAME.json).")
@click.option("--label", default=None)
@click.option("--command", "command", default="", help="The training command, recorded beside the score.")
@click.option("--out", default="results/elman", show_default=True, type=click.Path(file_okay=False))
def elman_neural(run_dir, name, label, command, out):
    """Score a model trained by `isan train ... --alphabet words` on the Elman test set (NNL, bits)."""
    from isan.train.studies.elman_neural import score_run

    _setup()
    r = score_run(Path(run_dir), label=label or name, command=command)
    d = Path(out) / "neural"
    (d / name).mkdir(parents=True, exist_ok=True)
    for f in ("train_log.jsonl", "config.json"):  # the committed logs the record comes from
        shutil.copyfile(Path(run_dir) / f, d / name / f)
    (d / f"{name}.json").write_text(json.dumps(r, indent=1) + "\n")
    click.echo(json.dumps({k: r[k] for k in ("label", "test_nnl", "test_bits_per_word", "n_params")}))


@elman.command("kappa", short_help="The ISAN's word-level kappa at the main verb (kappa.json).")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", default="results/elman", show_default=True, type=click.Path(file_okay=False))
def elman_kappa(run_dir, out):
    """The ISAN's word-level kappa at the main verb after a relative clause (kappa.json)."""
    from isan.train.studies.elman_neural import kappa_study

    _setup()
    r = kappa_study(Path(run_dir))
    (Path(out) / "kappa.json").write_text(json.dumps(r, indent=1) + "\n")
    click.echo(json.dumps({k: v for k, v in r.items() if k != "examples"}))


@elman.command("table", short_help="Rewrite TABLE.md, table.json and fig1.png from the logs.")
@click.option("--results", default="results/elman", show_default=True, type=click.Path(file_okay=False))
def elman_table(results):
    """Rewrite TABLE.md, table.json and fig1.png from the committed logs (no training)."""
    from isan.train.studies.elman_study import write_table

    write_table(Path(results))
    click.echo((Path(results) / "TABLE.md").read_text())


@study.group()
def occam() -> None:
    """Raiman and Sidor's Occam-gated LSTM on text8-10M."""


@occam.command("score", short_help="Score a trained Occam LSTM on test and a train slice.")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--name", required=True)
@click.option("--data", default=DEFAULT_TEXT8, show_default=True)
@click.option("--out", default="results/occam", show_default=True, type=click.Path(file_okay=False))
@click.option("--max-chars", type=POSITIVE_INT, default=None, help="Score only the first N characters of each split.")
def occam_score(run_dir, name, data, out, max_chars):
    """Score a trained Occam LSTM (best checkpoint) on test and a train slice; gate statistics; OUT/NAME/score.json."""
    from isan.train.studies.occam_study import score_run

    _setup()
    r = score_run(Path(run_dir), data, Path(out) / name, max_chars=max_chars)
    click.echo(json.dumps({k: v for k, v in r.items() if k != "gate_stats"}))


@occam.command("gates", short_help="Render the gates over a test passage (PNG and HTML).")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--name", required=True)
@click.option("--data", default=DEFAULT_TEXT8, show_default=True)
@click.option("--out", default="results/occam", show_default=True, type=click.Path(file_okay=False))
@click.option("--chars", type=POSITIVE_INT, default=360, show_default=True, help="Length of the rendered test passage.")
def occam_gates(run_dir, name, data, out, chars):
    """Render the gates over a test passage as highlights (PNG and HTML, like the paper's Figs 9-10)."""
    from isan.train.studies.occam_study import render_gates

    _setup()
    for p in render_gates(Path(run_dir), data, Path(out) / name, chars=chars):
        click.echo(f"wrote {p}")


@occam.command("export", short_help="Write an Occam LSTM as a bundle, checked against torch.")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--data", default=DEFAULT_TEXT8, show_default=True)
def occam_export(run_dir, out_dir, data):
    """Write a trained Occam LSTM as a bundle and check its numpy scorer against torch."""
    from isan.train.studies.occam_study import export_bundle

    _setup()
    click.echo(json.dumps(export_bundle(Path(run_dir), Path(out_dir), data)))


@occam.command("table", short_help="Rewrite TABLE.md and table.json from the logs and scores.")
@click.option("--results", default="results/occam", show_default=True, type=click.Path(file_okay=False))
def occam_table(results):
    """Rewrite TABLE.md and table.json from the committed logs and scores (no training)."""
    from isan.train.studies.occam_study import write_table

    write_table(Path(results))
    click.echo((Path(results) / "TABLE.md").read_text())
