"""How long a training loop stands still for a checkpoint: the store's save in the loop vs in the background.

    python bench/checkpoint_save.py [--recipe recipes/wmt14_base.yaml] [--vocab 37000] [--saves 3] [--dir DIR]

Builds the recipe's model (random weights) and its optimizer with a state (one step of zero gradients), then
saves everything a checkpoint holds (model, optimizer, random generators) `--saves` times each way into a
temporary folder under --dir (the current folder: the disk training writes to), each save a new best (best.pt
copied too, as early in a run): `CheckpointStore.save` called in the loop, then `BackgroundSaves.submit`
(train/store.py) followed by a wait, reporting how long the caller waited and how long the write went on.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from tformer_cli.config import load_config
from tformer_cli.run import build_model_from_config
from tformer_cli.train.optim import build_optimizer
from tformer_cli.train.reproducibility import rng_state
from tformer_cli.train.store import BackgroundSaves, CheckpointStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(Path(__file__).parents[1] / "recipes" / "wmt14_base.yaml"))
    parser.add_argument("--vocab", type=int, default=37_000)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    args = parser.parse_args()
    config = load_config(args.recipe, [])
    model = build_model_from_config(config, args.vocab)
    optimizer = build_optimizer(model, config.train)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # the optimizer's state exists, as in any checkpoint after the first update
    folder = Path(tempfile.mkdtemp(prefix="checkpoint_save.", dir=args.dir))
    try:
        store = CheckpointStore(folder)
        saves = BackgroundSaves(store)
        n = sum(p.numel() for p in model.parameters())
        print(f"{args.recipe}: {n:,} parameters; each save a new best (best.pt copied too)")
        for i in range(2 * args.saves):
            step, background = 1000 * (i + 1), i >= args.saves
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng_state()}
            start = time.perf_counter()
            if background:
                saves.submit(state, step, 1.0 / step, True)
            else:
                store.save(state, step, 1.0 / step, True)
            returned = time.perf_counter()
            saves.wait()
            done = time.perf_counter()
            how = "BackgroundSaves.submit" if background else "CheckpointStore.save"
            after = f"; the write went on {done - returned:.2f} s" if background else ""
            print(f"step {step}: {how}: the loop waited {returned - start:.2f} s{after}")
        size = (folder / "checkpoints" / "best.pt").stat().st_size
        print(f"checkpoint size {size / 1e6:,.0f} MB")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
