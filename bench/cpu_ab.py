"""CPU speed, this checkout against an earlier revision: training and decoding, the same work in each, interleaved.

    python bench/cpu_ab.py --before 5625201 [--rounds 5]    # 5625201: the last commit before the GPU issues

Issue 19's "CPU training speed does not regress" and issue 20's "CPU decoding unchanged". Each measurement runs in
a fresh process per tree and round, the trees alternating (before, after, before, after, ...), so that the
machine's drift falls on both:
- model: one fp32 update (forward, label-smoothed loss, backward, Adam) of tformer's model at
  bench/train_throughput.py's shape (d_model 512, 6+6 layers, vocabulary 8,000, 144 sentences of 27 / 28 tokens),
  built by each tree's own `tformer_cli.model.build_model` from the same seed, on the same random batch;
  one warm-up update, then --updates timed; target tokens/s.
- loop: each tree's `tformer train recipes/tiny_classifier.yaml` for --loop-updates updates on one thread (a tiny
  model: the loop's own cost per update shows), the median examples/s of its metrics.jsonl records after the first;
  19,500 training examples in one epoch, so that no validation or checkpoint falls among the timed updates.
- decode: bench/decode_speed.py's translation setting with each tree's code: a random model of the base shape
  (vocabulary 8,000, fp32, its linear layers packed as `tformer translate` packs them), 32 sentences of 25
  tokens, exactly 30 output tokens each, greedy and beam 4 (decoding/search.py, the CPU's path); tokens/s.
The earlier revision is checked out with `git worktree add` into a temporary folder (removed after). Prints a
table of medians and min-max, after / before of the medians and of the best (on a machine shared with others the
best is the steadier); nothing is written to docs/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).parents[1]

MODEL = r"""
import sys, time, json
sys.path.insert(0, sys.argv[1])
import torch, torch.nn.functional as F
from tformer_cli.model import build_model
B, S, T, V, updates = 144, 27, 28, 8000, int(sys.argv[2])
torch.manual_seed(0)
model = build_model("seq2seq", vocab_size=V, d_model=512, n_heads=8, n_layers=6, d_ff=2048, dropout=0.1,
                    share_all_embeddings=True).train()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
g = torch.Generator().manual_seed(1)
src, tgt = torch.randint(4, V, (B, S), generator=g), torch.randint(4, V, (B, T + 1), generator=g)
times = []
for i in range(updates + 1):
    start = time.perf_counter()
    logits = model(src, tgt[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, V), tgt[:, 1:].reshape(-1), label_smoothing=0.1, ignore_index=0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
print(json.dumps([B * T / t for t in times[1:]]))
"""


DECODE = r"""
import sys, time, json
sys.path.insert(0, sys.argv[1])
import torch
from tformer_cli.decoding.packed import pack_linears
from tformer_cli.decoding.search import beam_search, greedy
from tformer_cli.model import build_model
torch.manual_seed(0)
model = build_model("seq2seq", vocab_size=8000, d_model=512, n_heads=8, n_layers=6, d_ff=2048, dropout=0.0,
                    share_all_embeddings=True).eval()
pack_linears(model)
src = torch.randint(4, 8000, (32, 25), generator=torch.Generator().manual_seed(1))
greedy(model, src[:4], a=0.0, b=30, min_len=30)  # warm-up
rates = {}
for beam in (1, 4):
    start = time.perf_counter()
    if beam == 1:
        assert all(len(h.tokens) == 30 for h in greedy(model, src, a=0.0, b=30, min_len=30))
    else:
        assert all(len(h[0].tokens) == 30 for h in beam_search(model, src, beam=4, a=0.0, b=30, min_len=30))
    rates[beam] = 32 * 30 / (time.perf_counter() - start)
print(json.dumps(rates))
"""


def decode_rates(tree: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", DECODE, str(tree)], capture_output=True, text=True, check=True, cwd=tree
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def model_rates(tree: Path, updates: int) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", MODEL, str(tree), str(updates)], capture_output=True, text=True, check=True, cwd=tree
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def loop_rate(tree: Path, updates: int, work: Path) -> float:
    out_dir = work / f"loop-{tree.name}-{len(list(work.glob('loop-*')))}"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(
        [
            sys.executable, "-m", "tformer_cli", "train", "recipes/tiny_classifier.yaml", f"run.out_dir={out_dir}",
            f"train.max_updates={updates}", "train.log_every=10", "train.valid_every=0", "run.threads=1",
            "train.epochs=1", "data.pattern.n_examples=20000", "data.pattern.n_train=19500",
        ],
        capture_output=True, text=True, check=True, cwd=tree, env=env,
    )  # fmt: skip
    records = [json.loads(line) for line in (out_dir / "tiny_classifier" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["examples_per_s"] for r in records if r.get("split") == "train"][1:]
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the earlier revision (a commit, a tag)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=2, help="timed model updates per process")
    parser.add_argument("--loop-updates", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=ROOT, check=True)
        try:
            trees = {"before": before, "after": ROOT}
            model: dict[str, list[float]] = {name: [] for name in trees}
            loop: dict[str, list[float]] = {name: [] for name in trees}
            greedy: dict[str, list[float]] = {name: [] for name in trees}
            beam: dict[str, list[float]] = {name: [] for name in trees}
            for r in range(args.rounds):
                for name, tree in trees.items():
                    model[name] += model_rates(tree, args.updates)
                    loop[name].append(loop_rate(tree, args.loop_updates, Path(tmp)))
                    decoded = decode_rates(tree)
                    greedy[name].append(decoded["1"])
                    beam[name].append(decoded["4"])
                    print(f"round {r + 1} {name}: model {model[name][-1]:,.0f} target tokens/s, "
                          f"loop {loop[name][-1]:,.0f} examples/s, greedy {greedy[name][-1]:,.0f} and beam 4 "
                          f"{beam[name][-1]:,.0f} tokens/s", flush=True)  # fmt: skip
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    print(f"\nbefore = {args.before}, after = this checkout; {args.rounds} rounds, interleaved\n")
    print("| measurement | before: median (min-max) | after: median (min-max) | after / before: medians | best |")
    print("|---|---:|---:|---:|---:|")
    for what, values, unit in (
        ("model update, fp32", model, "target tokens/s"),
        ("tiny_classifier loop", loop, "examples/s"),
        ("greedy, 32 sentences, fp32", greedy, "tokens/s"),
        ("beam 4, 32 sentences, fp32", beam, "tokens/s"),
    ):
        b, a = statistics.median(values["before"]), statistics.median(values["after"])
        cells = [
            f"{statistics.median(v):,.0f} ({min(v):,.0f}-{max(v):,.0f}) {unit}"
            for v in (values["before"], values["after"])
        ]
        best = max(values["after"]) / max(values["before"])
        print(f"| {what} | {cells[0]} | {cells[1]} | {a / b:.3f} | {best:.3f} |")


if __name__ == "__main__":
    main()
