"""`tformer average`: the weights of a run's last step checkpoints, averaged into one checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import Force, out


def average(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    last: Annotated[int, typer.Option(help="How many of the latest step checkpoints to average.")] = 5,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Default: RUN/checkpoints/averaged_last<N>.pt")
    ] = None,
    force: Force = False,
) -> None:
    """Average the weights of the last N step checkpoints (the paper averages the last 5); any model kind.

    Reads the run's step checkpoints; writes one checkpoint (whole or not at all); prints what was averaged into it.
    """
    from tformer_cli.outputs import check_output
    from tformer_cli.run.checkpoints import average_checkpoints, average_inputs, save_checkpoint
    from tformer_cli.run.layout import CHECKPOINTS, averaged_file

    target = output or run_dir / CHECKPOINTS / averaged_file(last)
    paths = average_inputs(run_dir, last, target)
    check_output(target, "average", tuple(paths), force)
    save_checkpoint(average_checkpoints(paths), target)
    out.print(f"averaged {', '.join(p.name for p in paths)} -> {target}")
