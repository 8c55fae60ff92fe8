"""The torch backend of the engine's kernels: the same runner contract as the compiled kernels and
their numpy twins (:mod:`isan.engine.kernels.streams`), on any torch device (a CUDA GPU, or the
CPU, where CI tests it against the float64 reference).

This package is the one room of ``engine/`` that imports torch (docs/ARCHITECTURE.md; the import
test allows it here only). Nothing on the CPU path imports it: :mod:`isan.engine.kernels.backends`
imports it when a torch device is asked for, and says what to install when torch is missing.
"""

from isan.engine.kernels.torch.streams import TorchStreams

__all__ = ["TorchStreams"]
