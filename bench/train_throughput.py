"""Training throughput of one encoder-decoder shape: tformer vs torch.nn.Transformer vs Hugging Face.

    python bench/train_throughput.py [--rounds 3]      # writes its section of docs/benchmarks.md

Shape: d_model 512, 6+6 layers, 8 heads, d_ff 2048, a shared tied vocabulary of 8000, batches of 144
sentences of 27 source / 28 target tokens, label smoothing 0.1, Adam. Systems run interleaved (one
timed update each per round, after a warm-up update) so that machine noise hits all alike. Model FLOPs
utilisation is against peaks measured here with a large matmul (fp32 and bf16). The bf16 check trains
tformer 20 updates in fp32 and in bf16 from the same initialisation on the same batches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, write_section  # noqa: E402
from _systems import Shape, TorchNN, marian, random_batch, tformer, train_flops  # noqa: E402

SHAPE = Shape(d_model=512, layers=6, heads=8, d_ff=2048, vocab=8000, batch=144, src=27, tgt=28)


def make_step(kind: str, bf16: bool, seed: int = 0) -> tuple[Callable[[int], float], nn.Module]:
    """A function running one Adam update on batch `i`, returning the loss."""
    torch.manual_seed(seed)
    if kind == "tformer":
        model: nn.Module = tformer(SHAPE)

        def logits_of(src, tgt_in):
            return model(src, tgt_in)
    elif kind == "torch.nn":
        model = TorchNN(SHAPE)

        def logits_of(src, tgt_in):
            return model(src, tgt_in)
    else:
        model = marian(SHAPE)

        def logits_of(src, tgt_in):
            return model(input_ids=src, decoder_input_ids=tgt_in).logits

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    batches = [random_batch(SHAPE, i) for i in range(4)]
    model.train()

    def step(i: int) -> float:
        src, tgt_in, tgt_out = batches[i % len(batches)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = logits_of(src, tgt_in)
        loss = F.cross_entropy(
            logits.float().reshape(-1, SHAPE.vocab), tgt_out.reshape(-1), label_smoothing=0.1, ignore_index=0
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step, model


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    systems = [("tformer", False), ("tformer", True), ("torch.nn", False), ("torch.nn", True)]
    if marian(SHAPE) is not None:
        systems += [("hf-marian", False)]
    steps = {s: make_step(*s)[0] for s in systems}
    for s in systems:  # warm-up
        steps[s](0)
    times: dict[tuple[str, bool], list[float]] = {s: [] for s in systems}
    for r in range(args.rounds):
        for s in systems:
            start = time.perf_counter()
            steps[s](r + 1)
            times[s].append(time.perf_counter() - start)
            print(
                f"round {r + 1} {s[0]} {'bf16' if s[1] else 'fp32'}: {SHAPE.tgt_tokens / times[s][-1]:.0f} tgt tok/s",
                flush=True,
            )
    del steps
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)
    flops = train_flops(SHAPE)
    rate = {s: [SHAPE.tgt_tokens / t for t in times[s]] for s in systems}
    fastest_fp32_ref = max(statistics.median(rate[s]) for s in systems if s[0] != "tformer" and not s[1])
    rows = []
    for s in systems:
        med = statistics.median(rate[s])
        peak = peak16 if s[1] else peak32
        mfu = flops / statistics.median(times[s]) / 1e9 / peak
        rows.append(
            f"| {s[0]} | {'bf16 autocast' if s[1] else 'fp32'} | {med:,.0f} "
            f"| {min(rate[s]):,.0f}-{max(rate[s]):,.0f} | "
            f"{mfu:.0%} | {med / fastest_fp32_ref:.2f}x |"
        )
    # bf16 vs fp32 loss after 20 updates, same init and batches
    step32, _ = make_step("tformer", False, seed=1)
    step16, _ = make_step("tformer", True, seed=1)
    loss32 = [step32(i) for i in range(20)][-1]
    loss16 = [step16(i) for i in range(20)][-1]
    tf32, tf16, nn16 = (statistics.median(rate[s]) for s in (("tformer", False), ("tformer", True), ("torch.nn", True)))
    body = f"""## Training throughput (`bench/train_throughput.py`)

```bash
python bench/train_throughput.py --rounds {args.rounds}
```

Machine: {machine()}. Measured matmul peaks: fp32 {peak32:.0f} GFLOP/s, bf16 {peak16:.0f} GFLOP/s (2048x2048).

Encoder-decoder, d_model 512, 6+6 layers, 8 heads, d_ff 2048, shared tied vocabulary 8000, 144 sentences
of 27 source / 28 target tokens per batch, label smoothing 0.1, Adam; {args.rounds} interleaved rounds
after a warm-up. MFU: {flops / 1e9:.0f} GFLOP per update against the peak of the same precision.
Ratio: against the fastest fp32 reference ({fastest_fp32_ref:,.0f} target tokens/s).

| system | precision | target tokens/s (median) | min-max | MFU | ratio to fastest fp32 reference |
|---|---|---:|---:|---:|---:|
{chr(10).join(rows)}

tformer bf16 / torch.nn bf16: **{tf16 / nn16:.2f}x**. tformer fp32 / fastest fp32 reference:
**{tf32 / fastest_fp32_ref:.2f}x**; tformer bf16 / fastest fp32 reference: **{tf16 / fastest_fp32_ref:.2f}x**.
Loss after 20 updates from the same initialisation: fp32 {loss32:.4f}, bf16 {loss16:.4f}
({abs(loss16 - loss32) / loss32:.2%} apart).
"""
    print(body)
    write_section("train_throughput", body)


if __name__ == "__main__":
    main()
