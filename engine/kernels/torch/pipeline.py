"""Batches of texts through the device with the host's work overlapped: :func:`submit` and :class:`Pending`.

One call of the runner (:class:`~isan.engine.kernels.torch.TorchStreams`) waits for its results, so
the device idles while the host builds the next batch (the ids end to end, the state rows, the
copies in) and the host idles while the device steps: on an H200 (bench_results/gpu_h200/run4) a
batch of 65,536 documents x 512 characters took 0.61 s, of which the device's work was 0.20 s.
Here a batch is *submitted* (:func:`submit`: copied in through page-locked memory, its steps,
readout and copies out queued on the device, nothing waited for) and its results are *collected*
later (:meth:`Pending.result`, which waits for the batch's event alone).
:func:`isan.engine.batches.score_batches` keeps one batch in flight: the host builds and submits
batch k + 1 while the device works on batch k, then collects k. A batch is a
:class:`~isan.engine.packed.Packed`: only the span of its ids that its texts read travels (from
the first start to the last end, gaps between a selection's texts included), in its own dtype (uint8 for a text alphabet), with no join on the host; with ``hs`` one state (the model's
``h0``) the state rows are made on the device. The states and weights never leave the device
between the steps of a batch, and its results come back to page-locked memory, each document's
total reduced on the device unless each character's bits are asked for (the final states only
where the caller reads them).

A batch runs as :class:`~isan.engine.kernels.torch.streams.TorchStreams` runs rows without pairs,
block by block, except that no row is dropped between blocks (a row past its end is carried as
the sentinel symbol, exactly): the number of rows, and so every launch, is known on the host, and
the Triton step's blocks wait for nothing. A row that leaves the range is reported
(:attr:`BatchResult.divergence`: the first such row) and its later values are not meaningful; the
caller locates it with the float64 reference. Built and tested without a GPU: on torch's CPU device every copy and wait is
immediate, and the results equal the single call's (tests/test_gpu_pipeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels.chunked import WANTS, BatchResult, ChunkedReport
from isan.engine.kernels.streams import StreamModel
from isan.engine.kernels.torch.streams import ReadoutBuffers, StepBlock, TorchStreams, max_abs, on_device
from isan.engine.packed import Packed, PackedBits


@dataclass
class Pending:
    """A submitted batch: page-locked host buffers its results are being copied into, and the
    event after the last copy (None on the CPU device, where the copies are done at once).
    ``start``: where each text's bits begin in ``bits``; ``hs``: the states before the texts
    ((B, d) or (d,)), which locate a divergence."""

    packed: Packed
    start: np.ndarray
    hs: np.ndarray
    d: int
    want: str
    event: object
    finals: torch.Tensor | None
    diverged: torch.Tensor
    report: ChunkedReport | None = None
    totals: torch.Tensor | None = None
    bits: np.ndarray | None = None

    def result(self) -> BatchResult:
        """Wait for this batch alone, and give its results (views of the page-locked buffers)."""
        if self.event is not None:
            self.event.synchronize()
        if self.want == "totals":
            values = self.totals.numpy()
        elif self.want == "bits":
            values = PackedBits(self.bits, self.start, self.packed.length)
        else:
            values = None
        diverged = self.diverged.numpy()
        bad = np.flatnonzero(diverged >= 0)
        divergence = None
        if len(bad):
            i = int(bad[0])
            h = self.hs if self.hs.ndim == 1 else self.hs[i]
            divergence = (i, 0, np.asarray(h, dtype=np.float64), int(diverged[i]))
        finals = self.finals.numpy()[:, : self.d] if self.finals is not None else None
        return BatchResult(values, finals, divergence, self.report)


def _pinned(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` on its way: page-locked and asynchronous from a GPU, at once on the CPU."""
    if t.device.type == "cpu":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _checked(runner: TorchStreams, dm, packed, hs, want: str) -> tuple[Packed, np.ndarray]:
    """The batch and its states as :func:`submit` takes them, or ValueError."""
    if want not in WANTS:
        raise ValueError(f"want must be one of {', '.join(WANTS)}; got {want!r}")
    packed = Packed.of(packed)
    B = len(packed)
    if B == 0 or packed.length.min() < 1:
        raise ValueError("a batch needs at least one text, and every text at least one character")
    hs = np.asarray(hs)
    if hs.shape != (B, dm.d) and hs.shape != (dm.d,):
        raise ValueError(f"hs must be ({B}, {dm.d}) or ({dm.d},); got {hs.shape}")
    if want == "bits" and not packed.is_dense():  # each character's bits at its own place: texts apart
        packed = packed.dense()
    packed.check_ids(dm.K)
    return packed, hs


def submit(runner: TorchStreams, model: StreamModel, packed: "Packed | Sequence[np.ndarray]", hs: np.ndarray,
           want: str = "totals", limit: float = MAX_STATE_ABS, report: ChunkedReport | None = None,
           finals: bool = True) -> Pending:
    """Queue one batch on ``runner``'s device: each text a row from its state in ``hs``.

    Args:
        packed: a :class:`~isan.engine.packed.Packed` batch of B non-empty texts (or B int arrays,
            joined once); only the span of its ids the texts read travels, in its own dtype.
        hs: (B, d) the state before each text, or (d,) the state before every one (made into the
            rows on the device).
        want: ``"totals"`` (each text's bits summed on the device), ``"bits"`` (each character's,
            into page-locked memory) or ``"none"`` (final states only).
        report: what the result's ``report`` is.
        finals: False to leave the final states on the device (the result's ``finals`` is None).
    Returns:
        :class:`Pending`; its :meth:`~Pending.result` waits for this batch.
    Raises:
        ValueError: an empty text, a bad ``want``, ids out of range, or ``hs`` of the wrong shape.
    """
    dm = runner.device_model(model)
    packed, hs = _checked(runner, dm, packed, hs, want)
    B, d, dev = len(packed), dm.d, runner.device
    lo, hi = int(packed.start.min()), int((packed.start + packed.length).max())  # the span the rows read
    start = packed.start - lo
    with runner.ieee(), torch.no_grad(), on_device(dev):
        ids_d, start_d, lens_d, h_d = runner.upload(dm, packed.ids[lo:hi], start, packed.length, hs.reshape(-1, d))
        Hall = state_rows(h_d, B)
        out = ReadoutBuffers.on(dev, chars=hi - lo if want == "bits" else None, rows=B if want == "totals" else None)
        div = _run_blocks(runner, dm, Hall, ids_d, start_d, lens_d, int(packed.length.max()), B, out, limit)
        pending = Pending(packed, start, hs, d, want, None, _pinned(Hall) if finals else None, _pinned(div), report)
        if want == "totals":
            pending.totals = _pinned(out.totals)
        elif want == "bits":
            pending.bits = runner.empty_bits(hi - lo)
            host = torch.from_numpy(pending.bits)
            host.copy_(out.bits[: hi - lo], non_blocking=host.is_pinned())
        if dev.type == "cuda":
            pending.event = torch.cuda.Event()
            pending.event.record()
    return pending


def state_rows(h_d: torch.Tensor, B: int) -> torch.Tensor:
    """(B, d + 1) the state rows ``[h, 1]`` on ``h_d``'s device, from (B, d) or (1, d) states
    (device work: a fill there)."""
    d = h_d.shape[1]
    Hall = torch.empty((B, d + 1), dtype=h_d.dtype, device=h_d.device)
    Hall[:, :d] = h_d
    Hall[:, d] = 1.0
    return Hall


def first_stops(stops: list, stopped: list, Hall: torch.Tensor, lens_d: torch.Tensor, limit: float) -> torch.Tensor:
    """(B,) where each row left the range, or -1, from each block's (B,) stopping steps ``stops``
    (counted from the text's start) and whether the row stopped in that block (``stopped``), and
    the final states' range (the kernel's final check); device work, nothing copied from the host
    (a copy from pageable host memory would wait for the device's queue)."""
    d = Hall.shape[1] - 1
    at = torch.stack(stops)  # (blocks, B)
    stopped = torch.stack(stopped)
    first = stopped.to(torch.int8).argmax(0)  # the first block it stopped in
    div = torch.where(stopped.any(0), at.gather(0, first[None])[0], -1)
    m = max_abs(Hall[:, :d], 1)
    return torch.where((div < 0) & ~(m <= limit), lens_d, div)


def _run_blocks(runner, dm, Hall, ids_d, start_d, lens_d, longest: int, B: int, out, limit: float) -> torch.Tensor:
    """Every row through every block of steps (none dropped, nothing waits); (B,) the step at which
    each row left the range, or -1."""
    dev = Hall.device
    act = torch.arange(B, device=dev)
    blk = runner.block_steps(B, longest)
    stops, stopped = [], []  # each block's stopping steps (from the text's start), and whether a row stopped in it
    for t0 in range(0, longest, blk):
        n_steps = min(blk, longest - t0)
        block = StepBlock(runner, dm, Hall, act, 0, ids_d, start_d, lens_d, t0, blk, limit, n_steps=n_steps)
        at = block.run(out)
        stops.append(at + t0)
        stopped.append(at < block.n_steps)
    return first_stops(stops, stopped, Hall, lens_d, limit)
