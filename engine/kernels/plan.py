"""What one chunk-parallel batch needs, in one object: the kernel, its weights, the chunks, the
runner, the fallback, the stopping rule and the buffers (:class:`Plan`).

A backend makes the plan of a batch (:meth:`~isan.engine.kernels.backends.Backend.plan`), the
Engine's :class:`~isan.engine.planning.Planner` completes it once (the caller's chunks, the fallback) and
:func:`~isan.engine.kernels.chunked.score_texts_chunked` takes it whole.

Kernels are named by :class:`Kernel`, an Enum whose values are the names users and reports see
(``Kernel.JUMPS == "jumps"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import numpy as np

from isan.errors import IsanError

#: The correction's stopping rule (:mod:`isan.engine.kernels.chunked`, 'Correction pass'): a
#: chunk's error row stops at ``rtol / margin`` of its state, checked every ``check_every`` steps.
DEFAULT_RTOL = 1e-6
DEFAULT_MARGIN = 4.0
CHECK_EVERY = 16


class Kernel(str, Enum):
    """The kernels that advance the rows of a chunk-parallel batch.

    ``AUTO`` asks the backend's plan to choose (composed jumps when the model has a trie table and
    the batch makes enough rows for them, else one character a step); the others name a kernel:
    ``CHUNKED`` (one character a step, :mod:`~isan.engine.kernels.streams`), ``JUMPS`` (composed
    jumps of the trie table's keys, :mod:`~isan.engine.kernels.jumps`), ``JUMPS_F16`` (the same with
    float16 matrices: not exact, for the benchmark) and ``TORCH`` (the torch backend's runner).
    """

    AUTO = "auto"
    CHUNKED = "chunked"
    JUMPS = "jumps"
    JUMPS_F16 = "jumps-f16"
    TORCH = "torch"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, name: "str | Kernel") -> "Kernel":
        """The kernel a name asks for. Raises IsanError naming the choices for an unknown one."""
        try:
            return cls(name)
        except ValueError:
            raise IsanError(f"kernel must be one of {', '.join(k.value for k in cls)}; got {name!r}") from None

    @property
    def uses_table(self) -> bool:
        """Whether the kernel runs on the trie table's composed jumps."""
        return self in (Kernel.JUMPS, Kernel.JUMPS_F16)


@dataclass(frozen=True)
class ModelFacts:
    """What a backend's plan reads of the model it plans for, as values the Engine's planner
    gathers once a batch (:meth:`isan.engine.planning.Planner.plan`).

    Attributes:
        has_table: whether the model has a trie table (the jumps kernels can run).
        forget_bound_chars: characters after which the certificate proves any start-state error
            within the backend's tolerance (:attr:`Backend.rtol`); None without a certificate.
        min_chunk: the shortest chunk the CPU kernels cut for this model, in characters.
    """

    has_table: bool
    forget_bound_chars: int | None
    min_chunk: int


def host_bits(n: int) -> np.ndarray:
    """Where a runner writes the bits of ``n`` characters by default: ``(n,) float64``, uninitialised."""
    return np.empty(n, dtype=np.float64)


@dataclass(frozen=True)
class Plan:
    """How one chunk-parallel batch runs: everything :func:`~isan.engine.kernels.chunked.score_texts_chunked` reads.

    Attributes:
        kernel: the :class:`Kernel` that advances the rows.
        model: the runner's weights: a :class:`~isan.engine.kernels.streams.StreamModel` or a
            :class:`~isan.engine.kernels.jumps.JumpTable` (a backend's plan leaves None: the
            planner attaches the model's layout for the kernel).
        chunks: (B,) int64 the chunk count of each text (1: not cut).
        runner: the kernel that advances the rows (:class:`~isan.engine.kernels.chunked.Runner`).
        fallback: what redoes a chunk whose correction does not settle
            (:class:`~isan.engine.kernels.chunked.Float64Fallback`), or the proof that none can need it
            (:class:`~isan.engine.forgetting.ProvenForgetting`); None: a float64 fallback of ``model``'s
            weights, made when a chunk needs it.
        rtol, margin, check_every: the correction's stopping rule (the backend's: a GPU checks less
            often, each check being a synchronisation; float64 stops at a smaller ``rtol``).
        empty_bits: where the runner writes bits, ``n -> (n,) float64`` (a GPU's runner: page-locked memory).
        row_totals: whether the runner reduces each row's bits itself (``want_bits="totals"``).
        path: the name the scoring report gives the kernel (``"chunked"``, ``"jumps"``, ``"jumps-f16"``).
    """

    kernel: Kernel
    model: object = field(repr=False)
    chunks: np.ndarray
    runner: Callable = field(repr=False)  # a Runner (isan.engine.kernels.chunked)
    fallback: object = field(default=None, repr=False)
    rtol: float = DEFAULT_RTOL
    margin: float = DEFAULT_MARGIN
    check_every: int = CHECK_EVERY
    empty_bits: Callable[[int], np.ndarray] = field(default=host_bits, repr=False)
    row_totals: bool = False
    path: str = "chunked"

    @classmethod
    def one_row_a_text(cls, model, runner: Callable, n_texts: int, **options) -> "Plan":
        """The plan of ``n_texts`` texts on ``runner``, none cut (documents of a corpus, a benchmark's
        rows); ``options`` are the other fields."""
        return cls(options.pop("kernel", Kernel.CHUNKED), model, np.ones(n_texts, dtype=np.int64), runner, **options)

    @property
    def cuts(self) -> bool:
        """Whether it cuts some text into more than one chunk."""
        return bool(len(self.chunks) and int(np.max(self.chunks)) > 1)
