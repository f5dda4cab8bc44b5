"""The run's checkpoint folder: step files, an index with checksums and metrics, retention, averaging.

    checkpoints/step_00001000.pt   one per save (validation or preemption)
    checkpoints/best.pt            a byte copy of the step file with the best train.best_metric so far
    checkpoints/index.json         {file: {step, sha256, metric}} and "latest"

The checkpoint files are the truth; index.json is a cache of what they hold, rebuilt from them when it
is missing or unreadable. Every reader loads through `load_verified`, which checks the sha256 that the
index recorded. `save` orders its writes so that a kill at any point leaves a folder from which
`CheckpointStore.recover` resumes at the newest complete checkpoint with an intact best.pt.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from tformer_cli.data.text import sha256_file
from tformer_cli.errors import CheckpointError
from tformer_cli.files import atomic_open, remove_temporaries, same_file, write_json
from tformer_cli.log import console
from tformer_cli.train.checkpoint import load_checkpoint, save_checkpoint

INDEX = "index.json"
BEST = "best.pt"


def _empty_index() -> dict[str, Any]:
    return {"latest": None, "files": {}}


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


def checkpoint_files(folder: Path) -> list[Path]:
    """The step checkpoints and best.pt present in `folder` (not averages or other files)."""
    best = [folder / BEST] if (folder / BEST).is_file() else []
    return sorted(folder.glob("step_*.pt")) + best


def load_verified(path: Path) -> dict[str, Any]:
    """Load a checkpoint; one in a run's checkpoints/ folder whose index lists it must match its sha256.

    The one way every reader (eval, translate, generate, export, average, attention) loads a checkpoint.
    A standalone file (no index beside it, or one the index does not list, like an average) loads as is.

    Raises:
        CheckpointError: missing, not loadable, a checksum mismatch, or an unreadable index beside it.
    """
    real = path.resolve()
    index = read_index(real.parent) if real.parent.name == "checkpoints" else None
    entry = index["files"].get(real.name) if index is not None else None
    return load_checkpoint(path, entry["sha256"] if entry is not None else None)


class CheckpointStore:
    """Saves, prunes and finds the checkpoints of one run directory."""

    def __init__(
        self,
        run_dir: Path,
        keep_last: int = 5,
        keep_best: int = 1,
        higher_is_better: bool = True,
        index: dict[str, Any] | None = None,
    ) -> None:
        """Open `run_dir`/checkpoints with `index` (default: the one on disk).

        Raises:
            CheckpointError: index.json is unreadable (`recover` rebuilds it instead).
        """
        self.dir = run_dir / "checkpoints"
        self.keep_last, self.keep_best, self.higher = keep_last, keep_best, higher_is_better
        self.index_path = self.dir / INDEX
        self.index: dict[str, Any] = index if index is not None else read_index(self.dir) or _empty_index()

    @classmethod
    def recover(
        cls, run_dir: Path, keep_last: int = 5, keep_best: int = 1, higher_is_better: bool = True
    ) -> tuple[CheckpointStore, dict[str, Any] | None]:
        """Open the checkpoints for training (holding the run's lock) and load the state to resume from.

        Leftover temporaries of killed writes are removed; the index is made to list exactly the
        checkpoint files present (rebuilt from them when missing or unreadable); best.pt is restored
        from its step file when a killed save left it behind the resumed checkpoint's best validation.

        Returns:
            The store, and the newest step checkpoint that loads and verifies (None: no checkpoint
            file at all, a new run).

        Raises:
            CheckpointError: there are checkpoint files but no usable step checkpoint (nothing is
                overwritten: the user decides).
        """
        folder = run_dir / "checkpoints"
        if folder.is_dir():
            remove_temporaries(folder)
        index, changed = _index_of_files(folder)
        store = cls(run_dir, keep_last, keep_best, higher_is_better, index=index)
        state = store.latest_good()
        if state is None and checkpoint_files(folder):
            raise CheckpointError(
                f"{folder} holds checkpoint files but no usable step checkpoint; move the folder away "
                "(or use a new run.name) to train from scratch"
            )
        if state is not None:
            changed |= store._level_best(state)
        if changed and folder.is_dir():
            store._write_index()
        return store, state

    def _write_index(self) -> None:
        write_json(self.index_path, self.index)

    def _steps(self) -> list[str]:
        """The indexed step files, oldest first."""
        files = self.index["files"]
        return sorted((n for n in files if n.startswith("step_")), key=lambda n: files[n]["step"])

    def save(self, state: dict[str, Any], step: int, metric: float | None, is_best: bool) -> Path:
        """Write step_<step>.pt (and best.pt, a byte copy), list them in index.json, then prune.

        New files land before the index lists them, and old ones go only after it lists the new, so
        at every moment the folder holds a complete newest checkpoint and an intact best.pt (a save
        killed midway is completed by `recover`).
        """
        path = self.dir / f"step_{step:08d}.pt"
        save_checkpoint(state, path)
        entry = {"step": step, "sha256": sha256_file(path), "metric": metric}
        self.index["files"][path.name] = entry
        if is_best:
            _copy_atomically(path, self.dir / BEST)
            self.index["files"][BEST] = dict(entry)
        self.index["latest"] = path.name
        self._write_index()
        if self._prune():
            self._write_index()
        return path

    def _prune(self) -> bool:
        """Delete the step files beyond the last keep_last and the keep_best best scored; True if any went."""
        files, steps = self.index["files"], self._steps()
        keep = set(steps[-self.keep_last :])
        scored = [n for n in steps if files[n]["metric"] is not None]
        scored.sort(key=lambda n: files[n]["metric"], reverse=self.higher)
        keep |= set(scored[: self.keep_best])
        gone = [name for name in steps if name not in keep]
        for name in gone:
            (self.dir / name).unlink(missing_ok=True)
            del files[name]
        return bool(gone)

    def verified(self, name: str) -> dict[str, Any]:
        """Load `name` after checking the sha256 the index recorded for it."""
        entry = self.index["files"].get(name)
        return load_checkpoint(self.dir / name, entry["sha256"] if entry is not None else None)

    def _intact(self, name: str) -> bool:
        entry = self.index["files"].get(name)
        path = self.dir / name
        return entry is not None and path.is_file() and sha256_file(path) == entry["sha256"]

    def latest_good(self) -> dict[str, Any] | None:
        """The newest step checkpoint that verifies; corrupt or missing ones are reported and skipped."""
        for name in reversed(self._steps()):
            try:
                return self.verified(name)
            except CheckpointError as exc:
                console.print(f"[yellow]warning:[/] {exc}; trying the previous checkpoint")
        return None

    def _level_best(self, state: dict[str, Any]) -> bool:
        """Make best.pt the step file of `state`'s best validation when it is not; True if it changed.

        A save killed between its step file and best.pt leaves best.pt one best behind (or not matching
        the index). A best.pt newer than `state` (newer step files did not verify) is left alone.
        """
        best, step = state["position"]["best"], state["position"]["step"]
        files, entry = self.index["files"], self.index["files"].get(BEST)
        if best is None or (entry is not None and entry["step"] > step):
            return False
        if entry is not None and entry["metric"] == best and self._intact(BEST):
            return False
        sources = [n for n in self._steps() if files[n]["metric"] == best and files[n]["step"] <= step]
        if not sources or not self._intact(sources[0]):
            console.print(
                f"[yellow]warning:[/] {self.dir / BEST} does not hold the best validation so far ({best}) "
                "and no kept step checkpoint does"
            )
            return False
        _copy_atomically(self.dir / sources[0], self.dir / BEST)
        files[BEST] = dict(files[sources[0]])
        console.print(f"[yellow]note:[/] {BEST} restored from {sources[0]} (a save had been interrupted)")
        return True

    def last_paths(self, n: int) -> list[Path]:
        """The last `n` indexed step files, oldest first (fewer when fewer are kept)."""
        return [self.dir / name for name in self._steps()[-n:]] if n > 0 else []


def _copy_atomically(source: Path, target: Path) -> None:
    with source.open("rb") as src, atomic_open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def _index_of_files(folder: Path) -> tuple[dict[str, Any], bool]:
    """The folder's index made to list exactly the checkpoint files present; and whether that changed it.

    Entries whose file is gone are dropped; files the index lacks (or all, when the index is missing or
    unreadable) are loaded with the safe loader and entered with their saved step and metric.
    """
    try:
        on_disk = read_index(folder)
        problem = "missing"
    except CheckpointError:
        on_disk, problem = None, "unreadable"
    present = checkpoint_files(folder)
    if on_disk is None and present:
        console.print(f"[yellow]warning:[/] {folder / INDEX} {problem}: rebuilding it from the checkpoint files")
    listed = (on_disk or _empty_index())["files"]
    files = {n: e for n, e in listed.items() if (folder / n).is_file()}
    if gone := sorted(listed.keys() - files.keys()):
        console.print(f"[yellow]note:[/] {folder / INDEX} listed files that are gone: {', '.join(gone)}")
    for path in present:
        if path.name not in files and (entry := _entry_from_file(path)) is not None:
            files[path.name] = entry
    steps = sorted((n for n in files if n.startswith("step_")), key=lambda n: files[n]["step"])
    index = {"latest": steps[-1] if steps else None, "files": files}
    return index, index != on_disk


def _entry_from_file(path: Path) -> dict[str, Any] | None:
    """An index entry from the checkpoint itself (its saved step, and metric if saved at a validation)."""
    try:
        state = load_checkpoint(path)
    except CheckpointError as exc:
        console.print(f"[yellow]warning:[/] {exc}; left out of the index")
        return None
    position, config = state.get("position"), state.get("config")
    if not isinstance(position, dict) or not isinstance(position.get("step"), int) or not isinstance(config, dict):
        console.print(f"[yellow]warning:[/] {path}: not a training checkpoint (no position); left out of the index")
        return None
    step, best_metric = position["step"], config.get("train", {}).get("best_metric")
    metric = state.get("metrics", {}).get(best_metric) if position.get("validated_at") == step else None
    return {"step": step, "sha256": sha256_file(path), "metric": metric}


def paths_to_average(run_dir: Path, n: int, option: str) -> list[Path]:
    """The run's last `n` step checkpoints, for averaging (`option` names the argument in errors).

    Raises:
        CheckpointError: `run_dir` is not a directory, n < 1, or fewer than n step checkpoints are kept.
    """
    if n < 1:
        raise CheckpointError(f"{option} takes the number of step checkpoints to average (1 or more), got {n}")
    if not run_dir.is_dir():
        raise CheckpointError(f"{option} needs a run directory, got {run_dir}")
    paths = CheckpointStore(run_dir).last_paths(n)
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
    return {**states[-1], "model": average, "averaged": [p.name for p in paths], "optimizer": {}}


def average_to_file(run_dir: Path, n: int, target: Path) -> list[Path]:
    """Average the run's last `n` step checkpoints into `target` (written atomically); returns the inputs.

    Raises:
        CheckpointError: see `paths_to_average`; `target` is one of the run's checkpoints or its index.
    """
    paths = paths_to_average(run_dir, n, "--last")
    folder = run_dir / "checkpoints"
    taken = [*paths, folder / INDEX, *(folder / name for name in read_index(folder)["files"])]
    if any(same_file(target, p) or target.resolve() == p.resolve() for p in taken):
        raise CheckpointError(f"{target} is one of the checkpoints of {run_dir}; write the average to another file")
    save_checkpoint(average_checkpoints(paths), target)
    return paths
