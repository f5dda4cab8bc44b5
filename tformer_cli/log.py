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

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = time.time()

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time() - self.start, 3), **record}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def training_progress() -> Progress:
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
    )
