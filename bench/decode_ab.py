"""Decoding speed of two checkouts of tformer, interleaved in one run (did a change slow decoding?).

    git worktree add /tmp/before <commit>
    python bench/decode_ab.py /tmp/before .            # prints a table; writes nothing

Each round runs, for each checkout in turn, one fresh process that times `bench/decode_speed.py`'s
batched rows (WMT14-base shape, random weights, 100 sentences of 25 tokens, exactly 30 output tokens,
batches of 32: beam 4 and greedy, fp32 and bf16 weights) with that checkout's code. The table gives
the median over the rounds and the ratio after / before.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROUNDS = 5

CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
import tformer_cli
assert tformer_cli.__file__.startswith(sys.argv[1]), tformer_cli.__file__  # this checkout's code, not another
try:
    from tformer_cli.decoding.search import beam_search, greedy
    from tformer_cli.decoding.packed import pack_linears
except ImportError:  # before the decoding/ package
    from tformer_cli.beam import beam_search, greedy
    from tformer_cli.model.packed import pack_linears
try:
    from tformer_cli.run import cast_weights
except ImportError:
    from tformer_cli.inference import cast_weights
from tformer_cli.model import build_model

N_OUT = 30
times = {}
for dtype in (torch.float32, torch.bfloat16):
    torch.manual_seed(0)
    model = build_model("seq2seq", vocab_size=8000, d_model=512, n_heads=8, n_layers=6, d_ff=2048,
                        dropout=0.0, share_all_embeddings=True).eval()
    cast_weights(model, dtype)
    pack_linears(model)
    torch.manual_seed(1)
    src = torch.randint(4, 8000, (100, 25))
    beam_search(model, src[:2], beam=4, a=0.0, b=N_OUT, min_len=N_OUT)  # warm-up
    for beam in (4, 1):
        start = time.perf_counter()
        for i in range(0, 100, 32):
            if beam == 1:
                greedy(model, src[i : i + 32], a=0.0, b=N_OUT, min_len=N_OUT)
            else:
                beam_search(model, src[i : i + 32], beam=beam, a=0.0, b=N_OUT, min_len=N_OUT)
        times[f"{'beam 4' if beam > 1 else 'greedy'} {str(dtype)[6:]}"] = time.perf_counter() - start
print(json.dumps(times))
"""


def run(checkout: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(checkout)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    before, after = (Path(p).resolve() for p in sys.argv[1:3])
    results: dict[Path, list[dict[str, float]]] = {before: [], after: []}
    for round_ in range(ROUNDS):
        for checkout in (before, after) if round_ % 2 == 0 else (after, before):
            results[checkout].append(run(checkout))
        print(f"round {round_ + 1} of {ROUNDS} done", file=sys.stderr)
    print(f"| row (100 sentences x 30 tokens) | before s | after s | after / before |  ({before} vs {after})")
    print("|---|---:|---:|---:|")
    for key in results[before][0]:
        b, a = (statistics.median(r[key] for r in results[c]) for c in (before, after))
        print(f"| {key} | {b:.3f} | {a:.3f} | {a / b:.3f} |")


if __name__ == "__main__":
    main()
