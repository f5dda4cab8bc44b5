"""`tformer perplexity`: a language model's perplexity of a text file."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import Average, Checkpoint, RunOverrides, show


def perplexity(
    path: Checkpoint,
    text: Annotated[Path, typer.Argument(help="Raw text file to score (UTF-8, one line each).")],
    overrides: RunOverrides = None,
    stride: Annotated[int, typer.Option(help="Sliding-window stride (0 = non-overlapping blocks).")] = 0,
    window: Annotated[int, typer.Option(help="Tokens per window (0 = data.block_size, the training length).")] = 0,
    first_tokens: Annotated[int, typer.Option(help="Score only the first N tokens of TEXT (0 = all).")] = 0,
    average: Average = 0,
) -> None:
    """A language model's perplexity of TEXT: per token, per word, and bits per byte.

    Each line of TEXT ends with the end-of-line token; the model scores windows of --window tokens, in blocks or
    sliding by --stride (each window scoring its last --stride tokens). Reads the run and TEXT; in a run folder
    writes eval_<text>_<checkpoint>_<setting>.json beside it. Prints what was scored and the perplexities;
    progress on stderr. Ctrl-C (SIGINT) or SIGTERM stops it after the windows under way: the result over the
    tokens scored so far is printed, marked partial, and the exit code is 130 (SIGINT) or 143 (SIGTERM).
    """
    from tformer_cli import api
    from tformer_cli.evaluate import perplexity_report

    model = api.load(path, average=average, overrides=overrides or (), command="perplexity")
    result = model.perplexity(text, window=window, stride=stride, first_tokens=first_tokens)
    show(perplexity_report(result, text, stride))
    if result["partial"] is not None:  # stopped: the numbers over what was scored are out; the signal's code
        raise typer.Exit(128 + signal.Signals[result["partial"]].value)
