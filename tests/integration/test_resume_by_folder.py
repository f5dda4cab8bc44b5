"""`tformer train RUN_DIR`: a run resumes with its own saved settings (config.yaml), overrides allowed, from any
directory and wherever the folder was copied; a folder that is no run, or an override that would move the run,
is a one-line refusal.

A tiny translation run is trained once for the module (4 updates, settings given as overrides); each test resumes
its own copy."""

import shutil

import pytest
import yaml
from tiny_models import tiny_mt_recipe
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.run.checkpoints import read_index

runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def _ok(*args):
    result = _cli(*args)
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(tmp, run): runs/mt trained for 4 updates with settings that are not the recipe's (lr, warm-up, log_every)."""
    tmp = tmp_path_factory.mktemp("resume_folder")
    recipe = tiny_mt_recipe(tmp, train="  epochs: 5\n")
    _ok("prepare", recipe)
    _ok("train", recipe, "run.name=mt", "train.max_updates=4", "train.lr=1e-3", "train.warmup_steps=2")
    return tmp, tmp / "runs" / "mt"


def _steps(run) -> list[int]:
    return sorted(entry["step"] for entry in read_index(run / "checkpoints")["files"].values())


def test_a_run_folder_resumes_with_its_own_settings_from_anywhere(made, tmp_path, monkeypatch):
    _, run = made
    copy = shutil.copytree(run, tmp_path / "moved" / "mt")
    monkeypatch.chdir(tmp_path / "moved")
    result = _ok("train", "mt", "train.max_updates=7")
    assert f"resuming {copy} at update 4" in result.output
    assert "warning: the recipe changed since the checkpoint: train.max_updates 4 -> 7" in result.output
    assert "train.lr" not in result.output  # the run's own 1e-3, not the recipe's 3e-3
    assert _steps(copy)[-1] == 7
    saved = yaml.safe_load((copy / "config.yaml").read_text())
    assert (saved["train"]["lr"], saved["train"]["warmup_steps"], saved["train"]["max_updates"]) == (1e-3, 2, 7)
    assert _steps(run)[-1] == 4  # the original is untouched


def test_a_finished_run_folder_says_so_and_writes_nothing(made, tmp_path):
    _, run = made
    copy = shutil.copytree(run, tmp_path / "mt")
    before = (copy / "config.yaml").read_text()
    assert "finished at update 4; nothing to do" in _ok("train", copy).output
    assert (copy / "config.yaml").read_text() == before


def test_a_folder_without_config_yaml_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    result = _cli("train", tmp_path / "empty")
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"error: {tmp_path / 'empty'} is a folder without config.yaml: give a recipe file, or a run folder "
        "(which holds config.yaml)"
    )


def test_moving_a_run_folder_by_override_is_refused_with_the_command_that_starts_a_new_run(made):
    _, run = made
    result = _cli("train", run, "run.name=other")
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert f"`tformer train {run / 'config.yaml'} run.name=other`" in line


def test_check_reads_a_run_folder_too(made):
    _, run = made
    assert "lr: 0.001" in _ok("check", run).output


def test_a_run_and_its_data_moved_elsewhere_resume_with_data_dir_given(made, tmp_path):
    tmp, run = made
    copy = shutil.copytree(run, tmp_path / "runs" / "mt")
    data = shutil.copytree(tmp / "data", tmp_path / "data")
    result = _ok("train", copy, f"data.dir={data}", "train.max_updates=5")
    assert f"resuming {copy} at update 4" in result.output
    assert _steps(copy)[-1] == 5
    assert yaml.safe_load((copy / "config.yaml").read_text())["data"]["dir"] == str(data)
