"""Checkpoints written in the background (train/store.py BackgroundSaves): training goes on during a save, what is
written is the state when the save was asked for, saves land in order, an error is raised, not lost, and
`tformer train` returns (or stops) only with every checkpoint on disk.

The writer is held at a gate (a threading.Event) where a test needs a save to be still in flight."""

import threading
from pathlib import Path

import pytest
import torch

from tformer_cli.config import load_config
from tformer_cli.run.checkpoints import load_checkpoint
from tformer_cli.train import loop
from tformer_cli.train.store import BackgroundSaves, CheckpointStore, host_copy

TINY = str(Path(__file__).parents[3] / "recipes" / "tiny_classifier.yaml")


class GatedStore(CheckpointStore):
    """A store whose saves wait at `gate` before writing, and record the steps they wrote, in order."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.gate, self.started, self.written = threading.Event(), threading.Event(), []

    def save(self, state, step, metric, is_best):
        self.started.set()
        assert self.gate.wait(10), "the test never opened the gate"
        path = super().save(state, step, metric, is_best)
        self.written.append(step)
        return path


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((3,), value)}, "optimizer": {"state": {0: {"m": torch.zeros(2)}}}, "n": 1}


def test_a_save_runs_while_the_caller_goes_on_and_wait_returns_once_it_is_on_disk(tmp_path):
    store = GatedStore(tmp_path)
    saves = BackgroundSaves(store)
    saves.submit(_state(1.0), 10, None, False)
    assert store.started.wait(10) and store.written == []  # submit returned; the save is held at the gate
    store.gate.set()
    saves.wait()
    assert store.written == [10] and load_checkpoint(tmp_path / "checkpoints" / "step_00000010.pt")["n"] == 1


def test_what_is_written_is_the_state_at_submit_not_after_later_updates(tmp_path):
    store = GatedStore(tmp_path)
    saves = BackgroundSaves(store)
    state = _state(1.0)
    saves.submit(state, 10, None, False)
    with torch.no_grad():  # the next update changes the model and the optimizer in place
        state["model"]["w"].add_(5.0)
        state["optimizer"]["state"][0]["m"].fill_(7.0)
    store.gate.set()
    saves.wait()
    saved = load_checkpoint(tmp_path / "checkpoints" / "step_00000010.pt")
    assert saved["model"]["w"].tolist() == [1.0, 1.0, 1.0]
    assert saved["optimizer"]["state"][0]["m"].tolist() == [0.0, 0.0]


def test_saves_land_one_at_a_time_in_the_order_asked(tmp_path):
    store = GatedStore(tmp_path)
    store.gate.set()
    saves = BackgroundSaves(store)
    for step in (1, 2, 3):
        saves.submit(_state(float(step)), step, float(step), step == 2)
    saves.wait()
    assert store.written == [1, 2, 3] and store.index["latest"] == "step_00000003.pt"
    assert store.index["files"]["best.pt"]["step"] == 2


def test_a_failed_save_is_raised_by_the_next_call_once(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    saves = BackgroundSaves(store)

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save", full_disk)
    saves.submit(_state(1.0), 10, None, False)
    with pytest.raises(OSError, match="No space left"):
        saves.wait()
    saves.wait()  # raised once: the store is usable again
    monkeypatch.undo()
    saves.submit(_state(2.0), 20, None, False)
    saves.wait()
    assert store.index["latest"] == "step_00000020.pt"


def test_host_copy_copies_every_tensor_and_keeps_the_rest():
    state = {"a": [torch.ones(2), (torch.zeros(1), 3)], "b": "text", "c": {"d": torch.arange(3)}}
    copy = host_copy(state)
    assert copy["b"] == "text" and copy["a"][1][1] == 3 and isinstance(copy["a"][1], tuple)
    for original, copied in ((state["a"][0], copy["a"][0]), (state["a"][1][0], copy["a"][1][0])):
        assert torch.equal(original, copied) and copied.data_ptr() != original.data_ptr()
    assert torch.equal(copy["c"]["d"], torch.arange(3)) and copy["c"]["d"].data_ptr() != state["c"]["d"].data_ptr()


def test_tied_weights_stay_one_tensor_in_the_snapshot_and_the_file(tmp_path):
    """A state dict lists a tied weight under each of its names (the three-way tying of wmt14_base): one copy."""
    embedding = torch.nn.Embedding(500, 16)
    output = torch.nn.Linear(16, 500, bias=False)
    output.weight = embedding.weight
    model = torch.nn.ModuleDict({"embedding": embedding, "output": output})
    copy = host_copy(model.state_dict())
    assert copy["embedding.weight"] is copy["output.weight"]
    saves = BackgroundSaves(CheckpointStore(tmp_path))
    saves.submit({"model": model.state_dict()}, 1, None, False)
    saves.wait()
    step_file = tmp_path / "checkpoints" / "step_00000001.pt"
    one = tmp_path / "one.pt"
    torch.save({"format": 1, "model": {"embedding.weight": embedding.weight.detach()}}, one)
    assert step_file.stat().st_size < 1.5 * one.stat().st_size  # the weight's 32,000 bytes stored once, not twice


def _slow_saves(monkeypatch) -> list[int]:
    """CheckpointStore.save made slow (every call sleeps first): a training run outpaces its saves. Returns the
    steps written, in order."""
    written, real_save = [], CheckpointStore.save

    def slow(self, state, step, metric, is_best):
        threading.Event().wait(0.3)
        path = real_save(self, state, step, metric, is_best)
        written.append(step)
        return path

    monkeypatch.setattr(CheckpointStore, "save", slow)
    return written


def test_train_returns_with_every_checkpoint_on_disk(tmp_path, monkeypatch):
    written = _slow_saves(monkeypatch)
    config = load_config(TINY, [f"run.out_dir={tmp_path}", "train.max_updates=6", "train.valid_every=2"])
    loop.train(config, tmp_path / "run")
    assert written == [2, 4, 6]
    store = CheckpointStore(tmp_path / "run")
    assert store.index["latest"] == "step_00000006.pt" and store.latest_good()["position"]["step"] == 6


def test_a_run_stopped_by_an_error_still_finishes_the_save_in_flight(tmp_path, monkeypatch):
    """The run's lock is released only after the save: a next `tformer train` resumes from it."""
    written = _slow_saves(monkeypatch)
    real_account = loop._Training.account

    def fails_after_update_4(self, status, stats):
        real_account(self, status, stats)
        if self.progress.step == 5:
            raise RuntimeError("a bug in update 5 (simulated)")

    monkeypatch.setattr(loop._Training, "account", fails_after_update_4)
    config = load_config(TINY, [f"run.out_dir={tmp_path}", "train.max_updates=8", "train.valid_every=4"])
    with pytest.raises(RuntimeError, match="simulated"):
        loop.train(config, tmp_path / "run")
    assert written == [4]
    assert CheckpointStore(tmp_path / "run").latest_good()["position"]["step"] == 4
