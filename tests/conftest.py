"""Shared test setup: no network (the hub fails at once instead of retrying), few threads, seeded RNGs."""

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _seeded_rngs():
    """Every test starts from the same state of the global RNGs (random, numpy, torch): a test that draws
    tensors or shapes without its own seed fails the same way on a rerun, alone or in the suite."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
