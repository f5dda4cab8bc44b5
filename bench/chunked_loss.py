"""The output projection and loss whole (token_loss) vs in pieces (train.loss_chunk): peak memory and time.

    python bench/chunked_loss.py [--tokens 4096] [--vocab 16000] [--d-model 512] [--chunks 0,4096,1024,1024c]
                                 [--rounds 3]

Each setting runs in its own process (peak resident memory is per process): forward and backward of
the label-smoothed loss of `tokens` hidden states through a (vocab x d_model) output weight, in fp32 on
the CPU. Prints, per chunk size (0: the whole batch's logits; a "c" after the size: the pieces through
torch.compile, as train.compile runs them, after one untimed pass that compiles), the peak resident memory
above the inputs (a compiled row's includes the compiler's own), the median time of `rounds` passes, and
the ratios to the whole-batch row. Prints only.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def _one(tokens: int, vocab: int, d_model: int, setting: str, rounds: int) -> dict[str, float | str]:
    """Runs in the child process: the peak memory (MB above the inputs) and median seconds of one setting."""
    import torch

    from tformer_cli.metrics import token_loss
    from tformer_cli.train.loss import linear_cross_entropy

    chunk, compiled = int(setting.removesuffix("c")), setting.endswith("c")
    torch.manual_seed(0)
    hidden = torch.randn(tokens, d_model, requires_grad=True)
    weight = (torch.randn(vocab, d_model) / d_model**0.5).requires_grad_()
    targets = torch.randint(1, vocab, (tokens,))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB (Linux reports KB)
    seconds = []
    for _ in range(rounds + compiled):  # a compiled row's first pass compiles: untimed
        hidden.grad = weight.grad = None
        start = time.perf_counter()
        if chunk:
            loss, _ = linear_cross_entropy(hidden, weight, targets, 0.1, chunk, compiled)
        else:
            loss, _ = token_loss(hidden @ weight.T, targets, 0.1)
        loss.backward()
        seconds.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "chunk": setting,
        "peak_mb": peak - base,
        "seconds": statistics.median(seconds[compiled:]),
        "loss": float(loss),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--chunks", default="0,4096,1024,1024c")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(_one(args.tokens, args.vocab, args.d_model, args.child, args.rounds)))
        return
    rows = []
    for chunk in args.chunks.split(","):
        child = [sys.executable, __file__, f"--tokens={args.tokens}", f"--vocab={args.vocab}"]
        child += [f"--d-model={args.d_model}", f"--rounds={args.rounds}", f"--child={chunk}"]
        out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.tokens} tokens x vocabulary {args.vocab} x d_model {args.d_model}, fp32, CPU, forward + backward")
    print("| loss_chunk | peak memory above inputs (MB) | vs whole | seconds (median) | vs whole | loss |")
    print("|---:|---:|---:|---:|---:|---:|")
    whole = rows[0]
    for row in rows:
        print(
            f"| {'whole' if row['chunk'] == '0' else row['chunk']} | {row['peak_mb']:,.0f} | {row['peak_mb'] / whole['peak_mb']:.2f} "
            f"| {row['seconds']:.3f} | {row['seconds'] / whole['seconds']:.2f} | {row['loss']:.6f} |"
        )


if __name__ == "__main__":
    main()
