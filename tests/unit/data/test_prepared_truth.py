"""The prepared folder is the truth for training: `tformer train` takes where the data came from (data.train,
valid, test, the hub keys) from data.dir's manifest. It refuses only when the recipe's own input files are
here with other content, or when a setting that shapes the arrays differs, and then its advice is a command
that works."""

import random
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from tiny_models import WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app

ROOT = Path(__file__).parents[3]
MULTI30K = str(ROOT / "recipes" / "multi30k_en_de.yaml")
runner = CliRunner()


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.delenv("TFORMER_DATA", raising=False)  # the recipe's rooted splits are dropped: it names the hub
    monkeypatch.chdir(tmp_path)
    rng = random.Random(0)
    (tmp_path / "a").mkdir()
    for split, n in (("train", 200), ("val", 20)):
        for lang in ("en", "de"):
            lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(n)]
            (tmp_path / "a" / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    return tmp_path


SMALL = [
    "data.dir=prepared",
    "tokenizer.vocab_size=40",
    "model.d_model=16",
    "model.n_heads=2",
    "model.d_ff=32",
    "model.n_layers=1",
    "train.max_updates=2",
    "train.max_minutes=0",
    "train.valid_bleu_lines=0",
    "train.best_metric=loss",
    "train.max_tokens=256",
    "train.precision=fp32",
    "train.compile=false",  # the data settings are the subject: compiling the model would take a minute
]


def _files(folder: Path | str) -> list[str]:
    return [f"data.train={folder}/train", f"data.valid={folder}/val", "data.test=null"]


def _invoke(command: str, *args: str):
    return runner.invoke(app, [command, MULTI30K, *SMALL, *args])


def _recorded_data(run: str) -> dict:
    return yaml.safe_load((Path("runs") / run / "config.yaml").read_text())["data"]


def test_train_takes_the_data_settings_from_the_prepared_folder(corpus):
    """Prepared with data.* overrides; trained with none (the recipe names the hub): no refusal, and the run
    records the files the data really came from."""
    assert _invoke("prepare", *_files(corpus / "a")).exit_code == 0
    result = _invoke("train", "run.name=plain")
    assert result.exit_code == 0, result.output
    assert f"data: prepared was prepared from data.train={corpus}/a/train, data.valid={corpus}/a/val" in result.stderr
    assert "(the recipe names the hub)" in result.stderr
    data = _recorded_data("plain")
    assert (data["train"], data["valid"]) == (f"{corpus}/a/train", f"{corpus}/a/val")
    # the same command resumes: the adopted settings are the recorded ones
    again = _invoke("train", "run.name=plain", "train.max_updates=3")
    assert again.exit_code == 0, again.output


def test_the_recipes_files_elsewhere_with_the_same_content_are_accepted(corpus):
    assert _invoke("prepare", *_files(corpus / "a")).exit_code == 0
    shutil.copytree(corpus / "a", corpus / "b")  # another data root, the same files
    result = _invoke("train", *_files(corpus / "b"), "run.name=copy")
    assert result.exit_code == 0, result.output
    assert "(the recipe's files have the same content)" in result.stderr
    (corpus / "b" / "train.en").unlink()  # the recipe's files are not all here: the prepared folder is the truth
    gone = _invoke("train", *_files(corpus / "b"), "run.name=gone")
    assert gone.exit_code == 0, gone.output
    assert "(the recipe's input files are not here)" in gone.stderr


def test_the_recipes_files_with_other_content_are_refused_with_a_command_that_works(corpus):
    assert _invoke("prepare", *_files(corpus / "a")).exit_code == 0
    shutil.copytree(corpus / "a", corpus / "b")
    with (corpus / "b" / "train.de").open("a") as f:
        f.write("ein neuer satz\n")
    (corpus / "b" / "train.en").open("a").write("a new sentence\n")
    result = _invoke("train", *_files(corpus / "b"), "run.name=other")
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"error: prepared: data.train: the recipe's {corpus}/b/train.en, {corpus}/b/train.de differ in content "
        f"from the files data.dir was prepared from ({corpus}/a/train.en, {corpus}/a/train.de); prepare it again "
        "from them with `tformer prepare "
    )
    advice = shlex.split(line.split("`")[1])
    assert runner.invoke(app, advice[1:]).exit_code == 0  # the advice works
    assert _invoke("train", *_files(corpus / "b"), "run.name=other").exit_code == 0
    assert not (Path("runs") / "other" / "config.yaml").read_text().count(f"{corpus}/a/")


def test_a_setting_that_shapes_the_arrays_is_refused_with_two_commands_that_work(corpus):
    assert _invoke("prepare", *_files(corpus / "a")).exit_code == 0
    result = _invoke("train", "tokenizer.vocab_size=41", "run.name=vocab")  # the recipe names the hub here
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert "prepared with other settings: tokenizer.vocab_size=40 there, 41 in the recipe" in line
    prepare, train = (shlex.split(command) for command in line.split("`")[1::2])
    # the recipe's inputs are not here (the hub, offline): the prepare advice names the files it was made from
    assert f"data.train={corpus}/a/train" in prepare and f"data.valid={corpus}/a/val" in prepare
    assert "tokenizer.vocab_size=41" in prepare
    assert train.count("tokenizer.vocab_size=40") == 1 and "tokenizer.vocab_size=41" not in train
    assert runner.invoke(app, train[1:]).exit_code == 0, "train on it as prepared"
    assert runner.invoke(app, prepare[1:]).exit_code == 0, "prepare it again"
    assert _invoke("train", "tokenizer.vocab_size=41", "run.name=vocab41").exit_code == 0


def test_the_other_direction_is_a_setting_that_shapes_the_arrays(corpus):
    """A DE-EN recipe on EN-DE prepared data would train the wrong direction: refused, not adopted."""
    assert _invoke("prepare", *_files(corpus / "a")).exit_code == 0
    swap = ["data.src_lang=de", "data.tgt_lang=en", "data.src_field=de", "data.tgt_field=en"]
    result = _invoke("train", *_files(corpus / "a"), *swap, "run.name=swap")
    assert result.exit_code == 1
    assert "data.src_lang='en' there, 'de' in the recipe" in result.stderr


def test_check_reports_where_the_prepared_data_came_from(corpus):
    assert _invoke("prepare", *_files(corpus / "a")).exit_code == 0
    result = _invoke("check")
    assert result.exit_code == 0, result.output
    assert f"data: prepared was prepared from data.train={corpus}/a/train" in result.stdout
    assert "data.dir prepared: prepared and matches the recipe" in result.stdout
