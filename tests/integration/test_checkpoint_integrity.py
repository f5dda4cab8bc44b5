"""A checkpoint's integrity travels with it: the sha256 of its contents is saved inside it and every load verifies
it, with the run's index, without it (deleted), or with a damaged one; a damaged index is refused naming itself."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.errors import CheckpointError
from tformer_cli.run.checkpoints import CHECKSUM, load_checkpoint, save_checkpoint

runner = CliRunner()


def _state() -> dict:
    torch.manual_seed(0)
    return {
        "model": {"w": torch.randn(8, 4), "b": torch.zeros(4, dtype=torch.bfloat16), "n": torch.tensor(3)},
        "optimizer": {"state": {0: {"step": torch.tensor(2.0)}}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "config": {"train": {"lr": 0.001, "betas": (0.9, 0.98)}, "data": {"dir": None}},
        "position": {"step": 2, "best": None},
    }


def _resave(path: Path, change) -> None:
    """Load the file as it is (no verification), change it, and save it with torch.save: the checksum it holds
    is the old one."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


def test_a_checkpoint_verifies_against_its_own_checksum(tmp_path):
    path = tmp_path / "a.pt"
    save_checkpoint(_state(), path)
    state = load_checkpoint(path)
    assert CHECKSUM not in state and torch.equal(state["model"]["w"], _state()["model"]["w"])
    save_checkpoint(state, tmp_path / "again.pt")  # what was loaded saves again and verifies (an average does so)
    load_checkpoint(tmp_path / "again.pt")


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["model"]["w"].view(-1)[:10].fill_(float("inf")),
        lambda s: s["model"]["b"].add_(1),
        lambda s: s["model"].__setitem__("extra", torch.zeros(1)),
        lambda s: s["config"]["train"].__setitem__("lr", 0.0011),
        lambda s: s["position"].__setitem__("step", 3),
        lambda s: s["optimizer"]["state"][0]["step"].add_(1),
    ],
    ids=["weights-inf", "bf16", "a-tensor-more", "config", "position", "optimizer"],
)
def test_any_change_to_a_saved_checkpoint_is_refused_without_an_index(tmp_path, change):
    path = tmp_path / "checkpoints" / "best.pt"  # in a checkpoints/ folder that has no index.json
    save_checkpoint(_state(), path)
    _resave(path, change)
    with pytest.raises(CheckpointError, match="do not match the checksum saved in it"):
        load_checkpoint(path)


@pytest.fixture
def copied_run(translation_run, tmp_path) -> Path:
    run = tmp_path / "mt"
    shutil.copytree(translation_run / "runs/mt", run, ignore=shutil.ignore_patterns("eval_*", "ctranslate2"))
    return run


def _one_line(result, *parts) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert lines[-1].startswith("error: ") and all(p in lines[-1] for p in parts), result.stderr
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], result.stderr


def test_a_damaged_best_pt_is_refused_by_every_reader_with_the_index_deleted(copied_run, tmp_path):
    best = copied_run / "checkpoints/best.pt"
    (copied_run / "checkpoints/index.json").unlink()

    def thousand_infinities(state):
        weights = next(t for t in state["model"].values() if t.is_floating_point() and t.numel() >= 1000)
        weights.view(-1)[:1000] = float("inf")

    _resave(best, thousand_infinities)
    (tmp_path / "src.txt").write_text("the cat\n")
    for args in (
        ["eval", str(copied_run), "run.device=cpu"],
        ["translate", str(copied_run), "-i", str(tmp_path / "src.txt"), "run.device=cpu"],
        ["attention", str(copied_run), "-o", str(tmp_path / "a.png"), "--text", "the cat"],
        ["export", str(copied_run), "-o", str(tmp_path / "m.safetensors")],
    ):
        _one_line(runner.invoke(app, args), "checksum saved in it", str(best))
    assert not (tmp_path / "a.png").exists() and not (tmp_path / "m.safetensors").exists()


def test_a_stale_index_is_named_as_the_cause_and_a_damaged_one_refused(copied_run, tmp_path):
    index_path = copied_run / "checkpoints/index.json"
    index = json.loads(index_path.read_text())
    index["files"]["best.pt"]["sha256"] = "0" * 64  # the file is intact; the index is wrong
    index_path.write_text(json.dumps(index))
    _one_line(runner.invoke(app, ["eval", str(copied_run), "run.device=cpu"]), "the index is stale or damaged")
    index_path.write_text('{"files": ')
    _one_line(runner.invoke(app, ["eval", str(copied_run), "run.device=cpu"]), "index.json is unreadable")
    index_path.unlink()  # no index: the files are the truth, and they verify
    assert runner.invoke(app, ["eval", str(copied_run), "run.device=cpu"]).exit_code == 0
