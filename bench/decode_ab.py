"""Decoding speed of two checkouts of tformer, interleaved in one run (did a change slow decoding?).

    git worktree add /tmp/before <commit>
    python bench/decode_ab.py /tmp/before .            # prints a table; writes nothing
    python bench/decode_ab.py /tmp/before . 9 greedy   # 9 rounds, only the rows whose name has "greedy"

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

ROUNDS = 5  # default

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
    if not any(sys.argv[2] in f"{search} {str(dtype)[6:]}" for search in ("beam 4", "greedy")):
        continue
    torch.manual_seed(0)
    model = build_model("seq2seq", vocab_size=8000, d_model=512, n_heads=8, n_layers=6, d_ff=2048,
                        dropout=0.0, share_all_embeddings=True).eval()
    cast_weights(model, dtype)
    pack_linears(model)
    torch.manual_seed(1)
    src = torch.randint(4, 8000, (100, 25))
    beam_search(model, src[:2], beam=4, a=0.0, b=N_OUT, min_len=N_OUT)  # warm-up
    for beam in (4, 1):
        name = f"{'beam 4' if beam > 1 else 'greedy'} {str(dtype)[6:]}"
        if sys.argv[2] not in name:
            continue
        start = time.perf_counter()
        for i in range(0, 100, 32):
            if beam == 1:
                greedy(model, src[i : i + 32], a=0.0, b=N_OUT, min_len=N_OUT)
            else:
                beam_search(model, src[i : i + 32], beam=beam, a=0.0, b=N_OUT, min_len=N_OUT)
        times[name] = time.perf_counter() - start
print(json.dumps(times))
"""


def run(checkout: Path, rows: str) -> dict[str, float]:
    command = [sys.executable, "-c", CHILD, str(checkout), rows]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    before, after = (Path(p).resolve() for p in sys.argv[1:3])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else ROUNDS
    rows = sys.argv[4] if len(sys.argv) > 4 else ""  # "": every row
    results: dict[Path, list[dict[str, float]]] = {before: [], after: []}
    for round_ in range(rounds):
        for checkout in (before, after) if round_ % 2 == 0 else (after, before):
            results[checkout].append(run(checkout, rows))
        print(f"round {round_ + 1} of {rounds} done", file=sys.stderr)
    print("| row (100 sentences x 30 tokens) | before s (median, range) | after s (median, range) | after / before |")
    print("|---|---:|---:|---:|")
    for key in results[before][0]:
        cells, medians = [], []
        for checkout in (before, after):
            times = [r[key] for r in results[checkout]]
            medians.append(statistics.median(times))
            cells.append(f"{medians[-1]:.3f} ({min(times):.3f}-{max(times):.3f})")
        print(f"| {key} | {cells[0]} | {cells[1]} | {medians[1] / medians[0]:.3f} |")
    print(f"before: {before}, after: {after}, {rounds} rounds (the order alternates each round)")


if __name__ == "__main__":
    main()
