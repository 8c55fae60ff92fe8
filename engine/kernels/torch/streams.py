"""Many state rows advanced together, grouped by symbol, in torch on any device: :class:`TorchStreams`.

The same contract as :func:`~isan.engine.kernels.streams.run_streams` (its numpy twin
:func:`~isan.engine.kernels.streams.run_streams_ref` is the reference these tests compare with):
row s reads ``ids[start[s] : start[s] + length[s]]`` from the state row ``H[s]``; each step it is
checked (``max |h| <= limit``), read out (``bits = -log2 softmax(W_ro h + b_ro)[x]``, the
prediction of a character from the state before it) and stepped (``h <- W[x] h + b[x]``, Foerster
et al. 2017, eq. 1). With ``pairs=True`` rows ``P + s`` are error rows (``e <- W[x] e``) and a pair
stops once ``max|e| <= stop_ratio * max(1, max|h|)``, checked every ``check_every`` steps: the
correction pass of chunk-parallel scoring (:mod:`isan.engine.kernels.chunked`), which runs
unchanged on this runner.

How the work is laid out (a step is the routing of a mixture of experts: a row's symbol is its
expert, and a row never gathers its own ``W[x]``, 187 KB a row a step at d = 216):

* Steps run in *blocks* of ``check_every`` steps (``block`` without pairs). At the start of a
  block the rows still running are compacted onto the device, and the symbols of all their steps
  in the block are sorted at once (one ``torch.sort`` over a (steps, rows) matrix; a row past its
  end reads a sentinel symbol that sorts last and is carried unchanged). The group sizes of the
  whole block cross to the host in one transfer; the steps themselves run without waiting for the
  host (the block's bookkeeping, compaction and masked writes, waits a few times a block).
* A step is ``rows @ WT[x]`` in the homogeneous row layout ``[h, 1]`` (the bias rides in the
  product), run one of two ways (``step``): one fused Triton kernel that gathers, multiplies and
  scatters each symbol's rows (:mod:`~isan.engine.kernels.torch.grouped`, the default on a GPU in
  float32), or a gather of the rows in symbol order, one torch GEMM per symbol present on a
  contiguous slice, and a scatter back (``"mm"``, any device).
* The states of the block's steps live in one buffer and are read out with one GEMM every so many
  steps; the log-softmax runs in float64 (as the numpy twin's), and bits, range checks and the
  stopping step of a row that leaves the range are worked out on the device, the bits written
  without a host synchronisation. Results come back through page-locked memory.

``dtype`` is the arithmetic of the states and products: float32 (the default, as the compiled
kernel; never TF32, whatever the process set: on CUDA a call holds torch's process-wide
setting at IEEE through a lock shared with the other calls, :mod:`~isan.engine.kernels.torch.precision`) or float64 (the exact
reference on the device: bits within about 1e-12 of the float64 numpy reference of the model's
weights, which bundles store in float32). In float64 the products of the ``"mm"`` step and of the
readout are made from pieces whose GEMM sums are exact (:mod:`~isan.engine.kernels.torch.ozaki`), so
the order a BLAS adds in cannot show: the bits are the same bytes whatever torch's thread count,
the machine's load and the other rows of the call, for six times a product's arithmetic (with the
fused Triton step, whose float64 products are Triton's own, the readout's are plain GEMMs too). The arrays of the contract (``H`` and ``bits``) stay
numpy on the host: the span of ``ids`` and ``bits`` the rows read is copied to the device once a
call and back once at its end.

Differences from the compiled kernel, none in the results it promises: a row that leaves the range
(``diverged >= 0``) is stopped with its bits written up to and including that step as there, but
its final row in ``H`` is not meaningful (the compiled kernel leaves the state after the bad step;
here the block's later steps may have run); ``threads``, ``split`` and ``frac`` are accepted and
ignored (they choose a CPU schedule).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels.streams import SCHED_FRAC, StreamModel, StreamsResult, check_frac, check_rows_arguments
from isan.engine.kernels.torch import ozaki
from isan.engine.kernels.torch.precision import matmul_tf32

#: Steps a block runs between synchronisations when rows are not in pairs (with pairs: ``check_every``)
#: on the CPU device; on a GPU as many as :data:`BLOCK_BYTES` of the block's bookkeeping allow (a
#: synchronisation drains the device's queue: 65,536 documents x 512 characters ran in 8 blocks of 64
#: steps at 55M chars/s on an H200, bench_results/gpu_h200/run4, where their steps alone ran at 261M).
BLOCK_STEPS = 64
#: Bytes of a block's bookkeeping on a GPU (about 56 a row a step: its positions, symbols, their sort
#: and the Triton step's tiles), which bounds the steps of a block there.
BLOCK_BYTES = 2 << 30
#: How a step runs (see :class:`TorchStreams`).
STEPS = ("auto", "mm", "triton")
#: What importing Triton (with the step's module, which compiles nothing but builds its kernel and
#: autotuner) raises where the Triton step cannot run: Triton missing or broken (ImportError), a
#: CUDA driver or library that cannot load (OSError), Triton's own checks of its driver, backend
#: or version (RuntimeError), a Triton whose API does not match torch's or this module's
#: (AttributeError, TypeError). ``step="triton"`` turns them into a ValueError; ``"auto"`` logs
#: them and runs ``"mm"`` (:attr:`TorchStreams.step_reason` says why).
TRITON_IMPORT_ERRORS = (ImportError, OSError, RuntimeError, AttributeError, TypeError)

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class _DeviceModel:
    """The weights on the device: WT (K, d + 1, d + 1) and RoT (d + 1, V), unpadded."""

    WT: torch.Tensor
    RoT: torch.Tensor
    d: int
    V: int
    K: int
    key: tuple = field(repr=False)
    source: object = field(repr=False)  # the StreamModel itself: held, so its id is not reused while cached
    WT_ext: torch.Tensor | None = field(default=None, repr=False)  # WT and an identity for symbol K (triton)
    width: int = 0  # the row stride of the states: d + 1, or padded for the Triton step
    RoT_w: torch.Tensor | None = field(default=None, repr=False)  # RoT with zero rows to the width
    # float64: the weights split for exact products (ozaki.split_right): WT's (K, d + 1, 2 (d + 1))
    # for the "mm" step, RoT_w's (width, 2 V) for the readout; None in float32
    WT_split: torch.Tensor | None = field(default=None, repr=False)
    RoT_split: torch.Tensor | None = field(default=None, repr=False)


class TorchStreams:
    """A runner with :func:`~isan.engine.kernels.streams.run_streams`'s signature, in torch.

    Args:
        device: a torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        dtype: ``"float32"`` (default) or ``"float64"``: the arithmetic of states and products.
        block: steps between synchronisations without pairs (default: :data:`BLOCK_STEPS` on the
            CPU device; on a GPU all the rows' steps, as far as :data:`BLOCK_BYTES` allows).
        step: how a step runs: ``"mm"`` (one torch GEMM per symbol between a gather and a scatter;
            any device), ``"triton"`` (one fused grouped kernel a step,
            :mod:`~isan.engine.kernels.torch.grouped`; a GPU, or the CPU device under Triton's
            interpreter) or ``"auto"`` (default: ``"triton"`` on a GPU in float32 where Triton
            imports, else ``"mm"``). The attribute ``step`` says which was chosen and
            ``step_reason`` why; :meth:`describe` gives both. ``"auto"`` on a GPU where Triton
            cannot run (:data:`TRITON_IMPORT_ERRORS`, or its interpreter turned on) logs a
            warning, never a silent change.
        precision: the Triton step's products in float32: ``"ieee"`` (default) or ``"tf32x3"``
            (three TF32 tensor-core products: about float32's accuracy; measured by ``isan bench gpu``).

    Raises:
        ValueError: an unknown dtype or step, a block under 1, or ``step="triton"`` where Triton
            cannot run on the device (cannot be imported: the message says what it raised).

    The runner keeps the last model's weights on the device (keyed by the model object), so many
    calls with one model copy them once. It holds no other state between calls: a call that raises
    leaves it ready for the next.
    """

    name = "torch"

    def __init__(self, device: str | torch.device = "cpu", dtype: str = "float32", block: int | None = None,
                 step: str = "auto", precision: str = "ieee"):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}; got {dtype!r}")
        if block is not None and int(block) < 1:
            raise ValueError(f"block must be at least 1; got {block}")
        if step not in STEPS:
            raise ValueError(f"step must be one of {', '.join(STEPS)}; got {step!r}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.block = int(block) if block is not None else None
        self._tdtype = _DTYPES[dtype]
        self._model: _DeviceModel | None = None
        self._grouped = None  # the Triton step's module, where it runs
        self.step, self.step_reason = self._choose_step(step)
        if precision not in ("ieee", "tf32x3") or (precision != "ieee" and (self.step != "triton" or dtype != "float32")):
            raise ValueError(f"precision must be 'ieee' or, with the Triton step in float32, 'tf32x3'; got {precision!r} "
                             f"(step {self.step}, {dtype})")
        self.precision = precision
        #: whether a call holds torch's cuBLAS setting at IEEE (:func:`.precision.matmul_tf32`): float32 on
        #: CUDA only (TF32 applies to float32 cuBLAS products; the CPU device and float64 need nothing)
        self._holds_tf32 = self.device.type == "cuda" and dtype == "float32"

    def _choose_step(self, step: str) -> tuple[str, str]:
        """The step and why: ``"auto"``, the fused Triton step on a GPU in float32 where Triton
        imports, else ``"mm"`` (logged; a GPU's fall back to ``"mm"`` as a warning). ``"triton"``
        asked for where it cannot run raises (nothing is silently replaced)."""
        if step == "mm":
            return "mm", "asked for"
        if step == "auto" and self.device.type == "cpu":
            return self._auto_mm("the CPU device (the Triton step runs there only in Triton's interpreter)")
        if step == "auto" and self.dtype != "float32":
            return self._auto_mm(f"{self.dtype}: the fused step is the default in float32 only")
        try:
            grouped = _import_triton_step()
        except TRITON_IMPORT_ERRORS as e:  # Triton missing, or it cannot load here
            why = f"Triton cannot be imported ({type(e).__name__}: {_first_line(e)})"
            if step == "auto":
                return self._auto_mm(why, warn=True)
            raise ValueError(f"step 'triton' needs Triton, which cannot be imported here ({type(e).__name__}: "
                             f"{_first_line(e)}); use step='mm'") from e
        if step == "auto" and grouped.interpreted():
            return self._auto_mm("Triton's interpreter is on (TRITON_INTERPRET=1): it runs on the CPU device only",
                                 warn=True)
        grouped.check_device(self.device)
        self._grouped = grouped
        return "triton", ("asked for" if step == "triton" else f"auto: a GPU ({self.device}) in float32 where Triton imports")

    def _auto_mm(self, why: str, warn: bool = False) -> tuple[str, str]:
        """``step="auto"`` runs ``"mm"`` because of ``why``: logged (a warning where a GPU loses
        the fused step), and said by :meth:`describe`."""
        (log.warning if warn else log.info)("torch runner on %s in %s: step 'auto' runs 'mm': %s",
                                             self.device, self.dtype, why)
        return "mm", f"auto: {why}"

    def describe(self) -> dict:
        """What runs: ``{"step", "step_reason"}`` and, where not IEEE, ``"precision"``."""
        out = {"step": self.step, "step_reason": self.step_reason}
        if self.precision != "ieee":
            out["precision"] = self.precision
        return out

    def __repr__(self) -> str:
        return (f"TorchStreams(device={str(self.device)!r}, dtype={self.dtype!r}, step={self.step!r}"
                + (f", precision={self.precision!r})" if self.precision != "ieee" else ")"))

    #: chunk-parallel scoring keeps its state rows in this dtype (:mod:`isan.engine.kernels.chunked`)
    @property
    def state_dtype(self):
        return np.float64 if self.dtype == "float64" else np.float32

    #: the ids it reads (uint8 where the alphabet allows travels as it is; int32 otherwise)
    ids_dtypes = (np.int32, np.uint8)

    def device_model(self, model: StreamModel) -> _DeviceModel:
        """The weights of ``model`` on this runner's device and in its dtype (copied once, then kept)."""
        key = (id(model), model.WT.ctypes.data, model.RoT.ctypes.data)
        dm = self._model
        if dm is None or dm.key != key:
            d, V = model.d, model.V
            # WT and RoT are float32 in the StreamModel; the float64 runner widens them (exactly)
            WT = torch.from_numpy(np.ascontiguousarray(model.WT[:, : d + 1, : d + 1]))
            RoT = torch.from_numpy(np.ascontiguousarray(model.RoT[: d + 1, :V]))
            dm = _DeviceModel(WT.to(self.device, self._tdtype), RoT.to(self.device, self._tdtype), d, V, model.K, key,
                              model)
            dm.width, dm.RoT_w = d + 1, dm.RoT
            if self.step == "triton":
                dm.WT_ext = self._grouped.with_identity(dm.WT)
                dm.width = self._grouped.padded(d + 1)
                dm.RoT_w = torch.zeros((dm.width, V), dtype=dm.RoT.dtype, device=dm.RoT.device)
                dm.RoT_w[: d + 1] = dm.RoT
            if self.dtype == "float64" and self.step == "mm":  # products whose sums are exact: the same bytes
                dm.RoT_split = ozaki.split_right(dm.RoT_w)  # in any order (the Triton step's own are not)
                dm.WT_split = ozaki.split_right(dm.WT)
            self._model = dm
        return dm

    def __call__(self, model: StreamModel, ids: np.ndarray, start: np.ndarray, length: np.ndarray, H: np.ndarray,
                 bits: np.ndarray | None = None, pairs: bool = False, stop_ratio: float = 0.0,
                 check_every: int = 16, limit: float = MAX_STATE_ABS, threads: int = 1,
                 split: str = "auto", frac: float = SCHED_FRAC, totals: np.ndarray | None = None) -> StreamsResult:
        """Advance every row through its characters (see the module docstring).

        Args:
            model: the weights (:meth:`StreamModel.from_params`).
            ids: (N,) int32 or uint8 symbol ids; start, length: (P,) int64.
            H: (P, dp) (2P with ``pairs``) state rows, float32 or float64 (the arithmetic is the
                runner's ``dtype`` whatever H's), updated in place to the final states.
            bits: (N,) float64 or None: where the bits of each character are written.
            pairs, stop_ratio, check_every, limit: as :func:`~isan.engine.kernels.streams.run_streams`.
            threads, split, frac: accepted for the signature and ignored (``frac`` is checked).
            totals: (P,) float64 or None: where each row's sum of the bits it writes goes, reduced
                on the device (rows without pairs only), its bits added one at a time in order (the
                same bytes whatever the other rows): with ``bits=None``, no character's bits
                leave the device.
        Returns:
            StreamsResult (total_steps, steps_done, residual, diverged).
        Raises:
            TypeError, ValueError: arrays of the wrong dtype, shape or range.
        """
        P = check_rows_arguments(model, ids, start, length, H, bits, pairs,
                                 np.float64 if H.dtype == np.float64 else np.float32, ids_dtypes=self.ids_dtypes)
        check_frac(frac)
        if P and (start.min() < 0 or length.min() < 0 or int((start + length).max()) > len(ids)):
            raise ValueError("every row must read inside ids: 0 <= start and start + length <= len(ids)")
        check_every = int(check_every)
        if check_every < 1:
            raise ValueError(f"check_every must be at least 1; got {check_every}")
        if totals is not None and (pairs or totals.dtype != np.float64 or totals.shape != (P,)):
            raise ValueError("totals must be a (P,) float64 array, for rows without pairs")
        steps_done = np.zeros(P, dtype=np.int64)
        residual = np.full(P, np.inf, dtype=np.float32)
        diverged = np.full(P, -1, dtype=np.int64)
        if P == 0:
            return StreamsResult(0, steps_done, residual, diverged)
        # float32 means float32 (TF32 would err by ~1e-3): torch's GEMMs on CUDA read a process-wide
        # setting, held at IEEE for the call by a lock shared with the other calls (precision.py)
        with self.ieee(), torch.no_grad(), on_device(self.device):
            total = self._run(model, ids, start, length, H, bits, pairs, float(stop_ratio), check_every,
                              float(limit), steps_done, residual, diverged, totals)
        return StreamsResult(int(total), steps_done, residual, diverged)

    def block_steps(self, rows: int, longest: int) -> int:
        """Steps a block runs without pairs: ``block`` if given; on the CPU device
        :data:`BLOCK_STEPS`; on a GPU the longest row's, as far as :data:`BLOCK_BYTES` allows."""
        if self.block is not None:
            return self.block
        if self.device.type == "cpu":
            return BLOCK_STEPS
        return max(BLOCK_STEPS, min(longest, BLOCK_BYTES // (56 * max(1, rows))))

    def ieee(self) -> contextlib.AbstractContextManager:
        """What a call holds while it launches: torch's cuBLAS setting at IEEE float32 on CUDA in
        float32 (:func:`.precision.matmul_tf32`, a lock shared with the other calls), else nothing."""
        return matmul_tf32(False) if self._holds_tf32 else contextlib.nullcontext()

    def upload(self, dm: "_DeviceModel", ids: np.ndarray, start: np.ndarray, length: np.ndarray,
               rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A call's inputs on the device, never sharing the caller's memory: the ids in the narrowest
        type that holds the alphabet (uint8 for K <= 256: a quarter of int32's bytes; a block widens
        only its own symbols), the rows' starts and lengths, and the state rows in the runner's dtype."""
        dev = self.device
        return (_to_device(ids, dev, np.uint8 if dm.K <= 256 else np.int32), _to_device(start, dev),
                _to_device(length, dev), _to_device(rows, dev).to(self._tdtype))

    def empty_bits(self, n: int) -> np.ndarray:
        """(n,) float64, uninitialised: where a caller has this runner write the bits of ``n``
        characters; on a GPU page-locked, so that they come back in one direct copy (no staging
        copy, no page faults of fresh memory: about a third of a 65,536 x 512 batch's host time)."""
        if self.device.type == "cpu":
            return np.empty(n, dtype=np.float64)
        return torch.empty(n, dtype=torch.float64, pin_memory=True).numpy()

    def _run(self, model, ids, start, length, H, bits, pairs, stop_ratio, check_every, limit,
             steps_done, residual, diverged, totals=None) -> int:
        dev = self.device
        dm = self.device_model(model)
        d = dm.d
        P = len(start)
        blk = check_every if pairs else self.block_steps(P, int(length.max()))
        lo, hi = int(start.min()), int((start + length).max())  # the span the rows read: only it travels
        ids_d, start_d, length_d, Hall = self.upload(dm, ids[lo:hi], start - lo, length, H[:, : d + 1])
        out = ReadoutBuffers.on(dev, chars=hi - lo if bits is not None else None, rows=P if totals is not None else None)
        steps_d = torch.zeros(P, dtype=torch.int64, device=dev)
        div_d = torch.full((P,), -1, dtype=torch.int64, device=dev)
        res_d = torch.full((P,), math.inf, dtype=torch.float32, device=dev)
        running = torch.ones(P, dtype=torch.bool, device=dev)  # not finished, converged or diverged
        total = torch.zeros((), dtype=torch.int64, device=dev)
        t0 = 0
        while True:
            # between blocks: drop finished rows and (pairs, at a check) converged ones
            fin = running & (length_d <= t0)
            steps_d = torch.where(fin, length_d, steps_d)
            running &= ~fin
            if pairs and t0 > 0 and t0 % check_every == 0:
                mh = max_abs(Hall[:P], 1)  # whole rows: the homogeneous 1 floors max|h| at 1
                me = max_abs(Hall[P:], 1)
                r = (me / mh).to(torch.float32)
                res_d = torch.where(running, r, res_d)
                conv = running & (r <= stop_ratio)
                steps_d = torch.where(conv, torch.full_like(steps_d, t0), steps_d)
                running &= ~conv
            act = torch.nonzero(running).squeeze(1)  # (A,) the rows of this block
            A = int(act.numel())  # the block's synchronisation
            if A == 0:
                break
            blk_steps = StepBlock(self, dm, Hall, act, P if pairs else 0, ids_d, start_d, length_d, t0, blk, limit)
            stopped_at = blk_steps.run(out)
            total += blk_steps.kept
            bad = stopped_at < blk_steps.n_steps
            div_d[act[bad]] = t0 + stopped_at[bad]
            steps_d[act[bad]] = t0 + stopped_at[bad] + 1
            running[act[bad]] = False
            t0 += blk
        # rows whose final state is out of range (the kernel's final check)
        m = max_abs(Hall[:P, :d], 1)
        div_d = torch.where((div_d < 0) & ~(m <= limit), steps_d, div_d)
        H[:, : d + 1] = _to_host(Hall)
        if bits is not None:  # where every character of the span was written (the rule), no masked copy
            if bool(out.written[: hi - lo].all()):
                copy_to_host(out.bits[: hi - lo], bits[lo:hi])
            else:  # a correction pass: the few characters it rewrote, and where they are
                at = torch.nonzero(out.written[: hi - lo]).squeeze(1)
                bits[lo + _to_host(at)] = _to_host(out.bits[at])
        if totals is not None:
            totals[:] = _to_host(out.totals)
        steps_done[:] = _to_host(steps_d)
        residual[:] = _to_host(res_d)
        diverged[:] = _to_host(div_d)
        return int(total)


def on_device(dev: torch.device) -> contextlib.AbstractContextManager:
    """``dev`` made the current CUDA device for a block of work (its kernels, its stream and any
    event recorded go to ``dev``, whichever device is current); nothing elsewhere."""
    return torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()


def _import_triton_step():
    """The Triton step's module (:mod:`~isan.engine.kernels.torch.grouped`), imported with Triton
    (what it raises where it cannot: :data:`TRITON_IMPORT_ERRORS`)."""
    return importlib.import_module("isan.engine.kernels.torch.grouped")


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:200]


def max_abs(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``max |x|`` along ``dim`` in one reduction (no ``|x|`` made first: a gigabyte at a GPU
    readout); NaN where a NaN is, as ``x.abs().amax(dim)``."""
    return torch.linalg.vector_norm(x, ord=math.inf, dim=dim)


@dataclass
class ReadoutBuffers:
    """Where a call's readout goes, on the device: each character's bits (``bits``, with
    ``written`` marking what goes back), each row's total (``totals``), either or neither."""

    bits: torch.Tensor | None = None
    written: torch.Tensor | None = None
    totals: torch.Tensor | None = None

    @classmethod
    def on(cls, device: torch.device, chars: int | None = None, rows: int | None = None) -> "ReadoutBuffers":
        """Each of ``chars`` characters' bits (with one slot more, where steps not kept write: no
        synchronisation to mask them; ``written`` says what goes back), and/or each of ``rows``
        rows' total, on ``device``."""
        out = cls()
        if chars is not None:
            out.bits = torch.empty(chars + 1, dtype=torch.float64, device=device)
            out.written = torch.zeros(chars + 1, dtype=torch.bool, device=device)
        if rows is not None:
            out.totals = torch.zeros(rows, dtype=torch.float64, device=device)
        return out

    @property
    def reads_out(self) -> bool:
        return self.bits is not None or self.totals is not None


def copy_to_host(t: torch.Tensor, dst: np.ndarray) -> None:
    """``dst[...] = t``: one direct copy where ``dst`` is page-locked (:meth:`TorchStreams.empty_bits`),
    else through a page-locked staging buffer (:func:`_to_host`)."""
    if t.device.type != "cpu":
        host = torch.from_numpy(dst)
        if host.is_pinned():
            host.copy_(t)
            return
    dst[...] = _to_host(t)


def _to_device(a: np.ndarray, device: torch.device, dtype=None) -> torch.Tensor:
    """A copy of ``a`` (cast to ``dtype`` if given) on ``device``, never sharing the caller's
    memory; to a GPU through page-locked memory, asynchronously (torch's caching host allocator
    keeps the buffer until the copy is done)."""
    dtype = np.dtype(dtype or a.dtype)
    if device.type == "cpu":
        return torch.from_numpy(np.array(a, dtype=dtype, copy=True))
    buf = torch.empty(a.shape, dtype=torch.from_numpy(np.empty(0, dtype=dtype)).dtype, pin_memory=True)
    np.copyto(buf.numpy(), a, casting="unsafe")
    return buf.to(device, non_blocking=True)


def _to_host(t: torch.Tensor) -> np.ndarray:
    """``t`` as a numpy array; from a GPU through page-locked memory (a copy to pageable memory ran
    at about 1.3 GB/s on the H200's machine: half the device time of a batch, by the profile of
    ``isan bench gpu --profile``)."""
    if t.device.type == "cpu":
        return t.numpy()
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    buf.copy_(t)
    return buf.numpy()


#: Bytes of saved states a block keeps before it reads them out (the readout runs every so many
#: steps), by device type: fewer, larger readouts on a GPU; the host's memory spared on the CPU.
READOUT_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}

_LOG2E = 1.0 / math.log(2.0)


class StepBlock:
    """One block of steps of the rows ``act`` (and their error rows ``act + P`` when ``P``).

    The states of the block's steps live in one buffer ``hist`` (steps + 1, rows, d + 1): a step
    reads its slot and writes the next, and the readout reads the slots of the steps since the last
    one, so no state is copied to be kept. Nothing in a step waits for the host."""

    def __init__(self, runner: TorchStreams, dm: _DeviceModel, Hall, act, P: int, ids_d, start_d, length_d,
                 t0: int, blk: int, limit: float, n_steps: int | None = None):
        """``n_steps``: the block's steps with a live row where the caller knows them (every row
        from step ``t0``: the longest row's steps left, at most ``blk``); then the Triton step's
        block waits for nothing on the host (the ``mm`` step still reads its group sizes there)."""
        dev = Hall.device
        K = dm.K
        self.runner, self.dm, self.Hall, self.act, self.P, self.limit = runner, dm, Hall, act, P, limit
        A = self.A = int(act.numel())
        self.rows = torch.cat([act, act + P]) if P else act
        steps = torch.arange(blk, device=dev)
        lens_a = length_d[act] - t0  # steps left, >= 1
        self.live = steps[:, None] < lens_a[None, :]  # (blk, A)
        self.pos = start_d[act][None, :] + t0 + steps[:, None]
        self.sym = torch.where(self.live, ids_d[self.pos.clamp(max=len(ids_d) - 1)].long(), torch.full_like(self.pos, K))
        sym_rows = torch.cat([self.sym, self.sym], dim=1) if P else self.sym  # (blk, rows): sentinel K sorts last
        order = torch.sort(sym_rows, dim=1, stable=True)
        self.perm = order.indices
        counts = torch.zeros(blk, K + 1, dtype=torch.int64, device=dev)
        counts.scatter_add_(1, order.values, torch.ones_like(order.values))
        if n_steps is None or runner.step == "mm":
            self.counts = counts.cpu().numpy()  # one transfer for the whole block
            self.n_steps = int((self.counts[:, :K].sum(axis=1) > 0).sum())  # steps with a live row
        else:
            self.counts, self.n_steps = None, int(n_steps)
        if runner.step == "triton":
            self.tile_rows, self.tile_sym = runner._grouped.tile_layout(
                order.values[: self.n_steps], self.perm[: self.n_steps], K + 1, counts=counts[: self.n_steps])
        itemsize = 8 if Hall.dtype == torch.float64 else 4
        budget = READOUT_BYTES.get(dev.type, READOUT_BYTES["cpu"])
        self.ro_steps = max(1, min(self.n_steps, budget // max(1, len(self.rows) * dm.width * itemsize)))
        self.kept = torch.zeros((), dtype=torch.int64, device=dev)

    def run(self, out: "ReadoutBuffers") -> torch.Tensor:
        """Run the block; returns (A,) the step at which each row left the range (``n_steps`` if none)."""
        dm, A = self.dm, self.A
        n_rows = len(self.rows)
        # zeros: a padded row's columns past d + 1 are never written, and the readout multiplies them by 0
        alloc = torch.empty if dm.width == dm.d + 1 else torch.zeros
        hist = alloc((self.ro_steps + 1, n_rows, dm.width), dtype=self.Hall.dtype, device=self.Hall.device)
        hist[0, :, : dm.d + 1] = self.Hall.index_select(0, self.rows)
        scratch = None
        if self.runner.step == "mm":  # the products of a step (float64: each row's pieces by both of W's)
            scratch = torch.empty_like(hist[0]) if dm.WT_split is None else \
                hist.new_empty((n_rows * ozaki.LEFT_PIECES, dm.WT_split.shape[2]))
        stopped_at = torch.full((A,), self.n_steps, dtype=torch.int64, device=hist.device)
        j0 = slot = 0
        for j in range(self.n_steps):
            self._step(j, hist[slot], hist[slot + 1], scratch)
            slot += 1
            if slot == self.ro_steps or j + 1 == self.n_steps:
                stopped_at = self._read_out(hist[:slot, :A], j0, stopped_at, out)
                j0 = j + 1
                if j + 1 < self.n_steps:
                    hist[0] = hist[slot]
                    slot = 0
        self.Hall.index_copy_(0, self.rows, hist[slot, :, : dm.d + 1])
        return stopped_at

    def _step(self, j: int, h_in, h_out, out) -> None:
        """Step ``j`` of the block: ``h_out[r] = h_in[r] @ WT[x_r]`` for every row (sentinel: a copy)."""
        dm, K = self.dm, self.dm.K
        if self.runner.step == "triton":
            self.runner._grouped.grouped_step(h_in, h_out, dm.WT_ext, self.tile_rows[j], self.tile_sym[j],
                                              n_cols=dm.d + 1, precision=self.runner.precision)
            return
        p = self.perm[j]
        hp = h_in.index_select(0, p)
        exact = dm.WT_split is not None  # float64: rows split in pieces, products exact (ozaki)
        f = ozaki.LEFT_PIECES if exact else 1  # rows of the GEMMs' left operand a state row
        a = ozaki.split_left(hp).view(-1, dm.width) if exact else hp
        W = dm.WT_split if exact else dm.WT
        s = 0
        for k in np.flatnonzero(self.counts[j, :K]).tolist():
            e = s + int(self.counts[j, k])
            torch.mm(a[f * s : f * e], W[k], out=out[f * s : f * e])
            s = e
        res = torch.cat([ozaki.combine(out[: f * s], dm.width), hp[s:]]) if exact else out
        if not exact and s < len(hp):  # rows past their end: carried unchanged
            out[s:] = hp[s:]
        h_out.index_copy_(0, p, res)

    def _read_out(self, hist, j0: int, stopped_at, out: "ReadoutBuffers"):
        """Range checks and bits of steps ``j0 ..`` from the states before them (n, A, width)."""
        dm, K = self.dm, self.dm.K
        n = len(hist)
        steps = torch.arange(j0, j0 + n, device=hist.device)
        live = self.live[j0 : j0 + n]
        bad = ~(max_abs(hist[:, :, : dm.d], 2) <= self.limit)
        if out.reads_out:
            flat = hist.reshape(-1, dm.width)
            L = (flat @ dm.RoT_w if dm.RoT_split is None else ozaki.matmul(flat, dm.RoT_split))
            L = L.to(torch.float64).reshape(n, self.A, dm.V)
            tgt = self.sym[j0 : j0 + n].clamp(max=K - 1)
            b = (torch.logsumexp(L, dim=2) - L.gather(2, tgt[:, :, None]).squeeze(2)) * _LOG2E
            bad |= ~torch.isfinite(b)
        bad &= live
        first = torch.where(bad.any(dim=0), bad.to(torch.int8).argmax(dim=0) + j0, stopped_at)
        stopped_at = torch.minimum(stopped_at, first)
        keep = live & (steps[:, None] <= stopped_at[None, :])  # bits up to and including a bad step
        if out.bits is not None:  # steps not kept write the trash slot at the end (no mask, so no sync)
            idx = torch.where(keep, self.pos[j0 : j0 + n], len(out.bits) - 1).reshape(-1)
            out.bits.index_put_((idx,), b.reshape(-1))
            out.written.index_fill_(0, idx, True)
        if out.totals is not None:  # each row's bits added one step at a time, in order: the same sum
            acc = out.totals.index_select(0, self.act)  # whatever the readouts and the other rows
            for step_bits in torch.where(keep, b, 0.0).unbind(0):
                acc = acc + step_bits
            out.totals.index_copy_(0, self.act, acc)
        self.kept += keep.sum()
        return stopped_at
