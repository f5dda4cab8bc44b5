"""train.precision=bf16-weights (train/master.py): the passes run a bf16 copy of the model, the optimizer steps the fp32
weights with the bf16 gradients, the copy follows them; checkpoints hold the fp32 weights and resume exactly."""

import copy
import random

import pytest
import torch
from tiny_models import WORDS

from tformer_cli.model import build_model
from tformer_cli.train import step
from tformer_cli.train.dist import World
from tformer_cli.train.master import MasterWeights
from tformer_cli.train.optim import build_optimizer
from tformer_cli.train.tasks import make_task

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def translation(prepared_pairs):
    """`overrides -> Config` for a prepared corpus of 120 pairs (100 to train), three-way tied embeddings."""
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(120)]
    pairs = [(s, " ".join(reversed(s.split()))) for s in sentences]
    return prepared_pairs(
        pairs, 100, "model.share_all_embeddings=true", "train.max_tokens=128", "train.log_every=1",
        "train.precision=bf16-weights", "train.clip_norm=0.5",
    )  # fmt: skip


def _engine(config) -> tuple[step.Engine, torch.nn.Module]:
    task = make_task(config)
    torch.manual_seed(0)
    model = task.build_model()
    optimizer = build_optimizer(model, config.train)
    return step.build_engine(
        model, task, optimizer, torch.amp.GradScaler("cpu", enabled=False), config.train, World()
    ), model


def test_the_bf16_copy_keeps_the_ties_and_the_position_tables():
    torch.manual_seed(0)
    model = build_model("seq2seq", vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=32, share_all_embeddings=True)
    copied = MasterWeights(model).model
    assert all(p.dtype == torch.bfloat16 for p in copied.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the master is left as it was
    assert copied.lm_head.weight is copied.encoder.embedding.weight is copied.decoder.embedding.weight
    assert all(b.dtype == torch.float32 for b in copied.buffers() if b.is_floating_point())


def test_an_update_steps_the_fp32_weights_with_the_bf16_gradients_and_rounds_them_back(translation):
    """The same update computed by hand: the bf16 model's forward and backward on the batch, its gradients cast
    to fp32, clipped and given to Adam over an fp32 copy of the weights; the bf16 model then equals them rounded."""
    config = translation("model.dropout=0.0")
    engine, master = _engine(config)
    batch = engine.task.batches(0)[0]
    reference = copy.deepcopy(master)
    bf16 = copy.deepcopy(engine.master.model)
    seen = []
    engine.master.model.register_forward_hook(lambda module, args, out: seen.append(out.dtype))

    stats, status = step.update(engine, step.Step([batch], True, 1e-3))

    assert status == "ok" and seen == [torch.bfloat16]  # the update's forward ran in bf16
    loss, _ = engine.task.loss_on(bf16, *engine.task.inputs(batch, CPU))
    loss.backward()
    for fp32, half in zip(reference.parameters(), bf16.parameters(), strict=True):
        fp32.grad = half.grad.float()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    optimizer = build_optimizer(reference, config.train)
    for group in optimizer.param_groups:
        group["lr"] = 1e-3
    optimizer.step()
    assert float(stats.host().loss_sum) == pytest.approx(float(loss.detach()) * stats.host().count, rel=1e-6)
    for (name, want), got, half in zip(
        reference.named_parameters(), master.parameters(), engine.master.model.parameters(), strict=True
    ):
        assert got.dtype == torch.float32 and torch.equal(got, want), name
        assert half.dtype == torch.bfloat16 and torch.equal(half, want.to(torch.bfloat16)), name
        assert half.grad is None, name  # taken over by the master


def test_a_nonfinite_update_changes_neither_copy(translation, monkeypatch):
    engine, master = _engine(translation())
    before, before_bf16 = copy.deepcopy(master.state_dict()), copy.deepcopy(engine.master.model.state_dict())
    real_loss_on = type(engine.task).loss_on
    monkeypatch.setattr(
        type(engine.task),
        "loss_on",
        lambda self, *args: (lambda out: (out[0] * float("nan"), out[1]))(real_loss_on(self, *args)),
    )
    _, status = step.update(engine, step.Step([engine.task.batches(0)[0]], True, 1e-3))
    assert status == "nonfinite"
    for name, value in master.state_dict().items():
        assert torch.equal(value, before[name]), name
    for name, value in engine.master.model.state_dict().items():
        assert torch.equal(value, before_bf16[name]), name
    assert all(p.grad is None for p in (*master.parameters(), *engine.master.model.parameters()))


def test_a_run_saves_fp32_weights_and_resumed_halfway_ends_where_the_straight_run_does(
    translation, straight_and_resumed
):
    """N/2 updates, a resume (the bf16 copy made again from the fp32 checkpoint), N/2 more = N straight, with
    dropout; the checkpoint holds the fp32 weights, as any run's."""
    straight, resumed = straight_and_resumed(translation, "model.dropout=0.1", "train.valid_every=4")
    assert all(value.dtype == torch.float32 for value in straight.values() if value.is_floating_point())
    assert straight.keys() == resumed.keys()
    assert [k for k in straight if not torch.equal(straight[k], resumed[k])] == []


def test_gradients_come_over_cast_and_a_parameter_without_one_gets_none():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 3), "unused": torch.nn.Linear(4, 3)})
    weights = MasterWeights(model)
    weights.model["used"](torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    expected = {name: p.grad.float() for name, p in weights.model.named_parameters() if p.grad is not None}
    weights.gradients_to_master()
    assert {name for name, p in model.named_parameters() if p.grad is not None} == {"used.weight", "used.bias"}
    for name, param in model.named_parameters():
        if name in expected:
            assert param.grad.dtype == torch.float32 and torch.equal(param.grad, expected[name]), name
    assert all(p.grad is None for p in weights.model.parameters())


def test_in_one_process_the_micro_batches_gradients_add_up_in_fp32(translation):
    """train.update_freq=2: each micro-batch's bf16 gradient is cast and added to the fp32 ones after its backward
    (added in bf16 first, the sum would be rounded to bf16's 8 bits). The gradients the optimizer steps with are
    those of the same sum computed by hand (no clipping here)."""
    engine, master = _engine(translation("model.dropout=0.0", "train.clip_norm=0"))
    batches = engine.task.batches(0)[:2]
    bf16 = copy.deepcopy(engine.master.model)
    counts = [engine.task.count(b) for b in batches]
    expected: dict[str, torch.Tensor] = {}
    for batch, count in zip(batches, counts, strict=True):
        loss, _ = engine.task.loss_on(bf16, *engine.task.inputs(batch, CPU))
        (loss * (count / sum(counts))).backward()  # step.update's weight
        for name, param in bf16.named_parameters():
            grad = param.grad.float()
            expected[name] = grad if name not in expected else expected[name].add_(grad)
        bf16.zero_grad(set_to_none=True)
    seen = {}
    real_step = engine.optimizer.step
    engine.optimizer.step = lambda *args, **kwargs: (  # what the optimizer is given
        seen.update({name: p.grad.clone() for name, p in master.named_parameters()}) or real_step(*args, **kwargs)
    )
    _, status = step.update(engine, step.Step(batches, True, 1e-3))
    assert status == "ok" and seen.keys() == expected.keys()
    assert [name for name in expected if not torch.equal(seen[name], expected[name])] == []
