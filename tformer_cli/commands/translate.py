"""`tformer translate`: raw text translated line by line."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import (
    Average,
    Checkpoint,
    Engine,
    EnsembleOf,
    Force,
    Quantization,
    RunOverrides,
    stdin_lines,
)
from tformer_cli.stdout import STDOUT


def translate(
    path: Checkpoint,
    overrides: RunOverrides = None,
    input: Annotated[
        Path | None, typer.Option("--input", "-i", help="Source file (default: stdin, line by line).")
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output file (default: stdout).")] = None,
    average: Average = 0,
    ensemble: EnsembleOf = None,
    engine: Annotated[
        Engine,
        typer.Option(
            help="native (tformer's search) or ctranslate2 (the same search in CTranslate2, from an export "
            "built into RUN/ctranslate2/ on first use and kept while the checkpoint is unchanged)."
        ),
    ] = Engine.native,
    quantization: Annotated[
        Quantization | None,
        typer.Option(
            help="--engine ctranslate2: int8, int8_float16 or float16 weights (default: float32); the float16 "
            "types are for GPUs (on a CPU, CTranslate2 computes them as int8 and float32)."
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Translate raw text: one output line per input line (decode.* overrides: decode.beam=1 for greedy).

    Reads -i FILE, or stdin (each line translated as soon as it is read); writes -o FILE whole or not at all (a
    file that is not empty is replaced only with --force: plain text cannot be told for an earlier translation),
    or stdout. decode.nbest=N: N lines per input, `index<TAB>score<TAB>text`. Progress on stderr.
    """
    from tformer_cli import api
    from tformer_cli.data.text import read_lines
    from tformer_cli.files import atomic_open
    from tformer_cli.log import LineProgress
    from tformer_cli.outputs import check_output

    if output is not None:  # neither an input (-i, the runs) nor, without --force, a file that is not empty
        check_output(output, "text", (input, path, *(ensemble or [])), force)
    model = api.load(
        path,
        average=average,
        ensemble=ensemble or (),
        engine=engine.value,  # the Enum's values are api.load's names
        quantization=quantization.value if quantization is not None else None,
        overrides=overrides or (),
        command="translate",
    )
    file_lines = list(read_lines(input)) if input is not None else None
    lines = file_lines if file_lines is not None else stdin_lines("-i FILE")
    progress = LineProgress("translated", len(file_lines) if file_lines is not None else 0)  # a file: its lines
    with atomic_open(output) if output is not None else nullcontext(STDOUT) as sink, progress:  # never half-written
        for line in model.translate_iter(lines, interactive=input is None, on_done=progress.advance):
            sink.write(line + "\n")
            sink.flush()
