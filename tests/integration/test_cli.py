"""The CLI, run in-process on the tiny recipe: train, eval, errors, resume."""

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli import __version__
from tformer_cli.cli import app

ROOT = Path(__file__).parents[2]
TINY = str(ROOT / "recipes" / "tiny_classifier.yaml")
runner = CliRunner()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    result = runner.invoke(app, ["train", TINY, f"run.out_dir={out}"])
    assert result.exit_code == 0, result.output
    return out / "tiny_classifier", result


def test_train_writes_run_directory(trained):
    run_dir, result = trained
    assert "final validation loss" in result.stdout and "accuracy" in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "curves.png", "checkpoints/index.json", "checkpoints/best.pt"):
        assert (run_dir / name).is_file(), name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"train", "valid"}
    assert sum(r["split"] == "valid" for r in records) == 4  # every epoch
    assert all("lr" in r and "examples_per_s" in r for r in records if r["split"] == "train")
    best = max(r["accuracy"] for r in records if r["split"] == "valid")
    assert best > 0.6  # 3 classes: chance is 1/3


def test_eval_on_best_checkpoint_prints_the_same_accuracy(trained):
    run_dir, _ = trained
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best = max(r["accuracy"] for r in records if r["split"] == "valid")
    result = runner.invoke(app, ["eval", str(run_dir / "checkpoints" / "best.pt")])
    assert result.exit_code == 0, result.output
    assert f"validation accuracy: {best:.4f}" in result.stdout
    assert "confusion matrix" in result.stdout
    saved = json.loads((run_dir / "eval_valid_best.json").read_text())
    assert saved["accuracy"] == pytest.approx(best) and sum(map(sum, saved["confusion"])) == 100
    by_dir = runner.invoke(app, ["eval", str(run_dir)])
    assert f"validation accuracy: {best:.4f}" in by_dir.stdout


def test_training_a_finished_run_again_says_it_is_finished(trained):
    run_dir, _ = trained
    result = runner.invoke(app, ["train", TINY, f"run.out_dir={run_dir.parent}"])
    assert result.exit_code == 0, result.output
    assert f"{run_dir} finished at update 64; nothing to do" in result.stderr
    assert "final validation loss" in result.stdout  # the run's results, as at its end


def test_resume_with_a_different_model_is_refused(trained):
    run_dir, _ = trained
    result = runner.invoke(app, ["train", TINY, f"run.out_dir={run_dir.parent}", "model.d_ff=128"])
    assert result.exit_code == 1
    assert "model.d_ff: 64 -> 128" in result.stderr


def test_unknown_override_is_one_line_without_traceback():
    result = runner.invoke(app, ["train", TINY, "train.lrr=1"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.lrr" in lines[0] and "did you mean 'train.lr'" in lines[0]
    assert "Traceback" not in result.output


def test_debug_shows_the_exception():
    result = runner.invoke(app, ["--debug", "train", TINY, "train.lrr=1"])
    assert result.exit_code != 0 and result.exception is not None


def test_dry_run_and_check_print_config_and_parameters():
    for args in (["train", TINY, "--dry-run"], ["check", TINY]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "d_model: 32" in result.stdout
        total = re.search(r"total\s*│\s*([\d,]+)", result.stdout)
        assert total and int(total.group(1).replace(",", "")) > 0


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.stdout


def test_eval_errors_are_one_line(tmp_path):
    result = runner.invoke(app, ["eval", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no such run directory" in result.stderr
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    result = runner.invoke(app, ["eval", str(bad)])
    assert result.exit_code == 1 and "not a loadable tformer checkpoint" in result.stderr


def test_checkpoint_with_malicious_pickle_is_not_executed(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "model": Evil()}, path)
    result = runner.invoke(app, ["eval", str(path)])
    assert result.exit_code == 1 and not marker.exists()


def test_attention_heatmap_png(trained, tmp_path):
    run_dir, _ = trained
    result = runner.invoke(app, ["attention", str(run_dir), "-o", str(tmp_path / "att.png"), "--example", "1"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "att.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 attention layers" in result.stdout


def test_average_and_export(trained, tmp_path):
    run_dir, _ = trained
    result = runner.invoke(app, ["average", str(run_dir), "--last", "2", "-o", str(tmp_path / "avg.pt")])
    assert result.exit_code == 0, result.output
    from tformer_cli.run.checkpoints import last_step_paths, load_checkpoint

    paths = last_step_paths(run_dir, 2)
    a, b = (load_checkpoint(p)["model"] for p in paths)
    avg = load_checkpoint(tmp_path / "avg.pt")["model"]
    key = "head.weight"
    assert torch.allclose(avg[key], (a[key] + b[key]) / 2, atol=1e-6)
    assert runner.invoke(app, ["eval", str(tmp_path / "avg.pt")]).exit_code == 0
    too_many = runner.invoke(app, ["average", str(run_dir), "--last", "99"])
    assert too_many.exit_code == 1 and "only" in too_many.stderr
    result = runner.invoke(app, ["export", str(run_dir), "-o", str(tmp_path / "m.safetensors")])
    assert result.exit_code == 0, result.output
    from safetensors.torch import load_file

    exported = load_file(str(tmp_path / "m.safetensors"))
    assert torch.equal(
        exported["head.weight"], load_checkpoint(run_dir / "checkpoints/best.pt")["model"]["head.weight"]
    )


def test_check_counts_wmt14_base_without_prepared_data(tmp_path):
    base = str(ROOT / "recipes" / "wmt14_base.yaml")
    result = runner.invoke(app, ["check", base, f"data.dir={tmp_path}/nothing_here"])
    assert result.exit_code == 0, result.output
    assert re.search(r"total\s*│\s*63,082,496", result.stdout)
    assert re.search(r"decoder cross-attention\s*│\s*6,303,744", result.stdout)
    assert "tokens per update: 28,672 source + 28,672 target (train.max_tokens 28,672 x update_freq 1 x 1 process" in (
        result.stdout
    )
    assert "training FLOPs: 1.09e+13 per update, 1.09e+18 for 100,000 updates" in result.stdout


def test_dry_run_under_torchrun_counts_every_process(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")  # torchrun's
    lm = str(ROOT / "recipes" / "wikitext2_lm.yaml")
    result = runner.invoke(app, ["train", lm, "--dry-run", f"data.dir={tmp_path}/none", "train.update_freq=2"])
    assert result.exit_code == 0, result.output
    assert "tokens per update: 65,536 (train.batch_size 16 x data.block_size 256 x update_freq 2 x 8 processes)" in (
        result.stdout
    )
