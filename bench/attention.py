"""Attention forward+backward, fast path (F.scaled_dot_product_attention) vs the written-out
reference, at T = 128 .. 2048; and cached vs uncached LM generation of 256 tokens. With --scores:
the four attention score functions (model.attention_score) in a multi-head attention layer.

    python bench/attention.py            # writes its section of docs/benchmarks.md
    python bench/attention.py --scores   # writes the score functions' section

Peak memory is measured in a fresh subprocess per cell: the process's peak resident set size
(VmHWM) during one forward+backward, minus its resident size just before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _report import bench_lm, machine, rss_kb, write_section  # noqa: E402

from tformer_cli.decoding.search import generate  # noqa: E402
from tformer_cli.decoding.settings import SearchSettings  # noqa: E402
from tformer_cli.model.attention import (  # noqa: E402
    MultiHeadAttention,
    attention_fast,
    attention_reference,
    reference_attention,
)

B, H, D_HEAD = 2, 8, 64
LENGTHS = [128, 256, 512, 1024, 2048]


def _inputs(t: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return tuple(torch.randn(B, H, t, D_HEAD, requires_grad=True) for _ in range(3))


def _step(path: str, q, k, v) -> None:
    if path == "fast":
        out = attention_fast(q, k, v, is_causal=True)
    else:
        causal = torch.ones(q.size(2), q.size(2), dtype=torch.bool).tril()
        out, _ = attention_reference(q, k, v, causal)
    out.sum().backward()


def measure_memory(path: str, t: int) -> None:
    """Subprocess entry: print the peak extra memory (MiB) of one forward+backward."""
    q, k, v = _inputs(t)
    before = rss_kb("VmRSS")
    _step(path, q, k, v)
    print(json.dumps({"peak_mib": (rss_kb("VmHWM") - before) / 1024}))


def time_attention(path: str, t: int, reps: int) -> float:
    q, k, v = _inputs(t)
    _step(path, q, k, v)  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        _step(path, q, k, v)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_of(path: str, t: int) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--memory", path, str(t)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def generation(n_new: int = 256) -> tuple[float, float]:
    model = bench_lm()
    prompt = torch.randint(1, 8000, (1, 16))
    result = {}
    for cached in (True, False):
        start = time.perf_counter()
        out = generate(model, prompt, SearchSettings(max_new_tokens=n_new, use_cache=cached))
        result[cached] = n_new / (time.perf_counter() - start)
        assert out.size(1) == 16 + n_new
    return result[True], result[False]


# --scores: one multi-head self-attention layer (projections included), CPU-sized
SCORE_B, SCORE_D, SCORE_H, SCORE_LENGTHS = 32, 256, 4, [32, 64]
MODEL_SCORES = ["scaled_dot", "dot", "general", "additive"]
SCORE_ROWS = [  # (label, model.attention_score, written-out reference path even for scaled_dot)
    ("scaled_dot (fused)", "scaled_dot", False),
    ("scaled_dot (written out)", "scaled_dot", True),
    ("dot", "dot", True),
    ("general", "general", True),
    ("additive", "additive", True),
]


def _score_layer(kind: str, reference: bool, t: int) -> tuple[MultiHeadAttention, torch.Tensor, bool]:
    torch.manual_seed(0)
    layer = MultiHeadAttention(SCORE_D, n_heads=SCORE_H, score=kind)
    return layer, torch.randn(SCORE_B, t, SCORE_D, requires_grad=True), reference


def _score_step(layer: MultiHeadAttention, x: torch.Tensor, reference: bool) -> None:
    layer.zero_grad(set_to_none=True)
    with reference_attention() if reference else nullcontext():
        layer(x).sum().backward()


def measure_score_memory(row: int, t: int) -> None:
    """Subprocess entry: print the peak extra memory (MiB) of one forward+backward of SCORE_ROWS[row]."""
    layer, x, reference = _score_layer(*SCORE_ROWS[row][1:], t)
    before = rss_kb("VmRSS")
    _score_step(layer, x, reference)
    print(json.dumps({"peak_mib": (rss_kb("VmHWM") - before) / 1024}))


def time_scores(t: int, reps: int) -> list[float]:
    """Median seconds of one forward+backward per row of SCORE_ROWS, the rows interleaved in each round."""
    cases = [_score_layer(kind, reference, t) for _, kind, reference in SCORE_ROWS]
    for layer, x, reference in cases:
        _score_step(layer, x, reference)  # warm-up
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(reps):
        for i, (layer, x, reference) in enumerate(cases):
            start = time.perf_counter()
            _score_step(layer, x, reference)
            times[i].append(time.perf_counter() - start)
    return [statistics.median(ts) for ts in times]


def time_models(t: int, reps: int) -> list[float]:
    """Median seconds of one training forward+backward of wmt14_small's model per score, interleaved."""
    from tformer_cli.model import build_model

    models = []
    for kind in MODEL_SCORES:
        torch.manual_seed(0)
        shape = dict(d_model=SCORE_D, n_heads=SCORE_H, n_layers=3, d_ff=4 * SCORE_D, norm_placement="pre")
        models.append(build_model("seq2seq", vocab_size=8000, share_all_embeddings=True, attention_score=kind, **shape))
    src, tgt = torch.randint(4, 8000, (SCORE_B, t)), torch.randint(4, 8000, (SCORE_B, t + 1))

    def step(model: torch.nn.Module) -> None:
        model.zero_grad(set_to_none=True)
        logits = model(src, tgt[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten()).backward()

    for model in models:
        step(model)  # warm-up
    times: list[list[float]] = [[] for _ in models]
    for _ in range(reps):
        for i, model in enumerate(models):
            start = time.perf_counter()
            step(model)
            times[i].append(time.perf_counter() - start)
    return [statistics.median(ts) for ts in times]


def scores_section(reps: int) -> None:
    load = os.getloadavg()[0]  # the machine is shared: say how busy it was
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (
        f"OMP_NUM_THREADS={threads} python bench/attention.py --scores"
        if threads
        else "python bench/attention.py --scores"
    )
    rows = [
        "| score | T | ms per forward+backward | tokens/s | speed / additive's | peak MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for t in SCORE_LENGTHS:
        seconds = time_scores(t, reps)
        additive = seconds[-1]
        for i, ((label, _, _), sec) in enumerate(zip(SCORE_ROWS, seconds, strict=True)):
            out = subprocess.run(
                [sys.executable, __file__, "--score-memory", str(i), str(t)], capture_output=True, text=True, check=True
            )
            peak = json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]
            rows.append(
                f"| {label} | {t} | {sec * 1e3:.1f} | {SCORE_B * t / sec:,.0f} | {additive / sec:.2f}x | {peak:.0f} |"
            )
            print(rows[-1], flush=True)
    model_rows = [
        "| score | T | ms per forward+backward | target tokens/s | speed / additive's |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in SCORE_LENGTHS:
        seconds = time_models(t, reps)
        for kind, sec in zip(MODEL_SCORES, seconds, strict=True):
            model_rows.append(
                f"| {kind} | {t} | {sec * 1e3:.0f} | {SCORE_B * t / sec:,.0f} | {seconds[-1] / sec:.2f}x |"
            )
            print(model_rows[-1], flush=True)
    body = f"""## Attention score functions (`bench/attention.py --scores`)

```bash
{command}
```

Machine: {machine()}; load average {load:.1f} when it started (other processes on the machine).

One multi-head self-attention layer (`model.attention_score`; Q/K/V and output projections included),
d_model {SCORE_D}, {SCORE_H} heads of width {SCORE_D // SCORE_H}, batch {SCORE_B}, no mask, float32,
forward+backward; median of {reps} interleaved rounds. tokens/s = batch x T / time. Only
scaled_dot has the fused kernels; "written out" is the same score on the reference path, which
the other three take. Peak memory: extra resident memory of one forward+backward in its own process.

{chr(10).join(rows)}

The whole model of `recipes/wmt14_small.yaml` (3 + 3 pre-LN layers, d_model {SCORE_D}, {SCORE_H} heads,
d_ff {4 * SCORE_D}, shared vocabulary of 8000, dropout 0.1), every attention layer (self and cross) with
the score, {SCORE_B} pairs of T source and T target tokens, cross-entropy forward+backward, same rounds:

{chr(10).join(model_rows)}

The additive score evaluates a tanh for each (query, key, dimension) and keeps it for the backward
pass, where the dot products do one multiply-add per (query, key, dimension) inside a matrix product;
its share of the time grows with T. The issue's "~1.4x the additive's speed" is the slides' whole-model
figure from the WMT bake-off (approximate, other hardware and lengths), not a measurement of this code.
"""
    print(body)
    write_section("attention_scores", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", nargs=2, metavar=("PATH", "T"), help=argparse.SUPPRESS)
    parser.add_argument("--score-memory", nargs=2, type=int, metavar=("ROW", "T"), help=argparse.SUPPRESS)
    parser.add_argument("--scores", action="store_true", help="the attention score functions' section")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.memory:
        measure_memory(args.memory[0], int(args.memory[1]))
        return
    if args.score_memory:
        measure_score_memory(*args.score_memory)
        return
    if args.scores:
        scores_section(args.reps)
        return
    rows = [
        "| T | fast ms | reference ms | speed-up | fast peak MiB | reference peak MiB | memory ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in LENGTHS:
        reps = args.reps if t <= 1024 else max(2, args.reps // 2)
        fast, ref = time_attention("fast", t, reps), time_attention("reference", t, reps)
        fast_mem, ref_mem = memory_of("fast", t), memory_of("reference", t)
        rows.append(
            f"| {t} | {fast * 1e3:.1f} | {ref * 1e3:.1f} | {ref / fast:.2f}x | {fast_mem:.0f} | {ref_mem:.0f} | "
            f"{ref_mem / max(fast_mem, 1e-9):.1f}x |"
        )
        print(rows[-1], flush=True)
    cached, uncached = generation()
    body = f"""## Attention and KV cache (`bench/attention.py`)

```bash
python bench/attention.py
```

Machine: {machine()}.

Causal self-attention forward+backward, batch {B}, {H} heads of width {D_HEAD}, float32; median of
{args.reps} runs (2 at T=2048). Peak memory: extra resident memory during one forward+backward,
each cell in its own process.

{chr(10).join(rows)}

LM generation of 256 new tokens after a 16-token prompt (6 layers, d_model 384, 6 heads, RoPE,
vocabulary 8000, batch 1, greedy): with the KV cache **{cached:.1f} tokens/s**, recomputing the
prefix every step **{uncached:.1f} tokens/s**: **{cached / uncached:.1f}x** faster with the cache.
"""
    print(body)
    write_section("attention", body)


if __name__ == "__main__":
    main()
