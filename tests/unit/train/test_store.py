"""The checkpoint folder (train/store.py): the order of a save, recovery from the files; and the verified
reads (run/checkpoints.py) of what it wrote."""

import json
from pathlib import Path

import pytest
import torch

from tformer_cli.errors import CheckpointError
from tformer_cli.files import sha256_file
from tformer_cli.run.checkpoints import load_verified, paths_to_average, read_index, save_checkpoint
from tformer_cli.train import store as store_module
from tformer_cli.train.store import CheckpointStore


class Killed(BaseException):
    """Stands for kill -9: nothing after it runs (not even `except Exception` handlers)."""


def _state(step: int, loss: float, best: float) -> dict:
    return {
        "model": {"w": torch.full((4,), float(step))},
        "position": {"step": step, "validated_at": step, "best": best},
        "config": {"train": {"best_metric": "loss"}},
        "metrics": {"loss": loss},
    }


def _save(store: CheckpointStore, step: int, loss: float, best: float) -> None:
    store.save(_state(step, loss, best), step, loss, is_best=loss == best)


def _reader_view(run: Path) -> int | None:
    """The step a reader finds through the index on disk alone (no recovery)."""
    state = CheckpointStore(run).latest_good()
    return None if state is None else state["position"]["step"]


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_save_killed_while_pruning_leaves_an_index_that_lists_the_new_checkpoint(tmp_path, monkeypatch, when):
    """keep_last=1: step 2 is pruned by the save of step 4; the index must list step 4 before that."""
    store = CheckpointStore(tmp_path, keep_last=1, keep_best=0, higher_is_better=False)
    _save(store, 2, 1.0, 1.0)
    real_unlink = Path.unlink

    def unlink(path, *args, **kwargs):
        if when == "after":
            real_unlink(path, *args, **kwargs)
        raise Killed

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(Killed):
        _save(store, 4, 0.5, 0.5)
    monkeypatch.undo()
    assert _reader_view(tmp_path) == 4
    assert CheckpointStore.recover(tmp_path, 1, 0, False)[1]["position"]["step"] == 4


def test_best_pt_is_a_byte_copy_of_its_step_file(tmp_path):
    store = CheckpointStore(tmp_path, higher_is_better=False)
    _save(store, 2, 1.0, 1.0)
    _save(store, 4, 2.0, 1.0)
    files = json.loads((tmp_path / "checkpoints/index.json").read_text())["files"]
    assert files["best.pt"] == files["step_00000002.pt"]
    assert sha256_file(tmp_path / "checkpoints/best.pt") == files["best.pt"]["sha256"]


def test_recover_restores_best_pt_that_a_killed_save_left_behind(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path, higher_is_better=False)
    _save(store, 2, 1.0, 1.0)
    monkeypatch.setattr(store_module, "_copy_atomically", lambda source, target: (_ for _ in ()).throw(Killed))
    with pytest.raises(Killed):
        _save(store, 4, 0.5, 0.5)  # step 4 is a new best; the kill comes before best.pt is written
    monkeypatch.undo()
    recovered, state = CheckpointStore.recover(tmp_path, higher_is_better=False)
    assert state["position"]["step"] == 4
    assert torch.equal(load_verified(tmp_path / "checkpoints/best.pt")["model"]["w"], torch.full((4,), 4.0))
    assert recovered.index["files"]["best.pt"]["step"] == 4


def test_recover_leaves_a_best_pt_newer_than_the_resumed_checkpoint_alone(tmp_path):
    store = CheckpointStore(tmp_path, higher_is_better=False)
    _save(store, 2, 1.0, 1.0)
    _save(store, 4, 0.5, 0.5)
    (tmp_path / "checkpoints/step_00000004.pt").write_bytes(b"torn")
    best = (tmp_path / "checkpoints/best.pt").read_bytes()
    _, state = CheckpointStore.recover(tmp_path, higher_is_better=False)
    assert state["position"]["step"] == 2 and (tmp_path / "checkpoints/best.pt").read_bytes() == best


def test_recover_of_a_new_run_writes_nothing(tmp_path):
    store, state = CheckpointStore.recover(tmp_path)
    assert state is None and store.index == {"latest": None, "files": {}} and not any(tmp_path.iterdir())


def test_load_verified_checks_listed_files_and_loads_standalone_ones_as_they_are(tmp_path):
    store = CheckpointStore(tmp_path)
    _save(store, 2, 1.0, 1.0)
    listed = tmp_path / "checkpoints/step_00000002.pt"
    standalone = tmp_path / "checkpoints/averaged_last1.pt"
    save_checkpoint(_state(9, 1.0, 1.0), standalone)
    data = bytearray(listed.read_bytes())
    data[len(data) // 2] ^= 1
    listed.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_verified(listed)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_verified(tmp_path / "checkpoints" / ".." / "checkpoints" / "step_00000002.pt")
    assert load_verified(standalone)["position"]["step"] == 9
    (tmp_path / "checkpoints/index.json").write_text("{")
    with pytest.raises(CheckpointError, match="index.json is unreadable"):
        load_verified(standalone)


@pytest.mark.parametrize("text", ["", "{", "[]", '{"files": {"a.pt": {"step": "x", "sha256": "", "metric": null}}}'])
def test_an_index_that_is_not_one_is_a_checkpoint_error(tmp_path, text):
    (tmp_path / "index.json").write_text(text)
    with pytest.raises(CheckpointError, match="unreadable"):
        read_index(tmp_path)


@pytest.mark.parametrize("n", [0, -2])
def test_averaging_fewer_than_one_checkpoint_is_an_error(tmp_path, n):
    _save(CheckpointStore(tmp_path), 2, 1.0, 1.0)
    with pytest.raises(CheckpointError, match="--last takes the number"):
        paths_to_average(tmp_path, n, "--last")
