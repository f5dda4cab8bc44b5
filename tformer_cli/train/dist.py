"""Multi-process training under torchrun: process group set-up, rank facts, reductions.

`torchrun --nproc_per_node=N -m tformer_cli train RECIPE` sets RANK / WORLD_SIZE / LOCAL_RANK;
we use NCCL on CUDA and gloo on CPU. Without torchrun, everything here is a no-op for one process.

The loop's own reductions (`sum_across`: token counts, flags, logged statistics) are of host values. Under NCCL
they go over a second process group of the same processes on gloo (`World.host_group`), with CPU tensors: NCCL
reduces CUDA tensors only (a CPU tensor raises "No backend type associated with device type cpu"), and a
CUDA tensor read back to the host waits for all the work queued on the GPU: each update's reductions (its global
token count, whether it was finite, the stop checks) would leave the GPU idle while the host prepares the next
update. DDP's gradients go over the default group (NCCL on CUDA).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tformer_cli.errors import TformerError


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    host_group: Any = None  # the process group of `sum_across` (gloo); None: the default group (gloo already)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(device: torch.device, backend: str = "auto") -> World:
    """Join the process group when launched by torchrun; otherwise a world of one.

    `backend` (run.dist_backend): auto is NCCL on CUDA, else gloo. Under NCCL each process uses GPU LOCAL_RANK,
    made current before the group starts (NCCL binds to it; it refuses two processes on one GPU), and a gloo
    group of the same processes reduces host values (`sum_across`). Under gloo on CUDA the processes use the
    current GPU (CUDA_VISIBLE_DEVICES decides), several of them may share it.

    Raises:
        TformerError: NCCL asked for without CUDA, or for more processes on this machine than it has GPUs.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise TformerError("run.dist_backend=nccl needs a CUDA device (NCCL reduces CUDA tensors only); use gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        if local_rank >= (gpus := torch.cuda.device_count()):
            raise TformerError(
                f"run.dist_backend=nccl takes one GPU per process, and this machine's process {local_rank} has none "
                f"({gpus} visible): start at most {gpus} here (torchrun --nproc_per_node={gpus}), or let processes "
                "share a GPU with run.dist_backend=gloo"
            )
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    host_group = dist.new_group(backend="gloo") if backend == "nccl" else None  # every process makes it, in order
    return World(dist.get_rank(), dist.get_world_size(), local_rank, host_group)


def sum_across(world: World, values: list[float]) -> list[float]:
    """Element-wise sum over all processes, on the host (identity for one process).

    A CPU tensor over `world.host_group` (gloo): no GPU work is waited for.
    """
    if world.size == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, group=world.host_group)
    return tensor.tolist()


def any_across(world: World, flag: bool) -> bool:
    return sum_across(world, [float(flag)])[0] > 0


def close_world(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
