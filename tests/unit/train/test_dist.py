"""Reductions across processes (train/dist.py): host values over a gloo group whatever the device, and none for one
process."""

import pytest
import torch
import torch.distributed as dist

from tformer_cli.errors import TformerError
from tformer_cli.train.dist import World, any_across, init_world, sum_across


@pytest.mark.parametrize(
    "device, setting, calls",
    [  # the GPU is current before NCCL starts; host values get their own gloo group
        ("cuda", "auto", [("set_device", 1), ("init", "nccl"), ("new_group", "gloo")]),
        ("cuda", "nccl", [("set_device", 1), ("init", "nccl"), ("new_group", "gloo")]),
        ("cpu", "auto", [("init", "gloo")]),  # the default group is gloo already
        ("cuda", "gloo", [("init", "gloo")]),  # processes may share a GPU: none is made current
    ],
)
def test_init_world_under_torchrun_joins_the_groups(monkeypatch, device, setting, calls):
    """torchrun's environment, the process groups faked: no GPU and no second process needed."""
    made = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: made.append(("init", backend)))
    monkeypatch.setattr(dist, "new_group", lambda backend: made.append(("new_group", backend)) or "host group")
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: made.append(("set_device", index)))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    world = init_world(torch.device(device), setting)
    assert made == calls
    assert world == World(rank=1, size=2, local_rank=1, host_group="host group" if ("init", "nccl") in calls else None)


def test_nccl_without_cuda_is_refused_in_one_line_before_any_group(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "init_process_group", lambda backend: pytest.fail("a group was started"))
    with pytest.raises(TformerError) as error:
        init_world(torch.device("cpu"), "nccl")
    assert str(error.value) == ("run.dist_backend=nccl needs a CUDA device (NCCL reduces CUDA tensors only); use gloo")


def test_more_nccl_processes_than_gpus_are_refused_in_one_line_before_any_group(monkeypatch):
    """Two processes on a one-GPU machine: the second has no GPU (CUDA itself says "invalid device ordinal")."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: pytest.fail(f"GPU {index} made current"))
    monkeypatch.setattr(dist, "init_process_group", lambda backend: pytest.fail("a group was started"))
    with pytest.raises(TformerError) as error:
        init_world(torch.device("cuda"), "auto")
    assert str(error.value) == (
        "run.dist_backend=nccl takes one GPU per process, and this machine's process 1 has none (1 visible): start at "
        "most 1 here (torchrun --nproc_per_node=1), or let processes share a GPU with run.dist_backend=gloo"
    )


def test_a_world_of_one_reduces_nothing(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_world(torch.device("cuda")) == World()  # no torchrun: no process group, whatever the device
    monkeypatch.setattr(dist, "all_reduce", lambda *args, **kwargs: pytest.fail("a world of one reduced"))
    assert sum_across(World(), [1.5, 2.0]) == [1.5, 2.0]
    assert any_across(World(), True) and not any_across(World(), False)


def test_host_values_reduce_on_the_cpu_over_the_host_group(monkeypatch):
    """Under NCCL a CUDA tensor would be needed, and reading it back would wait for the GPU: the host group's CPU
    tensor is used instead (the all-reduce faked: a world of two with a group of its own)."""
    seen = []

    def all_reduce(tensor, group=None):
        seen.append((tensor.device, group))
        tensor.mul_(2)  # two processes with the same values

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    world = World(rank=0, size=2, host_group="host group")
    assert sum_across(world, [1.5, 2.0]) == [3.0, 4.0]
    assert any_across(world, True) and not any_across(world, False)
    assert seen == [(torch.device("cpu"), "host group")] * 3


def test_a_reduction_over_real_groups(device, tmp_path):
    """A real process group of one (gloo on the CPU; NCCL and its gloo host group on a GPU): the sum takes the
    all-reduce path (the World says 2 processes; the group sums over its one). On a GPU it waits for no GPU work
    (CUDA's sync debug mode raises at a sync)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        world = World(rank=0, size=2, local_rank=0, host_group=dist.new_group(backend="gloo"))
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        try:
            assert sum_across(world, [1.5, 2.0]) == [1.5, 2.0]
            assert any_across(world, True) and not any_across(world, False)
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    finally:
        dist.destroy_process_group()
