"""train.loss_chunk (train/loss.py): the output projection and the loss together, a piece of the batch at a time.

The same loss, statistics and gradients as the logits-then-token_loss path; no tensor as large as the batch's
logits is ever made; training with it follows training without it; and no step of the loss, nor of the update's
bookkeeping, waits for the device (host syncs are counted by a TorchFunctionMode)."""

import random

import pytest
import torch
import torch._dynamo
from tiny_models import SESSIONS, WORDS
from torch._dynamo.utils import counters
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError
from tformer_cli.metrics import token_loss
from tformer_cli.train import loss as loss_module
from tformer_cli.train import step
from tformer_cli.train.dist import World
from tformer_cli.train.loss import bare_model, linear_cross_entropy
from tformer_cli.train.tasks import make_task

CPU = torch.device("cpu")


def _case(n: int = 37, d: int = 16, v: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden (n, d) and weight (v, d) that need gradients, targets (n,) with padding (id 0) every 5th."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g).requires_grad_()
    weight = torch.randn(v, d, generator=g).requires_grad_()
    targets = torch.randint(1, v, (n,), generator=g)
    targets[::5] = 0
    return hidden, weight, targets


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1, 6, 37, 100])
def test_the_loss_its_sums_and_its_gradients_are_token_losss(smoothing, chunk, compiled):
    """Eager pieces, and pieces through torch.compile (train.compile: inductor, as training runs it)."""
    hidden, weight, targets = _case()
    loss, stats = token_loss(hidden @ weight.T, targets, smoothing)
    grads = torch.autograd.grad(loss * 3.0, [hidden, weight])  # an upstream gradient other than 1
    loss_c, stats_c = linear_cross_entropy(hidden, weight, targets, smoothing, chunk, compiled)
    grads_c = torch.autograd.grad(loss_c * 3.0, [hidden, weight])
    torch.testing.assert_close(loss_c, loss, rtol=1e-6, atol=1e-6)
    assert stats_c.host().count == stats.host().count == 29
    assert stats_c.host().correct == stats.host().correct
    assert stats_c.host().loss_sum == pytest.approx(stats.host().loss_sum, rel=1e-6)
    for grad_c, grad in zip(grads_c, grads, strict=True):
        torch.testing.assert_close(grad_c, grad, rtol=1e-5, atol=1e-6)
    assert not grads_c[0][::5].any()  # padding rows get no gradient


@pytest.mark.parametrize("compiled", [False, True])
def test_under_bf16_autocast_it_follows_token_loss_of_the_autocast_logits(compiled):
    hidden, weight, targets = _case(n=64, d=32, v=80)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = token_loss(hidden @ weight.T, targets, 0.1)
        loss_c, _ = linear_cross_entropy(hidden, weight, targets, 0.1, 16, compiled)
    grads = torch.autograd.grad(loss, [hidden, weight])
    grads_c = torch.autograd.grad(loss_c, [hidden, weight])
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-5)  # both take bf16 logits' log-softmax in fp32
    for grad_c, grad in zip(grads_c, grads, strict=True):
        assert grad_c.dtype == grad.dtype == torch.float32  # the parameters' dtype
        assert (grad_c - grad).norm() / grad.norm() < 1e-2  # bf16 products, rounded at other points


@pytest.fixture
def compiles(monkeypatch):
    """What torch.compile is asked to compile for the pieces (a fresh compiled piece; TorchDynamo's capture, no
    code generation), and how many calls went through what it made."""
    record = {"compiled": [], "calls": 0}

    def compile_(fn, **kwargs):
        record["compiled"].append((fn, kwargs))

        def counted(*args):
            record["calls"] += 1
            return real_compile(fn, backend="eager", **kwargs)(*args)

        return counted

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setattr(loss_module, "_compiled_piece", loss_module._CompiledPiece())
    return record


def test_train_compile_compiles_the_piece_once_for_every_size_and_runs_every_piece_through_it(compiles):
    torch._dynamo.reset()
    counters.clear()
    hidden, weight, targets = _case()  # 37 tokens
    for chunk in (6, 10):  # pieces of 6 and 1, then 10 and 7
        linear_cross_entropy(hidden, weight, targets, 0.1, chunk, compiled=True)[0].backward()
    assert [fn.__name__ for fn, _ in compiles["compiled"]] == ["_piece"]
    assert compiles["calls"] == 7 + 4
    assert counters["stats"]["unique_graphs"] <= 2  # a piece of one row may get its own
    linear_cross_entropy(hidden, weight, targets, 0.1, 6, compiled=False)[0].backward()
    assert compiles["calls"] == 11  # eager pieces without train.compile


def test_a_piece_that_fails_to_compile_runs_eagerly_with_one_warning(monkeypatch, capsys):
    attempts = []

    def broken(fn, **kwargs):
        attempts.append(fn)
        raise RuntimeError("no C++ compiler (simulated)\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(loss_module, "_compiled_piece", loss_module._CompiledPiece())
    hidden, weight, targets = _case()
    loss, stats = token_loss(hidden @ weight.T, targets, 0.1)
    for _ in range(2):
        loss_c, stats_c = linear_cross_entropy(hidden, weight, targets, 0.1, 6, compiled=True)
        torch.testing.assert_close(loss_c, loss, rtol=1e-6, atol=1e-6)
    assert len(attempts) == 1
    err = capsys.readouterr().err
    assert err.count("torch.compile failed (no C++ compiler (simulated)); pieces run eagerly") == 1


class _Largest(TorchDispatchMode):
    """The largest tensor any operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.numel = max(self.numel, tensor.numel())
        return out


def test_no_tensor_as_large_as_the_batchs_logits_is_made_forward_or_backward():
    n, v, chunk = 64, 500, 8
    hidden, weight, targets = _case(n=n, d=4, v=v)  # the weight (v x 4) is smaller than a piece's logits
    with _Largest() as whole:
        token_loss(hidden @ weight.T, targets, 0.1)[0].backward()
    with _Largest() as pieces:
        linear_cross_entropy(hidden, weight, targets, 0.1, chunk)[0].backward()
    assert whole.numel == n * v  # what the reference path makes (the check can see it)
    assert pieces.numel == chunk * v  # one piece's logits at most


class _HostSyncs(TorchFunctionMode):
    """Counts the calls that copy a tensor's value to Python (a host sync on a GPU)."""

    SYNCS = {"__bool__", "__float__", "__int__", "__index__", "item", "tolist"}

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.SYNCS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("chunk", [0, 5])
def test_the_losses_read_nothing_back_from_the_device(chunk):
    hidden, weight, targets = _case()
    with _HostSyncs() as syncs:
        if chunk:
            loss, stats = linear_cross_entropy(hidden, weight, targets, 0.1, chunk)
        else:
            loss, stats = token_loss(hidden @ weight.T, targets, 0.1)
        loss.backward()
    assert syncs.calls == []
    assert stats.host().count == 29  # read when asked


@pytest.mark.parametrize("chunk", [0, 5])
def test_micro_batches_add_no_host_sync_beyond_the_models_own(chunk, translation):
    """An update of 3 micro-batches reads back what one of them does, plus the model's forward (its mask
    shortcuts) twice more: the loss, the statistics and the finiteness check stay on the device."""
    task = make_task(translation(f"train.loss_chunk={chunk}"))
    model = task.build_model()
    batches = task.batches(0)

    def syncs_of(work) -> int:
        with _HostSyncs() as syncs:
            work()
        return len(syncs.calls)

    src, tgt_in, _ = task.collate(batches[0])
    forward = syncs_of(lambda: model(src, tgt_in))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    engine = _engine(model, task, optimizer)
    one = syncs_of(lambda: step.update(engine, step.Step(batches[:1], True, 0.01)))
    three = syncs_of(lambda: step.update(engine, step.Step(batches[1:4], True, 0.01)))
    assert three == one + 2 * forward


def _engine(model, task, optimizer) -> step.Engine:
    """One process's training engine around `model` and its loss, in fp32 on the CPU (as the loop builds it)."""
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return step.Engine(step.Objective(model, task), task, optimizer, scaler, CPU, World(), "fp32", 1.0)


def _train(task, updates: int) -> list[float]:
    """Losses of `updates` SGD updates of a fresh model (seed 0) on the first batches, two micro-batches each."""
    torch.manual_seed(0)
    model = task.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    engine = _engine(model, task, optimizer)
    batches, losses = task.batches(0), []
    for i in range(updates):
        torch.manual_seed(100 + i)  # the same dropout draws in both runs
        stats, status = step.update(engine, step.Step(batches[2 * i : 2 * i + 2], True, 0.5))
        assert status == "ok"
        losses.append(stats.loss)
    return losses


@pytest.fixture(scope="module")
def translation(prepared_pairs):
    """`overrides -> Config` for a prepared corpus of 120 pairs (100 to train)."""
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(120)]
    return prepared_pairs([(s, s) for s in sentences], 100, "train.max_tokens=128", "train.label_smoothing=0.1")


@pytest.mark.parametrize("kind", ["seq2seq", "lm", "lstm"])
def test_training_with_the_chunked_loss_follows_training_without_it(kind, translation):
    """Same initialisation, batches and dropout draws: the same losses, update after update."""
    if kind == "seq2seq":
        plain, chunked = make_task(translation()), make_task(translation("train.loss_chunk=7"))
    else:
        plain = make_task(load_config(None, [*SESSIONS, f"model.kind={kind}", "train.label_smoothing=0.1"]))
        chunked = make_task(
            load_config(None, [*SESSIONS, f"model.kind={kind}", "train.label_smoothing=0.1", "train.loss_chunk=7"])
        )
    losses, losses_chunked = _train(plain, 4), _train(chunked, 4)
    assert losses[-1] < losses[0]  # it learns
    assert losses_chunked == pytest.approx(losses, rel=1e-5)


def test_the_output_weight_is_found_inside_the_wrappers():
    task = make_task(load_config(None, [*SESSIONS, "model.kind=lm"]))
    model = task.build_model()
    wrapped = torch.compile(torch.nn.Sequential(model))  # _orig_mod, then a container (not unwrapped)
    assert bare_model(wrapped)[0] is model
    assert bare_model(torch.compile(model)).output.weight is model.decoder.embedding.weight  # tied


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.loss_chunk=-1"], "train.loss_chunk must be in [0, 16_777_216], got -1"),
        (
            ["data.kind=pattern", "model.kind=classifier", "train.loss_chunk=512"],
            "train.loss_chunk needs a token-predicting model (lm, lstm, seq2seq)",
        ),
    ],
)
def test_a_bad_loss_chunk_is_refused_in_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert message in str(error.value) and "\n" not in str(error.value)
