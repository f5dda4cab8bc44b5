"""Where a batched decoding step spends its time: the shape and data of `bench/decode_speed.py`.

    python bench/decode_profile.py      # prints tables; docs/benchmarks.md quotes them

Profiles tformer (as `tformer translate` prepares it, fp32 and bf16 weights) translating 32
sentences, beam 4 and greedy, and groups PyTorch's operator times into linear layers, attention and
the rest; times a linear layer at decoding's row counts (`F.linear`, oneDNN's and MKL's packed
products); decodes 4 and 32 sentences with fp32 linear layers on MKL's packed product (tformer's)
and on oneDNN's; counts page faults with and without reusing key/value buffers; measures read
bandwidth by working-set size and thread count; times a product with its weights in cache and
from memory; times four ways to compute beam search's self-attention over
the shared key buffer; times decoding with the decoder's layer norms or its attention taken out (what
each costs); and compares tformer with Hugging Face on one batch of 32 and one of 4 sentences.
"""

from __future__ import annotations

import itertools
import math
import resource
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from unittest.mock import patch

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from decode_speed import SRC_LEN, VOCAB, hf_model, run_hf, run_tformer, seq2seq_model  # noqa: E402

import tformer_cli.decoding.packed as packed_module  # noqa: E402
import tformer_cli.model.attention as attention_module  # noqa: E402
from tformer_cli.decoding.cache import pool_for  # noqa: E402
from tformer_cli.decoding.packed import PackedLinear, packing_available  # noqa: E402

GROUPS = {
    "linear layers (GEMM)": ("mkl::_mkl_linear", "mkldnn::_linear_pointwise", "aten::addmm", "aten::mm"),
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


def _cycled_us(products: list) -> float:
    """Best time per call of the zero-argument callables `products`, called in turn."""
    turn = itertools.cycle(products)
    return best_us(lambda: next(turn)())


def linear_times() -> None:
    """One linear layer (512 -> 2048, and the 512 -> 8000 output layer): F.linear vs packed products.

    Each timing cycles through COPIES layers with different weights, so that, as in decoding, the
    weights come from memory rather than from the core's cache.
    """
    copies = 12
    print(
        "\n| rows | out | fp32 F.linear us | fp32 oneDNN packed us | fp32 MKL packed (tformer) us "
        "| bf16 F.linear us | bf16 oneDNN packed (tformer) us |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for out in (2048, 8000):
            fp32 = [torch.nn.Linear(512, out) for _ in range(copies)]
            bf16 = [torch.nn.Linear(512, out).to(torch.bfloat16) for _ in range(copies)]
            onednn = [torch.ops.mkldnn._reorder_linear_weight(linear.weight, 128) for linear in fp32]
            packed, packed_bf16 = [PackedLinear(linear) for linear in fp32], [PackedLinear(linear) for linear in bf16]
            for rows in (1, 4, 8, 32, 128):
                x, xb = torch.randn(rows, 512), torch.randn(rows, 512, dtype=torch.bfloat16)
                variants = [
                    [partial(linear, x) for linear in fp32],
                    [
                        partial(torch.ops.mkldnn._linear_pointwise, x, w, linear.bias, "none", [], "")
                        for w, linear in zip(onednn, fp32, strict=True)
                    ],
                    [partial(linear, x) for linear in packed],
                    [partial(linear, xb) for linear in bf16],
                    [partial(linear, xb) for linear in packed_bf16],
                ]
                cells = [f"{_cycled_us(products):.0f}" for products in variants]
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


def memory_bandwidth() -> None:
    """Read bandwidth by working-set size and thread count: where the decoder's weights come from."""
    threads = torch.get_num_threads()
    counts = sorted({1, threads})
    print("\n| working set MB | " + " | ".join(f"read GB/s, {n} thread{'s' * (n > 1)}" for n in counts) + " |")
    print("|---:|" + "---:|" * len(counts))
    with torch.inference_mode():
        for mb in (2, 16, 64, 128, 512):
            data = torch.randn(mb * 2**20 // 4)
            calls = max(3, 1024 // mb)
            cells = []
            for n in counts:
                torch.set_num_threads(n)
                cells.append(f"{mb / 1024 / (best_us(data.sum, calls=calls, repeats=3) / 1e6):.0f}")
            torch.set_num_threads(threads)
            print(f"| {mb} | " + " | ".join(cells) + " |")


def product_hot_vs_memory() -> None:
    """MKL's packed 512 -> 2048 product with its weights in the core's cache (one weight, called again
    and again) and from memory (cycling through 24 weights, 96 MB, as decoding does), 1 and 2 threads.
    Equal times would mean reading overlaps arithmetic; the difference is the time spent waiting."""
    threads = torch.get_num_threads()
    weights = [torch.randn(2048, 512) for _ in range(24)]
    print("\n| threads | rows | weights in cache us | weights from memory us | waiting |")
    print("|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            for rows in (4, 32, 128):
                x = torch.randn(rows, 512)
                packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in weights]
                products = [
                    partial(torch.ops.mkl._mkl_linear, x, p, w, None, rows)
                    for p, w in zip(packed, weights, strict=True)
                ]
                hot, cold = _cycled_us(products[:1]), _cycled_us(products)
                print(f"| {n} | {rows} | {hot:.0f} | {cold:.0f} | {1 - hot / cold:.0%} |")
    torch.set_num_threads(threads)


def products_end_to_end() -> None:
    """tformer decoding with fp32 linear layers on MKL's packed GEMM (the default) vs oneDNN's."""
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (32, SRC_LEN))
    models = {}
    for mkl in (False, True):
        with patch.object(packed_module, "mkl_packing_available", lambda mkl=mkl: mkl and packing_available()):
            models[mkl] = seq2seq_model()
            run_tformer(models[mkl], src[:2], 4, 2, True)  # packs the weights
    print("\n| search | sentences | rows | oneDNN packed s | MKL packed (tformer) s | MKL / oneDNN |")
    print("|---|---:|---:|---:|---:|---:|")
    for beam, n in ((1, 4), (1, 32), (4, 4), (4, 32)):
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(5):  # interleaved, median of 5
            for mkl, model in models.items():
                times[mkl].append(run_tformer(model, src[:n], beam, n, True))
        onednn, mkl = (statistics.median(times[key]) for key in (False, True))
        name = "beam 4" if beam > 1 else "greedy"
        print(f"| {name} | {n} | {n * beam} | {onednn:.3f} | {mkl:.3f} | {mkl / onednn:.2f} |")


def page_faults() -> None:
    """Minor page faults and time of one 32-sentence batch, with the model's key/value buffer pool and without."""
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (32, SRC_LEN))
    models = {True: seq2seq_model(), False: seq2seq_model()}
    pool_for(models[False]).capacity = 0  # nothing kept: every batch allocates fresh buffers
    print("\n| search | buffers | minor page faults | s |")
    print("|---|---|---:|---:|")
    for beam in (4, 1):
        for pooled, model in models.items():
            run_tformer(model, src, beam, 32, True)  # warm-up (and fills the pool)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            seconds = run_tformer(model, src, beam, 32, True)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            name = "beam 4" if beam > 1 else "greedy"
            print(f"| {name} | {'reused (tformer)' if pooled else 'fresh'} | {faults:,} | {seconds:.2f} |")


@contextmanager
def _skipping_decoder_attention(model):
    """Within it, the decoder's attention calls return their queries: no keys or values are read.

    The encoder's attention still runs (the decoder's forward hooks switch the skipping on and off).
    """
    inside = {"decoder": False}
    real = attention_module.attention_fast

    def attention(q, k, v, *args, **kwargs):
        return q if inside["decoder"] else real(q, k, v, *args, **kwargs)

    hooks = [
        model.decoder.register_forward_pre_hook(lambda *_: inside.update(decoder=True)),
        model.decoder.register_forward_hook(lambda *_: inside.update(decoder=False)),
    ]
    try:
        with patch.object(attention_module, "attention_fast", attention):
            yield
    finally:
        for hook in hooks:
            hook.remove()


def without_parts() -> None:
    """32 sentences decoded as usual, without the decoder's layer norms, without its attention, without both.

    Not a translation any more (the numbers change), but the same work otherwise: every sentence still
    gets exactly N_OUT tokens. The time each removal saves bounds what fusing or speeding up that part
    could save.
    """
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (32, SRC_LEN))
    models = {False: seq2seq_model(), True: seq2seq_model()}  # keyed by "layer norms removed"
    for block in models[True].decoder.blocks:
        block.self_attn_norm, block.cross_attn_norm, block.ffn_norm = nn.Identity(), nn.Identity(), nn.Identity()
    configs = [(no_norm, no_attention) for no_attention in (False, True) for no_norm in (False, True)]
    print("\n| search | as is s | no layer norms s | no attention s | neither s |")
    print("|---|---:|---:|---:|---:|")
    for beam in (1, 4):
        times: dict[tuple[bool, bool], list[float]] = {config: [] for config in configs}
        for round_ in range(6):  # interleaved; the first round is a warm-up
            for no_norm, no_attention in configs:
                with _skipping_decoder_attention(models[no_norm]) if no_attention else nullcontext():
                    seconds = run_tformer(models[no_norm], src, beam, 32, True)
                if round_ > 0:
                    times[(no_norm, no_attention)].append(seconds)
        cells = " | ".join(f"{statistics.median(times[config]):.3f}" for config in configs)
        print(f"| {'beam 4' if beam > 1 else 'greedy'} | {cells} |")


def batches_vs_hugging_face() -> None:
    """tformer and Hugging Face `generate` (fp32) on one batch of 32 sentences and one of 4 (the last
    batch of `bench/decode_speed.py`'s 100), median of 5 interleaved runs."""
    hf = hf_model()
    if hf is None:
        print("\n(Hugging Face transformers is not installed: no per-batch comparison)")
        return
    model = seq2seq_model()
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (32, SRC_LEN))
    run_tformer(model, src[:2], 4, 2, True)
    run_hf(hf, src[:2], 4, 2)
    print("\n| search | sentences | tformer s | Hugging Face s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for beam, n in ((1, 32), (1, 4), (4, 32), (4, 4)):
        ours, theirs = [], []
        for _ in range(5):
            ours.append(run_tformer(model, src[:n], beam, n, True))
            theirs.append(run_hf(hf, src[:n], beam, n))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"| {'beam 4' if beam > 1 else 'greedy'} | {n} | {a:.3f} | {b:.3f} | {b / a:.2f} |")


def main() -> None:
    operator_shares()
    linear_times()
    products_end_to_end()
    page_faults()
    memory_bandwidth()
    product_hot_vs_memory()
    beam_attention_alternatives()
    without_parts()
    batches_vs_hugging_face()


if __name__ == "__main__":
    main()
