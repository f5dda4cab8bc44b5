"""Pieces of one update (train/step.py): train.compile."""

from pathlib import Path

import torch
from torch import nn

from tformer_cli.config import load_config
from tformer_cli.train import step
from tformer_cli.train.dist import World
from tformer_cli.train.tasks import make_task

TINY = Path(__file__).parents[3] / "recipes" / "tiny_classifier.yaml"


class CountingModule(nn.Module):
    """Stands for what torch.compile returns: delegates to the module and counts the calls through it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0
        self.states: list[tuple[bool, bool]] = []  # (grad mode, autocast) of each call

    def forward(self, *args, **kwargs):
        self.calls += 1
        self.states.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
        return self.inner(*args, **kwargs)


def test_compiled_returns_what_torch_compile_made_after_one_checked_batch(monkeypatch):
    made = []
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: made.append(CountingModule(module)) or made[-1])
    task = make_task(load_config(TINY, []))
    objective = step.Objective(task.build_model(), task)
    compiled = step.compiled(objective, task, torch.device("cpu"), "fp32")
    assert compiled is made[0] and compiled.inner is objective
    assert compiled.calls == 1  # the check batch ran through the compiled module


def test_compiled_falls_back_to_the_eager_module_with_a_warning(monkeypatch, capsys):
    def broken(module, **kwargs):
        raise RuntimeError("no C++ compiler (simulated)\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    task = make_task(load_config(TINY, []))
    objective = step.Objective(task.build_model(), task)
    assert step.compiled(objective, task, torch.device("cpu"), "fp32") is objective
    assert "torch.compile failed (no C++ compiler (simulated))" in capsys.readouterr().err


def test_the_compile_check_runs_under_the_global_state_of_training(monkeypatch):
    """Grad mode and autocast are guarded by torch.compile: a check under others would compile twice."""
    made = []
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: made.append(CountingModule(module)) or made[-1])
    task = make_task(load_config(TINY, []))
    cpu = torch.device("cpu")
    net = step.compiled(step.Objective(task.build_model(), task), task, cpu, "bf16")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    engine = step.Engine(net, task, optimizer, torch.amp.GradScaler("cpu", enabled=False), cpu, World(), "bf16", 0.0)
    step.update(engine, step.Step(task.batches(0)[:1], True, 0.0))
    check, training = net.states
    assert check == training == (True, True)
