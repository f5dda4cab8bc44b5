"""`tformer check`: what a recipe would do, checked without training."""

from __future__ import annotations

from tformer_cli.commands.options import Overrides, RecipeOrRun
from tformer_cli.commands.recipe import recipe_or_run, show_recipe


def check(recipe: RecipeOrRun, overrides: Overrides = None) -> None:
    """Validate a recipe; print its config, parameters and data (exit 1 when a local data file is missing).

    Reads the recipe (or a run folder's config.yaml) and data.dir's manifest; writes nothing; the hub is not
    contacted. Prints the config (the sections the recipe's kinds use), the parameters by component, the cost per
    update, the memory, what would waste the run, and the data: each local file found or missing, or the hub
    dataset; data.dir prepared or not. A missing local file fails the check (exit 1), unless data.dir already holds
    what `tformer prepare` would make.
    """
    config, path = recipe_or_run(recipe, overrides)
    show_recipe(config, path, overrides)
