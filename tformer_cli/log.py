"""Progress bar on stderr and `metrics.jsonl` in the run directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tformer_cli.files import write_text

console = Console(stderr=True, soft_wrap=True)  # no hard wrapping: one message, one line


class MetricsLog:
    """Appends one JSON object per line; each line carries the update number and wall time."""

    def __init__(self, path: Path, enabled: bool = True, resume_at: int = 0) -> None:
        """Open the log of a run that (re)starts after update `resume_at`.

        Records past `resume_at` (written before a kill, and about to be replayed) and a line torn by a
        kill mid-append are dropped first, so that the log of a resumed run is that of a straight run.
        """
        self.path, self.enabled = path, enabled
        self.start = time.time()
        if enabled:
            keep_records_until(path, resume_at)
        self.tensorboard = _tensorboard(path.parent, resume_at) if enabled else None

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    self.tensorboard.add_scalar(f"{record['split']}/{key}", value, record["step"])
            self.tensorboard.flush()
        record = {"time": round(time.time() - self.start, 3), **record}
        _append(self.path, (json.dumps(record) + "\n").encode("utf-8"))


def _append(path: Path, data: bytes) -> None:
    """Append `data` with one O_APPEND write (a kill leaves whole lines, or at worst one torn last line)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def keep_records_until(path: Path, step: int) -> None:
    """Rewrite the JSON-lines log `path` (atomically) without records past `step` or unreadable lines."""
    if not path.is_file():
        return
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.splitlines()
    kept = [line for line, at in zip(lines, map(_step_of, lines), strict=True) if at is not None and at <= step]
    if len(kept) != len(lines) or not text.endswith("\n"):
        write_text(path, "".join(line + "\n" for line in kept))


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record.get("step") if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def _tensorboard(run_dir: Path, resume_at: int):
    """A TensorBoard writer when the `tensorboard` package is installed (optional), else None.

    Events past `resume_at` are purged, like the records of metrics.jsonl.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_at + 1)


def training_progress(enabled: bool = True) -> Progress:
    """update i/N, bar, elapsed / remaining, then the latest loss, accuracy, lr and throughput."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
        transient=False,
        disable=not enabled,
    )
