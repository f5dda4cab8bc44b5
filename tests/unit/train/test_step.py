"""Pieces of one update (train/step.py): train.compile."""

from pathlib import Path

import torch
from torch import nn

from tformer_cli.config import load_config
from tformer_cli.train import step
from tformer_cli.train.tasks import ClassifierTask

TINY = Path(__file__).parents[3] / "recipes" / "tiny_classifier.yaml"


class CountingModule(nn.Module):
    """Stands for what torch.compile returns: delegates to the module and counts the calls through it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def test_compiled_returns_what_torch_compile_made_after_one_checked_batch(monkeypatch):
    made = []
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: made.append(CountingModule(module)) or made[-1])
    task = ClassifierTask(load_config(TINY, []))
    model = task.build_model()
    compiled = step.compiled(model, task, torch.device("cpu"))
    assert compiled is made[0] and compiled.inner is model
    assert compiled.calls == 1  # the check batch ran through the compiled module


def test_compiled_falls_back_to_the_eager_module_with_a_warning(monkeypatch, capsys):
    def broken(module, **kwargs):
        raise RuntimeError("no C++ compiler (simulated)\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    task = ClassifierTask(load_config(TINY, []))
    model = task.build_model()
    assert step.compiled(model, task, torch.device("cpu")) is model
    assert "torch.compile failed (no C++ compiler (simulated))" in capsys.readouterr().err
