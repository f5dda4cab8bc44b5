"""Checkpoint files and how every reader finds, verifies and averages them.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, written atomically and read
with `weights_only=True` (no pickled code ever runs):
    format, model, optimizer, scaler, rng, position, config, metrics, tokenizer_fingerprint;
and, from a run with train.ema_decay, trained_model and ema_updates (`model` is then the weights' average:
train/ema.py).

The checkpoint files are the truth; the folder's index.json is a cache of what they hold (written by
train/store.py, which also rebuilds it). A checkpoint carries its own checksum (`CHECKSUM`: the sha256 of its
contents, tensors' bytes included), so that its integrity travels with it: `load_checkpoint` verifies it on every
load, with or without an index (a file copied out of its run, an index deleted). Every reader loads through
`load_verified`, which also checks the sha256 of the file's bytes that the index recorded.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import torch

from tformer_cli.errors import CheckpointError
from tformer_cli.files import atomic_open, same_file, sha256_stream
from tformer_cli.run.layout import BEST, CHECKPOINTS, INDEX, STEP_GLOB, STEP_PREFIX

FORMAT = 1
CHECKSUM = "content_sha256"  # the sha256 of everything else in the checkpoint (`content_sha256`)
# Model tensors renamed since checkpoints were first written: old name -> today's. `load_checkpoint` reads them back
# under today's names, so every reader (resume, init_from, average, eval, translate, export) takes older files.
RENAMED = {"out_proj.weight": "lm_head.weight"}  # Seq2Seq's output projection, named as the language models' is
TRAINED = "trained_model"  # train.ema_decay: the weights the optimizer steps, `model` holding their average
EMA_UPDATES = "ema_updates"  # train.ema_decay: the updates the average has taken


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write `state` to `path` atomically (files.atomic_open): a crash at any moment leaves either the
    previous file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    contents = {"format": FORMAT, **{key: value for key, value in state.items() if key != CHECKSUM}}
    with atomic_open(path, "wb") as handle:
        torch.save({**contents, CHECKSUM: content_sha256(contents)}, handle)


def content_sha256(state: dict[str, Any]) -> str:
    """The sha256 of a checkpoint's contents: every tensor's dtype, shape and bytes, every other value's type and
    text, dicts in key order; the same for the state saved and the state loaded back."""
    digest = hashlib.sha256()
    _feed(digest, state)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        flat = value.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"tensor {flat.dtype} {tuple(value.shape)}:".encode())
        digest.update(flat.view(torch.uint8).numpy().data)
    elif isinstance(value, dict):
        digest.update(f"dict {len(value)}:".encode())
        for key in sorted(value, key=repr):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__} {len(value)}:".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__} {value!r};".encode())


def load_checkpoint(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """Read a checkpoint with `weights_only=True`, checking its bytes against `sha256` when given and its contents
    against the checksum saved in it (`CHECKSUM`); the model's tensors under today's names (`RENAMED`).

    The file is opened once, so the checksum and the load see the same bytes even if a training run
    replaces the file meanwhile.

    Raises:
        CheckpointError: a missing, corrupt or foreign file, or a checksum mismatch (one line).
    """
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    damaged = CheckpointError(
        f"{path}: checksum mismatch with {path.parent / INDEX} (corrupt or truncated); "
        "use another checkpoint of the run"
    )
    with path.open("rb") as handle:
        listed_wrong = sha256 is not None and sha256_stream(handle) != sha256
        handle.seek(0)
        try:
            state = torch.load(handle, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch.load fails in many ways (KeyError included) on what is not a checkpoint
            if listed_wrong:
                raise damaged from None
            raise CheckpointError(f"{path}: not a loadable tformer checkpoint ({_load_failure(exc)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("model"), dict):
        foreign = CheckpointError(f"{path}: not a tformer checkpoint (format {FORMAT} expected)")
        raise damaged if listed_wrong else foreign
    saved = state.pop(CHECKSUM, None)  # older files carry none
    intact = saved is not None and saved == content_sha256(state)
    if listed_wrong and intact:  # the real cause is the index: the file verifies against its own checksum
        raise CheckpointError(
            f"{path}: checksum mismatch with {path.parent / INDEX}, but the file verifies against the checksum saved "
            "in it: the index is stale or damaged; `tformer train` with the run's recipe rebuilds it"
        )
    if listed_wrong:
        raise damaged
    if saved is not None and not intact:
        raise CheckpointError(
            f"{path}: its contents do not match the checksum saved in it (damaged or altered); "
            "use another checkpoint of the run"
        )
    if RENAMED.keys() & state["model"].keys():
        state["model"] = {RENAMED.get(name, name): tensor for name, tensor in state["model"].items()}
    return state


def _load_failure(exc: Exception) -> str:
    """The gist of a `torch.load` failure: what the safe loader refused, or the first line of the error."""
    marker = "WeightsUnpickler error:"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, pickle.UnpicklingError):
        refused = [line.split(marker, 1)[1].split(". ")[0].strip() for line in lines if marker in line]
        return "the safe loader refused it" + (f": {refused[0][:140]}" if refused and refused[0] else "")
    return f"{type(exc).__name__}: {lines[0][:140]}" if lines else type(exc).__name__


def read_index(folder: Path) -> dict[str, Any] | None:
    """`folder`/index.json, or None when there is none.

    Raises:
        CheckpointError: the file exists but is not a checkpoint index (one line saying how to rebuild it).
    """
    path = folder / INDEX
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        index = None
    if not _is_index(index):
        raise CheckpointError(
            f"{path} is unreadable; `tformer train` with the run's recipe rebuilds it from the checkpoint files"
        )
    return index


def _is_index(index: Any) -> bool:
    files = index.get("files") if isinstance(index, dict) else None
    return isinstance(files, dict) and all(
        isinstance(entry, dict)
        and isinstance(entry.get("step"), int)
        and isinstance(entry.get("sha256"), str)
        and isinstance(entry.get("metric"), (int, float, type(None)))
        for entry in files.values()
    )


def step_names(index: dict[str, Any]) -> list[str]:
    """The step files an index lists, oldest first."""
    files = index["files"]
    return sorted((n for n in files if n.startswith(STEP_PREFIX)), key=lambda n: files[n]["step"])


def checkpoint_files(folder: Path) -> list[Path]:
    """The step checkpoints and best.pt present in `folder` (not averages or other files)."""
    best = [folder / BEST] if (folder / BEST).is_file() else []
    return sorted(folder.glob(STEP_GLOB)) + best


def load_verified(path: Path) -> dict[str, Any]:
    """Load a checkpoint; one in a run's checkpoints/ folder whose index lists it must match its sha256.

    The one way every reader (eval, translate, generate, export, average, attention) loads a checkpoint.
    A standalone file (no index beside it, or one the index does not list, like an average) loads as is.

    Raises:
        CheckpointError: missing, not loadable, a checksum mismatch, or an unreadable index beside it.
    """
    real = path.resolve()
    index = read_index(real.parent) if real.parent.name == CHECKPOINTS else None
    entry = index["files"].get(real.name) if index is not None else None
    return load_checkpoint(path, entry["sha256"] if entry is not None else None)


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint file as given, or a run directory's best (else latest) checkpoint.

    Raises:
        CheckpointError: no such path, no checkpoint in the run, or an unreadable index.json.
    """
    if not path.exists():
        raise CheckpointError(f"no such run directory or checkpoint: {path}")
    if not path.is_dir():
        return path
    folder = path / CHECKPOINTS
    index = read_index(folder)
    if (folder / BEST).is_file():
        return folder / BEST
    latest = index["latest"] if index is not None else None
    if latest and (folder / latest).is_file():
        return folder / latest
    steps = sorted(folder.glob(STEP_GLOB))  # no index (it is only a cache): the newest step file
    if steps:
        return steps[-1]
    raise CheckpointError(f"{path}: no checkpoints in this run directory")


def last_step_paths(run_dir: Path, n: int) -> list[Path]:
    """The last `n` step files that `run_dir`'s index lists, oldest first (fewer when fewer are kept).

    Raises:
        CheckpointError: an unreadable index.json.
    """
    folder = run_dir / CHECKPOINTS
    index = read_index(folder)
    names = step_names(index) if index is not None else []
    return [folder / name for name in names[-n:]] if n > 0 else []


def paths_to_average(run_dir: Path, n: int, option: str) -> list[Path]:
    """The run's last `n` step checkpoints, for averaging (`option` names the argument in errors).

    Raises:
        CheckpointError: `run_dir` is not a directory, n < 1, or fewer than n step checkpoints are kept.
    """
    if n < 1:
        raise CheckpointError(f"{option} takes the number of step checkpoints to average (1 or more), got {n}")
    if not run_dir.is_dir():
        raise CheckpointError(f"{option} needs a run directory, got {run_dir}")
    paths = last_step_paths(run_dir, n)
    if len(paths) < n:
        raise CheckpointError(f"{run_dir}: only {len(paths)} step checkpoints kept (train.keep_last), asked for {n}")
    return paths


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """The element-wise mean of the models in `paths` (the paper averages the last 5); other fields from the last.

    Each file is verified against its run's index (`load_verified`).
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_verified(p) for p in paths]
    average = {}
    for key, value in states[-1]["model"].items():
        if value.is_floating_point():
            average[key] = torch.stack([s["model"][key].double() for s in states]).mean(0).to(value.dtype)
        else:
            average[key] = value
    rest = {key: value for key, value in states[-1].items() if key not in (TRAINED, EMA_UPDATES)}  # a model only
    return {**rest, "model": average, "averaged": [p.name for p in paths], "optimizer": {}}


def average_inputs(run_dir: Path, n: int, target: Path) -> list[Path]:
    """The run's last `n` step checkpoints, to be averaged into `target` (`tformer average`): `target` may be none
    of the run's checkpoint files nor its index, under any spelling or link. Where else the average may be written
    is the command's to check (outputs.check_output), as for every file a command writes.

    Raises:
        CheckpointError: see `paths_to_average`; `target` is one of the run's checkpoints or its index.
    """
    paths = paths_to_average(run_dir, n, "--last")
    folder = run_dir / CHECKPOINTS
    index = read_index(folder)
    assert index is not None  # paths_to_average found the checkpoints in it
    taken = [*paths, folder / INDEX, *(folder / name for name in index["files"])]
    if any(same_file(target, p) or target.resolve() == p.resolve() for p in taken):
        raise CheckpointError(f"{target} is one of the checkpoints of {run_dir}; write the average to another file")
    return paths
