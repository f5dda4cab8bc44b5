"""Reductions across processes (train/dist.py): on the process group's own device, and none for one process."""

import pytest
import torch
import torch.distributed as dist

from tformer_cli.train.dist import World, any_across, init_world, reduction_device, sum_across


def test_nccl_reduces_on_the_process_s_gpu_and_gloo_on_the_cpu():
    assert reduction_device("nccl", 0) == torch.device("cuda", 0)
    assert reduction_device("nccl", 3) == torch.device("cuda", 3)
    assert reduction_device("gloo", 3) == torch.device("cpu")


@pytest.mark.parametrize(
    "device, backend, calls",
    [
        ("cuda", "nccl", [("set_device", 1), ("init", "nccl")]),  # the GPU is current before NCCL starts
        ("cpu", "gloo", [("init", "gloo")]),
    ],
)
def test_init_world_under_torchrun_records_the_group_s_device(monkeypatch, device, backend, calls):
    """torchrun's environment, the process group faked: no GPU and no second process needed."""
    made = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: made.append(("init", backend)))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: made.append(("set_device", index)))
    world = init_world(torch.device(device))
    assert made == calls
    assert world == World(rank=1, size=2, local_rank=1, device=reduction_device(backend, 1))


def test_a_world_of_one_reduces_nothing_and_touches_no_device(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_world(torch.device("cuda")) == World()  # no torchrun: no process group, whatever the device
    nowhere = World(device=torch.device("cuda", 99))  # no machine has it: any tensor built there would raise
    assert sum_across(nowhere, [1.5, 2.0]) == [1.5, 2.0]
    assert any_across(nowhere, True) and not any_across(nowhere, False)


def test_a_reduction_runs_on_the_group_s_device(device, tmp_path):
    """A real process group of one (gloo on the CPU, NCCL on a GPU): the sum takes the all-reduce path
    (the World says 2 processes; the group sums over its one) with its tensor where the backend needs it."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        world = World(rank=0, size=2, local_rank=0, device=reduction_device(backend, 0))
        assert sum_across(world, [1.5, 2.0]) == [1.5, 2.0]
        assert any_across(world, True) and not any_across(world, False)
    finally:
        dist.destroy_process_group()
