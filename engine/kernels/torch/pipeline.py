"""Batches of documents through the device with the host's work overlapped (issue #47): :func:`overlapped`.

One call of the runner (:class:`~isan.engine.kernels.torch.TorchStreams`) waits for its results, so
the device idles while the host builds the next batch (the ids end to end, the state rows, the
copies in) and the host idles while the device steps: on an H200 (bench_results/gpu_h200/run4) a
batch of 65,536 documents x 512 characters took 0.61 s, of which the device's work was 0.20 s.
Here a batch is *submitted* (:func:`submit`: copied in through page-locked memory, its steps,
readout and copies out queued on the device, nothing waited for) and its results are *collected*
later (:meth:`Pending.result`, which waits for the batch's event alone). :func:`overlapped` keeps
one batch in flight: the host builds and submits batch k + 1 while the device works on batch k, then
collects k. The states and weights never leave the device between the steps of a batch, and its
results come back to page-locked memory, each document's total reduced on the device unless each
character's bits are asked for.

A batch runs as :class:`~isan.engine.kernels.torch.streams.TorchStreams` runs rows without pairs,
block by block, except that no row is dropped between blocks (a row past its end is carried as
the sentinel symbol, exactly): the number of rows, and so every launch, is known on the host, and
the Triton step's blocks wait for nothing. A row that leaves the range is reported
(:attr:`BatchResult.diverged`) and its later values are not meaningful; the caller locates it with
the float64 reference. Built and tested without a GPU: on torch's CPU device every copy and wait is
immediate, and the results equal the single call's (tests/test_gpu_pipeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels.chunked import BatchResult, concat_ids
from isan.engine.kernels.streams import StreamModel
from isan.engine.kernels.torch.streams import ReadoutBuffers, StepBlock, TorchStreams, max_abs

#: What a batch's results hold: each document's total bits, each character's bits, or none.
WANTS = ("totals", "bits", "none")


@dataclass
class Pending:
    """A submitted batch: page-locked host buffers its results are being copied into, and the
    event after the last copy (None on the CPU device, where the copies are done at once)."""

    lens: np.ndarray
    start: np.ndarray
    d: int
    want: str
    event: object
    finals: torch.Tensor
    diverged: torch.Tensor
    totals: torch.Tensor | None = None
    bits: np.ndarray | None = None

    def result(self) -> BatchResult:
        """Wait for this batch alone, and give its results (views of the page-locked buffers)."""
        if self.event is not None:
            self.event.synchronize()
        if self.want == "totals":
            values = self.totals.numpy()
        elif self.want == "bits":
            values = [self.bits[s : s + n] for s, n in zip(self.start.tolist(), self.lens.tolist())]
        else:
            values = None
        return BatchResult(values, self.finals.numpy()[:, : self.d], self.diverged.numpy())


def _pinned(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` on its way: page-locked and asynchronous from a GPU, at once on the CPU."""
    if t.device.type == "cpu":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def submit(runner: TorchStreams, model: StreamModel, texts: Sequence[np.ndarray], hs: np.ndarray,
           want: str = "totals", limit: float = MAX_STATE_ABS) -> Pending:
    """Queue one batch on ``runner``'s device: each text a row from its state in ``hs`` (B, d).

    Args:
        texts: B non-empty int arrays of symbol ids.
        want: ``"totals"`` (each text's bits summed on the device), ``"bits"`` (each character's,
            into page-locked memory) or ``"none"`` (final states only).
    Returns:
        :class:`Pending`; its :meth:`~Pending.result` waits for this batch.
    Raises:
        ValueError: an empty text, a bad ``want``, or ``hs`` of the wrong shape.
    """
    if want not in WANTS:
        raise ValueError(f"want must be one of {', '.join(WANTS)}; got {want!r}")
    B = len(texts)
    lens = np.fromiter((len(t) for t in texts), dtype=np.int64, count=B)
    if B == 0 or (lens == 0).any():
        raise ValueError("a batch needs at least one text, and every text at least one character")
    dm = runner.device_model(model)
    d, dev = dm.d, runner.device
    hs = np.asarray(hs)
    if hs.shape != (B, d):
        raise ValueError(f"hs must be ({B}, {d}); got {hs.shape}")
    start = np.zeros(B, dtype=np.int64)
    np.cumsum(lens[:-1], out=start[1:])
    ids = concat_ids(texts)
    if ids.min() < 0 or ids.max() >= dm.K:
        raise ValueError(f"symbol ids must be in [0, {dm.K})")
    rows = np.empty((B, d + 1), dtype=runner.state_dtype)
    rows[:, :d] = hs
    rows[:, d] = 1.0
    with runner.ieee(), torch.no_grad():
        ids_d, start_d, lens_d, Hall = runner.upload(dm, ids, start, lens, rows)
        n_chars = len(ids)
        out = ReadoutBuffers.on(dev, chars=n_chars if want == "bits" else None, rows=B if want == "totals" else None)
        act = torch.arange(B, device=dev)
        div = torch.full((B,), -1, dtype=torch.int64, device=dev)
        longest = int(lens.max())
        blk = runner._block_steps(B, longest)
        for t0 in range(0, longest, blk):  # every row in every block: no row is dropped, nothing waits
            n_steps = min(blk, longest - t0)
            block = StepBlock(runner, dm, Hall, act, 0, ids_d, start_d, lens_d, t0, blk, limit, n_steps=n_steps)
            stopped_at = block.run(out)
            div = torch.where((div < 0) & (stopped_at < block.n_steps), t0 + stopped_at, div)
        m = max_abs(Hall[:, :d], 1)  # the final states' range (the kernel's final check)
        div = torch.where((div < 0) & ~(m <= limit), lens_d, div)
        pending = Pending(lens, start, d, want, None, _pinned(Hall), _pinned(div))
        if want == "totals":
            pending.totals = _pinned(out.totals)
        elif want == "bits":
            pending.bits = runner.empty_bits(n_chars)
            host = torch.from_numpy(pending.bits)
            host.copy_(out.bits[:n_chars], non_blocking=host.is_pinned())
        if dev.type == "cuda":
            pending.event = torch.cuda.Event()
            pending.event.record()
    return pending


def overlapped(runner: TorchStreams, model: StreamModel, batches: Iterable[tuple[Sequence[np.ndarray], np.ndarray]],
               want: str = "totals", limit: float = MAX_STATE_ABS) -> Iterator[BatchResult]:
    """Each batch's :class:`BatchResult`, in order, with one batch in flight: batch k + 1 is built on
    the host and submitted while the device works on batch k (see the module docstring).

    Args:
        batches: (texts, hs) pairs, as :func:`submit` takes them.
    """
    pending = None
    for texts, hs in batches:
        nxt = submit(runner, model, texts, hs, want, limit)
        if pending is not None:
            yield pending.result()
        pending = nxt
    if pending is not None:
        yield pending.result()
