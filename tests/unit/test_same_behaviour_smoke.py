"""bench/same_behaviour.py's comparison on made-up result folders (no training): identical sides pass, a side with
one metric value, one tensor element, one decoded line or a resume that drifted fails, naming what differs."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import same_behaviour  # noqa: E402


def _run(folder: Path, loss: float = 1.5) -> None:
    """A run folder as training leaves it: metrics.jsonl, a checkpoint with model and optimizer state, its index."""
    (folder / "checkpoints").mkdir(parents=True)
    records = [
        {"time": 0.1, "split": "train", "step": 4, "epoch": 0, "loss": loss, "lr": 0.001, "examples_per_s": 900.0},
        {"time": 0.2, "split": "valid", "step": 4, "epoch": 0, "loss": 1.25, "accuracy": 0.5},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "config.yaml").write_text("run:\n  name: x\n")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(3, 4, generator=g)
    state = {
        "model": {"layer.weight": weight, "layer.bias": torch.zeros(3)},
        "optimizer": {"state": {0: {"step": torch.tensor(4.0), "exp_avg": torch.randn(3, 4, generator=g)}}},
        "rng": {"torch": torch.Generator().manual_seed(1).get_state()},
        "position": {"step": 4, "epoch": 0, "seconds": 1.23},
    }
    torch.save(state, folder / "checkpoints" / "step_00000004.pt")
    index = {"latest": "step_00000004.pt", "files": {"step_00000004.pt": {"step": 4, "sha256": "ab", "metric": 0.5}}}
    (folder / "checkpoints" / "index.json").write_text(json.dumps(index))
    (folder / "train.log").write_text("update 4 elapsed 0:00:01\n")


@pytest.fixture(scope="module")
def side(tmp_path_factory) -> Path:
    """One side's result folder with every scenario's files present."""
    root = tmp_path_factory.mktemp("side")
    for paths in same_behaviour.SCENARIOS.values():
        for rel in paths:
            path = root / rel
            if rel.startswith("runs/"):
                _run(path)
            elif rel.startswith("data/"):
                path.mkdir(parents=True)
                (path / "manifest.json").write_text(json.dumps({"tokens": {"src": 10}}))
                (path / "train.src.bin").write_bytes(bytes(range(16)))
            elif rel.endswith(".json"):
                path.write_text(json.dumps({"tiny_float32_greedy_True": [[[5, 6, 2], -1.2345]]}))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("das haus\nein hund\n")
    (root / "side.json").write_text(json.dumps({"checks": {"update_freq_patience": [True, "stopped early at 8"]}}))
    return root


def _twin(side: Path, tmp_path: Path) -> Path:
    other = tmp_path / "other"
    shutil.copytree(side, other)
    return other


def _compare(a: Path, b: Path, capsys) -> tuple[int, dict[str, str]]:
    code = same_behaviour.main(["--compare", str(a), str(b)])
    lines = capsys.readouterr().out.splitlines()
    return code, {line.split()[0]: line for line in lines}


def test_identical_sides_are_the_same(side, tmp_path, capsys):
    other = _twin(side, tmp_path)
    # what the clock measures is not behaviour: other times, speeds and seconds trained still compare the same
    metrics = other / "runs/classifier/metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"time": 0.1', '"time": 9.9').replace("900.0", "12.5"))
    checkpoint = other / "runs/classifier/checkpoints/step_00000004.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["position"]["seconds"] = 99.0
    torch.save(state, checkpoint)
    (other / "runs/classifier/train.log").write_text("update 4 elapsed 0:07:00\n")
    code, lines = _compare(side, other, capsys)
    assert code == 0
    assert len(lines) == len(same_behaviour.SCENARIOS)
    assert all(" same" in line and "DIFFERS" not in line for line in lines.values()), lines


def test_one_metric_value_differs(side, tmp_path, capsys):
    other = _twin(side, tmp_path)
    metrics = other / "runs/dropout/metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"loss": 1.5', '"loss": 1.5000001'))
    code, lines = _compare(side, other, capsys)
    assert code == 1
    assert "DIFFERS" in lines["dropout"]
    assert "record 1 (split=train step=4 epoch=0) loss: 1.5 vs 1.5000001" in lines["dropout"]
    assert all("DIFFERS" not in line for name, line in lines.items() if name != "dropout"), lines


def test_one_tensor_element_differs(side, tmp_path, capsys):
    other = _twin(side, tmp_path)
    checkpoint = other / "runs/translation/checkpoints/step_00000004.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["optimizer"]["state"][0]["exp_avg"][1, 2] += 2.0**-10
    torch.save(state, checkpoint)
    code, lines = _compare(side, other, capsys)
    assert code == 1
    line = lines["translation_bleu"]
    assert "tensor optimizer.state.0.exp_avg differs, max abs difference 0.000977" in line, line
    assert "step_00000004.pt" in line


def test_a_model_weight_a_decoded_line_and_a_missing_file_differ(side, tmp_path, capsys):
    other = _twin(side, tmp_path)
    checkpoint = other / "runs/lm/checkpoints/step_00000004.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["model"]["layer.bias"][0] = 0.5
    torch.save(state, checkpoint)
    (other / "outputs/lstm_greedy.txt").write_text("das haus\nein katze\n")
    (other / "runs/classifier/config.yaml").unlink()
    code, lines = _compare(side, other, capsys)
    assert code == 1
    assert "tensor model.layer.bias differs, max abs difference 0.5" in lines["lm"]
    assert "line 2: 'ein hund' vs 'ein katze'" in lines["lstm_lm"]
    assert "config.yaml" in lines["classifier"] and "only in the first" in lines["classifier"]


def test_a_resume_that_drifts_from_its_straight_run_fails_on_its_side(side, tmp_path, capsys):
    """Both sides alike, but on each the resumed run's weights differ from the straight run's."""
    before, after = _twin(side, tmp_path / "b"), _twin(side, tmp_path / "a")
    for root in (before, after):
        checkpoint = root / "runs/resume_resumed/checkpoints/step_00000004.pt"
        state = torch.load(checkpoint, weights_only=True)
        state["model"]["layer.weight"][0, 0] += 1.0
        torch.save(state, checkpoint)
    code, lines = _compare(before, after, capsys)
    assert code == 1
    assert "before: resumed != straight: tensor model.layer.weight differs, max abs difference 1" in lines["resume"]
    assert "after: resumed != straight" in lines["resume"]


def test_a_scenario_that_did_not_do_its_job_fails(side, tmp_path, capsys):
    other = _twin(side, tmp_path)
    (other / "side.json").write_text(json.dumps({"checks": {"update_freq_patience": [False, "ran all 60 updates"]}}))
    code, lines = _compare(side, other, capsys)
    assert code == 1
    assert "after: not what the scenario is for: ran all 60 updates" in lines["update_freq_patience"]


def test_a_renamed_tensor_is_the_same_only_under_rename_and_only_with_its_values(side, tmp_path, capsys):
    """The second side names every checkpoint's `layer.weight` `head.weight`: a difference, unless --rename says so;
    then each line says in how many checkpoints it applied, and a changed value under the new name still differs."""
    other = _twin(side, tmp_path)
    for checkpoint in other.rglob("*.pt"):
        state = torch.load(checkpoint, weights_only=True)
        state["model"] = {("head.weight" if k == "layer.weight" else k): v for k, v in state["model"].items()}
        torch.save(state, checkpoint)
    code, lines = _compare(side, other, capsys)
    assert code == 1 and "model.head.weight: only in the second" in lines["translation_bleu"]
    rename = ["--rename", "model.layer.weight=model.head.weight"]
    code = same_behaviour.main(["--compare", str(side), str(other), *rename])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert code == 0, lines
    assert all(" same" in line for line in lines.values()), lines
    assert "same (model.layer.weight read as model.head.weight in 1 checkpoints)" in lines["translation_bleu"]
    assert "read as model.head.weight in 2 checkpoints" in lines["resume"]  # its straight and resumed runs
    assert "read as" not in lines["decode_outputs"]  # no checkpoint there
    checkpoint = other / "runs/translation/checkpoints/step_00000004.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["model"]["head.weight"][0, 0] += 1.0
    torch.save(state, checkpoint)
    code = same_behaviour.main(["--compare", str(side), str(other), *rename])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("translation_bleu"))
    assert code == 1 and "tensor model.head.weight differs, max abs difference 1" in line, line


def test_a_rename_that_names_no_tensor_is_said(side, tmp_path, capsys):
    code = same_behaviour.main(["--compare", str(side), str(_twin(side, tmp_path)), "--rename", "model.typo=model.x"])
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--rename")]
    assert code == 0
    assert said == [f"{'--rename':<22} model.typo=model.x: no checkpoint of the first side has model.typo"]
