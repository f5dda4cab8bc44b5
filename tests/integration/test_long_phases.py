"""Long phases of training say what they do, in the terminal and in train.log (the compile check, validation),
and a stop signal during the set-up (here the compile check) ends the process within seconds, saving nothing.

The stop is the subject here, so that test runs `tformer train` as a process of its own; its compile check is a
stand-in that takes minutes (torch.compile replaced before the command starts), as a real one does on a busy CPU."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.train import loop

runner = CliRunner()
REPO = Path(__file__).parents[2]
CLASSIFIER = "recipes/tiny_classifier.yaml"

SLOW_COMPILE = """
import os, sys, time
import torch
from tformer_cli.cli import main

def slow_compile(net, *args, **kwargs):
    def forward(*inputs):
        open(os.environ["CHECK_BEGUN"], "w").close()
        for _ in range(3000):  # ten minutes, as a compile on a loaded machine may take
            time.sleep(0.2)
        return net(*inputs)
    return forward

torch.compile = slow_compile
sys.argv = ["tformer", *sys.argv[1:]]
main()
"""


def test_a_stop_during_the_compile_check_ends_the_run_within_seconds_and_says_so(tmp_path):
    begun = tmp_path / "check-begun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CHECK_BEGUN": str(begun)}
    args = ["train", CLASSIFIER, "run.device=cpu", "train.compile=true", f"run.out_dir={tmp_path}", "train.epochs=1"]
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_COMPILE, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not begun.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert begun.exists(), "the compile check did not begin"
    process.send_signal(signal.SIGTERM)
    sent = time.time()
    _, said = process.communicate(timeout=60)
    took = time.time() - sent
    assert process.returncode == 143, (process.returncode, said)
    assert took < 10, took
    announced = "train.compile: compiling the model and its loss on one batch before training"
    stopped = "stopped during the set-up, before training began (nothing saved; its checkpoints are as they were)"
    assert said.strip().splitlines()[-1] == stopped
    assert announced in said
    log = (tmp_path / "tiny_classifier" / "train.log").read_text()
    assert announced in log and stopped in log
    assert not list((tmp_path / "tiny_classifier").glob("checkpoints/*.pt"))


def test_validation_says_it_starts_when_it_may_be_long(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "FIRST_VALIDATION_SAID_AFTER", 0.0)  # as if the run had taken a while already
    monkeypatch.setattr(loop, "LONG_PHASE", 0.0)  # as if each validation were long
    result = runner.invoke(
        app, ["train", CLASSIFIER, "run.device=cpu", f"run.out_dir={tmp_path}", "train.epochs=2", "run.threads=1"]
    )
    assert result.exit_code == 0, result.output
    log = (tmp_path / "tiny_classifier" / "train.log").read_text()
    first = "validating at update 16 (the first validation since the run started)"
    assert first in result.output and first in log
    assert "validating at update 32 (the last validation took 0:00:0" in log


def test_a_short_validation_of_a_short_run_is_not_announced(tmp_path):
    result = runner.invoke(
        app, ["train", CLASSIFIER, "run.device=cpu", f"run.out_dir={tmp_path}", "train.epochs=2", "run.threads=1"]
    )
    assert result.exit_code == 0, result.output
    assert "validating at" not in (tmp_path / "tiny_classifier" / "train.log").read_text()
