"""Where a command may write a file the user names, and names the user gives that become file names.

Every command that writes a file the user names (`translate -o`, `export -o`, `average -o`, `attention -o`,
eval's results, sweep's table) asks `check_output` first. It refuses, in one line:
- one of the command's own inputs (a source, a reference, the checkpoint being read);
- a file tformer manages: anything in a run directory's checkpoints/ (besides an average, for `average`),
  its config.yaml, metrics.jsonl, curves.png, eval results, lock and ctranslate2/ exports; anything inside a
  prepared data folder (`prepare` replaces it whole); tformer's lock and temporary files;
- what is not a regular file (a device, a pipe: replacing it atomically would put a file in its place);
- an existing file that is not an earlier output of the same kind, unless the user gives `--force`.
An earlier output is recognised by what tformer writes into it (safetensors metadata, an average's list of
steps, matplotlib's signature in a figure, the sweep command atop a table); a translation is plain text, so an
existing non-empty file needs `--force`.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from tformer_cli.data.manifest import MANIFEST, made_by_prepare, read_manifest
from tformer_cli.errors import TformerError
from tformer_cli.files import LOCK, TMP_SUFFIX, same_file
from tformer_cli.run.layout import (
    BEST,
    CHECKPOINTS,
    CONFIG,
    CTRANSLATE2,
    CURVES,
    INDEX,
    METRICS,
    STEP_PREFIX,
    SWEEP_RECORD,
    TRAIN_LOG,
)

Kind = Literal["text", "safetensors", "average", "figure", "table", "csv", "folder"]

_WHAT = {
    "text": "translation (plain text cannot be told apart from other text)",
    "safetensors": "tformer safetensors export",
    "average": "tformer average of checkpoints",
    "figure": "figure (matplotlib wrote none into it)",
    "table": "sweep table",
    "csv": "sweep table",
}
# A run directory's own files (named in run/layout.py; the lock file in files.py): replaced only by the run itself.
_RUN_FILES = (CHECKPOINTS, CONFIG, METRICS, CURVES, CTRANSLATE2, LOCK, SWEEP_RECORD, TRAIN_LOG)
MAX_HEADER = 100 << 20  # safetensors' own limit on a header's size


def one_name(value: str, what: str) -> str:
    """`value` when it can be one file name (no folder part, not `.` or `..`, no control character such as a
    newline or NUL, at most 200 bytes).

    Raises:
        TformerError: naming `what` (the option or key it came from).
    """
    control = any(ord(c) < 32 or ord(c) == 127 for c in value)
    if not value or value in (".", "..") or control or any(c in value for c in "/\\") or len(value.encode()) > 200:
        raise TformerError(
            f"{what} {value!r} must be a plain name (not empty, '.' or '..', no '/', '\\' or control character, "
            "at most 200 bytes): it becomes part of a file name"
        )
    return value


def check_output(
    target: Path, kind: Kind, inputs: tuple[Path | None, ...] = (), force: bool = False, what: str = "-o"
) -> None:
    """Refuse a `target` that writing `kind` there would destroy (see the module's docstring).

    Args:
        target: the file to be written (atomically) or replaced.
        kind: what the command writes, to recognise an earlier output of the same kind ("folder": an export
            folder, which `export/folder.py` replaces only when it is an earlier export).
        inputs: the files the command reads (a run directory stands for its checkpoints).
        force: replace an existing file that is not an earlier output of this kind.
        what: how the message names the target's option.

    Raises:
        TformerError: one line naming the target and why.
    """
    if str(target) == "-":  # a shell's "standard output", which would be a file named "-" in the working folder
        stdout = "; without it, the text goes to standard output" if kind == "text" else ""
        raise TformerError(f"{what} -: give a file name{stdout}")
    refuse_inputs(target, inputs, what)
    managed = managed_by_tformer(target, may_average=kind == "average")
    if managed is not None:
        raise TformerError(f"{what} {target} is {managed}, which tformer manages; write elsewhere")
    if kind == "folder" or not os.path.lexists(target) or target.is_dir():
        return  # new, or a folder: what replaces a folder decides (export/folder.py), or names it
    mode = os.stat(target).st_mode
    if not stat.S_ISREG(mode):
        raise TformerError(f"{what} {target} is not a regular file (a device, a pipe or a socket); write elsewhere")
    if not force and os.path.getsize(target) > 0 and not earlier_output(target, kind):
        raise TformerError(
            f"{what} {target} exists and is not an earlier {_WHAT[kind]}; "
            "give --force to replace it, or write elsewhere"
        )


def refuse_inputs(target: Path, inputs: tuple[Path | None, ...], what: str = "-o") -> None:
    """Refuse a `target` that is one of `inputs` (through any spelling or link).

    Raises:
        TformerError: naming both.
    """
    for source in filter(None, inputs):
        if same_file(target, source) or target.absolute() == source.absolute():
            raise TformerError(f"{what} {target} is one of this command's inputs ({source}); write elsewhere")


def managed_by_tformer(target: Path, may_average: bool = False) -> str | None:
    """What of tformer's own `target` is (in words), or None: a run's file, a prepared data folder's, a lock or
    temporary file. `may_average`: a new file in a run's checkpoints/ is allowed (where `average` writes)."""
    name = target.name
    if name.startswith(".") and (name.endswith(LOCK) or name.endswith(TMP_SUFFIX)):
        return "a lock or temporary file of tformer's"
    real = target.parent.resolve() / name
    for folder in real.parents:
        inside = real.relative_to(folder).parts
        if _prepared(folder):
            return f"inside the prepared data folder {folder} (`tformer prepare` replaces it whole)"
        if _is_run(folder):
            return _in_run(folder, inside, may_average)
    return None


MAX_WALK = 10_000  # folders looked into for a prepared folder inside a run directory (a run holds a few)


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run directory that is, is inside, or holds a prepared data folder (also through symbolic links):
    `tformer prepare` replaces its folder whole, and would take the run's checkpoints and logs with it.

    Raises:
        TformerError: one line naming the prepared folder.
    """
    real = run_dir.resolve()
    if folder := _self_or_parent(real, _prepared):
        where = "is" if folder == real else "is inside"
        raise TformerError(
            f"run directory {run_dir} {where} the prepared data folder {folder}, which `tformer prepare` "
            "replaces whole; choose another run.out_dir or run.name"
        )
    for count, (top, _, _) in enumerate(os.walk(real)):  # not through links: their targets are not inside the run
        if count > MAX_WALK:
            break
        if count and _prepared(Path(top)):
            raise TformerError(
                f"run directory {run_dir} holds the prepared data folder {top}; keep runs and prepared data "
                "apart: choose another run.out_dir or run.name"
            )


def check_data_dir(data_dir: Path) -> None:
    """Refuse a prepared data folder that is or is inside a run directory (also through symbolic links): a run and
    a prepared folder never nest (a run inside data.dir is refused by `prepare` as files it did not make).

    Raises:
        TformerError: one line naming the run directory.
    """
    real = data_dir.resolve()
    if folder := _self_or_parent(real, _is_run):
        where = "is" if folder == real else "is inside"
        raise TformerError(
            f"data.dir={data_dir} {where} the run directory {folder}; keep runs and prepared data apart: "
            "choose another data.dir"
        )


def _self_or_parent(real: Path, holds: Callable[[Path], bool]) -> Path | None:
    """The nearest of `real` and its parents that `holds`, or None."""
    return next((folder for folder in (real, *real.parents) if holds(folder)), None)


def _prepared(folder: Path) -> bool:
    """A folder `tformer prepare` made: its manifest is there and says so, or is there and damaged (prepare's still)."""
    if not (folder / MANIFEST).is_file():
        return False
    try:
        manifest = read_manifest(folder)
    except TformerError:
        return True  # a damaged manifest: still prepare's folder, to be replaced
    return manifest is not None and made_by_prepare(manifest)


def _is_run(folder: Path) -> bool:
    """A run directory: config.yaml with checkpoints/, metrics.jsonl or a lock beside it."""
    return (folder / CONFIG).is_file() and any((folder / name).exists() for name in (CHECKPOINTS, METRICS, LOCK))


def _in_run(run: Path, inside: tuple[str, ...], may_average: bool) -> str | None:
    """What a path `inside` a run directory is, when the run manages it (None: a file of the user's)."""
    first = inside[0]
    if first == CHECKPOINTS and may_average and len(inside) == 2:
        taken = inside[1] in (BEST, INDEX) or inside[1].startswith(STEP_PREFIX)
        return f"a checkpoint file of the run {run}" if taken else None
    if first in _RUN_FILES or (first.startswith("eval_") and len(inside) == 1):
        return f"{'/'.join(inside)} of the run {run}"
    return None


def earlier_output(path: Path, kind: Kind) -> bool:
    """Whether the existing file `path` holds what tformer writes as `kind` (never for plain text)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(1 << 16)
    except OSError:
        return False
    match kind:
        case "safetensors":
            return _safetensors_export(path, head)
        case "average":
            return _average(path)
        case "figure":  # PNG and SVG name matplotlib at the start, PDF in its info dictionary at the end
            return b"matplotlib" in head.lower() or b"matplotlib" in _tail(path).lower()
        case "table":
            return head.startswith(b"`tformer sweep ")
        case "csv":
            header = head.split(b"\n", 1)[0].split(b",")
            return b"status" in header and header[-1] == b"log"
    return False


def _tail(path: Path, size: int = 1 << 16) -> bytes:
    with path.open("rb") as handle:
        handle.seek(max(os.path.getsize(path) - size, 0))
        return handle.read()


def _safetensors_export(path: Path, head: bytes) -> bool:
    """A safetensors header whose metadata holds the recipe and tokenizer fingerprint `export` records."""
    size = int.from_bytes(head[:8], "little")
    if not 2 <= size <= min(MAX_HEADER, os.path.getsize(path) - 8):
        return False
    with path.open("rb") as handle:
        handle.seek(8)
        header = handle.read(size)
    try:
        metadata = json.loads(header).get("__metadata__") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(metadata, dict) and {"config", "tokenizer_fingerprint"} <= metadata.keys()


def _average(path: Path) -> bool:
    """A checkpoint `average` wrote: it lists the steps it averaged (read with the safe loader, memory-mapped)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a checkpoint at all: not an average either
        return False
    return isinstance(state, dict) and isinstance(state.get("averaged"), list)
