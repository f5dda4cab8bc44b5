"""A run that travels (tformer_cli/run/portable.py, train/keep.py): training keeps the tokenizer and the data's
manifest in the run folder and records absolute paths, so that translate, eval, export and attention serve the
run after its data folder is deleted, and after the run folder is copied elsewhere and the original removed,
called from another working directory. A run made before (no tokenizer of its own, relative paths) still loads.

One tiny translation run is trained for the module; each test works on its own copy of it."""

import json
import os
import shutil

import pytest
import yaml
from tiny_models import tiny_mt_recipe
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.files import sha256_file
from tformer_cli.run.checkpoints import load_checkpoint, save_checkpoint
from tformer_cli.run.layout import DATA_MANIFEST, TOKENIZER

runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def _ok(*args):
    result = _cli(*args)
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(tmp, run): a tiny corpus prepared into tmp/data and runs/mt trained on it for 6 updates, in tmp, the recipe
    giving data.dir and run.out_dir relative to it."""
    tmp = tmp_path_factory.mktemp("travel")
    recipe = tiny_mt_recipe(tmp, train="  max_updates: 6\n  epochs: 5\n")
    here = os.getcwd()
    os.chdir(tmp)
    try:
        _ok("prepare", recipe, "data.dir=data")
        _ok("train", recipe, "data.dir=data", "run.out_dir=runs", "run.name=mt")
    finally:
        os.chdir(here)
    (tmp / "test.en").write_text("the cat is red\nwe see a dog\n")
    (tmp / "test.de").write_text("eht tac si der\new ees a god\n")
    return tmp, tmp / "runs" / "mt"


@pytest.fixture
def travelled(made, tmp_path, monkeypatch):
    """The run copied to a new place, the data folder moved away (restored after), the working directory another:
    (the copy, the test set's source and reference files)."""
    tmp, run = made
    copy = tmp_path / "elsewhere" / "mt"
    shutil.copytree(run, copy)
    moved = tmp_path / "moved-data"
    shutil.move(tmp / "data", moved)
    monkeypatch.chdir(tmp_path)
    yield copy, tmp / "test.en", tmp / "test.de"
    shutil.move(moved, tmp / "data")


def test_the_run_keeps_its_tokenizer_and_the_datas_manifest(made):
    tmp, run = made
    assert sha256_file(run / TOKENIZER) == sha256_file(tmp / "data" / "spm.model")
    assert json.loads((run / DATA_MANIFEST).read_text()) == json.loads((tmp / "data" / "manifest.json").read_text())


def test_the_paths_a_run_records_are_absolute(made):
    _, run = made
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["data"]["dir"], saved["run"]["out_dir"]) == (str(made[0] / "data"), str(made[0] / "runs"))
    assert load_checkpoint(run / "checkpoints" / "best.pt")["config"]["data"]["dir"] == saved["data"]["dir"]


def test_translate_and_eval_without_the_data_folder_from_a_copy(travelled):
    copy, src, ref = travelled
    output = _ok("translate", copy, "-i", src, "run.device=cpu").stdout.splitlines()
    assert len(output) == 2
    result = _ok("eval", copy, "--src", src, "--ref", ref, "run.device=cpu")
    assert "bleu" in result.output.lower()


def test_export_and_attention_without_the_data_folder_from_a_copy(travelled):
    copy, _, _ = travelled
    _ok("export", copy, "--format", "hf", "-o", "hf")
    assert (copy.parent.parent / "hf" / "config.json").is_file()
    said = _ok("attention", copy, "--text", "the cat is red", "-o", "maps.png").output
    assert said.strip().endswith("attention layers over the greedy translation (not decode.beam's search)")
    assert (copy.parent.parent / "maps.png").stat().st_size > 0


def test_the_model_card_names_training_files_by_name_and_checksum_only(travelled, made):
    copy, _, _ = travelled
    tmp, _ = made
    _ok("export", copy, "--format", "hf", "-o", "hf")
    card = (copy.parent.parent / "hf" / "README.md").read_text()
    assert f"| train | train.en | `{sha256_file(tmp / 'train.en')}` |" in card
    assert str(tmp) not in card


def _as_made_before(run):
    """`run` as a run made before runs kept a tokenizer: no copy of it or of the manifest, relative paths (the
    recipe said data.dir=data and run.out_dir=runs, in the directory training ran in)."""
    (run / TOKENIZER).unlink()
    (run / DATA_MANIFEST).unlink()
    for path in (run / "checkpoints").glob("*.pt"):
        state = load_checkpoint(path)
        state["config"]["data"]["dir"], state["config"]["run"]["out_dir"] = "data", "runs"
        save_checkpoint(state, path)
    index = run / "checkpoints" / "index.json"
    entries = json.loads(index.read_text())
    for name, entry in entries["files"].items():
        entry["sha256"] = sha256_file(run / "checkpoints" / name)
    index.write_text(json.dumps(entries))


def test_a_run_made_before_reads_the_data_folder_it_was_trained_in_from_anywhere(made, tmp_path, monkeypatch):
    tmp, run = made
    root = tmp_path / "project"
    shutil.copytree(tmp / "data", root / "data")
    _as_made_before(shutil.copytree(run, root / "runs" / "mt"))
    monkeypatch.chdir(tmp_path)  # not the directory training ran in
    assert len(_ok("translate", "project/runs/mt", "-i", tmp / "test.en", "run.device=cpu").stdout.splitlines()) == 2


def test_a_missing_tokenizer_names_each_path_tried_and_why(made, tmp_path, monkeypatch):
    tmp, run = made
    old = shutil.copytree(run, tmp_path / "runs" / "mt")
    _as_made_before(old)
    monkeypatch.chdir(tmp_path)
    result = _cli("translate", old, "-i", tmp / "test.en", "run.device=cpu")
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: tokenizer not found: tried ")
    assert f"{old / TOKENIZER} (the run's own copy" in line
    assert f"{tmp_path / 'data' / 'spm.model'} (data.dir=data, relative to the directory training ran in)" in line
    assert "tformer prepare" not in line
