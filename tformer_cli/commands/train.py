"""`tformer train`: a recipe trained into its run folder, or a run folder resumed."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import Overrides, RecipeOrRun, out
from tformer_cli.commands.recipe import recipe_or_run, show_recipe, threads_line


def train(
    recipe: RecipeOrRun,
    overrides: Overrides = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what `tformer check` prints; do not train.")
    ] = False,
) -> None:
    """Train a recipe into runs/<run.name> (resumes if that run has a checkpoint), or resume a run folder with its
    own settings (its config.yaml; key=value overrides change them, as with a recipe).

    Reads data.dir (`tformer prepare`'s; generated data is made here). Writes the run folder: checkpoints, the
    resolved config, logs and curves. Prints the run, the final and the best validation metrics; progress on
    stderr. Exit codes: 130 (SIGINT) or 143 (SIGTERM) after the checkpoint of a stop asked for.
    """
    from dataclasses import replace

    from tformer_cli.budget import check_fits
    from tformer_cli.data.prepared import with_prepared_sources
    from tformer_cli.run.layout import BEST, CHECKPOINTS
    from tformer_cli.train.loop import Preempted
    from tformer_cli.train.loop import train as run_training

    config, path = recipe_or_run(recipe, overrides)
    if dry_run:
        return show_recipe(config, path, overrides)
    data, taken = with_prepared_sources(
        config.data, config.tokenizer, path, overrides
    )  # the prepared folder is the truth
    config = replace(config, data=data)
    first = os.environ.get("RANK", "0") == "0"  # said once under torchrun
    if taken is not None and first:
        print(taken, file=sys.stderr)
    run_dir = Path(config.run.out_dir) / config.run.name
    check_fits(config)  # budget.py: what the training device cannot hold is refused before anything is allocated
    if first and (crowded := threads_line(config)):
        from tformer_cli.log import console

        console.print(crowded)
    try:
        result = run_training(config, run_dir)
    except Preempted as stop:  # a stop the user asked for, already said by the loop: no error, the signal's code
        raise typer.Exit(stop.exit_code) from None
    metric = config.train.best_metric
    out.print(f"run: {run_dir}")
    out.print("final validation " + "  ".join(f"{k}: {v:.4f}" for k, v in result.items() if not k.startswith("best_")))
    out.print(f"best validation {metric}: {result[f'best_{metric}']:.4f}  ({run_dir / CHECKPOINTS / BEST})")
