"""How often train.compile recompiles over real updates: `tformer train` with torch.compile's backend chosen here.

    python bench/recompiles.py [--backend eager|aot_eager|inductor] RECIPE [key=value ...]

Trains RECIPE (with its overrides, train.compile=true added) into a temporary folder, then prints the graphs
compiled and each recompilation's first failed guard. backend "eager" (TorchDynamo's capture only) and
"aot_eager" (plus AOTAutograd) count what "inductor" would, in seconds on a CPU; the recompile limit is raised
so that every recompilation is counted (at torch's default, 8, the model would run eagerly from there on).
Prints only; nothing is written to docs/.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tformer_cli.config import load_config
from tformer_cli.train.loop import train


class _Recompiles(logging.Handler):
    """Keeps the first failed guard of each "Recompiling function" record of TORCH_LOGS=recompiles."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Recompiling" in message:
            guards = [line.strip() for line in message.splitlines() if line.strip().startswith("- ")]
            self.reasons.append(guards[0] if guards else message.splitlines()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="eager", choices=["eager", "aot_eager", "inductor"])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    compile_ = torch.compile
    torch.compile = lambda net, **kwargs: compile_(net, backend=args.backend, **kwargs)
    torch._dynamo.config.recompile_limit = 10_000
    recompiles = _Recompiles()
    torch._logging.set_logs(recompiles=True)
    logging.getLogger("torch._dynamo").addHandler(recompiles)
    with tempfile.TemporaryDirectory() as out:
        config = load_config(args.recipe, [*args.overrides, "train.compile=true", f"run.out_dir={out}"])
        start = time.time()
        train(config, Path(out) / config.run.name)
    print(f"{args.recipe} {' '.join(args.overrides)} (backend {args.backend}, {time.time() - start:.0f} s)")
    print(f"graphs compiled: {counters['stats']['unique_graphs']}; recompilations: {len(recompiles.reasons)}")
    for reason in recompiles.reasons:
        print(f"  {reason}")


if __name__ == "__main__":
    main()
