"""The registry of kernel backends: which code advances the state rows, and on which device.

Every backend gives runners with one contract (:class:`~isan.engine.kernels.chunked.Runner`), so
chunk-parallel scoring, batches, the server's rounds and corpus scoring run on any of them
unchanged:

========  ==========================================================  =============  =====  ===========================
name      runners                                                     devices        jumps  the default (none named)
========  ==========================================================  =============  =====  ===========================
native    the compiled C kernels (``run_streams``, ``run_jumps``)       cpu            yes    cpu in float32
numpy     their numpy twins (``run_streams_ref``, ``run_jumps_ref``)    cpu            yes    cpu in float32 where the
                                                                                            compiled module cannot load
torch     :class:`~isan.engine.kernels.torch.TorchStreams`              cpu, cuda[:N]  no     a GPU; float64
========  ==========================================================  =============  =====  ===========================

Which one runs where none is named is one rule, :func:`default_backend`: on the CPU in float32 the
backend ``ISAN_KERNELS`` names (:func:`~isan.engine.kernels.kernels_override`), else ``native``, or
``numpy`` where the compiled module cannot load (its :meth:`Backend.describe` then says why, under
``"why"``); torch on a GPU and for float64. A backend is an object: :func:`get_backend` builds one
by name from the registry (:data:`BACKENDS`) or takes any object that keeps the :class:`Backend`
protocol as it is.

torch is imported only when the torch backend is asked for (``device="cuda"`` asks for it): the
CPU path stays torch-free. Nothing falls back silently: a backend asked for by name that cannot
run raises :class:`BackendUnavailableError` naming what to install, rebuild or what is missing,
and :meth:`Backend.describe` says which backend and device ran.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from isan.engine.kernels import NAMES
from isan.engine.kernels.plan import CHECK_EVERY, DEFAULT_RTOL, Kernel, ModelFacts, Plan
from isan.errors import BackendUnavailableError, IsanError, install_hint

if TYPE_CHECKING:  # names for the annotations only
    from isan.engine.kernels.chunked import BatchResult, Runner
    from isan.engine.kernels.torch.pipeline import Pending
    from isan.engine.packed import Packed
    from isan.engine.kernels.streams import StreamModel
    from isan.params import ISANParams

#: The devices a user may name (``auto``: CUDA when torch sees a GPU, else the CPU).
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("float32", "float64")


#: Characters a call should hold where the caller chooses (:attr:`Backend.batch_chars`), by device.
CPU_BATCH_CHARS = 2_000_000
GPU_BATCH_CHARS = 32_000_000


@runtime_checkable
class Backend(Protocol):
    """One backend, its device and dtype, and its runners: what the Engine, the corpus scorer and
    the server ask, instead of branching on a backend's name. Any object with these attributes and
    methods keeps it (``isinstance(obj, Backend)``; no base class needed) and runs where a backend
    is asked for (``Engine(..., kernels=obj)``, :func:`get_backend`).

    Attributes:
        name: ``"native"``, ``"numpy"`` or ``"torch"`` for the registry's backends (a key of
            :data:`BACKENDS`); another object's own name.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"float32"`` (states and products; the default) or ``"float64"`` (torch only).
        streams: the per-symbol runner (one character a step).
        jumps: the composed-jumps runner, or None where the backend has none.
        runs_tables: whether the trie table's paths (the sequential ``composed`` path and
            ``jumps``) and the float64 ``reference`` path run beside it (the CPU's kernels); else
            every text goes chunk-parallel through :attr:`streams`.
        one_process: whether a corpus job must run in one process (its GEMM libraries choose
            kernels by shape, so a document's last bits could depend on how the work was cut).
        reports_where: whether a scoring report names the backend and device (all but the default).
        rtol: the correction's tolerance its plans stop at (the certificate's forgetting bound is
            asked at it: :class:`~isan.engine.kernels.plan.ModelFacts`).
        rounding: the name of the kernel a corpus job records where the bits depend on the
            backend (``"torch-cuda-float32"``), or None where they are the CPU kernels'.
        batch_chars: characters a caller should hand over in one call where it can choose (a
            corpus job's batches): about 2M on the CPU (a call's rows fit the caches' worth of work
            per thread), 32M on a GPU (a call there has a fixed cost of launches and
            synchronisations that only a large batch amortises; ``isan bench gpu``).
    """

    name: str
    device: str
    dtype: str
    streams: "Runner"
    jumps: "Runner | None"
    runs_tables: bool
    one_process: bool
    reports_where: bool

    @property
    def on_cpu(self) -> bool: ...

    @property
    def batch_chars(self) -> int: ...

    @property
    def rounding(self) -> str | None: ...

    @property
    def rtol(self) -> float: ...

    def plan(self, lengths: Sequence[int], threads: int, facts: ModelFacts, cut: bool = True,
             kernel: Kernel = Kernel.AUTO) -> Plan: ...

    def fallback(self, params: "ISANParams", forget_bound_chars: int | None): ...

    def submit(self, plan: Plan, packed: "Packed", hs: np.ndarray, want: str = "totals",
               threads: int = 1, finals: bool = True) -> "BatchResult | Pending": ...

    def describe(self) -> dict:
        """``{"backend", "device", "dtype", ...}``: what ran (the JSON a report carries)."""
        ...


@dataclass(frozen=True)
class _Kernels:
    """What every backend of the registry holds (:class:`Backend`): its name, device, dtype and
    runners, and ``why`` it runs where it was chosen for the caller although it is not the usual
    one (the compiled kernels missing, ``ISAN_KERNELS``), else None."""

    name: str
    device: str
    dtype: str
    streams: "Runner" = field(repr=False)
    jumps: "Runner | None" = field(default=None, repr=False)
    why: str | None = None

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def batch_chars(self) -> int:
        """Characters a call should hold where the caller chooses (:class:`Backend`)."""
        return GPU_BATCH_CHARS if self.device.startswith("cuda") else CPU_BATCH_CHARS

    def submit(self, plan: Plan, packed: "Packed", hs: np.ndarray, want: str = "totals",
               threads: int = 1, finals: bool = True) -> "BatchResult":
        """Score one batch of texts (``packed``, from the states ``hs``: (B, d) or (d,)) by ``plan``,
        here at once (:func:`~isan.engine.kernels.chunked.score_packed`): the result's
        ``result()`` is itself. A backend with an overlapped pipeline returns the batch in flight
        instead (:class:`TorchBackend`); :func:`isan.engine.batches.score_batches` keeps one so.
        ``finals``: whether the caller reads the final states (here they are made anyway)."""
        from isan.engine.kernels.chunked import score_packed

        return score_packed(plan, packed, hs, want, threads)

    def describe(self) -> dict:
        """``{"backend", "device", "dtype"}``: what ran; and ``"why"`` where it was chosen for the
        caller although it is not the usual one (:func:`default_backend`)."""
        out = {"backend": self.name, "device": self.device, "dtype": self.dtype}
        if self.why is not None:
            out["why"] = self.why
        return out


@dataclass(frozen=True)
class CpuBackend(_Kernels):
    """The CPU's kernels: the compiled C kernels (``native``) or their numpy twins (``numpy``),
    in float32; a per-symbol runner and a composed-jumps runner (:class:`Backend`)."""

    runs_tables: bool = True
    one_process: bool = False

    @property
    def reports_where(self) -> bool:
        return self.name != "native"

    @property
    def rounding(self) -> str | None:
        return None

    @property
    def rtol(self) -> float:
        """The correction's tolerance its plans stop at (:data:`~isan.engine.kernels.plan.DEFAULT_RTOL`)."""
        return DEFAULT_RTOL

    def plan(self, lengths: Sequence[int], threads: int, facts: ModelFacts, cut: bool = True,
             kernel: Kernel = Kernel.AUTO) -> Plan:
        """How a batch of texts of these ``lengths`` runs on ``threads`` threads.

        Args:
            lengths: characters of each text.
            threads: kernel threads (the rows planned: ROWS_PER_THREAD a thread).
            facts: what the plan reads of the model (:class:`~isan.engine.kernels.plan.ModelFacts`).
            cut: False for one row a text.
            kernel: ``"chunked"``, ``"jumps"``, ``"jumps-f16"`` or ``"auto"``: jumps when the model
                has a trie table and the batch makes at least ``MIN_ROWS_PER_THREAD`` rows a thread
                (queues by key need many rows), else chunked.
        Returns:
            Plan, without its model (the planner attaches the layout of its kernel).
        """
        from isan.engine.kernels.chunked import plan_chunks
        from isan.engine.kernels.jumps import MIN_ROWS_PER_THREAD, ROWS_PER_THREAD

        planned = np.asarray(plan_chunks([int(n) for n in lengths], target_rows=ROWS_PER_THREAD * threads,
                                         min_chunk=facts.min_chunk) if cut else np.ones(len(lengths)), dtype=np.int64)
        kernel = Kernel.of(kernel)
        if kernel is Kernel.AUTO:
            enough = int(planned.sum()) >= MIN_ROWS_PER_THREAD * threads
            kernel = Kernel.JUMPS if facts.has_table and enough else Kernel.CHUNKED
        if kernel.uses_table:
            return Plan(kernel, None, planned, self.jumps, path=kernel.value)
        if kernel is not Kernel.CHUNKED:
            raise IsanError(f"the {self.name} backend runs the kernels auto, chunked, jumps and jumps-f16; "
                            f"got {kernel.value!r}")
        return Plan(kernel, None, planned, self.streams)

    def fallback(self, params: "ISANParams", forget_bound_chars: int | None):
        """A certified model's proof that no chunk needs the float64 fallback
        (:class:`~isan.engine.forgetting.ProvenForgetting`; ``forget_bound_chars`` not None), else
        :class:`~isan.engine.kernels.chunked.Float64Fallback` of ``params``."""
        from isan.engine.forgetting import ProvenForgetting
        from isan.engine.kernels.chunked import Float64Fallback

        return ProvenForgetting(forget_bound_chars) if forget_bound_chars is not None else Float64Fallback(params)


@dataclass(frozen=True)
class TorchBackend(_Kernels):
    """The torch backend (any torch device; float32 or float64): one per-symbol runner,
    :class:`~isan.engine.kernels.torch.TorchStreams`, for every text and batch (:class:`Backend`)."""

    runs_tables: bool = False
    one_process: bool = True
    reports_where: bool = True

    @property
    def rounding(self) -> str | None:
        return f"torch-{self.device.split(':')[0]}-{self.dtype}"

    @property
    def rtol(self) -> float:
        """The correction's tolerance its plans stop at: the dtype's (:mod:`isan.engine.kernels.torch.plan`)."""
        from isan.engine.kernels.torch import plan

        return plan.rtol(self.dtype)

    def plan(self, lengths: Sequence[int], threads: int, facts: ModelFacts, cut: bool = True,
             kernel: Kernel = Kernel.AUTO) -> Plan:
        """Every batch on the per-symbol runner (``kernel`` is ignored), cut for the device
        (:mod:`isan.engine.kernels.torch.plan`) at the dtype's tolerance (:attr:`rtol`); without its
        model (the planner attaches it)."""
        from isan.engine.kernels.torch import plan

        chunks = plan.chunks([int(n) for n in lengths], self.device, threads, self.dtype, facts.forget_bound_chars) \
            if cut else np.ones(len(lengths))
        return Plan(Kernel.TORCH, None, np.asarray(chunks, dtype=np.int64), self.streams, rtol=self.rtol,
                    check_every=plan.check_every(self.device) or CHECK_EVERY, empty_bits=self.streams.empty_bits,
                    row_totals=True)

    def submit(self, plan: Plan, packed: "Packed", hs: np.ndarray, want: str = "totals",
               threads: int = 1, finals: bool = True) -> "BatchResult | Pending":
        """One batch by ``plan``: where it cuts no text, queued on the device and returned in
        flight (:func:`~isan.engine.kernels.torch.pipeline.submit`: its ``result()`` waits for it,
        so the host builds the next batch meanwhile); a batch of texts cut into chunks is scored
        chunk-parallel at once (:func:`~isan.engine.kernels.chunked.score_packed`). ``finals``: False
        leaves the final states on the device (the result's ``finals`` is None)."""
        from isan.engine.kernels.chunked import ChunkedReport, score_packed
        from isan.engine.kernels.torch import pipeline

        if plan.cuts:
            return score_packed(plan, packed, hs, want, threads)
        chars = int(packed.length.sum())
        report = ChunkedReport(chunks=len(packed), chars=chars, rtol=plan.rtol, margin=plan.margin, path=plan.path,
                               steps=chars, jumps=chars)
        return pipeline.submit(self.streams, plan.model, packed, hs, want, report=report, finals=finals)

    def fallback(self, params: "ISANParams", forget_bound_chars: int | None):
        """Always :class:`~isan.engine.kernels.chunked.Float64Fallback`: the device's chunks and
        tolerance are its own, so the certificate's bound is not relied on."""
        from isan.engine.kernels.chunked import Float64Fallback

        return Float64Fallback(params)

    def describe(self) -> dict:
        """``{"backend", "device", "dtype", "step", "step_reason"}`` (which step runs, the fused Triton
        step or one product a symbol, and why: never a silent choice) plus, on CUDA, ``"device_name"``,
        and ``"precision"`` where not IEEE: what ran."""
        out = super().describe()
        if self.device.startswith("cuda"):
            torch = _torch()
            out["device_name"] = torch.cuda.get_device_name(torch.device(self.device))
        out.update(self.streams.describe())  # TorchStreams: its step, why, and its precision
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


def default_backend(device: str, dtype: str = "float32", explain: bool = False) -> "str | tuple[str, str | None]":
    """The name of the backend that runs on ``device`` in ``dtype`` when none is named: the one
    rule every caller asks (the Engine, the corpus job's workers, the CLI).

    On ``"cpu"`` in float32: the backend ``ISAN_KERNELS`` names where it is set
    (:func:`~isan.engine.kernels.kernels_override`), else ``"native"`` (the compiled kernels), or
    ``"numpy"`` (their twins) where the compiled module cannot load. ``"torch"`` elsewhere (a GPU,
    or float64 anywhere).

    Args:
        device: as given or resolved (``"auto"`` is resolved first, :func:`resolve_device`).
        dtype: ``"float32"`` or ``"float64"``.
        explain: also say why the choice is not the usual one.
    Returns:
        The name; with ``explain``, ``(name, why)``: ``why`` a sentence where the choice is not the
        usual one (``ISAN_KERNELS``, or the compiled kernels missing), else None.
    Raises:
        IsanError: ``ISAN_KERNELS`` names no backend.
    """
    from isan.engine.kernels import kernels_override, native_error

    if str(device) == "auto":
        device = resolve_device(device)
    name, why = "torch", None
    if device == "cpu" and dtype == "float32":
        name, override, missing = "native", kernels_override(), native_error()
        if override is not None:
            name, why = override, (f"ISAN_KERNELS={override}" if override != "native" else None)
        elif missing is not None:
            name, why = "numpy", f"the compiled kernels are not available: {missing}"
    return (name, why) if explain else name


#: What an object must have to be a backend: the :class:`Backend` protocol's attributes and methods.
BACKEND_MEMBERS = tuple(sorted(set(Backend.__annotations__) | {k for k in vars(Backend) if not k.startswith("_")}))


def check_backend(obj: object) -> Backend:
    """``obj`` itself where it keeps the :class:`Backend` protocol (any class: checked by the
    runtime protocol, not by its base classes).

    Raises:
        IsanError: ``obj`` lacks some of the protocol's members, or has None for a method (the
            message names them).
    """
    if isinstance(obj, Backend):
        return obj
    missing = [m for m in BACKEND_MEMBERS if not hasattr(obj, m)
               or (callable(getattr(Backend, m, None)) and getattr(obj, m) is None)]
    raise IsanError(f"kernels must be a backend name ({', '.join(NAMES)}) or an object that keeps the Backend "
                    f"protocol (isan.engine.kernels.backends.Backend); this {type(obj).__name__} has no "
                    f"{', '.join(missing)}")


def get_backend(name: "str | Backend | None" = None, device: str = "cpu", dtype: str = "float32",
                **options) -> Backend:
    """The backend that runs on ``device``.

    Args:
        name: ``"native"``, ``"numpy"``, ``"torch"``, or None: the default for the device and dtype
            (:func:`default_backend`; where it is not the usual one, its ``describe()`` says why);
            or any object that keeps the :class:`Backend` protocol, returned as it is (``device``
            and ``dtype`` are its own).
        options: the backend's own options (torch: ``step`` and ``precision`` of
            :class:`~isan.engine.kernels.torch.TorchStreams`); the CPU backends take none.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (:func:`resolve_device`).
        dtype: ``"float32"`` or ``"float64"`` (float64 runs on the torch backend only: the exact
            reference on the device).
    Returns:
        Backend.
    Raises:
        BackendUnavailableError: torch or the GPU is missing, or the native backend is asked for
            where the compiled kernels cannot load (the message says what to do).
        IsanError: an unknown name, device or dtype, an object that is not a backend (the message
            names what it lacks), options given with one, or a combination that cannot run (the
            native and numpy backends on a GPU; float64 outside torch).
    """
    if name is not None and not isinstance(name, str):
        if options:
            raise IsanError(f"options {', '.join(map(repr, options))} are for a backend built by name; "
                            "this one is already built")
        return check_backend(name)
    if dtype not in DTYPES:
        raise IsanError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    device = resolve_device(device)
    why = None
    if name is None:
        name, why = default_backend(device, dtype, explain=True)
    if name not in BACKENDS:
        raise IsanError(f"backend must be one of {', '.join(NAMES)}; got {name!r}")
    try:
        backend = BACKENDS[name](device, dtype, **options)
    except TypeError as e:  # an option the backend does not have
        raise IsanError(f"the {name} backend takes no option {', '.join(map(repr, options))} ({e})") from None
    return dataclasses.replace(backend, why=why) if why is not None else backend


def _cpu_only(name: str, device: str, dtype: str) -> None:
    if device != "cpu":
        raise IsanError(f"the {name} backend runs on the CPU only; device {device!r} needs the torch backend")
    if dtype != "float32":
        raise IsanError(f"the {name} backend computes in float32; dtype {dtype!r} needs the torch backend")


def _native_backend(device: str, dtype: str) -> Backend:
    """The compiled C kernels (``run_streams``, ``run_jumps``) on the CPU, float32;
    BackendUnavailableError where the compiled module cannot load (never their twins in its name)."""
    from isan.engine.kernels import native_error

    _cpu_only("native", device, dtype)
    missing = native_error()
    if missing is not None:
        raise BackendUnavailableError(
            f"the native backend's compiled kernels cannot load ({missing}); rebuild them with "
            "`pip install --force-reinstall .` in the isan repository folder, with a C compiler (gcc or clang) "
            "present, or use the numpy backend (the default where they are missing)")
    from isan.engine.kernels.jumps import run_jumps
    from isan.engine.kernels.streams import run_streams

    return CpuBackend("native", device, dtype, run_streams, run_jumps)


def _numpy_backend(device: str, dtype: str) -> Backend:
    """The compiled kernels' numpy twins (``run_streams_ref``, ``run_jumps_ref``) on the CPU, float32."""
    _cpu_only("numpy", device, dtype)
    from isan.engine.kernels.jumps import run_jumps_ref
    from isan.engine.kernels.streams import run_streams_ref

    return CpuBackend("numpy", device, dtype, run_streams_ref, run_jumps_ref)


def _torch_backend(device: str, dtype: str, step: str = "auto", precision: str = "ieee") -> Backend:
    """:class:`~isan.engine.kernels.torch.TorchStreams` on any torch device, float32 or float64,
    with its ``step`` and ``precision`` (ValueError as an IsanError where they cannot run)."""
    _torch()
    from isan.engine.kernels.torch import TorchStreams

    try:
        runner = TorchStreams(device, dtype, step=step, precision=precision)
    except ValueError as e:
        raise IsanError(str(e)) from e
    return TorchBackend("torch", device, dtype, runner)


#: The registry: a backend's name to its factory ``(device, dtype) -> Backend`` (device resolved,
#: dtype checked); :func:`get_backend` looks names up here.
BACKENDS: dict[str, Callable[[str, str], Backend]] = {
    "native": _native_backend,
    "numpy": _numpy_backend,
    "torch": _torch_backend,
}
