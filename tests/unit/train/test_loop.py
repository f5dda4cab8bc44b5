"""Pieces of the training loop (train/loop.py): which validation is a new best, the device's set-up."""

import weakref
from pathlib import Path

import pytest
import torch

from tformer_cli.config import load_config
from tformer_cli.train import loop

TINY = Path(__file__).parents[3] / "recipes" / "tiny_classifier.yaml"


@pytest.mark.parametrize(
    "metric,value,best,improved",
    [
        ("loss", 0.4, 0.5, True),  # a loss improves downwards
        ("loss", 0.6, 0.5, False),
        ("loss", 0.5, 0.5, False),  # a tie is not a new best (early stopping counts it as stale)
        ("accuracy", 0.6, 0.5, True),  # accuracy and BLEU improve upwards
        ("accuracy", 0.4, 0.5, False),
        ("accuracy", 0.5, 0.5, False),
        ("bleu", 21.0, 20.0, True),
        ("bleu", 19.0, 20.0, False),
        ("hit10", 0.6, 0.5, True),  # next-item ranking (sessions) improves upwards too
        ("hit10", 0.4, 0.5, False),
        ("mrr", 0.6, 0.5, True),
        ("mrr", 0.4, 0.5, False),
        ("loss", 9.9, None, True),  # the first validation is always the best so far
        ("accuracy", 0.0, None, True),
    ],
)
def test_improved_compares_each_metric_in_its_own_direction(metric, value, best, improved):
    assert loop._improved(metric, value, best) is improved


def test_train_turns_tf32_on_for_its_device(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(loop, "use_tf32", asked.append)
    overrides = [f"run.out_dir={tmp_path}", "run.device=cpu", "train.max_updates=1", "train.valid_every=0"]
    loop.train(load_config(TINY, overrides), tmp_path / "run")
    assert asked == [torch.device("cpu")]


def test_the_run_and_its_module_are_freed_before_the_process_group_is_closed(tmp_path, monkeypatch):
    """Under DDP the module's reducer holds the process group: freed after the group was destroyed, it would be
    the group's last owner and destroy it holding the GIL, which gloo's worker thread may be waiting for (a hang
    at the end of torchrun). So `train` lets go of the run before `close_world`."""
    nets, alive_at_close = [], []
    real_start = loop._start

    def start(*args):
        run = real_start(*args)
        nets.append(weakref.ref(run.engine.net))  # what DDP wraps under torchrun
        return run

    monkeypatch.setattr(loop, "_start", start)
    monkeypatch.setattr(loop, "close_world", lambda world: alive_at_close.append([net() is not None for net in nets]))
    loop.train(load_config(TINY, [f"run.out_dir={tmp_path}", "train.max_updates=2"]), tmp_path / "run")
    assert alive_at_close == [[False]]
