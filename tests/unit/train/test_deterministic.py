"""run.deterministic (train/reproducibility.py deterministic_kernels): PyTorch's deterministic kernels while training,
the global state restored after; and a translation model with dropout resumed halfway ends bit for bit where the
straight run does, on the CPU and on CUDA (where the atomic adds of some kernels would otherwise differ)."""

import os
import random

import pytest
import torch
from tiny_models import WORDS

from tformer_cli.train import loop
from tformer_cli.train.reproducibility import deterministic_kernels


def _flags() -> tuple:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


def test_the_kernels_are_deterministic_inside_and_as_before_after(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = _flags()
    with deterministic_kernels(False):
        assert _flags() == before
    with deterministic_kernels(True):
        assert _flags() == (True, True, True, False, ":4096:8")  # warn_only: an op without one names itself
    assert _flags() == before


@pytest.mark.parametrize("deterministic", [True, False])
def test_training_runs_under_the_setting(deterministic, translation, monkeypatch, tmp_path):
    seen, real_update = [], loop.update
    monkeypatch.setattr(
        loop, "update", lambda *args: seen.append(torch.are_deterministic_algorithms_enabled()) or real_update(*args)
    )
    config = translation("train.max_updates=2", f"run.deterministic={str(deterministic).lower()}")
    loop.train(config, tmp_path / "run")
    assert seen == [deterministic] * 2
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.fixture(scope="module")
def translation(prepared_pairs):
    """`overrides -> Config` for a prepared corpus of 120 pairs (100 to train), dropout on."""
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(120)]
    pairs = [(s, " ".join(reversed(s.split()))) for s in sentences]
    return prepared_pairs(pairs, 100, "model.dropout=0.1", "train.max_tokens=128", "train.log_every=1")


def test_a_run_resumed_halfway_ends_bit_for_bit_where_the_straight_run_does(device, translation, straight_and_resumed):
    """N/2 updates, a resume, N/2 more = N straight, with dropout; on CUDA with run.deterministic."""
    common = [f"run.device={device.type}", "run.deterministic=true", "train.valid_every=4"]
    straight, resumed = straight_and_resumed(translation, *common)
    assert straight.keys() == resumed.keys()
    differ = {
        k: float((straight[k] - resumed[k]).abs().max()) for k in straight if not torch.equal(straight[k], resumed[k])
    }
    assert differ == {}  # on failure: each parameter that differs, and by how much at most
