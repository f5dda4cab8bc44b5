"""One optimiser update: forward/backward over the micro-batches, then clip and step.

One update = `train.update_freq` micro-batches on each of the torchrun processes; the gradient is the
sum of the per-token (or per-example) losses over all of them divided by their total count, so the
same global batch gives the same update whatever the split into processes and micro-batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tformer_cli.errors import TformerError, first_line
from tformer_cli.log import console, hms
from tformer_cli.metrics import Stats
from tformer_cli.model.stack import Stack
from tformer_cli.schema import TrainConfig
from tformer_cli.train.dist import World, any_across, sum_across
from tformer_cli.train.loss import outside_graphs
from tformer_cli.train.master import MasterWeights
from tformer_cli.train.tasks import Task

Precision = Literal["fp32", "bf16", "fp16", "bf16-weights"]  # train.precision (schema.TrainConfig)


class Objective(nn.Module):
    """The model and its training loss as one module: what an update runs, wrapped by DDP (several processes) and
    compiled (train.compile) as a whole.

    `forward` takes a batch's tensors on the device (the task's `inputs`) and returns (mean loss, loss sum,
    correct, count) (the task's `loss_on`, its Stats as a tuple: DDP and torch.compile hand tensors back
    through tuples). Compiled, the forward pass and the loss are one graph: the compiler fuses the loss's fp32
    cast, log-softmax and sums into a few kernels instead of eager's separate passes over the batch's logits
    (bench/gpu_train.py's "model + loss" rows). The model is the only submodule: the parameters are the model's.
    """

    def __init__(self, model: nn.Module, task: Task) -> None:
        super().__init__()
        self.model, self.task = model, task

    def forward(self, *inputs: Tensor) -> tuple[Tensor, Tensor | float, Tensor | int, Tensor | int]:
        loss, stats = self.task.loss_on(self.model, *inputs)
        return loss, stats.loss_sum, stats.correct, stats.count


@dataclass(frozen=True)
class Engine:
    """What every update uses, fixed for the whole run."""

    net: nn.Module  # the Objective as updated: wrapped by DDP (several processes) and torch.compile if asked
    task: Task  # batches, per-batch loss, validation
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # loss scaling for fp16 (disabled otherwise)
    device: torch.device
    world: World
    precision: Precision  # train.precision
    clip_norm: float  # train.clip_norm; 0: no clipping
    master: MasterWeights | None = None  # train.precision=bf16-weights: the optimizer steps these fp32 weights


@dataclass(frozen=True)
class Step:
    """One update's input in this process."""

    micro_batches: Sequence[Any]
    has_data: bool  # False: none left for this process at the end of an epoch; it joins the sync with weight 0
    lr: float


def build_engine(
    model: nn.Module,
    task: Task,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    tc: TrainConfig,
    world: World,
    say: Callable[[str], None] = console.print,
) -> Engine:
    """The engine of a run: the Objective over `model` (over its bf16 copy with train.precision=bf16-weights,
    `optimizer` then stepping `model` as the master weights), wrapped by DDP for several processes and compiled
    with train.compile.

    Args:
        model: the run's fp32 model on its device, as built or resumed; `optimizer` steps its parameters.
        say: where the compile check is said (the run's train.log and the terminal).
    """
    master = MasterWeights(model) if tc.precision == "bf16-weights" else None
    net: nn.Module = Objective(model if master is None else master.model, task)
    device = next(model.parameters()).device
    if world.size > 1:
        net = DistributedDataParallel(net)
    precision = tc.precision
    assert precision != "auto", "train.precision is resolved before the engine is built (precision.py)"
    if tc.compile:
        net = compiled(net, task, device, precision, say)
    return Engine(net, task, optimizer, scaler, device, world, precision, tc.clip_norm, master)


def update(engine: Engine, step: Step) -> tuple[Stats, str]:
    """One optimiser update over this process's micro-batches.

    Each micro-batch's mean loss is weighted by count * processes / global count, so that after DDP's
    gradient averaging the update is the mean over every token (or example) of the global batch.
    A process with no micro-batch (the end of an epoch) still joins the gradient sync with weight 0.

    Args:
        engine: The model, optimiser and settings of the run.
        step: This update's micro-batches and learning rate.

    Returns:
        The summed training stats of this process's micro-batches, and "ok", or "nonfinite" / "oom"
        for an update skipped (non-finite loss or gradient in any process / out of GPU memory).

    Raises:
        TformerError: out of GPU memory in forward/backward with several processes (the others would
            wait forever), or in the optimizer step.
    """
    engine.net.train()  # validation leaves the model in eval mode (no dropout)
    for group in engine.optimizer.param_groups:
        group["lr"] = step.lr
    counts = [engine.task.count(b) if step.has_data else 0 for b in step.micro_batches]
    global_count = sum_across(engine.world, [float(sum(counts))])[0]
    weights = [count * engine.world.size / max(global_count, 1.0) for count in counts]
    try:
        total, finite = _forward_backward(engine, step, weights)
    except torch.OutOfMemoryError:
        if engine.world.size > 1:
            raise TformerError(
                "out of GPU memory in forward/backward with several processes; "
                "lower train.max_tokens (or batch_size) and raise train.update_freq"
            ) from None
        engine.optimizer.zero_grad(set_to_none=True)
        engine.net.zero_grad(set_to_none=True)  # the bf16 model's, with master weights
        if engine.device.type == "cuda":
            torch.cuda.empty_cache()
        return Stats(), "oom"
    return total, "ok" if _optimizer_step(engine, finite) else "nonfinite"


def _forward_backward(engine: Engine, step: Step, weights: list[float]) -> tuple[Stats, Tensor]:
    """Accumulate the gradients of the micro-batches' losses times `weights`; DDP syncs on the last one.

    Nothing here waits for the device: the stats and the finiteness stay tensors on it until the
    optimizer step reads the finiteness (with the gradient norm, one host sync per update) and the
    loop reads the stats when it logs.

    Returns:
        The summed stats (empty without data) and whether every loss was finite in this process (a bool tensor).
    """
    net, world = engine.net, engine.world
    total, finite = Stats(), torch.ones((), dtype=torch.bool, device=engine.device)
    for i, (batch, weight) in enumerate(zip(step.micro_batches, weights, strict=True)):
        last = i == len(step.micro_batches) - 1
        sync = cast(DistributedDataParallel, net).no_sync() if world.size > 1 and not last else nullcontext()
        inputs = engine.task.inputs(batch, engine.device)
        with sync, autocast_for(engine.precision, engine.device):
            loss, *sums = net(*inputs)
        stats = Stats(*sums)
        finite &= torch.isfinite(torch.as_tensor(stats.loss_sum, device=engine.device))
        engine.scaler.scale(loss * weight).backward()
        if engine.master is not None and world.size == 1:
            engine.master.gradients_to_master()  # the micro-batches add up in fp32 (under DDP: at the step)
        if step.has_data:
            total.add(stats)
    return total, finite


def _optimizer_step(engine: Engine, finite: Tensor) -> bool:
    """Clip and apply the accumulated gradient unless it, or a loss, is non-finite in any process.

    Returns:
        Whether the step was taken (the gradients are cleared either way).

    Raises:
        TformerError: out of GPU memory in the optimizer step.
    """
    optimizer, scaler, master = engine.optimizer, engine.scaler, engine.master
    if master is not None:
        master.gradients_to_master()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(
        engine.net.parameters() if master is None else master.parameters(),
        engine.clip_norm if engine.clip_norm > 0 else float("inf"),
    )
    finite_here = bool(finite & torch.isfinite(norm))  # the update's one host sync
    taken = not any_across(engine.world, not finite_here)
    if taken:
        try:
            scaler.step(optimizer)
        except torch.OutOfMemoryError:
            raise TformerError(
                "out of GPU memory in the optimizer step: the model and its optimizer state do "
                "not fit; use a smaller model or more memory"
            ) from None
        if master is not None:
            master.weights_from_master()
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return taken


def autocast_for(precision: Precision, device: torch.device) -> AbstractContextManager[Any]:
    """bf16/fp16 autocast contexts (fp32 and bf16-weights, whose weights are bf16 already: none).

    On a CPU without oneDNN bf16 support (no AVX-512 or AVX-NE-CONVERT), oneDNN is switched off inside
    the context: PyTorch would still send an LSTM under bf16 autocast to oneDNN, which cannot run it
    there ("could not create a primitive descriptor"); the other kernels are the same either way.

    Raises:
        TformerError: fp16 on a device other than CUDA.
    """
    if precision in ("fp32", "bf16-weights"):
        return nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise TformerError("train.precision=fp16 needs CUDA; on CPU use train.precision=bf16")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return _without_onednn(autocast)
    return autocast


@contextmanager
def _without_onednn(context: AbstractContextManager[Any]) -> Iterator[None]:
    """`context` with oneDNN off (and back to its previous setting after)."""
    before = torch.backends.mkldnn.enabled
    # torch's stubs type the flag as its descriptor (ContextProp), which takes a bool
    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
    try:
        with context:
            yield
    finally:
        torch.backends.mkldnn.enabled = before


def compiled(
    net: nn.Module, task: Task, device: torch.device, precision: Precision, say: Callable[[str], None] = console.print
) -> nn.Module:
    """torch.compile(net) (the Objective: the model and its loss as one graph), checked on one batch; the eager
    module (with a warning) where it fails.

    The check runs as training will (gradients on, `precision`'s autocast, a backward pass whose gradients are then
    dropped): the graphs it compiles, forward and backward, are the ones training uses, and the first update
    compiles nothing. Checked under other global state (no_grad, no autocast), they would fail training's guards
    and everything would compile a second time.

    Token-budget batches change shape at every update. The check's batch has the sizes that differ between
    the first batches marked dynamic (`varying_sizes`), so that the one graph compiled here takes every
    (B, S, T); left to itself, torch.compile would compile a graph for the first shape, then a second one with
    dynamic sizes at the first new shape (automatic dynamic shapes): a compile of the whole model thrown away.
    A size that never changes (a language model's block) stays static. The model's forward and its loss must
    have no graph break (each piece would recompile on its own; see model/cache.py's `can_drop_mask`; with
    train.loss_chunk the loss runs after the graph, each of its pieces compiled on its own, see train/loss.py).
    Tested in tests/unit/train/test_compile_shapes.py.

    What it does and how long it takes are said (`say`): minutes on a busy CPU, with nothing else to see.
    """
    say(
        "train.compile: compiling the model and its loss on one batch before training (a minute or more on a "
        "CPU, less on a GPU; train.compile=false trains without it)"
    )
    started = time.time()
    try:
        outside_graphs()  # train.loss_chunk's call, fenced off before the step is traced
        for stack in (module for module in net.modules() if isinstance(module, Stack)):
            stack.prepare_positions(stack.max_len, device)  # RoPE's angles built now, not by the graph (a recompile)
        compiled_net = cast(nn.Module, torch.compile(net))  # a module compiled is a module (OptimizedModule)
        first = task.batches(0)[:8]
        inputs = task.inputs(first[0], device)
        for tensor, dims in zip(inputs, varying_sizes(task, first), strict=True):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
        with autocast_for(precision, device):
            loss = compiled_net(*inputs)[0]
        loss.backward()  # the backward graph compiles at the first backward: here, where a stop is honoured at once
        net.zero_grad(set_to_none=True)  # nothing is updated
        say(f"train.compile: compiled in {hms(time.time() - started)}")
        return compiled_net
    except Exception as exc:  # compilers fail in many ways (missing C++ toolchain, unsupported ops)
        reason = first_line(exc)
        console.print(f"[yellow]warning:[/] train.compile: torch.compile failed ({reason}); training without it")
        return net


def varying_sizes(task: Task, batches: Sequence[Any]) -> list[list[int]]:
    """For each of the task's input tensors, the dimensions whose size differs among `batches` (gathered on the
    host): a translation's sentences, source and target lengths; none for a language model's blocks of one size
    (its last, shorter batch recompiles once)."""
    cpu = torch.device("cpu")
    per_batch = [[tuple(x.shape) for x in task.inputs(batch, cpu)] for batch in batches]
    per_input = zip(*per_batch, strict=True)  # each input tensor's shape in each batch
    return [[dim for dim in range(len(shapes[0])) if len({shape[dim] for shape in shapes}) > 1] for shapes in per_input]
