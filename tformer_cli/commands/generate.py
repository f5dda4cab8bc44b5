"""`tformer generate`: a language model continues a prompt."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import Average, RunOverrides, stdin_lines, text_argument, write_now
from tformer_cli.stdout import STDOUT


def generate(
    path: Annotated[Path, typer.Argument(help="A language model's run directory or checkpoint.")],
    overrides: RunOverrides = None,
    prompt: Annotated[str | None, typer.Option(help="Text to continue (default: read from stdin).")] = None,
    average: Average = 0,
) -> None:
    """Continue a prompt; tokens appear as they are produced (decode.temperature/top_k/top_p/seed/max_new_tokens,
    decode.min_len/no_repeat_ngram/repetition_penalty; decode.samples=N: N samples, each printed whole, separated
    by a line of dashes).

    Reads the run and --prompt (or all of stdin); writes nothing; prints the prompt and its continuation, and a
    warning on stderr when nothing was generated.
    """
    from tformer_cli import api

    given = text_argument(prompt, "--prompt") if prompt is not None else None  # before the run is loaded
    model = api.load(path, average=average, overrides=overrides or (), command="generate")
    text = given if given is not None else "\n".join(stdin_lines("--prompt TEXT")).rstrip("\n")
    shown = model.generate(text, on_text=write_now)
    STDOUT.write("\n")
    if not shown.strip():  # generated from the start token, and the model's first token ended the line
        print(
            "warning: nothing generated: the model's first token was the end of the line; "
            "sample (decode.temperature=0.8) or give a --prompt",
            file=sys.stderr,
        )
