"""A datatrove pipeline block: isan's bits and bpc in each document's metadata, and a filter on them.

The way datatrove's KenLM perplexity blocks (``CCNetPerplexityStats``, CCNet's filtering) score
documents with an n-gram, :class:`IsanScoreFilter` scores them with an ISAN, batched through the
engine's kernels (``batch_size`` documents at a time, each scored exactly as ``isan corpus score``
scores it), and writes ``isan_bits``, ``isan_bpc``, ``isan_chars``, ``isan_changed_fraction`` (the
share of the document the normaliser changed or dropped: the corpus output's ``changed_fraction``)
and ``isan_error`` when a document cannot be scored into ``doc.metadata``. With ``min_bpc`` / ``max_bpc`` it drops the
documents outside that range (reason ``isan_bpc_low`` / ``isan_bpc_high``; a document that
cannot be scored is dropped with ``isan_error`` unless ``keep_errors``); without them it only
annotates::

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from isan.engine.corpus.datatrove import IsanScoreFilter

    LocalPipelineExecutor(pipeline=[JsonlReader("data/"), IsanScoreFilter(max_bpc=3.0),
                                    JsonlWriter("kept/")], tasks=4).run()

datatrove is an optional extra (``datatrove``: ``isan.errors.install_hint("datatrove")`` says the
command) and is imported only when the class is first used: ``IsanScoreFilter`` is built on first access (this module imports without it).
"""

from __future__ import annotations

__all__ = ["IsanScoreFilter"]

_CLASS = None


def _get_scorer(block):
    """The block's document scorer (:class:`isan.engine.corpus.scoring.DocScorer`), built on first use
    in each worker from its model and options."""
    if block._scorer is None:
        from isan.engine.corpus.parts import load_corpus_engine
        from isan.engine.corpus.scoring import DocScorer, ScoreOptions

        block._scorer = DocScorer(load_corpus_engine(block.model),
                                  ScoreOptions(normalize=block.normalize, unknown=block.unknown,
                                               replacement=block.replacement, threads=block.threads))
    return block._scorer


def _getstate(block) -> dict:
    """The block's state to pickle: the engine is rebuilt in each worker, never pickled."""
    state = dict(block.__dict__)
    state["_scorer"] = None
    return state


def _verdict(block, d, r: dict) -> bool | tuple[bool, str]:
    """Write one scored row ``r`` into document ``d``'s metadata and say whether to keep it (True)
    or drop it (False, the reason)."""
    d.metadata["isan_chars"] = r["chars_scored"]
    d.metadata["isan_bits"] = r["bits"]
    d.metadata["isan_bpc"] = r["bpc"]
    d.metadata["isan_changed_fraction"] = r["changed_fraction"]
    if r["error"]:
        d.metadata["isan_error"] = r["error"]
        block.stat_update("isan_errors")
        return True if block.keep_errors else (False, "isan_error")
    block.stat_update("isan_bpc", value=r["bpc"])  # datatrove's stats keep mean / min / max
    if block.min_bpc is not None and r["bpc"] < block.min_bpc:
        return (False, "isan_bpc_low")
    if block.max_bpc is not None and r["bpc"] > block.max_bpc:
        return (False, "isan_bpc_high")
    return True


def _filter_batch(block, batch: list) -> list:
    """Score datatrove documents together; one verdict (:func:`_verdict`) per document, in order."""
    from isan.engine.corpus.readers import Doc

    docs = [Doc(i, str(d.id), d.text if isinstance(d.text, str) else None,
                None if isinstance(d.text, str) else "the document's text is not a string")
            for i, d in enumerate(batch)]
    rows = block._get_scorer().score(docs)
    return [_verdict(block, d, r) for d, r in zip(batch, rows)]


def _build():
    """The class :class:`IsanScoreFilter`, built once, on first access (it subclasses datatrove's
    BaseFilter, so datatrove is imported here). Raises IsanError naming the install command when
    datatrove is missing."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    try:
        from datatrove.pipeline.filters.base_filter import BaseFilter
    except ImportError:
        from isan.errors import IsanError, install_hint

        raise IsanError(f"the datatrove block needs datatrove: {install_hint('datatrove')}") from None

    class IsanScoreFilter(BaseFilter):
        """Score documents with an ISAN (metadata ``isan_bits``, ``isan_bpc``, ``isan_chars``,
        ``isan_changed_fraction``) and
        keep those with ``min_bpc <= bpc <= max_bpc`` (either bound optional).

        Args:
            model: a bundle directory (default: the shipped model); loaded once per worker.
            min_bpc, max_bpc: the range of bits per character to keep (None: no bound).
            keep_errors: keep documents that cannot be scored (their ``isan_error`` says why).
            normalize, unknown, replacement: as for ``isan corpus score``.
            batch_size: documents scored together in one call of the batched kernel.
            threads: kernel threads (default: all the CPUs of the worker).
            exclusion_writer: a datatrove writer for the dropped documents.
        """

        name = "isan bits per character"
        type = "🔻 - FILTER"

        def __init__(self, model: str | None = None, min_bpc: float | None = None, max_bpc: float | None = None,
                     keep_errors: bool = False, normalize: str = "auto", unknown: str = "error",
                     replacement: str | None = None, batch_size: int = 512, threads: int | None = None,
                     exclusion_writer=None):
            super().__init__(exclusion_writer=exclusion_writer, batch_size=batch_size)
            self.model, self.min_bpc, self.max_bpc, self.keep_errors = model, min_bpc, max_bpc, keep_errors
            self.normalize, self.unknown, self.replacement, self.threads = normalize, unknown, replacement, threads
            self._scorer = None

        _get_scorer = _get_scorer
        __getstate__ = _getstate  # the engine is rebuilt in each worker, never pickled

        def filter(self, doc) -> bool | tuple[bool, str]:
            return self.filter_batch([doc])[0]

        filter_batch = _filter_batch

    IsanScoreFilter.__module__ = __name__  # pickled by reference: this module's __getattr__ finds it
    _CLASS = IsanScoreFilter
    return _CLASS


def __getattr__(name: str):
    if name == "IsanScoreFilter":
        return _build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
