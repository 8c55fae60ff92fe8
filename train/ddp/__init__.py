"""Data-parallel training on several processes or machines: torch.distributed + DistributedDataParallel.

Launch with torchrun (one process per CPU socket or per GPU; every option of ``isan train``)::

    torchrun --nproc_per_node 2 -m isan.train.ddp lstm --out runs/x --data ... [isan train options]
    torchrun --nnodes 2 --node_rank 0 --master_addr HOST --master_port 29500 --nproc_per_node 8 \\
        -m isan.train.ddp isan --out runs/x --device cuda ...
    torchrun --nproc_per_node 2 --no-python isan train isan --out runs/x --distributed   # the same

The backend is gloo for ``--device cpu`` and nccl for ``--device cuda`` (each process on GPU
``LOCAL_RANK``). ``--batch-size`` stays the global number of streams B (it must be divisible by the
number of processes); rank r trains streams ``[r B / W, (r + 1) B / W)``, so a run gives the same
parameters (to rounding) as a single process with the same B, and it writes the same checkpoint files
(rank 0 alone writes; the carried states of all ranks are gathered into it). A run started with W
processes resumes with any number that divides B, one included. Rank 0 reads the run directory and
sends what it holds to the others, so only rank 0 needs to see ``--out``; every machine needs ``--data``.

``python -m isan.train.ddp`` runs :mod:`isan.train.ddp.__main__` (the command: ``isan train ... --distributed``);
this package, the library the training loop uses, never imports the CLI.

Write the hidden size as ``--hidden`` under torchrun (its own parser takes ``--d`` for one of its options).

Everything that is not the gradient (evaluation, early stopping, logs, checkpoints) happens on rank 0;
its decisions are broadcast, so all ranks stop together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from isan.errors import IsanError

#: the environment torchrun sets for each process
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    """This process's place in a data-parallel run.

    Attributes:
        rank: 0..world-1 (rank 0 evaluates, logs and writes checkpoints).
        world: the number of processes.
        local_rank: the process's index on its machine (its GPU with nccl).
        device: the torch device this process trains on (``cuda:LOCAL_RANK`` or ``cpu``).
        backend: ``gloo`` or ``nccl``.
    """

    rank: int
    world: int
    local_rank: int
    device: str
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, B: int) -> slice:
        """This rank's streams among B. Raises IsanError if the processes do not divide B."""
        if B % self.world:
            raise IsanError(f"--batch-size {B} is not divisible by the {self.world} processes; "
                            f"choose a multiple of {self.world}")
        n = B // self.world
        return slice(self.rank * n, (self.rank + 1) * n)

    # ---- collectives (every rank must call them at the same point) ---------------------------
    def all_true(self, flag: bool) -> bool:
        """True when ``flag`` is true on every rank."""
        t = torch.tensor([0.0 if flag else 1.0], device=self.device)
        dist.all_reduce(t)
        return t.item() == 0.0

    def sum(self, *values: float) -> list[float]:
        """The sum over ranks of each value (float64)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank (any picklable object, tensors included)."""
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=torch.device(self.device) if self.backend == "nccl" else None)
        return box[0]

    def gather_streams(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's (B/W, ...) shard into (B, ...) in rank order (on every rank)."""
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, 0)


def init_from_env(device: str = "cpu") -> DistContext:
    """Join the process group that torchrun describes in the environment (gloo on CPU, nccl on CUDA).

    Raises:
        IsanError: not started by torchrun (or torch.distributed), or CUDA asked for and missing.
    """
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise IsanError(f"--distributed needs the environment torchrun sets ({', '.join(missing)} missing); "
                        "start with: torchrun --nproc_per_node N -m isan.train.ddp MODEL --out DIR ...")
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise IsanError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
        backend, dev = "nccl", f"cuda:{local}"
        torch.cuda.set_device(local)
    else:
        backend, dev = "gloo", "cpu"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistContext(rank, world, local, dev, backend)


def shutdown() -> None:
    """Leave the process group (no-op if none)."""
    if dist.is_initialized():
        dist.destroy_process_group()
