"""What `check` and `train` share: a recipe or a run folder's settings, and the report of what a recipe would do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tformer_cli.commands.options import out
from tformer_cli.errors import TformerError


def recipe_or_run(path: Path, overrides: list[str] | None) -> tuple[Any, Path]:
    """(the config, the recipe file it came from): a recipe with its overrides, or a run folder's own settings
    (its config.yaml, run/portable.py) with them."""
    if path.is_dir():  # the run package (and torch with it) only for a run folder: `check RECIPE` stays light
        from tformer_cli.run.layout import CONFIG
        from tformer_cli.run.portable import run_folder_recipe

        return run_folder_recipe(path, overrides or []), path / CONFIG
    from tformer_cli.config import load_config

    return load_config(path, overrides or []), path


def show_recipe(config: Any, recipe: Path, overrides: list[str] | None) -> None:
    """Print `recipe_report`'s lines.

    Raises:
        TformerError: a local input file is missing (and data.dir does not already hold what it would give).
    """
    lines, missing = recipe_report(config, recipe, overrides)
    for line in lines:
        out.print(line)
    if missing:
        raise TformerError(missing)


def recipe_report(config: Any, recipe: Path, overrides: list[str] | None) -> tuple[list[Any], str | None]:
    """The resolved config (the sections its kinds use), parameters, cost, memory, what would waste the run, then
    the data (data/report.py): the lines to print (text and a table), and the error of a missing local input.

    Raises:
        TformerError: a model that no single device could hold (budget.py).
    """
    from rich.table import Table

    from tformer_cli.budget import check_lines, parameter_counts
    from tformer_cli.config import relevant_yaml
    from tformer_cli.flops import cost_lines
    from tformer_cli.waste import waste_lines

    parameters = parameter_counts(config)  # from the shapes: no model is built (budget.py)
    memory = check_lines(config, parameters["total"])  # refuses what no single device could hold, before torch loads
    from tformer_cli.data.report import data_report  # the prepared folder's reader imports torch

    table = Table(title="parameters by component")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    for name, count in parameters.items():
        table.add_row(name, f"{count:,}")
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's: each process takes its own batches
    data = data_report(config.data, config.tokenizer, recipe, overrides)
    lines = [*cost_lines(config, parameters, processes), *memory, *waste_lines(config), *data.lines]
    return [relevant_yaml(config).removesuffix("\n"), table, *lines], data.missing
