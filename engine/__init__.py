"""isan.engine: streaming ISAN inference in numpy and compiled C kernels.

torch is imported only inside :mod:`isan.engine.kernels.torch` (the torch backend, GPU or float64),
and only when a torch device or dtype is asked for (``device="cuda"``, ``dtype="float64"``): importing
this package, and scoring on the CPU's kernels, imports no torch.

Public API: :class:`Engine`, :class:`State`, :class:`ScoreResult`, :class:`Attribution`,
and the reference functions in :mod:`isan.engine.reference`.
"""

from isan.engine.core import Engine  # noqa: F401
from isan.engine.loading import load_engine  # noqa: F401
from isan.engine.paths import default_model_path, paper_model_path  # noqa: F401
from isan.engine.results import Attribution, Sample, ScoreResult, State  # noqa: F401

__all__ = ["Attribution", "Engine", "Sample", "ScoreResult", "State", "default_model_path", "load_engine", "paper_model_path"]
