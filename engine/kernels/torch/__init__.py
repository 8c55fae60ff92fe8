"""The torch backend of the engine's kernels: the same runner contract as the compiled kernels and
their numpy twins (:mod:`isan.engine.kernels.streams`), on any torch device (a CUDA GPU, or the
CPU, where CI tests it against the float64 reference).

This package is the one room of ``engine/`` that imports torch (docs/ARCHITECTURE.md; the import
test allows it here only). Nothing on the CPU path imports it: :mod:`isan.engine.kernels.backends`
imports it when a torch device is asked for, and says what to install when torch is missing.

Importing the package imports no torch: :class:`TorchStreams` is loaded on first use (PEP 562), so
:mod:`~isan.engine.kernels.torch.plan` (chunk counts, no torch) stays importable without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from isan.engine.kernels.torch.streams import TorchStreams

__all__ = ["TorchStreams"]


def __getattr__(name: str):
    if name == "TorchStreams":  # imports torch: only when the runner is asked for
        from isan.engine.kernels.torch.streams import TorchStreams

        return TorchStreams
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
