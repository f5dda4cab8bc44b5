"""`tformer sweep`: a grid of settings trained, a run each, and their table."""

from __future__ import annotations

import shlex
from typing import Annotated

import typer

from tformer_cli.commands.options import Recipe, out, to_stderr
from tformer_cli.errors import TformerError


def sweep(
    recipe: Recipe,
    settings: Annotated[
        list[str] | None,
        typer.Argument(help="key=a,b,c (one run per value; several keys: every combination) or key=value (every run)."),
    ] = None,
    parallel: Annotated[int, typer.Option(help="How many runs train at a time.")] = 1,
    one_at_a_time: Annotated[
        bool,
        typer.Option(
            "--one-at-a-time",
            help="An ablation: every swept key at its first value, then each other value of one key alone.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace existing files at the table's names that are not sweep tables.")
    ] = False,
    max_points: Annotated[
        int, typer.Option("--max-points", help="The largest grid to train; a larger one is refused with its size.")
    ] = 1000,
) -> None:
    """Train a grid of settings, one run each (finished runs are not trained again); print and save a table.

    Reads the recipe; writes a run folder per point, the table (.md, .csv) and the loss curves (.png); prints the
    table; progress on stderr. Exit 1 when a run failed (naming its log).
    """
    from tformer_cli.sweep import run_sweep

    options = [
        *(["--parallel", str(parallel)] if parallel != 1 else []),
        *(["--one-at-a-time"] if one_at_a_time else []),
    ]
    command = shlex.join(["tformer", "sweep", str(recipe), *(settings or []), *options])
    result = run_sweep(recipe, settings or [], parallel, command, to_stderr, one_at_a_time, force, max_points)
    out.print(result.markdown, markup=False, end="")
    if result.failed:
        raise TformerError(f"{len(result.failed)} run(s) failed; see {', '.join(map(str, result.failed))}")
