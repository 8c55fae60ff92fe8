"""``isan corpus score``: score every document of a corpus, on this machine or on a Ray cluster
(the library: :mod:`isan.engine.corpus`)."""

from __future__ import annotations

import sys

import click

from isan.click_types import WholeNumber
from isan.cli.helpers import (POSITIVE_FLOAT, UserError, deprecated_option, emit_json, friendly, main,
                              normalize_option, unknown_options)
from isan.engine.corpus.job import EXECUTORS
from isan.engine.corpus.lines import MAX_LINE_BYTES
from isan.engine.kernels.backends import default_backend

#: processes (workers, readers) and kernel threads a job may ask for
MAX_PROCESSES = 1024


@main.group(short_help="Score a corpus's documents into resumable Parquet shards.")
def corpus():
    """Corpora: score every document (JSONL, Parquet, text) into resumable Parquet shards."""


def _existing_inputs(ctx, param, inputs):
    """A local path without glob characters that does not exist is a usage error (exit 2), as a glob that
    matches nothing is; directories, globs and URLs are expanded (and checked) by the job."""
    import os

    from isan.engine.corpus.readers import is_url

    for raw in inputs:
        p = raw[len("file://"):] if raw.startswith("file://") else raw
        if not is_url(p) and not any(c in p for c in "*?[") and not os.path.exists(p):
            raise click.BadParameter(f"{raw} does not exist; give JSONL, Parquet or text files, directories or "
                                     "globs (quoted) of them, or URLs", ctx=ctx, param=param)
    return inputs


@corpus.command("score", short_help="Score every document of INPUT... into resumable Parquet shards.")
@click.argument("inputs", nargs=-1, required=True, callback=_existing_inputs)
@click.option("--out", required=True, help="Output directory (an existing one of the same job is resumed).")
@click.option("--format", "fmt", type=click.Choice(["auto", "jsonl", "parquet", "text"]), default="auto",
              show_default=True, help="Input format (auto: by file name; .jsonl/.json/.ndjson[.gz|.zst], .parquet, else text).")
@click.option("--text-field", default="text", show_default=True, help="JSON field / Parquet column of the text.")
@click.option("--id-field", default="id", show_default=True,
              help="JSON field / Parquet column of the id (absent: FILE:LINE or FILE:ROW).")
@click.option("--per-line", is_flag=True, help="Text files: one document a non-blank line (default: one a file).")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="Where the job runs: local, this machine's cores through the batched kernels; ray, Ray Data "
                   "actors, one engine each.")
@deprecated_option("--runner", "--executor", "executor", type=click.Choice(EXECUTORS))
@click.option("--ray-address", default=None,
              help="A running Ray cluster (HOST:6379 or ray://HOST:10001; default: start a local one). Implies "
                   "--executor ray.")
@click.option("--ray-actors", type=WholeNumber(1, MAX_PROCESSES), default=None,
              help="Ray actors (default: the cluster's CPUs / --ray-cpus-per-actor).")
@click.option("--ray-cpus-per-actor", type=POSITIVE_FLOAT, default=1.0, show_default=True,
              help="CPUs (and kernel threads) per actor.")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--batch-chars", type=WholeNumber(min=1), default=None,
              help="Characters scored together in one call of the batched kernel (memory: about 40 bytes each; "
                   "default: the backend's, 2,000,000 on the CPU, 32,000,000 on a GPU).")
@click.option("--per-char-max", type=WholeNumber(min=0), default=0, show_default=True,
              help="Also store per-character bits for documents of at most this many scored characters (0: none).")
@click.option("--part-docs", type=WholeNumber(min=1), default=10_000, show_default=True,
              help="Documents an output part holds (a part is the unit a re-run resumes from).")
@click.option("--workers", type=WholeNumber(1, MAX_PROCESSES), default=None,
              help="Worker processes of the local executor, each normalising and scoring its share (default: the CPUs "
                   "this process may use divided by --threads; inputs under 4 MB: 1); the output is the same for any number.")
@click.option("--threads", type=WholeNumber(1, MAX_PROCESSES), default=None,
              help="Kernel threads of each worker (default: 1, or the CPUs divided by --workers when that is given).")
@click.option("--readers", type=WholeNumber(0, MAX_PROCESSES), default=None,
              help="With --device cuda (or --dtype float64), processes that read, decompress, parse, normalise and "
                   "map the documents to ids for the one scoring process, a whole input file each (default: the "
                   "CPUs but one, at most 15; inputs under 4 MB: 0, in the scoring process); the output is the "
                   "same for any number.")
@click.option("--max-line-bytes", type=WholeNumber(min=1), default=MAX_LINE_BYTES, show_default=True,
              help="The longest line (JSONL, or text with --per-line) read, in bytes; a longer one is its document's "
                   "error and is skipped in bounded memory.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True,
              help="cuda: score on the GPU with the torch backend (the gpu extra; with --executor ray one actor a "
                   "GPU); auto: cuda when torch sees a GPU.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True,
              help="float64: the exact float64 reference on the torch backend (any device; slower).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="A progress bar on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json's content as JSON.")
@normalize_option
@unknown_options
@friendly
def corpus_score_cmd(inputs, out, fmt, text_field, id_field, per_line, executor, ray_address, ray_actors,
                     ray_cpus_per_actor, model, batch_chars, per_char_max, part_docs, workers, threads, readers,
                     max_line_bytes, device, dtype, progress, as_json, normalize, unknown, replacement):
    """Score every document of INPUT... (paths, globs, directories, fsspec URLs) into --out DIR.

    DIR gets shards/*.parquet (per document: id, chars read and scored, bits, bpc, the
    normaliser's counts, error) and summary.json. A document that cannot be scored is recorded
    with its reason, never fatal; a re-run of a killed job resumes it and ends with the same files.
    """
    from isan.engine.corpus import JobInterrupted, score_corpus

    if ray_address:
        executor = "ray"
    if readers and executor == "local" and default_backend(device, dtype) == "native":
        raise UserError("--readers feeds the torch backend (--device cuda, or --dtype float64), which scores a job in "
                        "one process; on the CPU's kernels use --workers N (worker processes) instead")
    if executor == "ray":
        if workers is not None:
            raise UserError("--workers is the local executor's; the Ray executor has --ray-actors")
    else:
        from isan.engine.corpus.job import input_bytes
        from isan.engine.corpus.workers import plan_workers

        workers, threads = plan_workers(workers, threads, input_bytes(list(inputs)), device, dtype)
    try:
        summary = score_corpus(list(inputs), out, fmt=fmt, text_field=text_field, id_field=id_field or None,
                               per_line=per_line, executor=executor, ray_address=ray_address, model=model,
                               normalize=normalize, unknown=unknown, replacement=replacement, batch_chars=batch_chars,
                               per_char_max=per_char_max, part_docs=part_docs, threads=threads, progress=progress,
                               ray_actors=ray_actors, ray_cpus_per_actor=ray_cpus_per_actor, device=device,
                               dtype=dtype, workers=workers or 1, readers=readers, max_line_bytes=max_line_bytes)
    except JobInterrupted as e:
        click.echo(str(e), err=True)
        sys.exit(130)  # as a shell reports Ctrl-C
    if as_json:
        emit_json(summary)
        return
    run = summary["this_run"]
    bpc = f"{summary['bpc']:.4f}" if summary["bpc"] is not None else "-"
    click.echo(f"{_count(summary['documents'], 'document')} in {_count(summary['files'], 'file')}: "
               f"{summary['chars_scored']:,} characters scored, {summary['bits']:,.1f} bits ({bpc} bpc); "
               f"{_count(summary['errors'], 'document')} with errors, "
               f"{_count(len(summary['file_errors']), 'unreadable file')}")
    rate = f"{format_rate(run['docs_per_s'])} docs/s, {format_rate(run['chars_per_s'])} chars/s" if run["seconds"] else ""
    skipped = run["files_skipped"]
    how = run["runner"] + (f", {_count(run['workers'], 'worker')} x {_count(run['threads'], 'thread')}"
                           if "workers" in run else "") + (f", {_count(run['readers'], 'reader')}"
                                                           if run.get("readers") else "")
    click.echo(f"this run ({how}): {_count(run['documents'], 'document')} in {run['seconds']:.1f} s "
               f"({rate}); {_count(skipped, 'file')} {'was' if skipped == 1 else 'were'} complete already")
    for fe in summary["file_errors"][:5]:
        click.echo(f"  unreadable: {fe['error']}", err=True)
    click.echo(f"wrote {out}/shards/ and {out}/summary.json")


def _count(n: int, noun: str) -> str:
    """``"1 file"``, ``"2 files"``, ``"1,000 files"``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def format_rate(x: float | None) -> str:
    """A rate that a slow run does not round to 0: ``"1,234"``, ``"12.3"``, ``"0.122"`` (3 significant digits
    below 100)."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
