"""Training speed at the paper's shape on one GPU: tformer vs torch.nn.Transformer vs Hugging Face Marian, then
tformer's own training loop on the WMT14 sample, and the wall time of the paper's 100,000 updates.

    TFORMER_DATA=/path/to/data python bench/gpu_train.py   # on a CUDA GPU, the WMT14 sample under the data root: prints the tables, also in $OUT/gpu_train*.md
                                                       # where OUT is set (--write: into docs/benchmarks.md)
    python bench/gpu_train.py --loop-overrides train.compile=true train.loss_chunk=4096    # another loop setting
    python bench/gpu_train.py --smoke --no-compile     # on a CPU: a tiny shape in fp32, every code path, seconds

One process, in this order:
1. The bf16 matmul peak of this GPU (8192 x 8192 products, best of 3), the denominator of every MFU here.
2. The model-only update (forward, label-smoothed loss, backward, Adam step; fused Adam on CUDA, bf16 autocast)
   at the paper's shape: d_model 512, 6+6 layers, 8 heads, d_ff 2048, a shared tied vocabulary of 37,000,
   896 sentences of 27 source / 28 target tokens (25,088 target tokens), label smoothing 0.1, dropout 0.1.
   Rows: tformer eager, compiled (torch.compile(model), the loss eager on its output) and compiled with its
   loss (model and loss as one function: train.compile), with the whole batch's logits + token_loss, and with
   linear_cross_entropy (train.loss_chunk; eager, and compiled model with compiled pieces); tformer's own
   training step (train/step.py `update`, as `tformer train` runs it: fused Adam, the finiteness check) with
   each of --settings (default: train.compile=true, and with train.precision=bf16-weights: a bf16 model, fp32
   master weights); torch.nn.Transformer and MarianMTModel (F.cross_entropy on their logits) the same three ways. One row after
   the other (each its own peak memory), the same seeds, the same random batches. Per row: ms per update
   (median of the timed updates, the device synchronised around each),
   target tokens/s, TFLOP/s and MFU (bench/_systems.train_flops: one count for every system), peak memory
   allocated, the first update's loss. A row that fails is printed with its error and the others run.
3. The real loop: recipes/wmt14_base.yaml prepared into --work (runs/gpu_train/data, kept; tokenizer.vocab_size=8000:
   the 20k-pair sample takes no 37k vocabulary, as in bench/gpu_check.sh) and trained through the library for --loop-updates updates into a temporary run folder,
   with --loop-overrides last. Its rate: the median target tokens/s of metrics.jsonl's records after the first
   (train.log_every=1), as a fraction of tformer's own update() on random batches of the model-only shape with
   the loop's settings and vocabulary (what the loop adds: data, padding, varying shapes, logging). The paper's
   100,000 updates are projected with the loop's real target tokens per update (the mean over an epoch's
   batches), at the loop's rate and at the paper's vocabulary (the loop's rate x the model-only ratio of
   update() at 37,000 to update() at the loop's vocabulary); that rate over each tformer model-only row's.
4. Two markdown sections, the model-only update and the loop; --write puts each one measured into docs/benchmarks.md.
   One part at a time (compiling 4 models cold takes minutes): --only model, then --only loop.

Smoke mode: d_model 64, 2+2 layers, vocabulary 500, 8 x 10 tokens, fp32, 2 + 3 updates, loss chunk 32; the loop
trains 20 updates of the same tiny model on a made-up parallel corpus written to runs/gpu_train_smoke.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).parent))
from _gpu_loop import (  # noqa: E402
    LOOP_SAMPLE,
    LOOP_SMOKE,
    RECIPE,
    Loop,
    LoopResult,
    loop_shape,
    made_up_corpus,
    run_loop,
    update_as_the_loop,
    wmt14_sample,
)
from _report import machine, write_section  # noqa: E402
from _systems import Shape, TorchNN, marian, random_batch, tformer, train_flops  # noqa: E402

from tformer_cli.config import load_config  # noqa: E402
from tformer_cli.metrics import token_loss  # noqa: E402
from tformer_cli.train.loss import bare_model, linear_cross_entropy  # noqa: E402
from tformer_cli.train.step import Precision, autocast_for  # noqa: E402

PAPER = Shape(d_model=512, layers=6, heads=8, d_ff=2048, vocab=37_000, batch=896, src=27, tgt=28)
SMOKE = Shape(d_model=64, layers=2, heads=4, d_ff=256, vocab=500, batch=8, src=10, tgt=10)
SMOOTHING = 0.1
PAPER_UPDATES = 100_000
# tformer update() rows (--settings): its fastest settings, as `tformer train` runs them (bf16 autocast or bf16 weights)
TRAIN_SETTINGS = ["train.compile=true", "train.compile=true train.precision=bf16-weights"]
EAGER_SETTINGS = ["train.precision=bf16-weights"]

Compile = Literal["eager", "compiled model", "compiled model + loss"]  # what torch.compile sees of an update
COMPILE_MODES: dict[str, Compile] = {"model": "compiled model", "model+loss": "compiled model + loss"}  # --compile
Batch = tuple[Tensor, Tensor, Tensor]  # source (B, S), decoder input (B, T), target (B, T)
UpdateFn = Callable[[Batch], Tensor]  # one whole update on a batch; returns the loss (on the device)


@dataclass(frozen=True)
class System:
    """One row: what it is, its shape, and how to build its update (called once, after seeding)."""

    label: str  # exactly what runs, e.g. "tformer compiled + linear_cross_entropy (chunk 4096)"
    family: Literal["tformer", "peer", "reference"]  # reference: the loop's settings (not in the comparison)
    shape: Shape
    make_update: Callable[[torch.device], UpdateFn]


@dataclass(frozen=True)
class Row:
    """A system's measurement, or its error."""

    system: System
    ms: float = 0.0  # median ms per update
    rate: float = 0.0  # target tokens/s
    tflops: float = 0.0
    mfu: float = 0.0
    peak_mib: float | None = None  # None: not measured (CPU)
    first_loss: float = float("nan")
    error: str | None = None


def plain_update(
    model: nn.Module,
    loss_of: Callable[[nn.Module, Batch], Tensor],
    compile_: Compile,
    precision: Precision,
    device: torch.device,
) -> UpdateFn:
    """The update a user of `model` writes: the loss under `precision`'s autocast, backward, an Adam step (fused on
    CUDA), the gradients cleared. "compiled model": torch.compile(model), as a user compiles a model (the loss runs
    eagerly on its output); "compiled model + loss": the model and its loss compiled as one function (tformer's
    train.compile, train/step.py Objective)."""
    model.to(device).train()
    net = torch.compile(model) if compile_ == "compiled model" else model
    loss_fn = torch.compile(loss_of) if compile_ == "compiled model + loss" else loss_of
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True if device.type == "cuda" else None
    )

    def update(batch: Batch) -> Tensor:
        with autocast_for(precision, device):
            loss = loss_fn(net, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return update


def tformer_loss(chunk: int, compiled_pieces: bool = False) -> Callable[[nn.Module, Batch], Tensor]:
    """tformer's training loss: logits + token_loss (chunk 0), or linear_cross_entropy `chunk` tokens at a time
    (its pieces compiled with `compiled_pieces`, as train.compile does)."""

    def loss_of(net: nn.Module, batch: Batch) -> Tensor:
        src, tgt_in, tgt = batch
        if not chunk:
            return token_loss(net(src, tgt_in), tgt, SMOOTHING)[0]
        hidden = net(src, tgt_in, head=False)  # (B, T, D)
        weight = bare_model(net).output.weight
        return linear_cross_entropy(hidden, weight, tgt, SMOOTHING, chunk, compiled_pieces)[0]

    return loss_of


def peer_loss(logits_of: Callable[[nn.Module, Tensor, Tensor], Tensor]) -> Callable[[nn.Module, Batch], Tensor]:
    """The label-smoothed cross-entropy a user of torch.nn or transformers writes, on fp32 logits."""

    def loss_of(net: nn.Module, batch: Batch) -> Tensor:
        src, tgt_in, tgt = batch
        logits = logits_of(net, src, tgt_in).float()  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), label_smoothing=SMOOTHING, ignore_index=0)

    return loss_of


def systems(
    shape: Shape,
    chunk: int,
    modes: list[Compile],
    precision: Precision,
    settings: list[list[str]],
    sizes: tuple[str, ...],
) -> list[System]:
    """The model-only rows: tformer's settings, then tformer's own update() as `tformer train` runs it with each of
    `settings` (train.* overrides of recipes/wmt14_base.yaml, after `sizes`), then torch.nn.Transformer and Marian,
    in each of `modes`.

    linear_cross_entropy has no "compiled model + loss" row: compiled, its pieces run after the compiled forward,
    each piece compiled on its own (train/loss.py), which is its "compiled model" row."""

    def system(
        label: str,
        family: Literal["tformer", "peer"],
        build: Callable[[], nn.Module],
        loss_of: Callable[[nn.Module, Batch], Tensor],
        mode: Compile,
    ) -> System:
        return System(label, family, shape, lambda device: plain_update(build(), loss_of, mode, precision, device))

    def torch_nn_logits(net: nn.Module, src: Tensor, tgt_in: Tensor) -> Tensor:
        return net(src, tgt_in)

    def marian_logits(net: nn.Module, src: Tensor, tgt_in: Tensor) -> Tensor:
        return net(input_ids=src, decoder_input_ids=tgt_in).logits

    rows = []
    for mode in modes:
        rows.append(
            system(f"tformer {mode}, logits + token_loss", "tformer", lambda: tformer(shape), tformer_loss(0), mode)
        )
        if mode != "compiled model + loss":
            pieces = mode == "compiled model"  # train.compile with train.loss_chunk: pieces compiled too
            label = f"tformer {mode}, linear_cross_entropy chunk {chunk}" + (" (pieces compiled)" if pieces else "")
            rows.append(system(label, "tformer", lambda: tformer(shape), tformer_loss(chunk, pieces), mode))
    for overrides in settings:  # the training step itself (train/step.py build_engine, update), random batches
        config = load_config(RECIPE, [*sizes, *overrides])
        label = f"tformer update() as train runs it: {' '.join(overrides)}"
        rows.append(System(label, "tformer", shape, update_as_the_loop(config, shape)))
    for mode in modes:
        rows.append(
            system(f"torch.nn.Transformer {mode}", "peer", lambda: TorchNN(shape), peer_loss(torch_nn_logits), mode)
        )
    if importlib.util.find_spec("transformers") is None:
        print("transformers is not installed: no Marian rows (pip install 'tformer-cli[bench]')")
        return rows
    for mode in modes:
        rows.append(system(f"HF MarianMTModel {mode}", "peer", lambda: marian(shape), peer_loss(marian_logits), mode))
    return rows


def measure(system: System, device: torch.device, warmup: int, updates: int, peak_tflops: float) -> Row:
    """Warm-up then timed updates of one system on its seeded random batches; its error instead if it fails."""
    cuda = device.type == "cuda"
    try:
        torch.manual_seed(0)  # the same initialisation for the same model
        update = system.make_update(device)
        # contiguous, as a data loader gives them (the slices of random_batch are views)
        batches = [tuple(t.to(device).contiguous() for t in random_batch(system.shape, 1000 + i)) for i in range(4)]
        torch.manual_seed(1)  # the same dropout masks
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds, first_loss = [], float("nan")
        for i in range(warmup + updates):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            loss = update(batches[i % len(batches)])
            if cuda:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
            if i == 0:
                first_loss = float(loss)
        peak_mib = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    except Exception as exc:  # a compile error, out of memory: the row says so, the others still run
        return Row(system, error=one_line(exc))
    finally:
        update = None  # noqa: F841  (frees the model and optimizer before the next row)
        torch._dynamo.reset()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    median = statistics.median(seconds[warmup:])
    flops = train_flops(system.shape)
    tflops = flops / median / 1e12
    row = Row(
        system, 1000 * median, system.shape.tgt_tokens / median, tflops, tflops / peak_tflops, peak_mib, first_loss
    )
    print(f"  {system.label}: {row.ms:.1f} ms/update, {row.rate:,.0f} target tokens/s, MFU {row.mfu:.1%}", flush=True)
    return row


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> float:
    """TFLOP/s of `reps` (n x n) @ (n x n) products in `dtype`: the best of 3 timings after a warm-up."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for timed in (False, True, True, True):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        if timed:
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 * reps / best / 1e12


@dataclass(frozen=True)
class Report:
    """Everything main measured (what the summary shows)."""

    rows: list[Row]  # the model-only comparison
    loop: LoopResult | None
    loop_rows: list[Row]  # update() with the loop's settings: at the loop's vocabulary, then at the model-only one
    body: str  # the markdown summary


def model_table(rows: list[Row]) -> str:
    """The rows as a markdown table; a failed row shows its error."""
    lines = [
        "| system | ms / update | target tokens/s | TFLOP/s | MFU | peak memory | first loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.system.label} | failed: {r.error.replace('|', '/')} | | | | | |")
            continue
        memory = "n/a" if r.peak_mib is None else f"{r.peak_mib / 1024:.2f} GiB"
        lines.append(
            f"| {r.system.label} | {r.ms:.1f} | {r.rate:,.0f} | {r.tflops:.3g} | {r.mfu:.1%} | {memory} | {r.first_loss:.4f} |"
        )
    return "\n".join(lines)


def best_ratio(rows: list[Row]) -> str:
    """tformer's fastest row against the fastest peer row."""
    fastest = {}
    for family in ("tformer", "peer"):
        done = [r for r in rows if r.system.family == family and not r.error]
        if done:
            fastest[family] = max(done, key=lambda r: r.rate)
    if len(fastest) < 2:
        return "tformer / peers: n/a (no row of one side finished)"
    t, p = fastest["tformer"], fastest["peer"]
    return f"fastest tformer ({t.system.label}) / fastest peer ({p.system.label}): **{t.rate / p.rate:.2f}x**"


def loop_summary(
    loop: LoopResult, loop_rows: list[Row], model_rows: list[Row], shape: Shape, overrides: list[str]
) -> str:
    """The loop's rate, its fraction of update() with its settings, and the paper's 100,000 updates projected."""
    at_loop_vocab, at_shape_vocab = loop_rows[0], loop_rows[-1]
    tc = loop.config.train
    lines = [
        f"Real loop: `tformer train recipes/wmt14_base.yaml` through the library, {loop.updates} updates "
        f"(overrides: `{' '.join(overrides) or 'none'}`; train.compile={tc.compile}, train.loss_chunk={tc.loss_chunk}, "
        f"train.precision={tc.precision}, vocabulary {loop.vocab:,}). First update {loop.first_update_s:.1f} s after "
        f"the model was built; after it, median **{loop.rate:,.0f} target tokens/s**, {loop.ms_per_update:.1f} ms "
        f"between updates; {loop.tokens_per_update:,.0f} real target tokens per update (the mean over an epoch's "
        f"batches of train.max_tokens {tc.max_tokens:,} x update_freq {tc.update_freq}, padding and source excluded).",
        "",
        "tformer's update() on random batches of the model-only shape with the loop's model and settings "
        "(its optimizer, no fused Adam; the clip-norm check):",
        "",
        model_table(loop_rows),
        "",
    ]
    if at_loop_vocab.error or at_shape_vocab.error:
        return "\n".join([*lines, "No fraction or projection: an update() row failed."])
    scale = at_shape_vocab.rate / at_loop_vocab.rate
    hours = PAPER_UPDATES * loop.tokens_per_update / loop.rate / 3600
    lines += [
        f"- Loop / update() at vocabulary {loop.vocab:,}: **{loop.rate / at_loop_vocab.rate:.1%}**.",
        f"- Projected {PAPER_UPDATES:,} updates of {loop.tokens_per_update:,.0f} target tokens: **{hours:.1f} h** at the "
        f"loop's rate (vocabulary {loop.vocab:,}); **{hours / scale:.1f} h** at vocabulary {shape.vocab:,} (the loop's "
        f"rate x {scale:.3f}, update()'s rate at {shape.vocab:,} over its rate at {loop.vocab:,}).",
    ]
    fractions = [
        f"{row.system.label} {loop.rate * scale / row.rate:.1%}"
        for row in model_rows
        if row.system.family == "tformer" and not row.error
    ]
    if fractions:
        lines.append(
            f"- The loop at vocabulary {shape.vocab:,} as a fraction of the model-only rows: {'; '.join(fractions)}."
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, with the defaults of the mode (GPU or --smoke) filled in."""
    root = Path(__file__).parents[1]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU in fp32 (the code paths)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--compile",
        nargs="*",
        choices=["model", "model+loss"],
        default=["model", "model+loss"],
        help="the compiled model-only rows: torch.compile(model), and the model and loss compiled together",
    )
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled model-only rows")
    parser.add_argument(
        "--settings",
        nargs="*",
        help="tformer update() rows, each a quoted list of train.* settings "
        f"({' / '.join(TRAIN_SETTINGS)}; --no-compile: {' / '.join(EAGER_SETTINGS)}; none: no such row)",
    )
    parser.add_argument("--loss-chunk", type=int, help="linear_cross_entropy's tokens per piece (4096; smoke 32)")
    parser.add_argument("--warmup", type=int, help="untimed updates per row (5; smoke 2)")
    parser.add_argument("--updates", type=int, help="timed updates per row (20; smoke 3)")
    parser.add_argument("--only", choices=["model", "loop"], help="one part: the model-only rows, or the loop")
    parser.add_argument("--loop-updates", type=int, help="the loop's train.max_updates (300; smoke 20)")
    parser.add_argument("--loop-minutes", type=float, help="the loop's train.max_minutes, a bound (4; smoke 2)")
    parser.add_argument("--loop-overrides", nargs="*", default=[], help="key=value settings of the loop, last")
    parser.add_argument(
        "--data", type=Path, default=wmt14_sample(), help="the WMT14 sample ($TFORMER_DATA/wmt14-en-de)"
    )
    parser.add_argument("--work", type=Path, help="prepared data, kept (runs/gpu_train; smoke runs/gpu_train_smoke)")
    parser.add_argument("--write", action="store_true", help="write the summary into docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    smoke = args.smoke
    defaults = {
        "loss_chunk": 32 if smoke else 4096,
        "warmup": 2 if smoke else 5,
        "updates": 3 if smoke else 20,
        "loop_updates": 20 if smoke else 300,
        "loop_minutes": 2.0 if smoke else 4.0,
        "work": root / "runs" / ("gpu_train_smoke" if smoke else "gpu_train"),
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.settings is None:
        args.settings = EAGER_SETTINGS if args.no_compile else TRAIN_SETTINGS
    return args


def title(part: str, device: torch.device, peak: float, peak_dtype: str, args: argparse.Namespace) -> str:
    """A section's title, the command, the machine and the measured peak."""
    where = (
        f"GPU: **{torch.cuda.get_device_name(device)}**, CUDA {torch.version.cuda}"
        if device.type == "cuda"
        else "CPU (no GPU)"
    )
    return f"""## Training on one GPU: {part} (`bench/gpu_train.py`)

```bash
python bench/gpu_train.py {shlex.join(args.argv)}
```

{where}; {machine()}. Measured {peak_dtype} matmul peak: {peak:.3g} TFLOP/s."""


def model_section(rows: list[Row], shape: Shape, device: torch.device, args: argparse.Namespace) -> str:
    """What the model-only rows ran, their table and tformer's fastest over the fastest peer."""
    adam = "fused Adam" if device.type == "cuda" else "Adam"
    return f"""Model-only update: d_model {shape.d_model}, {shape.layers}+{shape.n_dec} layers, {shape.heads} heads, \
d_ff {shape.d_ff}, shared tied vocabulary {shape.vocab:,}, {shape.batch} sentences x {shape.src} source / {shape.tgt} \
target tokens ({shape.tgt_tokens:,} target tokens), label smoothing {SMOOTHING}, dropout {shape.dropout}, {adam}, \
{"fp32" if args.smoke else "bf16 autocast"}; {train_flops(shape) / 1e12:.3g} TFLOP per update (bench/_systems.py). \
Median of {args.updates} updates after {args.warmup} warm-up, one row after the other, the same seeds and batches.

{model_table(rows)}

{best_ratio(rows)}"""


def loop_part(
    args: argparse.Namespace, device: torch.device, shape: Shape, peak: float, model_rows: list[Row]
) -> tuple[LoopResult | None, list[Row], str]:
    """The real loop, then update() with its settings at its vocabulary and at `shape`'s; and their summary."""
    sizes = LOOP_SMOKE if args.smoke else LOOP_SAMPLE
    corpus = made_up_corpus(args.work / "corpus") if args.smoke else args.data
    loop = Loop(corpus, args.work, device, args.loop_updates, args.loop_minutes, (*sizes, *args.loop_overrides))
    try:
        result = run_loop(loop)
    except Exception as exc:  # the model-only rows are still worth printing
        print(f"real loop: FAILED: {one_line(exc)}", flush=True)
        return None, [], f"Real loop: FAILED: {one_line(exc)}"
    rows = []
    for vocab in dict.fromkeys((result.vocab, shape.vocab)):  # once if they are the same
        as_the_loop = loop_shape(result.config, vocab, shape)
        label = f"tformer update() as the loop, vocabulary {vocab:,}"
        system = System(label, "reference", as_the_loop, update_as_the_loop(result.config, as_the_loop))
        rows.append(measure(system, device, args.warmup, args.updates, peak))
    return result, rows, loop_summary(result, rows, model_rows, shape, list(loop.overrides))


def main(argv: list[str] | None = None) -> Report:
    """Run everything (see the module docstring); print the summary and return what was measured."""
    args = parse_args(argv)
    device = torch.device("cpu" if args.smoke else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"gpu_train: torch {torch.__version__} sees no CUDA device (--smoke or --device cpu: on the CPU)")
    if args.data is None and not args.smoke and args.only != "model":
        sys.exit(
            "gpu_train: the loop trains on the WMT14 sample: give --data DATA_ROOT/wmt14-en-de or set TFORMER_DATA"
        )
    shape, precision = (SMOKE, "fp32") if args.smoke else (PAPER, "bf16")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"gpu_train on {where}: torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    peak_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    n, reps = (8192, 50) if device.type == "cuda" else (1024 if not args.smoke else 256, 3)
    peak = matmul_peak(device, peak_dtype, n, reps)
    print(f"matmul peak ({n} x {n}, {peak_dtype}): {peak:.3g} TFLOP/s", flush=True)

    rows: list[Row] = []
    if args.only != "loop":
        compiled = [] if args.no_compile else [COMPILE_MODES[name] for name in args.compile]
        sizes = LOOP_SMOKE if args.smoke else ()
        settings = [shlex.split(setting) for setting in args.settings]
        for system in systems(shape, args.loss_chunk, ["eager", *compiled], precision, settings, sizes):
            rows.append(measure(system, device, args.warmup, args.updates, peak))
            if rows[-1].error:
                print(f"  {system.label}: FAILED: {rows[-1].error}", flush=True)
    dtype = str(peak_dtype).removeprefix("torch.")
    sections = {}
    if rows:
        sections["gpu_train"] = title("the model-only update", device, peak, dtype, args)
        sections["gpu_train"] += "\n\n" + model_section(rows, shape, device, args)

    result, loop_rows = None, []
    if args.only != "model":
        result, loop_rows, text = loop_part(args, device, shape, peak, rows)
        sections["gpu_train_loop"] = title("the real loop", device, peak, dtype, args) + "\n\n" + text
    body = "\n\n".join(sections.values()) + "\n"
    print("\n" + body)
    if "OUT" in os.environ:  # a results folder (bench/gpu_check.sh sets it)
        out = Path(os.environ["OUT"]) / f"gpu_train{'_' + args.only if args.only else ''}.md"
        out.write_text(body)
        print(f"(also in {out})")
    if args.write:
        for name, section in sections.items():
            if name == "gpu_train" or result is not None:  # a failed loop is printed, not written
                write_section(name, section)
    return Report(rows, result, loop_rows, body)


if __name__ == "__main__":
    main()
