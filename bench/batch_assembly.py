"""The host's time to assemble a training batch (indices -> padded tensors), what each update waits for.

    python bench/batch_assembly.py RECIPE [key=value ...]      # e.g. the WMT14 sample as prepared for wmt14_base

Builds the recipe's task (its data prepared first: `tformer prepare RECIPE ...`), then times `task.inputs` on the
CPU for every batch of epoch 0, three times over, and prints the best epoch's mean per batch, with the mean real
and padded tokens per batch. The GPU runs none of this; a training step cannot start before its batch exists.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from tformer_cli.config import load_config
from tformer_cli.train.tasks import make_task


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    config = load_config(argv[0], argv[1:])
    task = make_task(config)
    batches, cpu = task.batches(0), torch.device("cpu")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for batch in batches:
            inputs = task.inputs(batch, cpu)
        best = min(best, time.perf_counter() - start)
    shapes = [tuple(t.shape) for t in inputs]
    real = np.mean([task.count(b) for b in batches])
    print(
        f"{len(batches)} batches (train.max_tokens {config.train.max_tokens:,}; the last one's tensors {shapes}), "
        f"{real:,.0f} real target tokens per batch on average"
    )
    print(
        f"task.inputs: {best / len(batches) * 1000:.2f} ms per batch (the best of 3 epochs, {torch.get_num_threads()} threads)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
