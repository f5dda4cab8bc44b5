"""The random generators' state, saved in each checkpoint so that a resumed run draws what a straight run draws.

The checkpoint file itself (format, atomic writes, verified reads) is run/checkpoints.py's.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Every random generator the training run draws from (Python, NumPy, torch CPU and CUDA)."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` saved.

    The CUDA generators are restored where CUDA is available, for the GPUs this machine has: a checkpoint
    from a GPU machine resumes on a CPU-only one or on fewer GPUs (one from a CPU-only machine saved none).
    """
    random.setstate(_as_tuple(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
