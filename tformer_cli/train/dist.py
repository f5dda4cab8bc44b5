"""Multi-process training under torchrun: process group set-up, rank facts, reductions.

`torchrun --nproc_per_node=N -m tformer_cli train RECIPE` sets RANK / WORLD_SIZE / LOCAL_RANK;
we use NCCL on CUDA and gloo on CPU. Without torchrun, everything here is a no-op for one process.

A reduction's tensor must live on the process group's device: NCCL reduces CUDA tensors only (a CPU
tensor raises "No backend type associated with device type cpu"), gloo CPU ones. `World.device` records it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")  # where reductions build their tensors (the group's device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(device: torch.device) -> World:
    """Join the process group when launched by torchrun (NCCL on CUDA, else gloo); otherwise a world of one.

    On CUDA each process uses GPU LOCAL_RANK, made current before the group starts (NCCL binds to it).
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    backend = "nccl" if device.type == "cuda" else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return World(dist.get_rank(), dist.get_world_size(), local_rank, reduction_device(backend, local_rank))


def reduction_device(backend: str, local_rank: int) -> torch.device:
    """The device of the tensors a process group of `backend` reduces: this process's GPU for NCCL, else the CPU."""
    return torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")


def sum_across(world: World, values: list[float]) -> list[float]:
    """Element-wise sum over all processes (identity for one process, which touches no device)."""
    if world.size == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=world.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def any_across(world: World, flag: bool) -> bool:
    return sum_across(world, [float(flag)])[0] > 0


def close_world(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
