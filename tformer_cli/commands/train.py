"""`tformer train`: a recipe trained into its run folder, or a run folder resumed."""

from __future__ import annotations

from typing import Annotated

import typer

from tformer_cli.commands.options import Overrides, RecipeOrRun, out
from tformer_cli.commands.recipe import recipe_or_run, show_recipe


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
    from tformer_cli.train import Preempted, train_recipe

    config, path = recipe_or_run(recipe, overrides)
    if dry_run:
        return show_recipe(config, path, overrides)
    try:
        trained = train_recipe(config, path, overrides or [])
    except Preempted as stop:  # a stop the user asked for, already said by the loop: no error, the signal's code
        raise typer.Exit(stop.exit_code) from None
    for line in trained.lines():
        out.print(line)
