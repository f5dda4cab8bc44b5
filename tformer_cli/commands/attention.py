"""`tformer attention`: a model's attention weights drawn as heatmaps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import Checkpoint, Force, out, text_argument
from tformer_cli.errors import TformerError


def attention(
    path: Checkpoint,
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG to write.")],
    example: Annotated[
        int | None,
        typer.Option(help="Classifier / sessions: which validation example (session) to show [default: 0]."),
    ] = None,
    text: Annotated[str | None, typer.Option(help="Translation / LM: the input sentence.")] = None,
    force: Force = False,
) -> None:
    """Attention heatmaps per layer and head (encoder self-, decoder self- and cross-attention) as a PNG.

    A run that reads text shows --text (a translation: over its greedy translation); a classifier or a session
    model shows its validation example --example. Reads the run (on the CPU); writes -o; prints what it drew.
    """
    from tformer_cli.attention_maps import attention_heatmaps, classifier_maps, session_maps, text_maps
    from tformer_cli.kinds import Command
    from tformer_cli.outputs import check_output
    from tformer_cli.run import check_served, load_run

    if text is not None and example is not None:  # each kind reads one of them: the other would go unread
        raise TformerError("give --text (a translation or LM) or --example (a classifier or sessions), not both")
    if text is not None and not text.split():
        raise TformerError("--text is empty: give the sentence whose attention to draw")
    check_output(output, "figure", (path,), force)
    run = load_run(path, device="cpu", cast=False)  # the maps are read on the CPU, from the weights as trained
    command: Command = "attention --example" if text is None else "attention --text"
    check_served(run, command)
    if text is not None:
        maps, rows, cols, title = text_maps(run, text_argument(text, "--text"))
    elif run.kind == "classifier":  # --example serves two kinds (kinds.py), each with its own examples to show
        maps, rows, cols, title = classifier_maps(run, example or 0)
    else:
        maps, rows, cols, title = session_maps(run, example or 0)
    attention_heatmaps(maps, rows, cols, output, title)
    made = (
        " over the greedy translation (not decode.beam's search)" if text is not None and run.kind == "seq2seq" else ""
    )
    out.print(f"wrote {output}: {len(maps)} attention layers{made}")
