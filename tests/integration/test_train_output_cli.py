"""`tformer train` off a terminal (CI, nohup, a pipe): a plain line per log interval on stderr, the same in the run's
train.log, and a stop the user asked for said as a stop (the signal's exit code, no `error:`)."""

import os
import signal
from pathlib import Path

from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.train import loop

TINY = str(Path(__file__).parents[2] / "recipes" / "tiny_classifier.yaml")
COMMON = ["run.threads=1", "train.log_every=2", "train.valid_every=2"]
runner = CliRunner()


def test_off_a_terminal_training_prints_plain_lines_and_keeps_them_in_train_log(tmp_path):
    result = runner.invoke(app, ["train", TINY, f"run.out_dir={tmp_path}", *COMMON, "train.max_updates=4"])
    assert result.exit_code == 0, result.output
    printed = [line for line in result.stderr.splitlines() if line.startswith("update ")]
    assert [line.split(" loss ")[0] for line in printed] == ["update 2/4 epoch 1", "update 4/4 epoch 1"]
    assert "\x1b[" not in result.stderr  # no bar, no colour codes
    kept = [line.split(" ", 2)[2] for line in (tmp_path / "tiny_classifier/train.log").read_text().splitlines()]
    assert [line for line in kept if line.startswith("update ")] == printed
    assert [line.split(":")[0] for line in kept if " valid " in line] == [
        "epoch 1 (part) update 2",
        "epoch 1 (part) update 4",
    ]


def test_a_stop_the_user_asked_for_is_no_error(tmp_path, monkeypatch):
    real_update, done = loop.update, [0]

    def update(*args):
        result = real_update(*args)
        done[0] += 1
        if done[0] == 3:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        return result

    monkeypatch.setattr(loop, "update", update)
    result = runner.invoke(app, ["train", TINY, f"run.out_dir={tmp_path}", *COMMON, "train.max_updates=8"])
    assert result.exit_code == 130, result.output  # the shell's code for SIGINT: `train && eval` does not go on
    last = result.stderr.strip().splitlines()[-1]
    assert last == "stopped at update 3 (checkpoint saved); rerun the same command to resume"
    assert "error" not in result.stderr
