"""Where a batched decoding step spends its time: the shape and data of `bench/decode_speed.py`.

    python bench/decode_profile.py      # prints a table; docs/benchmarks.md quotes it

Profiles tformer (as `tformer translate` prepares it) translating 32 sentences, beam 4 and greedy,
and groups PyTorch's operator times into linear layers, attention and the rest; then times one
linear layer (512 -> 2048) at decoding's row counts, `F.linear` against the packed weights.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from decode_speed import SRC_LEN, VOCAB, run_tformer, seq2seq_model  # noqa: E402

from tformer_cli.model.packed import PackedLinear  # noqa: E402

GROUPS = {
    "linear layers (GEMM)": ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm"),
    "attention (sdpa)": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
}


def main() -> None:
    model = seq2seq_model()
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (32, SRC_LEN))
    run_tformer(model, src[:2], 4, 2, True)  # warm-up
    print("| search | wall s | " + " | ".join(GROUPS) + " | other operators |")
    print("|---|---:|" + "---:|" * (len(GROUPS) + 1))
    for beam in (4, 1):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            wall = run_tformer(model, src, beam, 32, True)
        self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
        total = sum(self_us.values())
        shares = [sum(self_us.get(op, 0) for op in ops) / total for ops in GROUPS.values()]
        cells = " | ".join(f"{s:.0%}" for s in shares)
        print(f"| {'beam 4' if beam > 1 else 'greedy'} | {wall:.2f} | {cells} | {1 - sum(shares):.0%} |")
    linear = torch.nn.Linear(512, 2048)
    packed = PackedLinear(linear)
    print("\n| rows | F.linear us | packed us |\n|---:|---:|---:|")
    with torch.inference_mode():
        for rows in (1, 4, 32, 128):
            x = torch.randn(rows, 512)
            times = []
            for f in (linear, packed):
                for _ in range(20):
                    f(x)
                start = time.perf_counter()
                for _ in range(500):
                    f(x)
                times.append((time.perf_counter() - start) / 500 * 1e6)
            print(f"| {rows} | {times[0]:.0f} | {times[1]:.0f} |")


if __name__ == "__main__":
    main()
