"""The run's checkpoint folder: step files, an index with checksums and metrics, retention, averaging.

    checkpoints/step_00001000.pt   one per save (validation or preemption)
    checkpoints/best.pt            the best by train.best_metric so far
    checkpoints/index.json         {file: {step, sha256, metric}} and "latest"; written atomically

Loading verifies the sha256 recorded when the file was written; a corrupt or truncated latest file is
reported and the previous good one is used.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from tformer_cli.data.text import sha256_file
from tformer_cli.errors import CheckpointError
from tformer_cli.log import console
from tformer_cli.train.checkpoint import load_checkpoint, save_checkpoint


class CheckpointStore:
    """Saves, prunes and finds the checkpoints of one run directory."""

    def __init__(self, run_dir: Path, keep_last: int = 5, keep_best: int = 1, higher_is_better: bool = True) -> None:
        self.dir = run_dir / "checkpoints"
        self.keep_last, self.keep_best, self.higher = keep_last, keep_best, higher_is_better
        self.index_path = self.dir / "index.json"
        self.index: dict[str, Any] = {"latest": None, "files": {}}
        if self.index_path.is_file():
            self.index = json.loads(self.index_path.read_text())

    def _write_index(self) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".index.", dir=self.dir)
        with os.fdopen(fd, "w") as handle:
            json.dump(self.index, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.index_path)

    def save(self, state: dict[str, Any], step: int, metric: float | None, is_best: bool) -> Path:
        """Write step_<step>.pt (and best.pt), record checksums, prune old files."""
        path = self.dir / f"step_{step:08d}.pt"
        save_checkpoint(state, path)
        self.index["files"][path.name] = {"step": step, "sha256": sha256_file(path), "metric": metric}
        if is_best:
            best = self.dir / "best.pt"
            save_checkpoint(state, best)
            self.index["files"]["best.pt"] = {"step": step, "sha256": sha256_file(best), "metric": metric}
        self.index["latest"] = path.name
        self._prune()
        self._write_index()
        return path

    def _prune(self) -> None:
        steps = sorted(
            (n for n in self.index["files"] if n.startswith("step_")), key=lambda n: self.index["files"][n]["step"]
        )
        keep = set(steps[-self.keep_last :])
        scored = [n for n in steps if self.index["files"][n]["metric"] is not None]
        scored.sort(key=lambda n: self.index["files"][n]["metric"], reverse=self.higher)
        keep |= set(scored[: self.keep_best])
        for name in steps:
            if name not in keep:
                (self.dir / name).unlink(missing_ok=True)
                del self.index["files"][name]

    def verified(self, name: str) -> dict[str, Any]:
        """Load `name` after checking its recorded sha256."""
        path = self.dir / name
        expected = self.index["files"].get(name, {}).get("sha256")
        if not path.is_file():
            raise CheckpointError(f"checkpoint not found: {path}")
        if expected is not None and sha256_file(path) != expected:
            raise CheckpointError(f"{path}: checksum mismatch (corrupt or truncated)")
        return load_checkpoint(path)

    def latest_good(self) -> dict[str, Any] | None:
        """The newest step checkpoint that verifies; corrupt ones are reported and skipped."""
        steps = sorted(
            (n for n in self.index["files"] if n.startswith("step_")),
            key=lambda n: self.index["files"][n]["step"],
            reverse=True,
        )
        for name in steps:
            try:
                return self.verified(name)
            except CheckpointError as exc:
                console.print(f"[yellow]warning:[/] {exc}; trying the previous checkpoint")
        return None

    def last_paths(self, n: int) -> list[Path]:
        steps = sorted(
            (n for n in self.index["files"] if n.startswith("step_")), key=lambda n: self.index["files"][n]["step"]
        )
        return [self.dir / name for name in steps[-n:]]


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """The element-wise mean of the models in `paths` (the paper averages the last 5); other fields from the last."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    average = {}
    for key, value in states[-1]["model"].items():
        if value.is_floating_point():
            average[key] = torch.stack([s["model"][key].double() for s in states]).mean(0).to(value.dtype)
        else:
            average[key] = value
    return {**states[-1], "model": average, "averaged": [p.name for p in paths], "optimizer": {}}
