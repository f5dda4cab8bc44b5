"""`tformer prepare` throughput and the training loader's peak memory, on the WMT14 20k-pair sample.

    python bench/prepare_data.py [--shared ../shared/data]    # writes its section of docs/benchmarks.md

Throughput: lines (pairs) per second for the whole command (SentencePiece training + encoding), and
for encoding alone. Loader memory: a fresh process builds every training batch of one epoch
(token-budget batching, padding, shifting) from the memory-mapped arrays; we report its peak
resident memory above the resident size before loading. The same is done on the sample repeated 5
times (100k pairs) to show that the loader's memory does not grow with the corpus.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, rss_kb, write_section  # noqa: E402

ROOT = Path(__file__).parents[1]


def loader_child(data_dir: str) -> None:
    """Subprocess entry: one epoch of training batches; print peak extra memory (MiB)."""
    import torch  # noqa: F401  (imported before measuring: its own memory is not the loader's)

    from tformer_cli.config import load_config
    from tformer_cli.train.tasks import make_task

    config = load_config(ROOT / "recipes" / "wmt14_base.yaml", [f"data.dir={data_dir}", "train.max_tokens=4096"])
    before, anon_before = rss_kb("VmRSS"), rss_kb("RssAnon")
    task = make_task(config)
    n_tokens, anon_peak = 0, 0
    start = time.perf_counter()
    for batch in task.batches(0):
        src, tgt_in, tgt = task.collate(batch)  # what each training step gathers, pads and shifts
        n_tokens += int((tgt != 0).sum())
        anon_peak = max(anon_peak, rss_kb("RssAnon"))
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "peak_mib": (rss_kb("VmHWM") - before) / 1024,
                "anon_mib": (anon_peak - anon_before) / 1024,
                "batches": len(task.batches(0)),
                "seconds": seconds,
                "pairs": len(task.train_src),
            }
        )
    )


def run_prepare(train_prefix: Path, shared: Path, out: Path, tokenizer_model: str | None = None) -> float:
    args = [
        sys.executable,
        "-m",
        "tformer_cli",
        "prepare",
        str(ROOT / "recipes" / "wmt14_base.yaml"),
        f"data.train={train_prefix}",
        f"data.valid={shared}/wmt14-en-de/newstest2013",
        f"data.test={shared}/wmt14-en-de/newstest2014",
        "tokenizer.vocab_size=8000",
        f"data.dir={out}",
    ]
    start = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--loader", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loader:
        loader_child(args.loader)
        return
    if not (args.shared / "wmt14-en-de" / "train.en").is_file():
        sys.exit(f"WMT14 sample not found under {args.shared} (see ../shared/data/README.md)")
    lines = 20_000 + 3_000 + 3_003
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        big = tmp_path / "big"
        for lang in ("en", "de"):
            text = (args.shared / "wmt14-en-de" / f"train.{lang}").read_text()
            (tmp_path / f"big.{lang}").write_text(text * 5)
        for name, prefix, n_train in (
            ("20k sample", args.shared / "wmt14-en-de" / "train", 20_000),
            ("sample x5", big, 100_000),
        ):
            out = tmp_path / name.replace(" ", "_")
            seconds = run_prepare(prefix, args.shared, out)
            manifest = json.loads((out / "manifest.json").read_text())
            child = subprocess.run(
                [sys.executable, __file__, "--loader", str(out)], capture_output=True, text=True, check=True
            )
            loader = json.loads(child.stdout.strip().splitlines()[-1])
            disk = sum(p.stat().st_size for p in out.glob("train.*")) / 2**20
            total_lines = lines - 20_000 + n_train
            rows.append(
                f"| {name} | {n_train:,} | {seconds:.1f} | {total_lines / seconds:,.0f} | "
                f"{manifest['splits']['train']['kept']:,} | {disk:.1f} | {loader['batches']:,} | "
                f"{loader['peak_mib']:.1f} | {loader['anon_mib']:.1f} |"
            )
            print(rows[-1], flush=True)
    body = f"""## Data preparation (`bench/prepare_data.py`)

```bash
python bench/prepare_data.py
```

Machine: {machine()}.

`tformer prepare recipes/wmt14_base.yaml` on the WMT14 sample (train + newstest2013 + newstest2014,
joint BPE of 8000 pieces trained on the training pairs), end to end in a fresh process (SentencePiece
training, encoding in parallel, manifest). The loader column is the peak resident memory a fresh
process adds while building every training batch of one epoch (4096-token budget) from the
memory-mapped arrays; "anonymous" counts only the process's own allocations, sampled at every batch
(the rest of the peak is pages of the mapped files, shared and reclaimable page cache). What grows
with the corpus is the per-example index (offsets and lengths, 16 bytes a pair, and the epoch's batch
order): the token arrays themselves are never loaded.

| corpus | training pairs | prepare s | lines/s (all splits) | kept | train arrays MiB | batches/epoch | loader peak RSS MiB | loader anonymous MiB |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
"""
    print(body)
    write_section("prepare", body)


if __name__ == "__main__":
    main()
