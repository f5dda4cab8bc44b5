"""train.compile's check builds the position tables before tracing: the first training update runs the graph the
check compiled. Built inside the graph (RoPE's angles are made on first use), a table changes the guards and the
first update compiles the whole model again: seconds to minutes on a CPU, during which a stop signal waits."""

import random
from pathlib import Path

import pytest
import torch
import torch._dynamo
from tiny_models import WORDS
from torch._dynamo.utils import counters

from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
from tformer_cli.train import step
from tformer_cli.train.dist import World
from tformer_cli.train.tasks import make_task

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _lm_task(tmp_path: Path, pos: str):
    rng = random.Random(0)
    for name, lines in (("train", 200), ("valid", 20)):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(lines))
        (tmp_path / f"{name}.txt").write_text(text + "\n")
    overrides = [
        f"data.train={tmp_path}/train.txt", f"data.valid={tmp_path}/valid.txt", f"data.dir={tmp_path}/data",
        "data.test=null", "tokenizer.vocab_size=40", "data.block_size=16", "train.batch_size=4", "data.workers=1",
        "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32", f"model.pos={pos}",
    ]  # fmt: skip
    config = load_config(Path(__file__).parents[3] / "recipes/wikitext2_lm.yaml", overrides)
    prepare(config.data, config.tokenizer, log=lambda _: None)
    return make_task(config)


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "alibi"])
def test_the_first_updates_run_the_graph_the_compile_check_made(tmp_path, monkeypatch, pos):
    task = _lm_task(tmp_path, pos)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda net, **kwargs: real_compile(net, backend="eager", **kwargs))
    model = task.build_model()
    objective = step.Objective(model, task)
    net = step.compiled(objective, task, CPU, "fp32", say=lambda _: None)
    assert net is not objective  # compiled: no fallback to eager
    assert counters["stats"]["unique_graphs"] == 1  # the check's graph
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    engine = step.Engine(net, task, optimizer, torch.amp.GradScaler("cpu", enabled=False), CPU, World(), "fp32", 1.0)
    for batch in task.batches(0)[:3]:  # blocks of one size: the epoch's last, shorter batch would recompile once
        assert step.update(engine, step.Step([batch], True, 0.01))[1] == "ok"
    assert counters["stats"]["unique_graphs"] == 1  # no recompile at the first update


def test_the_check_compiles_the_backward_graph_and_leaves_no_gradient(tmp_path, monkeypatch):
    """AOTAutograd compiles the backward graph at the first backward: in the check (where a stop is honoured at
    once), not in the first update. The check's gradients are dropped: training starts from none."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    task = _lm_task(tmp_path, "rope")
    backward_compiles = []

    def backward(graph, example_inputs):
        backward_compiles.append(graph)
        return make_boxed_func(graph.forward)

    backend = aot_autograd(
        fw_compiler=lambda graph, example_inputs: make_boxed_func(graph.forward), bw_compiler=backward
    )
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda net, **kwargs: real_compile(net, backend=backend, **kwargs))
    model = task.build_model()
    net = step.compiled(step.Objective(model, task), task, CPU, "fp32", say=lambda _: None)
    assert len(backward_compiles) == 1
    assert all(p.grad is None for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    engine = step.Engine(net, task, optimizer, torch.amp.GradScaler("cpu", enabled=False), CPU, World(), "fp32", 1.0)
    assert step.update(engine, step.Step([task.batches(0)[0]], True, 0.01))[1] == "ok"
    assert len(backward_compiles) == 1  # the first update compiled nothing more
