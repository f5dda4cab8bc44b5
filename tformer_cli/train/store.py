"""The writer of a run's checkpoint folder: saves, the index, retention, and recovery after a kill.

The files are named in run/layout.py; run/checkpoints.py reads them (and is the only way readers do).
The checkpoint files are the truth; index.json is a cache of what they hold, rebuilt from them when it
is missing or unreadable. `save` orders its writes so that a kill at any point leaves a folder from which
`CheckpointStore.recover` resumes at the newest complete checkpoint with an intact best.pt.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import torch

from tformer_cli.errors import CheckpointError
from tformer_cli.files import atomic_open, remove_temporaries, sha256_file, write_json
from tformer_cli.log import console
from tformer_cli.run.checkpoints import checkpoint_files, load_checkpoint, read_index, save_checkpoint, step_names
from tformer_cli.run.layout import BEST, CHECKPOINTS, INDEX, step_file


def _empty_index() -> dict[str, Any]:
    return {"latest": None, "files": {}}


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
        self.dir = run_dir / CHECKPOINTS
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
        folder = run_dir / CHECKPOINTS
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
        return step_names(self.index)

    def save(self, state: dict[str, Any], step: int, metric: float | None, is_best: bool) -> Path:
        """Write step_<step>.pt (and best.pt, a byte copy), list them in index.json, then prune.

        New files land before the index lists them, and old ones go only after it lists the new, so
        at every moment the folder holds a complete newest checkpoint and an intact best.pt (a save
        killed midway is completed by `recover`).
        """
        path = self.dir / step_file(step)
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


class BackgroundSaves:
    """`CheckpointStore.save` in a thread, so that training goes on while a checkpoint is written (at the paper's
    size a save writes, fsyncs and checksums ~0.76 GB, and a new best copies it: seconds each time).

    One save at a time, in order: `submit` first waits for the one in flight. `submit` takes a snapshot of the
    state (every tensor copied to host memory) before it returns, so that the updates that follow cannot change
    what is written. A save's error is raised by the next `submit` or `wait`. Call `wait` before anything
    that needs the checkpoint on disk (saying it is saved, exiting, releasing the run's lock; leaving a `with`
    block of it waits too); the write
    order of `save` holds in the thread, so a kill at any moment leaves what `recover` resumes from.
    """

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, state: dict[str, Any], step: int, metric: float | None, is_best: bool) -> None:
        """Snapshot `state` and start saving it (see `CheckpointStore.save`).

        Raises:
            The previous save's error, if it failed (nothing new is started).
        """
        self.wait()
        snapshot = host_copy(state)

        def save() -> None:
            try:
                self.store.save(snapshot, step, metric, is_best)
            except BaseException as exc:  # raised in the training thread by the next submit or wait
                self._error = exc

        self._thread = threading.Thread(target=save, name=f"save step {step}")
        self._thread.start()

    def __enter__(self) -> BackgroundSaves:
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()  # every checkpoint on disk (or its error raised) however the block ends

    def wait(self) -> None:
        """Return once no save is in flight.

        Raises:
            The last save's error, if it failed (once).
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def host_copy(value: Any, copies: dict[tuple, torch.Tensor] | None = None) -> Any:
    """`value` with every tensor in it (dicts, lists and tuples followed) copied to host memory: a snapshot
    that later in-place updates of the originals do not reach. The same memory met twice (tied weights, one
    tensor under each of their names in a state dict) is copied once, so the file still stores it once."""
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        key = (value.device, value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
        if key not in copies:
            copies[key] = value.detach().to("cpu", copy=True)
        return copies[key]
    if isinstance(value, dict):
        return {key: host_copy(item, copies) for key, item in value.items()}
    if isinstance(value, list):
        return [host_copy(item, copies) for item in value]
    if isinstance(value, tuple):
        return tuple(host_copy(item, copies) for item in value)
    return value


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
    steps = step_names({"files": files})
    index = {"latest": steps[-1] if steps else None, "files": files}
    return index, index != on_disk


def _entry_from_file(path: Path) -> dict[str, Any] | None:
    """An index entry from the checkpoint itself (its saved step, and metric if saved at a validation)."""
    try:
        state = load_checkpoint(path)
    except CheckpointError as exc:
        console.print(f"[yellow]warning:[/] {exc}; left out of the index")
        return None
    progress, config = state.get("position"), state.get("config")  # train/loop.py's Progress, under its stored key
    if not isinstance(progress, dict) or not isinstance(progress.get("step"), int) or not isinstance(config, dict):
        console.print(f"[yellow]warning:[/] {path}: not a training checkpoint (no progress); left out of the index")
        return None
    step, best_metric = progress["step"], config.get("train", {}).get("best_metric")
    metric = state.get("metrics", {}).get(best_metric) if progress.get("validated_at") == step else None
    return {"step": step, "sha256": sha256_file(path), "metric": metric}
