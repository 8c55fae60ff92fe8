"""Corpus scoring: score every document of a corpus (JSONL, Parquet, text) with an ISAN, on this
machine or on a Ray cluster, into resumable Parquet shards (see :func:`score_corpus`).

Rooms: :mod:`~isan.engine.corpus.readers` (inputs and formats), :mod:`~isan.engine.corpus.frames`
(compressed files as checked gzip members and zstd frames), :mod:`~isan.engine.corpus.lines` (lines in
bounded memory, each once its frame checked out), :mod:`~isan.engine.corpus.scoring`
(documents to rows, batched through :func:`isan.engine.batches.score_batches`),
:mod:`~isan.engine.corpus.prepared` (a part's documents read, normalised and mapped to ids, with
:mod:`~isan.engine.corpus.batch_prepare`: many texts normalised together in passes of bytes),
:mod:`~isan.engine.corpus.feed` (reader processes feeding one scoring process, their parts in shared
memory: :mod:`~isan.engine.corpus.shared_parts`; their timings: :mod:`~isan.engine.corpus.reader_timing`),
:mod:`~isan.engine.corpus.writers` (the output's layout),
:mod:`~isan.engine.corpus.job` (the job and the local runner), :mod:`~isan.engine.corpus.parts` (one input
file into its parts, what every runner shares), :mod:`~isan.engine.corpus.workers` (the local runner's worker
processes), :mod:`~isan.engine.corpus.ray_runner` (Ray Data), :mod:`~isan.engine.corpus.datatrove` (a datatrove pipeline block).
"""

from isan.engine.corpus.job import JobInterrupted, score_corpus
from isan.engine.corpus.readers import Doc, InputFileError, read_docs
from isan.engine.corpus.scoring import DocScorer, ScoreOptions
from isan.engine.corpus.writers import read_output

__all__ = ["Doc", "DocScorer", "InputFileError", "JobInterrupted", "ScoreOptions", "read_docs", "read_output", "score_corpus"]
