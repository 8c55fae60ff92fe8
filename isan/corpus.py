"""Scoring corpora: the public API of :mod:`isan.engine.corpus`.

Example:
    >>> from isan.corpus import score_corpus, read_output
    >>> summary = score_corpus(["data/*.jsonl.gz"], "scores/", executor="local")   # doctest: +SKIP
    >>> read_output("scores/").to_pandas()[["id", "bits", "bpc", "error"]]       # doctest: +SKIP
"""

from isan.engine.corpus import Doc, DocScorer, InputFileError, JobInterrupted, ScoreOptions, read_docs, read_output, score_corpus

__all__ = ["Doc", "DocScorer", "InputFileError", "JobInterrupted", "ScoreOptions", "read_docs", "read_output", "score_corpus"]
