"""Same results, fast or plain: the fast training path against the plain eager one, the same initialisation and
batches, N updates each; their final losses within 1%.

    python bench/gpu_same_results.py                     # on a CUDA GPU: 300 updates each way
    python bench/gpu_same_results.py --fast train.compile=true train.loss_chunk=4096
    python bench/gpu_same_results.py --both train.pad_to_multiple=8          # settings of both paths
    python bench/gpu_same_results.py --smoke --fast train.loss_chunk=32      # on a CPU: a tiny model, seconds

recipes/wmt14_base.yaml on the WMT14 sample (8,000 BPE, bench/_gpu_loop.py's real loop, as bench/gpu_train.py's) is
trained twice through the library from the same seed, so from the same initial weights over the same batches in
the same order: the plain path (train.compile=false train.loss_chunk=0) and the fast one (--fast; default
train.compile=true), each after the settings of --both (e.g. train.pad_to_multiple=8: on CUDA the compiled path
compiles again, about a minute each time, the first time a batch's lengths are, or are not, multiples of 8).
Compiled code draws other dropout masks than eager code, so the two are not bit-equal: compared are the mean
training loss of the last 10 updates and the validation loss (newstest2013) after the last update, each as
fast / plain - 1, against --tolerance (the issue's 1%). Prints a markdown table and PASS or FAIL last; also into
$OUT/gpu_same_results.md where OUT is set (bench/gpu_check.sh sets it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _gpu_loop import LOOP_SAMPLE, LOOP_SMOKE, Loop, LoopResult, made_up_corpus, run_loop, wmt14_sample  # noqa: E402
from _report import machine  # noqa: E402

PLAIN = ("train.compile=false", "train.loss_chunk=0")
LAST = 10  # training updates averaged at the end


def compare(plain: LoopResult, fast: LoopResult, tolerance: float) -> tuple[list[tuple[str, float, float]], bool]:
    """(what, plain, fast) for the final training loss and the validation loss; and whether both agree."""
    rows = [
        (f"training loss, mean of the last {LAST} updates", _last(plain), _last(fast)),
        ("validation loss after the last update", plain.valid_loss, fast.valid_loss),
    ]
    return rows, all(abs(f / p - 1) <= tolerance for _, p, f in rows)


def _last(result: LoopResult) -> float:
    return statistics.mean(result.losses[-LAST:])


def report(args: argparse.Namespace, rows: list[tuple[str, float, float]], same: bool, updates: int) -> str:
    where = (
        f"GPU: **{torch.cuda.get_device_name(0)}**, CUDA {torch.version.cuda}"
        if args.device == "cuda"
        else "CPU (no GPU)"
    )
    lines = [
        "## Same results: the fast training path against the plain one (`bench/gpu_same_results.py`)",
        "",
        f"`python bench/gpu_same_results.py {' '.join(args.argv)}`",
        "",
        f"{where}; {machine()}. {updates} updates each way from the same seed"
        + (f", both with `{' '.join(args.both)}`" if args.both else "")
        + f"; plain: `{' '.join(PLAIN)}`; fast: `{' '.join(args.fast)}`.",
        "",
        "| loss | plain | fast | fast / plain - 1 |",
        "|---|---:|---:|---:|",
        *(f"| {what} | {p:.4f} | {f:.4f} | {f / p - 1:+.2%} |" for what, p, f in rows),
        "",
        f"**{'PASS' if same else 'FAIL'}**: both within {args.tolerance:.0%}" + ("" if same else " (not both)"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> bool:
    """Run both paths, print the comparison; returns whether they agree within the tolerance."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model on a made-up corpus, on the CPU")
    parser.add_argument("--fast", nargs="*", default=["train.compile=true"], help="the fast path's key=value settings")
    parser.add_argument("--both", nargs="*", default=[], help="key=value settings of both paths, before their own")
    parser.add_argument("--updates", type=int, help="updates each way (300; smoke 20)")
    parser.add_argument("--tolerance", type=float, default=0.01, help="the largest |fast / plain - 1| (0.01)")
    parser.add_argument(
        "--data", type=Path, default=wmt14_sample(), help="the WMT14 sample ($TFORMER_DATA/wmt14-en-de)"
    )
    parser.add_argument("--work", type=Path, help="prepared data, kept (runs/gpu_same; smoke runs/gpu_same_smoke)")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.device = "cpu" if args.smoke else "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"gpu_same_results: torch {torch.__version__} sees no CUDA device (--smoke: on the CPU)")
    if args.data is None and not args.smoke:
        sys.exit("gpu_same_results: give --data DATA_ROOT/wmt14-en-de (the WMT14 sample) or set TFORMER_DATA")
    updates = args.updates or (20 if args.smoke else 300)
    work = args.work or Path(__file__).parents[1] / "runs" / ("gpu_same_smoke" if args.smoke else "gpu_same")
    corpus = made_up_corpus(work / "corpus") if args.smoke else args.data
    sizes = LOOP_SMOKE if args.smoke else LOOP_SAMPLE
    results = []
    for settings in ((*args.both, *PLAIN), (*args.both, *args.fast)):
        print(f"training {updates} updates: {' '.join(settings)}", flush=True)
        loop = Loop(corpus, work, torch.device(args.device), updates, 0.0, (*sizes, *settings))
        results.append(run_loop(loop))
    rows, same = compare(*results, args.tolerance)
    body = report(args, rows, same, updates)
    print("\n" + body)
    if "OUT" in os.environ:
        (Path(os.environ["OUT"]) / "gpu_same_results.md").write_text(body + "\n")
    return same


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
