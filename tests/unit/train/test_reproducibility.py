"""The random generators' state in a checkpoint (train/reproducibility.py): CPU and CUDA generators come back."""

import random

import numpy as np
import pytest
import torch

from tformer_cli.train.reproducibility import rng_state, set_rng_state


def _draws(device: torch.device) -> list:
    """One draw from each generator a training run uses (torch's on `device`: dropout draws there)."""
    return [random.random(), float(np.random.rand()), torch.rand(3).tolist(), torch.rand(3, device=device).tolist()]


def test_restoring_the_state_repeats_every_draw(device):
    torch.zeros(1, device=device)  # a run on a GPU has started CUDA (its model is there) before it saves
    saved = rng_state()
    first = _draws(device)
    set_rng_state(saved)
    assert _draws(device) == first


def test_cuda_generators_are_saved_and_restored_for_the_gpus_there_are(monkeypatch):
    """A checkpoint of a 2-GPU machine on a 1-GPU one: the first generator comes back (CUDA faked)."""
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["gpu0", "gpu1"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state = rng_state()
    assert state["cuda"] == ["gpu0", "gpu1"]
    set_rng_state(state)
    assert restored == [["gpu0"]]


def test_a_run_on_the_cpu_of_a_gpu_machine_saves_no_cuda_generators(monkeypatch):
    """CUDA there but never started by the run: reading its generators would start it at every save (CUDA faked)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("started CUDA to read its generators"))
    assert rng_state()["cuda"] == []


@pytest.mark.parametrize("cuda_available", [True, False])
def test_a_checkpoint_without_cuda_generators_restores_none(monkeypatch, cuda_available):
    """A CPU-only machine's checkpoint saved none; where there is no CUDA, a GPU's are not restored."""
    restored = []
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state = {**rng_state(), "cuda": [] if cuda_available else ["gpu0"]}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_available)
    set_rng_state(state)
    assert restored == []
