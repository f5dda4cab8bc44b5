"""Where a batched decoding step spends its time: the shape and data of `bench/decode_speed.py`.

    python bench/decode_profile.py      # prints a table; docs/benchmarks.md quotes it

Profiles tformer (as `tformer translate` prepares it, fp32 and bf16 weights) translating 32
sentences, beam 4 and greedy, and groups PyTorch's operator times into linear layers, attention and the rest; times a linear
layer at decoding's row counts, `F.linear` against the packed weights; and times four ways to
compute beam search's self-attention over the shared key buffer.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from decode_speed import SRC_LEN, VOCAB, run_tformer, seq2seq_model  # noqa: E402

from tformer_cli.model.packed import PackedLinear  # noqa: E402

GROUPS = {
    "linear layers (GEMM)": ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm"),
    "attention (sdpa)": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
}


def best_us(f, *args, calls: int = 200, repeats: int = 5) -> float:
    """Best of `repeats` runs of `calls` calls of f(*args), in microseconds per call."""
    for _ in range(10):
        f(*args)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            f(*args)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def operator_shares() -> None:
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (32, SRC_LEN))
    print("| search | weights | wall s | " + " | ".join(GROUPS) + " | other operators |")
    print("|---|---|---:|" + "---:|" * (len(GROUPS) + 1))
    for dtype in (torch.float32, torch.bfloat16):
        model = seq2seq_model(dtype)
        run_tformer(model, src[:2], 4, 2, True)  # warm-up
        for beam in (4, 1):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                wall = run_tformer(model, src, beam, 32, True)
            self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
            total = sum(self_us.values())
            shares = [sum(self_us.get(op, 0) for op in ops) / total for ops in GROUPS.values()]
            cells = " | ".join(f"{s:.0%}" for s in shares)
            name = "beam 4" if beam > 1 else "greedy"
            print(f"| {name} | {str(dtype).removeprefix('torch.')} | {wall:.2f} | {cells} | {1 - sum(shares):.0%} |")


def linear_times() -> None:
    """One linear layer (512 -> 2048, and the 512 -> 8000 output layer): F.linear vs PackedLinear."""
    print("\n| rows | out | fp32 F.linear us | fp32 packed us | bf16 F.linear us | bf16 packed us |")
    print("|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for out in (2048, 8000):
            layers = {}
            for dtype in (torch.float32, torch.bfloat16):
                linear = torch.nn.Linear(512, out).to(dtype)
                layers[dtype] = (linear, PackedLinear(linear))
            for rows in (1, 4, 8, 32, 128):
                cells = []
                for dtype, (linear, packed) in layers.items():
                    x = torch.randn(rows, 512, dtype=dtype)
                    cells += [f"{best_us(linear, x):.0f}", f"{best_us(packed, x):.0f}"]
                print(f"| {rows} | {out} | " + " | ".join(cells) + " |")


def _masked(q, keys, values, mask):  # tformer's way (BeamKVCache): all K x t keys, masked to ancestors
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def _explicit(q, keys, values, additive):
    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.size(-1)) + additive
    return scores.softmax(-1) @ values


def _gathered(q, keys, values, flat):  # each hypothesis' own t keys first, then attention over t
    n, heads, k, d = q.shape
    own_k = keys.gather(2, flat).view(n, heads, k, -1, d)
    own_v = values.gather(2, flat).view(n, heads, k, -1, d)
    return F.scaled_dot_product_attention(q.unsqueeze(3), own_k, own_v).squeeze(3)


def beam_attention_alternatives() -> None:
    """Beam 4 self-attention of one layer, 32 sentences x 8 heads, t steps cached: four ways."""
    n, heads, d, k = 32, 8, 64, 4
    print(
        "\n| weights | steps t | bool mask (tformer) us | float mask us | matmul-softmax-matmul us "
        "| gather own keys + sdpa us |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    torch.manual_seed(0)
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            for t in (8, 16, 30):
                keys = torch.randn(n, heads, t, k, d, dtype=dtype).flatten(2, 3)  # (B, H, t*K, d): BeamKVCache
                values = torch.randn(n, heads, t, k, d, dtype=dtype).flatten(2, 3)
                q = torch.randn(n, heads, k, d, dtype=dtype)  # a sentence's K hypotheses are its queries
                ancestry = torch.randint(0, k, (n * k, t))
                mask = F.one_hot(ancestry, k).bool().view(n, k, t * k).unsqueeze(1)  # (B, 1, K, t*K)
                additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))
                flat = (torch.arange(t) * k + ancestry).view(n, 1, k * t, 1).expand(n, heads, k * t, d)
                reference = _masked(q, keys, values, mask).float()
                for other in (_explicit(q, keys, values, additive), _gathered(q, keys, values, flat)):
                    assert torch.allclose(other.float(), reference, atol=2e-2)  # the same attention
                times = [
                    best_us(_masked, q, keys, values, mask),
                    best_us(_masked, q, keys, values, additive),
                    best_us(_explicit, q, keys, values, additive),
                    best_us(_gathered, q, keys, values, flat),
                ]
                name = str(dtype).removeprefix("torch.")
                print(f"| {name} | {t} | " + " | ".join(f"{x:.0f}" for x in times) + " |")


def main() -> None:
    operator_shares()
    linear_times()
    beam_attention_alternatives()


if __name__ == "__main__":
    main()
