"""What a resumed run needs to repeat a straight one: the random generators' state, saved in each checkpoint,
and (run.deterministic) kernels that give the same bits for the same inputs.

The checkpoint file itself (format, atomic writes, verified reads) is run/checkpoints.py's.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Every random generator the training run draws from (Python, NumPy, torch CPU and CUDA).

    The CUDA generators only where this process has started CUDA (a run on a GPU has): a run on the CPU of a GPU
    machine draws nothing from them, and reading them would start CUDA at every save (seconds, and a context's
    memory on the GPU) and again at its resume, inside train.max_minutes.
    """
    np_state = cast("tuple[Any, ...]", np.random.get_state())  # the legacy tuple: the global generator's MT19937
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` saved.

    The CUDA generators are restored where CUDA is available, for the GPUs this machine has: a checkpoint
    from a GPU machine resumes on a CPU-only one or on fewer GPUs (one from a CPU-only machine, or from a run on
    a GPU machine's CPU, saved none).
    """
    random.setstate(_as_tuple(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


@contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """run.deterministic: inside, PyTorch's deterministic kernels (with `enabled`; nothing changes without).

    On a GPU some kernels add in an order that varies from run to run (atomic adds: the backward of an
    embedding, of index and scatter operations, of some attention kernels; cuBLAS's reductions without a
    fixed workspace), so a resumed run drifts from a straight one in the last bits, then further. This asks
    for PyTorch's deterministic kernels (`torch.use_deterministic_algorithms`), cuDNN's, and a fixed cuBLAS
    workspace (`CUBLAS_WORKSPACE_CONFIG`, read when CUDA first creates a cuBLAS handle: a new process, as
    `tformer train` is). An operation without a deterministic kernel warns, naming itself, and runs anyway
    (warn_only): that warning says where bit-exactness ends. Global state: restored on exit.
    """
    if not enabled:
        yield
        return
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        if before[4] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
