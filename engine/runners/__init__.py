"""Deprecated: the models other than the ISAN core moved to :mod:`isan.engine.baselines` (issue #46), so that
"runner" means one thing in the engine (:class:`isan.engine.kernels.chunked.Runner`, a kernel that advances
state rows). ``isan.engine.runners`` and its modules stay for one release as aliases of the new ones, and
importing them warns."""
import warnings

warnings.warn("isan.engine.runners is deprecated: import isan.engine.baselines instead "
              "(the same modules; the alias goes after one release)", DeprecationWarning, stacklevel=2)
