"""The corpus job: plan the inputs, score each input file into atomic Parquet parts, summarise.

:func:`score_corpus` is the entry point (``isan corpus score`` calls it). Each input file is read
in order and cut into parts of ``part_docs`` documents (or ``part_chars`` characters); each part is
scored and written atomically, then the file's ``KEY.done.json``. A re-run of the same job skips
complete files and parts, so a job killed at any moment and run again ends with exactly the output
of an uninterrupted run (the bits of a document do not depend on how it was batched; see
:mod:`isan.engine.corpus.scoring`). Where the job runs is its *executor*: the local executor scores
the files in this process with all its cores (or in worker processes,
:mod:`isan.engine.corpus.workers`); the Ray executor (:mod:`isan.engine.corpus.ray_runner`) gives
the files to actors, one engine each, and writes the same files. (A *runner*, in the engine, is a
kernel: :class:`~isan.engine.kernels.chunked.Runner`.)
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from isan.atomic import write_json_atomic
from isan.errors import IsanError, install_hint
from isan.engine.corpus.lines import MAX_LINE_BYTES
from isan.engine.corpus.readers import detect_format, expand_inputs, is_url, resolve_input
from isan.engine.corpus.scoring import DocScorer, corpus_path
from isan.engine.corpus.writers import COLUMNS_V1
from isan.engine.kernels.backends import default_backend
from isan.engine.loading import renamed_keyword
# the per-file units every executor shares (the workers and the Ray actors import them from parts.py, not from here)
from isan.engine.corpus.parts import JobConfig, load_corpus_engine, process_file

log = logging.getLogger(__name__)

JOB_FORMAT = "isan-corpus-job"
JOB_VERSION = 1
#: where a job runs (:func:`score_corpus`'s ``executor``)
EXECUTORS = ("local", "ray")


class JobInterrupted(KeyboardInterrupt):
    """A corpus job stopped by Ctrl-C (or SIGTERM where it has worker or reader processes). Every
    part written is kept, and a re-run of the same command resumes from them.

    Attributes:
        out: the job's output directory; parts_written: parts this run wrote; parts_kept: parts in
        ``out/shards`` (this run's and earlier ones'); files_done: input files complete there.
    """

    def __init__(self, out, parts_written: int, parts_kept: int, files_done: int):
        self.out, self.parts_written, self.parts_kept, self.files_done = out, parts_written, parts_kept, files_done
        super().__init__(f"interrupted: this run wrote {parts_written:,} part{'' if parts_written == 1 else 's'}; "
                         f"{parts_kept:,} part{'' if parts_kept == 1 else 's'} ({files_done:,} complete input "
                         f"file{'' if files_done == 1 else 's'}) are kept in {out}/shards: run the same command "
                         "again to resume from them")


def _count_files(folder: Path, pattern: str) -> int:
    return sum(1 for _ in folder.glob(pattern))


def input_bytes(inputs: list[str]) -> int | None:
    """The inputs' total size in bytes as stored, None when a URL's is not known (or a pattern
    matches nothing: the job says why)."""
    try:
        sizes = _input_sizes(expand_inputs(inputs))
    except IsanError:
        return None
    return None if None in sizes.values() else sum(sizes.values())


def _input_sizes(paths: list[str]) -> dict[str, int | None]:
    """Each input's size in bytes (as stored: a compressed file's compressed bytes); 0 for a file
    that cannot be read, None for a URL (not asked for)."""
    sizes: dict[str, int | None] = {}
    for p in paths:
        if is_url(p):
            sizes[p] = None
            continue
        try:
            sizes[p] = os.path.getsize(p)
        except OSError:
            sizes[p] = 0
    return sizes


class Progress:
    """A tqdm bar over the input files' bytes, with documents/s and characters/s beside it.

    Its total is the files' sizes (unknown when an input is a URL); each part advances it to how far
    its file was read (``Doc.file_pos``) and a finished file to the file's size, so count and total
    are the same unit and the bar ends at 100%.
    """

    def __init__(self, enabled: bool, sizes: dict[str, int | None]):
        self.t0 = time.perf_counter()
        self.docs = self.chars = 0
        self.sizes = sizes
        self.at: dict[str, int] = {}  # bytes counted for each file so far
        self.bar = None
        if enabled:
            from tqdm import tqdm

            known = list(sizes.values())
            total = None if None in known else sum(known)
            files = len(sizes)
            self.bar = tqdm(total=total, unit="B", unit_scale=True, dynamic_ncols=True, smoothing=0.1,
                            desc=f"scoring {files} file{'s' if files != 1 else ''}")

    def update(self, path: str, docs: int, chars: int, file_pos: int = -1, done: bool = False) -> None:
        """``docs`` documents and ``chars`` characters more, ``path`` read to ``file_pos`` bytes
        (``done``: read whole)."""
        self.docs += docs
        self.chars += chars
        size, at = self.sizes.get(path), self.at.get(path, 0)
        now = size if done and size is not None else max(at, file_pos)
        if size is not None:
            now = min(now, size)
        self.at[path] = now
        if self.bar is not None:
            dt = max(time.perf_counter() - self.t0, 1e-9)
            self.bar.set_postfix_str(f"{self.docs:,} docs, {self.docs / dt:,.0f} docs/s, "
                                     f"{self.chars / dt:,.0f} chars/s", refresh=False)
            self.bar.update(now - at)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _check_job(out: Path, cfg: JobConfig) -> None:
    """Refuse ``out`` when it holds another job; a job started before the parts' columns were
    recorded goes on with its own (``cfg.columns`` becomes :data:`COLUMNS_V1`)."""
    path = out / "job.json"
    if path.is_file():
        try:
            have = json.loads(path.read_text())
        except (OSError, ValueError):
            have = None
        if not isinstance(have, dict) or have.get("format") != JOB_FORMAT:
            raise IsanError(f"{out} holds something other than an isan corpus job ({path} is not one); "
                            "choose another --out")
        have.setdefault("kernel", "chunked")  # jobs written before the kernel was recorded: one character a step
        if "columns" not in have:  # started before changed_fraction: its parts go on without it (one schema)
            cfg.columns = list(COLUMNS_V1)
            have["columns"] = cfg.columns
        have.setdefault("max_line_bytes", MAX_LINE_BYTES)  # before the limit: lines that fitted in memory
        if "input_paths" not in have:  # started before inputs were resolved: its parts keep their names
            cfg.input_paths = have["input_paths"] = "as-given"
        want = {"format": JOB_FORMAT, "format_version": JOB_VERSION, **cfg.identity()}
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        if diff:
            hint = ""
            if "kernel" in diff:
                hint = (f" (its documents were scored by the {have['kernel']} kernel, this run's by {want['kernel']}: "
                        "composed jumps wherever the model has a trie table; they agree within 1e-7, not to the "
                        "last bit, so one job's files never mix them)")
            elif "columns" in diff:
                hint = (" (its parts have the columns of another isan version; one job's parts keep one schema, so "
                        "finish it with the isan that started it)")
            raise IsanError(f"{out} holds the output of another job (it differs in: {', '.join(diff)}){hint}; "
                            "re-run with the same options to resume it, or choose another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"format": JOB_FORMAT, "format_version": JOB_VERSION, **cfg.identity()})


def score_corpus(inputs: list[str] | str, out: str | os.PathLike, *, fmt: str = "auto", text_field: str = "text",
                 id_field: str | None = "id", per_line: bool = False, executor: str | None = None,
                 ray_address: str | None = None, model: str | None = None, normalize: str = "auto",
                 unknown: str = "error", replacement: str | None = None, batch_chars: int | None = None,
                 per_char_max: int = 0, part_docs: int = 10_000, part_chars: int = 32_000_000,
                 threads: int | None = None, progress: bool = True, ray_actors: int | None = None,
                 ray_cpus_per_actor: float = 1, engine=None, device: str = "cpu", dtype: str = "float32",
                 workers: int = 1, readers: int | None = None, max_line_bytes: int = MAX_LINE_BYTES,
                 runner: str | None = None) -> dict:
    """Score every document of a corpus with an ISAN and write Parquet shards and ``summary.json``.

    Args:
        inputs: paths, globs, directories or fsspec URLs of JSONL (``.gz``/``.zst``), Parquet or text files.
        out: the output directory (created; an existing one of the same job is resumed).
        fmt: ``auto`` (by file name), ``jsonl``, ``parquet`` or ``text``.
        text_field, id_field: the fields (columns) holding each document's text and id.
        per_line: with text files, one document a non-blank line (default: one a file).
        executor: where the job runs: ``local`` (the default: this process, all its cores, or
            ``workers`` processes) or ``ray`` (Ray Data; ``ray_address`` of a running cluster, e.g.
            ``ray://head:10001`` or ``HOST:6379``, or None to start a local one).
        model: a bundle directory (default: the shipped model). ``engine``: an Engine instead (local only).
        normalize, unknown, replacement: as for :meth:`Engine.score`.
        batch_chars: characters scored together in one call of the batched kernel (default: the
            backend's, ``Backend.batch_chars``: 2M on the CPU, 32M on a GPU; the output does not
            depend on it on the CPU's kernels).
        per_char_max: also keep per-character bits of documents of at most this many scored characters.
        part_docs, part_chars: an output part (the unit of resumption) closes after this many documents or characters.
        threads: kernel threads of the local executor (default: all the CPUs this process may use),
            of each worker process when ``workers`` > 1 (default there: 1).
        workers: worker processes of the local executor (:mod:`isan.engine.corpus.workers`); the
            output files are the same whatever their number.
        readers: with a backend that runs a job in one process (a GPU, or float64: the torch
            backend), reader processes that read, decompress, parse, normalise and map the
            documents to ids for it (:mod:`isan.engine.corpus.feed`); 0 reads in the scoring
            process; default: a CPU each but one, at most 15 (0 for inputs under 4 MB). The output
            files are the same for any number.
        max_line_bytes: the longest line (JSONL, or text one document a line) read, in bytes; a
            longer one is its document's error, skipped in bounded memory.
        progress: show a progress bar (stderr).
        ray_actors, ray_cpus_per_actor: Ray actors (default: the cluster's CPUs / CPUs per actor) and CPUs each.
        device, dtype: where and in what the kernels run (:meth:`Engine.load`): ``device="cuda"``
            scores on the GPU with the torch backend (the Ray executor: one actor a GPU, each asking
            Ray for one); ``dtype="float64"`` is the exact reference there.
        runner: deprecated alias of ``executor``, kept for a release (it warns: ``DeprecationWarning``).
    Returns:
        the summary (also written to ``out/summary.json``).
    Raises:
        IsanError: bad options (among them ``executor`` and ``runner`` both given), no inputs, or
            ``out`` holding another job's output. Bad documents
            and unreadable files never raise: they are recorded in the output.
        JobInterrupted: Ctrl-C (or SIGTERM with worker or reader processes); it says how many parts
            this run wrote, all kept for a re-run to resume from.
    """
    executor = renamed_keyword("executor", executor, "runner", runner, default="local")
    paths = _checked_inputs(inputs, executor, fmt, engine, workers, part_docs=part_docs, part_chars=part_chars,
                            batch_chars=batch_chars, max_line_bytes=max_line_bytes, per_char_max=per_char_max)
    t0 = time.perf_counter()
    engine, on_actors = _job_engine(executor, engine, model, device, dtype, workers, readers)
    cfg = _job_config(engine, on_actors, model, device, dtype, batch_chars, dict(
        fmt=fmt, text_field=text_field, id_field=id_field, per_line=per_line, normalize=normalize, unknown=unknown,
        replacement=replacement, per_char_max=per_char_max, part_docs=part_docs, part_chars=part_chars,
        max_line_bytes=max_line_bytes))
    out = Path(out)
    paths = _open_job(out, cfg, paths)
    records, where = _run_parts(executor, paths, cfg, out, engine, progress=progress, threads=threads,
                                workers=workers, readers=readers, ray_address=ray_address, ray_actors=ray_actors,
                                ray_cpus_per_actor=ray_cpus_per_actor)
    seconds = time.perf_counter() - t0
    summary = summarize(records, cfg, engine, seconds, where)
    write_json_atomic(out / "summary.json", summary)
    return summary


def _checked_inputs(inputs: list[str] | str, executor: str, fmt: str, engine, workers: int, *, part_docs: int,
                    part_chars: int, batch_chars: int | None, max_line_bytes: int, per_char_max: int) -> list[str]:
    """The input files (``inputs`` expanded: :func:`~isan.engine.corpus.readers.expand_inputs`), once
    the options that need no model are checked (those of :func:`score_corpus`).

    Raises:
        IsanError: a bad option, pyarrow missing, or no input file.
    """
    if executor not in EXECUTORS:
        raise IsanError(f"executor must be local or ray; got {executor!r}")
    try:
        import pyarrow  # noqa: F401  (the output is Parquet)
    except ImportError:
        raise IsanError(f"the corpus job writes Parquet with pyarrow: {install_hint('corpus')} "
                        f"(or, for the Ray executor too: {install_hint('ray')})") from None
    detect_format("x", fmt)
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [str(inputs)]
    paths = expand_inputs([str(p) for p in inputs])
    if not paths:
        raise IsanError("no input files; give paths, globs or directories of JSONL, Parquet or text files")
    for k, v in {"part_docs": part_docs, "part_chars": part_chars, "batch_chars": batch_chars,
                 "max_line_bytes": max_line_bytes}.items():
        if v is not None and v < 1:
            raise IsanError(f"{k} must be at least 1; got {v}")
    if per_char_max < 0:
        raise IsanError(f"per_char_max must be at least 0; got {per_char_max}")
    if workers < 1:
        raise IsanError(f"workers must be at least 1; got {workers}")
    if workers > 1 and (executor != "local" or engine is not None):
        raise IsanError("worker processes are the local executor's, and load the model themselves: pass model=, "
                        "not engine= (the Ray executor has its actors)")
    return paths


def _job_engine(executor: str, engine, model, device: str, dtype: str, workers: int, readers: int | None):
    """``(the engine the job is planned with, on_actors)``: ``engine``, else ``model`` loaded on
    ``device`` in ``dtype``; ``on_actors`` when the Ray actors run the torch backend (a GPU, or
    float64): they load the model on their device, and here it is loaded on the CPU for its identity.

    Raises:
        IsanError: options that the executor and the engine's backend cannot run together.
    """
    if executor == "ray" and device == "auto":
        raise IsanError("name the device of a Ray job's actors, cpu or cuda: auto would be decided here, not on them")
    # the torch backend on the actors (a GPU, or float64): they load the model on their device, and
    # here only its identity is needed
    on_actors = executor == "ray" and default_backend(device, dtype) == "torch"
    if engine is None:
        engine = load_corpus_engine(model) if on_actors else load_corpus_engine(model, device, dtype)
    elif executor == "ray":
        raise IsanError("the Ray executor loads the model on every actor: pass model=, not engine=")
    if workers > 1 and engine.kernels.one_process:
        raise IsanError("worker processes run the CPU's compiled kernels: on the torch backend (a GPU, or float64) "
                        "one process drives the device (and its GEMMs choose their kernels by shape, so a "
                        "document's last bits could depend on how the work was cut); use workers=1, and readers "
                        "to read and prepare the documents in other processes")
    if readers is not None and readers > 0 and not (executor == "local" and engine.kernels.one_process):
        raise IsanError("reader processes (--readers) feed the torch backend (--device cuda, or --dtype float64), "
                        "which runs a job in one process, on the local executor; the CPU's kernels take worker "
                        "processes instead: use --workers N (workers= from Python)")
    return engine, on_actors


def _job_config(engine, on_actors: bool, model, device: str, dtype: str, batch_chars: int | None,
                options: dict) -> JobConfig:
    """The job's :class:`JobConfig`: the user's ``options`` (the fields that decide the output) with
    the model's identity and kernel, and where it runs (the actors' ``device``, ``dtype`` and
    kernel when ``on_actors``, else the engine's; ``batch_chars`` None: the backend's)."""
    if batch_chars is None and not on_actors:
        batch_chars = engine.kernels.batch_chars  # the backend's (the Ray actors' own on their device)
    kernel = actors_rounding(device, dtype) if on_actors else corpus_path(engine)  # as the actors name it
    return JobConfig(model=str(model) if model else None, params_sha256=engine.params_sha256, kernel=kernel,
                     device=device if on_actors else engine.kernels.device,
                     dtype=dtype if on_actors else engine.kernels.dtype, batch_chars=batch_chars, **options)


def _open_job(out: Path, cfg: JobConfig, paths: list[str]) -> list[str]:
    """Start the job in ``out``, or resume the same job there (:func:`_check_job`), with
    ``out/shards`` ready (a killed run's unfinished writes removed); returns ``paths`` as the job
    names them (resolved, once each, in order; as given in a job started before that)."""
    _check_job(out, cfg)
    if cfg.input_paths == "resolved":  # one name for a file however it was spelled (dict: once each, in order)
        paths = list(dict.fromkeys(resolve_input(p) for p in paths))
    shards = out / "shards"
    shards.mkdir(exist_ok=True)
    for leftover in shards.glob(".*.tmp"):  # a killed run's unfinished writes (never read)
        leftover.unlink(missing_ok=True)
    return paths


def _run_parts(executor: str, paths: list[str], cfg: JobConfig, out: Path, engine, *, progress: bool,
               threads: int | None, workers: int, readers: int | None, ray_address: str | None,
               ray_actors: int | None, ray_cpus_per_actor: float) -> tuple[list[dict], dict]:
    """Score ``paths`` into ``out/shards`` where the job runs (the Ray actors, worker processes, or
    this process), with the progress bar; returns ``(one done record per path, where it ran)``.

    Raises:
        JobInterrupted: Ctrl-C (or SIGTERM with worker or reader processes).
    """
    shards = out / "shards"
    bar = Progress(progress, _input_sizes(paths))

    def on_part(t: dict) -> None:
        bar.update(t["path"], t["documents"], t["chars_read"], t.get("file_pos", -1), t.get("done", False))

    parts_before = _count_files(shards, "*.part-*.parquet")
    try:
        if executor == "ray":
            from isan.engine.corpus.ray_runner import run_ray

            records, where = run_ray(paths, cfg, out, ray_address, ray_actors, ray_cpus_per_actor,
                                     on_file=lambda r: bar.update(r["path"], r["documents"], r["chars_read"],
                                                                  done=True))
        elif workers > 1:
            from isan.engine.corpus.workers import run_workers

            # without a bar, workers that take whole files need not report their parts (a manager process fewer)
            records, facts = run_workers(paths, cfg, shards, workers, threads or 1,
                                         on_part=on_part if bar.bar is not None else None)
            where = {"runner": "local", **facts}  # the summary's key stays "runner" (its JSON is unchanged)
        else:
            records, where = _run_here(engine, paths, cfg, shards, threads, readers, on_part)
        if executor == "local" and engine.kernels.rounding is not None:  # say where it ran
            where.update(engine.kernels.describe())
    except KeyboardInterrupt:
        bar.close()
        raise JobInterrupted(out, _count_files(shards, "*.part-*.parquet") - parts_before,
                             _count_files(shards, "*.part-*.parquet"), _count_files(shards, "*.done.json")) from None
    finally:
        bar.close()
    return records, where


def _run_here(engine, paths: list[str], cfg: JobConfig, shards: Path, threads: int | None, readers: int | None,
              on_part) -> tuple[list[dict], dict]:
    """Score ``paths`` in this process (fed by reader processes on the torch backend, when
    :func:`~isan.engine.corpus.feed.plan_readers` gives some); ``(records, where it ran)``."""
    scorer = DocScorer(engine, cfg.options(threads))
    n_readers = 0
    if engine.kernels.one_process:
        from isan.engine.corpus.feed import plan_readers

        n_readers = plan_readers(readers, input_bytes([str(p) for p in paths]))
    if n_readers > 0:
        from isan.engine.corpus.feed import run_readers

        records, facts = run_readers(paths, cfg, shards, scorer, n_readers, on_part=on_part)
    else:
        records = [process_file(scorer, cfg, p, shards, on_part=on_part) for p in paths]
        facts = {"readers": 0} if engine.kernels.one_process else {}
    return records, {"runner": "local", "workers": 1, "threads": scorer.threads, "batch_chars": scorer.batch_chars,
                     **facts}


def actors_rounding(device: str, dtype: str) -> str:
    """The kernel a Ray job's actors record on the torch backend (its ``Backend.rounding``:
    ``"torch-cuda-float32"``), asked here, on a driver that need not have their device or torch:
    of the backend without its runners."""
    from isan.engine.kernels.backends import TorchBackend

    return TorchBackend("torch", device, dtype, streams=None).rounding


def summarize(records: list[dict], cfg: JobConfig, engine, seconds: float, where: dict) -> dict:
    docs = sum(r["documents"] for r in records)
    chars_scored = sum(r["chars_scored"] for r in records)
    bits = float(sum(r["bits"] for r in records))
    new_docs = sum(r["new_documents"] for r in records)
    new_chars = sum(r["new_chars"] for r in records)
    return {
        "format": "isan-corpus-summary", "format_version": 1,
        "files": len(records), "documents": docs, "chars_read": sum(r["chars_read"] for r in records),
        "chars_scored": chars_scored, "bits": bits, "bpc": bits / chars_scored if chars_scored else None,
        "errors": sum(r["errors"] for r in records),
        "file_errors": [{"path": r["path"], "error": r["file_error"]} for r in records if r.get("file_error")],
        "model": {"source": engine.source, "params_sha256": engine.params_sha256, "normalizer": engine.normalizer.id},
        "this_run": {"seconds": seconds, "documents": new_docs, "chars_read": new_chars,
                     "docs_per_s": new_docs / seconds if seconds > 0 else None,
                     "chars_per_s": new_chars / seconds if seconds > 0 else None,
                     "files_skipped": sum(1 for r in records if r.get("skipped")), **where},
    }
