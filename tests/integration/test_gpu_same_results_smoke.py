"""bench/gpu_same_results.py in smoke mode (a tiny model on a made-up corpus, on the CPU): both paths train from the
same seed and are compared; the same loss through another path agrees, another loss does not. The compiled fast
path (its default) is for a GPU: compiling on 2 CPU cores takes minutes, so these use train.loss_chunk."""

import os
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import gpu_same_results  # noqa: E402


def test_the_same_loss_by_another_path_passes(tmp_path, capsys):
    args = ["--smoke", "--updates", "12", "--work", str(tmp_path), "--fast", "train.loss_chunk=32"]
    assert gpu_same_results.main(args)
    out = capsys.readouterr().out
    assert "| training loss, mean of the last 10 updates |" in out and "**PASS**" in out


def test_another_loss_fails(tmp_path, capsys):
    """A learning rate 20 times the recipe's trains another model: the comparison must say so."""
    args = ["--smoke", "--updates", "12", "--work", str(tmp_path), "--fast", "train.lr_scale=20"]
    assert not gpu_same_results.main(args)
    assert "**FAIL**" in capsys.readouterr().out


def test_the_suite_runs_without_the_callers_out():
    """$OUT may be the folder of the real tables (bench/gpu_check.sh runs the suite with it set): conftest
    takes OUT away, so that a smoke run of a bench script writes no tiny-model table over a real one."""
    assert "OUT" not in os.environ


def test_settings_of_both_paths_reach_both(tmp_path, capsys):
    """--both changes both paths alike: a learning rate 20 times the recipe's in both still passes (in one path
    alone it fails, above), and the report names it."""
    args = ["--smoke", "--updates", "12", "--work", str(tmp_path), "--both", "train.lr_scale=20"]
    assert gpu_same_results.main([*args, "--fast", "train.loss_chunk=32"])
    assert "both with `train.lr_scale=20`" in capsys.readouterr().out
