"""Checkpoints: written atomically, read with `weights_only=True` (no pickled code ever runs).

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts:
    format, model, optimizer, step, epoch, batch (position in the epoch), rng, config, metrics.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tformer_cli.data.text import sha256_stream
from tformer_cli.errors import CheckpointError
from tformer_cli.files import atomic_open

FORMAT = 1


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write `state` to `path` atomically (files.atomic_open): a crash at any moment leaves either the
    previous file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as handle:
        torch.save({"format": FORMAT, **state}, handle)


def load_checkpoint(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """Read a checkpoint with `weights_only=True`, checking its bytes against `sha256` when given.

    The file is opened once, so the checksum and the load see the same bytes even if a training run
    replaces the file meanwhile.

    Raises:
        CheckpointError: a missing, corrupt or foreign file, or a checksum mismatch (one line).
    """
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    with path.open("rb") as handle:
        if sha256 is not None and sha256_stream(handle) != sha256:
            raise CheckpointError(
                f"{path}: checksum mismatch with {path.parent / 'index.json'} (corrupt or truncated); "
                "use another checkpoint of the run"
            )
        handle.seek(0)
        try:
            state = torch.load(handle, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch.load fails in many ways (KeyError included) on what is not a checkpoint
            raise CheckpointError(f"{path}: not a loadable tformer checkpoint ({_load_failure(exc)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or "model" not in state:
        raise CheckpointError(f"{path}: not a tformer checkpoint (format {FORMAT} expected)")
    return state


def _load_failure(exc: Exception) -> str:
    """The gist of a `torch.load` failure: what the safe loader refused, or the first line of the error."""
    marker = "WeightsUnpickler error:"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, pickle.UnpicklingError):
        refused = [line.split(marker, 1)[1].split(". ")[0].strip() for line in lines if marker in line]
        return "the safe loader refused it" + (f": {refused[0][:140]}" if refused and refused[0] else "")
    return f"{type(exc).__name__}: {lines[0][:140]}" if lines else type(exc).__name__


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
    """Restore what `rng_state` saved."""
    random.setstate(_as_tuple(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
