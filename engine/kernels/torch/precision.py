"""TF32 or not, per call: the float32 products of the torch runner without racing the process's setting.

What torch 2.x offers (checked on torch 2.13): Triton takes the precision of a product per launch
(``tl.dot(..., input_precision=...)``), so the fused step (:mod:`~isan.engine.kernels.torch.grouped`)
passes it per call and touches nothing else. A torch GEMM on CUDA (cuBLAS) has no per-call or
per-thread setting: it reads the process-wide ``torch.backends.cuda.matmul.fp32_precision`` (since
torch 2.9; before, ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.set_float32_matmul_precision``,
which torch 2.9+ refuses to read once a process has mixed the two: a RuntimeError).

So the runner's float32 calls on CUDA hold :func:`matmul_tf32` (``allow=False``), which:

* writes nothing where the process already runs IEEE float32 (the default), and nothing at all on
  the CPU device or in float64 (TF32 does not apply there): the runner does not enter it then;
* is a *mode lock* otherwise: any number of threads may hold it with the same setting at once (the
  server's threads scoring in parallel never wait for each other), a thread asking the other setting
  waits until they are done (and new holders of the first wait behind it, so neither starves); the
  first holder saves the process's setting and switches it, the last restores it exactly, through
  the API the process used (legacy or new), so torch never sees the two mixed by us.

Code of the same process that wants TF32 for its own products while runners may be in flight
asks for it through the same lock (``with matmul_tf32(True): ...``): then each sees its own
setting for its whole block. Code that writes torch's flag directly, bypassing the lock, during a
runner's call is not protected (nothing in torch can be): do not.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

__all__ = ["matmul_tf32", "tf32_enabled"]


def _matmul():
    import torch

    return torch.backends.cuda.matmul


def tf32_enabled() -> bool:
    """Whether cuBLAS float32 products in this process may use TF32 now (read without writing,
    and without the legacy getter, which raises in a process that mixed torch's two APIs)."""
    import torch

    m = _matmul()
    try:
        p = m.fp32_precision  # torch 2.9+: "tf32", "ieee", or "none" (inherit the generic setting)
    except AttributeError:  # an older torch: the legacy flag is the only one
        return bool(m.allow_tf32)
    if p == "none":
        p = getattr(torch.backends, "fp32_precision", "none")
    return p == "tf32"


def _switch(allow: bool) -> tuple:
    """Set cuBLAS's TF32 to ``allow``; returns what :func:`_restore` needs to put back exactly
    what was there, through the API the process used."""
    import torch

    m = _matmul()
    new_api = getattr(m, "fp32_precision", None)  # None: a torch before 2.9
    try:
        legacy = m.allow_tf32  # raises where the process set the new API only (torch 2.9+)
    except RuntimeError:
        m.fp32_precision = "tf32" if allow else "ieee"
        return ("new", new_api)
    try:
        precision = torch.get_float32_matmul_precision()  # "high" or "medium" (bfloat16) when TF32 is on
    except RuntimeError:
        precision = None
    m.allow_tf32 = allow
    return ("legacy", legacy, precision, new_api)


def _restore(saved: tuple) -> None:
    import torch

    m = _matmul()
    if saved[0] == "new":
        m.fp32_precision = saved[1]
        return
    _, legacy, precision, new_api = saved
    if legacy and precision not in (None, "highest"):
        torch.set_float32_matmul_precision(precision)
    else:
        m.allow_tf32 = legacy
    if new_api is not None and m.fp32_precision != new_api:  # "none" (inherit) where it was
        m.fp32_precision = new_api


class _ModeLock:
    """Holders share one setting (``allow``); the other setting waits until they are done."""

    def __init__(self):
        self._cond = threading.Condition()
        self._mode: bool | None = None  # the setting held now; None: nobody holds it
        self._holders = 0
        self._waiting = {True: 0, False: 0}  # threads waiting for each setting
        self._saved: tuple | None = None  # the process's setting before the first holder
        self._mine = threading.local()  # this thread's (setting, depth)

    def _free_for(self, allow: bool) -> bool:
        return self._mode is None or (self._mode == allow and not self._waiting[not allow])

    @contextlib.contextmanager
    def hold(self, allow: bool) -> Iterator[None]:
        allow = bool(allow)
        mine = getattr(self._mine, "held", None)
        if mine is not None:  # nested in this thread
            if mine[0] != allow:
                raise RuntimeError(f"matmul_tf32({allow}) inside matmul_tf32({mine[0]}) in one thread would deadlock")
            self._mine.held = (allow, mine[1] + 1)
            try:
                yield
            finally:
                self._mine.held = (allow, self._mine.held[1] - 1)
            return
        with self._cond:
            if not self._free_for(allow):
                self._waiting[allow] += 1
                try:
                    self._cond.wait_for(lambda: self._free_for(allow))
                finally:
                    self._waiting[allow] -= 1
            if self._mode is None:
                self._saved = _switch(allow) if tf32_enabled() != allow else None
                self._mode = allow
            self._holders += 1
        self._mine.held = (allow, 1)
        try:
            yield
        finally:
            self._mine.held = None
            with self._cond:
                self._holders -= 1
                if self._holders == 0:
                    try:
                        if self._saved is not None:
                            _restore(self._saved)
                    finally:
                        self._saved, self._mode = None, None
                        self._cond.notify_all()


_LOCK = _ModeLock()


def matmul_tf32(allow: bool) -> contextlib.AbstractContextManager:
    """Hold the process's cuBLAS float32 setting at TF32 (``allow=True``) or IEEE (``False``) for a
    block (see the module docstring): shared with other holders of the same setting, waited for by
    those of the other; the setting before is restored when the last holder leaves.

    Raises:
        RuntimeError: asked for the other setting inside a block of this one in the same thread.
    """
    return _LOCK.hold(allow)
