"""A trained run loaded for decoding text: `tformer translate`, `generate`, `score`, `eval --src/--text`."""

from __future__ import annotations

from pathlib import Path

from tformer_cli.decoding.packed import pack_linears
from tformer_cli.kinds import Command
from tformer_cli.run import Run, check_served, load_run


def load_for_decoding(
    path: Path,
    overrides: list[str] | None = None,
    device: str = "auto",
    average: int = 0,
    command: Command | None = None,
) -> Run:
    """`load_run` (see there), refused if `command` does not serve the run (the kinds table's reason:
    `run.check_served`), then the CPU linears packed once for MKL or oneDNN (decoding/packed.py).

    Args:
        command: the command loading it; None (a library caller): any model kind loads.

    Raises:
        CheckpointError: see `load_run`.
        TformerError: a run `command` does not serve ("RUN is a classifier: it reads no text ...").
    """
    run = load_run(path, overrides, device, average)
    if command is not None:
        check_served(run, command)
    pack_linears(run.model)  # on CPU, weights packed once for MKL or oneDNN; elsewhere unused
    return run
