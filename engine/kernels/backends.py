"""The registry of kernel backends: which code advances the state rows, and on which device.

Every backend gives runners with one contract (:class:`~isan.engine.kernels.chunked.Runner`), so
chunk-parallel scoring, batches, the server's rounds and corpus scoring run on any of them
unchanged:

========  ==========================================================  ===============  ============
name      runners                                                     devices          jumps
========  ==========================================================  ===============  ============
native    the compiled C kernels (``run_streams``, ``run_jumps``)       cpu              yes
numpy     their numpy twins (``run_streams_ref``, ``run_jumps_ref``)    cpu              yes
torch     :class:`~isan.engine.kernels.torch.TorchStreams`              cpu, cuda[:N]    no (measured
                                                                                         first, issue 35)
========  ==========================================================  ===============  ============

torch is imported only when the torch backend is asked for (``device="cuda"`` asks for it): the
CPU path stays torch-free. Nothing falls back silently: a device that cannot run raises
:class:`BackendUnavailableError` naming what to install or what is missing, and
:meth:`Backend.describe` says which backend and device ran.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from isan.errors import BackendUnavailableError, IsanError, install_hint

#: Backend names, and the devices a user may name (``auto``: CUDA when torch sees a GPU, else the CPU).
NAMES = ("native", "numpy", "torch")
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Backend:
    """One backend, its device and dtype, and its runners.

    Attributes:
        name: ``"native"``, ``"numpy"`` or ``"torch"``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"float32"`` (states and products; the default) or ``"float64"`` (torch only).
        streams: the per-symbol runner (one character a step).
        jumps: the composed-jumps runner, or None where the backend has none.
    """

    name: str
    device: str
    dtype: str
    streams: object = field(repr=False)
    jumps: object | None = field(default=None, repr=False)

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def describe(self) -> dict:
        """``{"backend", "device", "dtype"}`` plus, on CUDA, ``"device_name"``, and ``"step"`` where
        the torch backend runs its fused Triton step: what ran."""
        out = {"backend": self.name, "device": self.device, "dtype": self.dtype}
        if self.name == "torch" and self.device.startswith("cuda"):
            torch = _torch()
            out["device_name"] = torch.cuda.get_device_name(torch.device(self.device))
        if self.name == "torch" and getattr(self.streams, "step", None) != "mm":
            out["step"] = self.streams.step  # the fused Triton step (TorchStreams)
            if self.streams.precision != "ieee":
                out["precision"] = self.streams.precision
        return out


def _torch(optional: bool = False):
    """The torch module, imported here only, when a torch device is asked for (the CPU path stays
    torch-free); None when ``optional`` and it cannot be imported, else a clear error (a CUDA build
    whose libraries are missing fails with OSError, not ImportError)."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        if optional:
            return None
        raise BackendUnavailableError(f"a torch device was asked for but torch is not installed: {install_hint('gpu')}"
                                      " (a GPU machine's own CUDA build of torch works too), or use device 'cpu'") from None
    except OSError as e:  # e.g. libcudart missing beside a CUDA build
        if optional:
            return None
        raise BackendUnavailableError(f"torch is installed but cannot load ({str(e).splitlines()[0][:200]}); "
                                      "reinstall it, or use device 'cpu'") from None
    return torch


def resolve_device(device: str) -> str:
    """The device a name asks for: ``"cpu"``, ``"cuda"``/``"cuda:N"`` (checked to exist), or, for
    ``"auto"``, CUDA when torch is installed and sees a GPU, else the CPU.

    Raises:
        BackendUnavailableError: CUDA asked for where torch is missing or sees no GPU.
        IsanError: an unknown device name.
    """
    device = str(device)
    if device == "cpu":
        return device
    if device == "auto":
        torch = _torch(optional=True)
        return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    if device == "cuda" or device.startswith("cuda:"):
        index = device.partition(":")[2]
        if ":" in device and not index.isdigit():
            raise IsanError(f"device {device!r}: a GPU is named cuda or cuda:N (N its index)")
        torch = _torch()
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"device {device!r} was asked for but torch {torch.__version__} sees no CUDA GPU "
                f"(torch built for CUDA {torch.version.cuda or 'none'}); use device 'cpu'")
        idx = int(index) if index else 0
        if not 0 <= idx < torch.cuda.device_count():
            raise BackendUnavailableError(f"device {device!r} does not exist: torch sees {torch.cuda.device_count()} GPU(s)")
        return device
    raise IsanError(f"device must be one of {', '.join(DEVICES)} (or cuda:N); got {device!r}")


def get_backend(name: str | None = None, device: str = "cpu", dtype: str = "float32") -> Backend:
    """The backend that runs on ``device``.

    Args:
        name: ``"native"``, ``"numpy"``, ``"torch"``, or None: native on the CPU, torch on a GPU.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (:func:`resolve_device`).
        dtype: ``"float32"`` or ``"float64"`` (float64 runs on the torch backend only: the exact
            reference on the device).
    Returns:
        Backend.
    Raises:
        BackendUnavailableError: torch or the GPU is missing (the message says what to do).
        IsanError: an unknown name, device or dtype, or a combination that cannot run (the
            native and numpy backends on a GPU; float64 outside torch).
    """
    if dtype not in DTYPES:
        raise IsanError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    device = resolve_device(device)
    if name is None:
        name = "native" if device == "cpu" and dtype == "float32" else "torch"
    if name not in NAMES:
        raise IsanError(f"backend must be one of {', '.join(NAMES)}; got {name!r}")
    if name != "torch":
        if device != "cpu":
            raise IsanError(f"the {name} backend runs on the CPU only; device {device!r} needs the torch backend")
        if dtype != "float32":
            raise IsanError(f"the {name} backend computes in float32; dtype {dtype!r} needs the torch backend")
        if name == "native":
            from isan.engine.kernels.jumps import run_jumps
            from isan.engine.kernels.streams import run_streams

            return Backend(name, device, dtype, run_streams, run_jumps)
        from isan.engine.kernels.jumps import run_jumps_ref
        from isan.engine.kernels.streams import run_streams_ref

        return Backend(name, device, dtype, run_streams_ref, run_jumps_ref)
    _torch()
    from isan.engine.kernels.torch import TorchStreams

    return Backend(name, device, dtype, TorchStreams(device, dtype))
