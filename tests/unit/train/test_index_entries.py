"""A step file the index lacks is entered from its own training progress (stored under "position"); one without
that record is left out with a one-line warning."""

from tformer_cli.run.checkpoints import save_checkpoint
from tformer_cli.train import store


def test_a_file_without_training_progress_is_left_out_of_the_index(tmp_path, capsys):
    common = {"model": {}, "config": {"train": {"best_metric": "loss"}}, "metrics": {"loss": 2.5}}
    save_checkpoint({**common, "position": {"step": 4, "validated_at": 4}}, tmp_path / "step_00000004.pt")
    save_checkpoint(common, tmp_path / "step_00000008.pt")
    index, changed = store._index_of_files(tmp_path)
    assert changed and list(index["files"]) == ["step_00000004.pt"] and index["latest"] == "step_00000004.pt"
    assert index["files"]["step_00000004.pt"]["step"] == 4 and index["files"]["step_00000004.pt"]["metric"] == 2.5
    said = " ".join("".join(capsys.readouterr()).split())
    assert "step_00000008.pt: not a training checkpoint (no progress); left out of the index" in said
