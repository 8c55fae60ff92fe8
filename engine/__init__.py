"""isan.engine: streaming ISAN inference in numpy and compiled C kernels.

torch is imported only inside :mod:`isan.engine.kernels.torch` (the torch backend, GPU or float64),
and only when a torch device or dtype is asked for (``device="cuda"``, ``dtype="float64"``): importing
this package, and scoring on the CPU's kernels, imports no torch.

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
