"""The one place that chooses between a compiled kernel and its numpy twin.

Each compiled kernel (``run_streams``, ``run_jumps``, ``seq_composed``, ``segment``) has a numpy
twin of the same signature (``run_streams_ref``, ...) that the tests hold it equal to (mamba's
``selective_scan_fn`` / ``selective_scan_ref``). :func:`native_or_twin` joins the two: the kernel
is written as ``fast(nat, *args)`` with the compiled module first, and callers get one function
that runs it when the compiled module is there and the twin, with the same arguments, when it is
not: no C compiler at install, or ``ISAN_KERNELS=numpy``. :func:`isan.engine.kernels.native`
decides, on each call; it is the one that reads ``ISAN_KERNELS``
(:func:`isan.engine.kernels.kernels_override`), so the kernels that no backend object holds (the
sequential composed path's) follow it as the backends' runners do.

Example::

    def add_ref(a, b):
        return a + b

    @native_or_twin(add_ref)
    def add(nat, a, b):
        return nat.add(a, b)
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, TypeVar

import isan.engine.kernels as _kernels

T = TypeVar("T")


def native_or_twin(twin: Callable[..., T]) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator: the compiled kernel ``fast(nat, *args, **kwargs)`` where the compiled module is
    available, else ``twin(*args, **kwargs)``.

    Args:
        twin: the numpy twin, whose signature is the kernel's without ``nat``.
    Returns:
        A decorator; the function it returns has the twin's signature and the kernel's docstring,
        and keeps both as ``.native`` (the kernel, taking ``nat`` first) and ``.twin``.
    """

    def wrap(fast: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fast)
        def run(*args, **kwargs):
            nat = _kernels.native()  # on each call: ISAN_KERNELS (read there) and the tests may change it
            if nat is None:
                return twin(*args, **kwargs)
            return fast(nat, *args, **kwargs)

        params = list(inspect.signature(fast).parameters.values())[1:]
        run.__signature__ = inspect.signature(fast).replace(parameters=params)
        del run.__wrapped__  # the signature above, not fast's with nat
        run.native = fast
        run.twin = twin
        return run

    return wrap


def same_signature(kernel) -> bool:
    """Whether a :func:`native_or_twin` kernel and its twin take the same parameters (names, kinds
    and defaults, in order; annotations aside). For the tests."""

    def shape(sig: inspect.Signature):
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    return shape(inspect.signature(kernel)) == shape(inspect.signature(kernel.twin))
