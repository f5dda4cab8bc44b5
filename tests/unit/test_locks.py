"""Lock files never follow a planted link, and a prepared data folder in use is not replaced.

`RUN/.lock` and the prepared data's `.NAME.lock` are opened with O_NOFOLLOW and must be regular files with
one name: a symbolic link, a hard link or a pipe put there is refused in one line and never written into.
Training holds its data folder's lock shared for the run; `prepare` takes it exclusively, without waiting,
and names the training process.
"""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_models import WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
from tformer_cli.data.prepared import PreparedData
from tformer_cli.errors import TformerError
from tformer_cli.files import FolderLock

ROOT = Path(__file__).parents[2]
runner = CliRunner()
QUIET = {"log": lambda _: None}


def _plant(kind: str, lock: Path, victim: Path) -> None:
    match kind:
        case "symlink":
            lock.symlink_to(victim)
        case "hardlink":
            os.link(victim, lock)
        case "fifo":
            os.mkfifo(lock)


@pytest.mark.parametrize(("kind", "says"), [("symlink", "symbolic link"), ("hardlink", "hard link"), ("fifo", "not a")])
def test_a_planted_lock_file_is_refused_and_never_written_into(tmp_path, kind, says):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    _plant(kind, run / ".lock", victim)
    with pytest.raises(TformerError, match=f"{run / '.lock'} is .*{says}.*remove it"):
        FolderLock(run, "tformer train").acquire()
    assert victim.read_text() == "precious\n"


def test_train_refuses_a_symlinked_run_lock_in_one_line(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "runs/tiny_classifier").mkdir(parents=True)
    (tmp_path / "runs/tiny_classifier/.lock").symlink_to(victim)
    result = runner.invoke(app, ["train", str(ROOT / "recipes/tiny_classifier.yaml"), f"run.out_dir={tmp_path}/runs"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith("error: ") and "symbolic link" in lines[-1], result.output
    assert victim.read_text() == "precious\n"


def _corpus(folder: Path) -> dict[str, str]:
    rng = random.Random(0)
    for split, n in (("train", 200), ("valid", 20)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(n)]
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return {
        "data.kind": "text",
        "model.kind": "lm",
        "data.train": f"{folder}/train.txt",
        "data.valid": f"{folder}/valid.txt",
        "data.dir": f"{folder}/out",
        "tokenizer.vocab_size": "40",
        "tokenizer.kind": "unigram",
        "data.workers": "1",
        "data.block_size": "8",
    }


def _config(settings: dict[str, str], **more: str):
    return load_config(None, [f"{k}={v}" for k, v in {**settings, **more}.items()])


def test_prepare_refuses_a_symlinked_data_lock(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / ".out.lock").symlink_to(victim)
    with pytest.raises(TformerError, match="symbolic link"):
        config = _config(_corpus(tmp_path))
        prepare(config.data, config.tokenizer, **QUIET)
    assert victim.read_text() == "precious\n" and not (tmp_path / "out").exists()


def test_readers_share_the_data_lock_and_prepare_names_them(tmp_path):
    settings = _corpus(tmp_path)
    config = _config(settings)
    prepare(config.data, config.tokenizer, **QUIET)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    first = PreparedData(config.data, config.tokenizer)  # two runs read it
    second = PreparedData(config.data, config.tokenizer)
    other = _config(settings, **{"tokenizer.vocab_size": "36"})
    with pytest.raises(TformerError, match=rf"in use by process {os.getpid()} \(a training run reads it\)"):
        prepare(other.data, other.tokenizer, **QUIET)
    del first
    with pytest.raises(TformerError, match="in use by process"):
        prepare(other.data, other.tokenizer, **QUIET)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    del second
    prepare(other.data, other.tokenizer, **QUIET)  # no reader left: replaced


def test_a_reader_waits_for_no_prepare(tmp_path):
    settings = _corpus(tmp_path)
    config = _config(settings)
    prepare(config.data, config.tokenizer, **QUIET)
    with FolderLock(tmp_path, "tformer prepare", name=".out.lock"):
        with pytest.raises(TformerError, match=rf"in use by process {os.getpid()} \(tformer prepare\)"):
            PreparedData(config.data, config.tokenizer)


def test_prepare_does_not_replace_the_data_a_training_process_reads(tmp_path):
    overrides = [f"{k}={v}" for k, v in _corpus(tmp_path).items()]
    recipe = str(ROOT / "recipes/wikitext2_lm.yaml")
    assert runner.invoke(app, ["prepare", recipe, *overrides]).exit_code == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    train = [
        *("model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32", "train.batch_size=4"),
        *("train.epochs=1000", "train.warmup_steps=1", "run.threads=1", f"run.out_dir={tmp_path}/runs"),
    ]
    command = [sys.executable, "-m", "tformer_cli", "train", recipe]
    process = subprocess.Popen([*command, *overrides, *train], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "runs/wikitext2_lm/metrics.jsonl").exists():  # past reading the data
            assert process.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        result = runner.invoke(app, ["prepare", recipe, *overrides, "tokenizer.vocab_size=36"])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 1 and lines[-1].startswith("error: "), result.output
        assert f"in use by process {process.pid} (a training run reads it)" in lines[-1], lines[-1]
    finally:
        process.kill()
        process.wait()
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


def test_sweep_never_appends_its_log_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "runs/tiny_classifier").mkdir(parents=True)
    (tmp_path / "runs/tiny_classifier/train.log").symlink_to(victim)
    result = runner.invoke(app, ["sweep", str(ROOT / "recipes/tiny_classifier.yaml"), f"run.out_dir={tmp_path}/runs"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith("error: ") and "symbolic link" in lines[-1], result.output
    assert victim.read_text() == "precious\n"
