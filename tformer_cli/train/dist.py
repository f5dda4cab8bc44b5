"""Multi-process training under torchrun: process group set-up, rank facts, reductions.

`torchrun --nproc_per_node=N -m tformer_cli train RECIPE` sets RANK / WORLD_SIZE / LOCAL_RANK;
we use NCCL on CUDA and gloo on CPU. Without torchrun, everything here is a no-op for one process.
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

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(device: torch.device) -> World:
    """Join the process group when launched by torchrun; otherwise a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world = World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(world.local_rank)
    return world


def sum_across(world: World, values: list[float]) -> list[float]:
    """Element-wise sum over all processes (identity for one process)."""
    if world.size == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def any_across(world: World, flag: bool) -> bool:
    return sum_across(world, [float(flag)])[0] > 0


def close_world(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
