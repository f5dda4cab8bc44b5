"""An output path never destroys what the user did not ask to replace (tformer_cli/outputs.py).

Every command that writes a file the user names refuses, in one line, one of its own inputs, a file of a
run's or of a prepared data folder's, a device, or an existing file that is not an earlier output of the same
kind (unless --force); names the user gives (--test-set, run names, sweep points) stay in their folder.
"""

import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tformer_cli.cli import app

runner = CliRunner()
ROOT = Path(__file__).parents[2]


def _refused(args, *parts):
    result = runner.invoke(app, [str(a) for a in args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "internal error" not in lines[0] and "Traceback" not in result.output
    for part in parts:
        assert part in lines[0], (part, lines[0])


def _ok(args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def mt(translation_run, tmp_path) -> Path:
    """A copy of the tiny translation run and its prepared data (data.dir is recorded as an absolute path)."""
    shutil.copytree(translation_run / "runs/mt", tmp_path / "mt")
    return tmp_path / "mt"


def test_translate_refuses_the_runs_and_the_prepared_datas_files(mt, translation_run, tmp_path):
    source = tmp_path / "src.txt"
    source.write_text("the cat\n")
    data = translation_run / "data"
    run_before, data_before = _files(mt), _files(data)
    translate = ["translate", mt, "-i", source, "-o"]
    for target in ("checkpoints/best.pt", "checkpoints/new.txt", "config.yaml", "metrics.jsonl", "eval_x.json"):
        _refused([*translate, mt / target], "which tformer manages", str(mt))
        _refused([*translate, mt / target, "--force"], "which tformer manages")  # --force never reaches them
    for target in ("spm.model", "manifest.json", "train.src.bin", "mine.txt"):
        _refused([*translate, data / target, "--force"], "inside the prepared data folder", str(data))
    assert _files(mt) == run_before and _files(data) == data_before


def test_translate_refuses_an_existing_file_without_force_and_devices_always(mt, translation_run, tmp_path):
    source = tmp_path / "src.txt"
    source.write_text("the cat\n")
    corpus = tmp_path / "train.en"
    corpus.write_text("a training corpus\n")
    _refused(["translate", mt, "-i", source, "-o", corpus], "exists and is not an earlier translation", "--force")
    assert corpus.read_text() == "a training corpus\n"
    _ok(["translate", mt, "-i", source, "-o", corpus, "--force"])
    assert corpus.read_text() != "a training corpus\n"
    os.mkfifo(tmp_path / "pipe")  # not /dev/null: with the guard broken, the replacement would be the machine's
    _refused(["translate", mt, "-i", source, "-o", tmp_path / "pipe", "--force"], "not a regular file")
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)
    (tmp_path / "empty.txt").write_text("")
    _ok(["translate", mt, "-i", source, "-o", tmp_path / "empty.txt"])  # an empty file loses nothing


def test_an_output_named_dash_is_refused_not_written_as_a_file_named_dash(mt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src.txt").write_text("the cat\n")
    _refused(["translate", mt, "-i", "src.txt", "-o", "-"], "-o -: give a file name; without it, the text goes")
    _refused(["export", mt, "-o", "-"], "-o -: give a file name")
    assert not (tmp_path / "-").exists()


def test_export_refuses_another_checkpoint_of_the_run_and_files_it_did_not_write(mt, tmp_path):
    steps = sorted((mt / "checkpoints").glob("step_*.pt"))
    before = _files(mt)
    _refused(["export", steps[0], "-o", steps[1]], "which tformer manages")
    _refused(["export", mt, "-o", mt], "is one of this command's inputs")
    _refused(["export", mt, "--format", "hf", "-o", mt / "ctranslate2"], "which tformer manages")
    assert _files(mt) == before
    notes = tmp_path / "notes.safetensors"
    notes.write_text("my notes\n")
    _refused(["export", mt, "-o", notes], "exists and is not an earlier tformer safetensors export")
    assert notes.read_text() == "my notes\n"
    weights = tmp_path / "mt.safetensors"
    _ok(["export", mt, "-o", weights])
    _ok(["export", steps[0], "-o", weights])  # an earlier export of the same kind is replaced
    _ok(["export", mt, "-o", notes, "--force"])


def test_average_refuses_another_runs_best_and_a_training_corpus(mt, translation_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(mt, other)
    before = _files(other)
    _refused(["average", mt, "--last", "2", "-o", other / "checkpoints/best.pt"], "which tformer manages")
    _refused(["average", mt, "--last", "2", "-o", other / "checkpoints/index.json"], "which tformer manages")
    assert _files(other) == before
    corpus = tmp_path / "train.en"
    shutil.copy(translation_run / "train.en", corpus)
    _refused(["average", mt, "--last", "2", "-o", corpus], "exists and is not an earlier tformer average")
    assert corpus.read_bytes() == (translation_run / "train.en").read_bytes()
    _refused(["average", mt, "--last", "2", "-o", translation_run / "data/avg.pt"], "inside the prepared data")
    _ok(["average", mt, "--last", "2"])
    _ok(["average", mt, "--last", "2"])  # its own earlier average, in the run's checkpoints/
    _ok(["average", mt, "--last", "2", "-o", other / "checkpoints/averaged_mt.pt"])
    _ok(["average", mt, "--last", "2", "-o", corpus, "--force"])


def test_attention_replaces_only_an_earlier_figure(mt, tmp_path):
    photo = tmp_path / "photo.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\n not a figure of ours")
    _refused(["attention", mt, "--text", "the cat", "-o", photo], "exists and is not an earlier figure")
    assert photo.read_bytes().endswith(b"not a figure of ours")
    _refused(["attention", mt, "--text", "the cat", "-o", mt / "curves.png"], "which tformer manages")
    for maps in (tmp_path / "maps.png", tmp_path / "maps.pdf", tmp_path / "maps.svg"):
        _ok(["attention", mt, "--text", "the cat", "-o", maps])
        _ok(["attention", mt, "--text", "the cat", "-o", maps])  # its own earlier figure is replaced


def test_eval_names_stay_in_the_run_and_never_replace_its_inputs(mt, translation_run, tmp_path):
    valid = translation_run / "valid.en"
    ref = translation_run / "valid.de"
    results = set(mt.glob("eval_*"))  # the run is shared: other tests' results may be there already
    for name in ("a/../../x", "..", "/tmp/x", "a\\b", "two\nlines", "tab\there"):
        _refused(["eval", mt, "--src", valid, "--ref", ref, "--test-set", name], "--test-set", "plain name")
    assert not list(tmp_path.glob("x*")) and set(mt.glob("eval_*")) == results
    _ok(["eval", mt, "--src", valid, "--ref", ref, "--test-set", "t"])
    hyp = next(mt.glob("eval_t_*.hyp"))
    before = hyp.read_bytes()
    _refused(["eval", mt, "--src", hyp, "--ref", ref, "--test-set", "t"], "is one of this command's inputs")
    assert hyp.read_bytes() == before


def test_run_names_and_sweep_points_stay_in_their_folder(tmp_path):
    recipe = ROOT / "recipes/tiny_classifier.yaml"
    _refused(["train", recipe, f"run.out_dir={tmp_path}/runs", "run.name=a/../../x"], "run.name must be one folder")
    from tformer_cli.sweep import plan

    sweep = plan(recipe, [f"run.out_dir={tmp_path}/runs", "data.dir=a/../../x,b/../y"])
    assert all(point.run_dir.parent == tmp_path / "runs" for point in sweep.points)
    assert sweep.table.parent == tmp_path / "runs"
    assert not (tmp_path / "runs").exists()


def test_sweep_refuses_a_file_at_its_tables_name_before_training(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    notes = out / "sweep_tiny_classifier.md"
    notes.write_text("my notes\n")
    recipe = ROOT / "recipes/tiny_classifier.yaml"
    _refused(["sweep", recipe, f"run.out_dir={out}"], "exists and is not an earlier sweep table", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["sweep_tiny_classifier.md"]  # nothing trained
    assert notes.read_text() == "my notes\n"
