"""Progress bar on stderr and `metrics.jsonl` in the run directory."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


class MetricsLog:
    """Appends one JSON object per line; each line carries the update number and wall time."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path, self.enabled = path, enabled
        self.start = time.time()
        self.tensorboard = _tensorboard(path.parent) if enabled else None

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    self.tensorboard.add_scalar(f"{record['split']}/{key}", value, record["step"])
            self.tensorboard.flush()
        record = {"time": round(time.time() - self.start, 3), **record}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def _tensorboard(run_dir: Path):
    """A TensorBoard writer when the `tensorboard` package is installed (optional), else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


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
