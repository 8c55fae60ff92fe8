"""isan.engine: streaming ISAN inference in numpy (no torch).

Public API: :class:`Engine`, :class:`State`, :class:`ScoreResult`, :class:`Attribution`,
and the reference functions in :mod:`isan.engine.reference`.
"""

from isan.engine.core import (  # noqa: F401
    Attribution,
    Engine,
    Sample,
    ScoreResult,
    State,
    default_model_path,
    paper_model_path,
    load_engine,
)

__all__ = ["Attribution", "Engine", "Sample", "ScoreResult", "State", "default_model_path", "load_engine", "paper_model_path"]
