"""``isan export`` (bundles, ONNX, ARPA) and ``isan table`` (info, build)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from isan.cli.helpers import (UserError, emit_json, friendly, load_engine, main, table_options)


@main.command(short_help="Write the runtime bundle of a training run (and ONNX).")
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
        from isan.engine.baselines.ngram import load_ngram
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

@main.group()
def table():
    """Inspect and build composed trie tables."""


@table.command("info", short_help="Entries, bytes, dtype and average match of a model's table.")
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
