"""A recipe trained into its run folder: what `tformer train` does around the loop (train/loop.py).

Before the loop: data.dir's prepared folder is taken as the truth for the data's sources (data/prepared.py), and a
model the training device cannot hold is refused before anything is allocated (budget.py). After it: the run's
folder, its final validation metrics and its best checkpoint, as one value that can print itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rich.markup import escape

from tformer_cli.budget import check_fits
from tformer_cli.data.prepared import with_prepared_sources
from tformer_cli.log import console
from tformer_cli.run.layout import BEST, CHECKPOINTS
from tformer_cli.schema import Config
from tformer_cli.train.loop import train
from tformer_cli.waste import threads_line


@dataclass(frozen=True)
class Trained:
    """A finished run: its folder, the final validation metrics, and the best value of `metric` (in `best`)."""

    run_dir: Path
    metric: str
    final: dict[str, float]
    best: float

    @property
    def best_checkpoint(self) -> Path:
        return self.run_dir / CHECKPOINTS / BEST

    def lines(self) -> list[str]:
        """What `tformer train` prints when the run ends."""
        return [
            f"run: {self.run_dir}",
            "final validation " + "  ".join(f"{k}: {v:.4f}" for k, v in self.final.items()),
            f"best validation {self.metric}: {self.best:.4f}  ({self.best_checkpoint})",
        ]


def train_recipe(
    config: Config, recipe: Path, overrides: Sequence[str] = (), say: Callable[[str], None] = console.print
) -> Trained:
    """Train `config` (read from `recipe`, a recipe file or a run folder's config.yaml, with `overrides`) into
    run.out_dir/run.name, resuming it if it has a checkpoint. `say` gets the lines worth saying before training
    (a prepared folder's sources taken over the recipe's, too many CPU threads), in rich markup; said by the first
    process only under torchrun.

    Raises:
        Preempted: a stop asked for (SIGINT/SIGTERM), after its checkpoint (train/loop.py).
        TformerError: a model the device cannot hold, a data.dir that does not fit the recipe, and whatever the
            loop refuses.
    """
    data, taken = with_prepared_sources(config.data, config.tokenizer, recipe, list(overrides))
    config = replace(config, data=data)  # the prepared folder is the truth
    first = os.environ.get("RANK", "0") == "0"
    if first and taken is not None:
        say(escape(taken))
    check_fits(config)
    if first and (crowded := threads_line(config)) is not None:
        say(crowded)
    run_dir = Path(config.run.out_dir) / config.run.name
    result = train(config, run_dir)
    metric = config.train.best_metric
    final = {k: v for k, v in result.items() if not k.startswith("best_")}
    return Trained(run_dir=run_dir, metric=metric, final=final, best=result[f"best_{metric}"])
