"""`tformer score`: given translations scored by a translation run (log p of each reference)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import Average, Checkpoint, RunOverrides
from tformer_cli.stdout import STDOUT


def score(
    path: Checkpoint,
    src: Annotated[Path, typer.Option(help="Source file, one sentence a line.")],
    ref: Annotated[Path, typer.Option(help="The given translation of each source line.")],
    overrides: RunOverrides = None,
    average: Average = 0,
) -> None:
    """Score given translations: `line<TAB>log p<TAB>tokens` per pair on stdout, the total on stderr
    (log p of the reference and its end, given the source; fairseq --score-reference, marian-scorer).

    Reads the run, --src and --ref (the same number of lines); writes nothing. BLEU of a translation file is
    `tformer bleu`.
    """
    from tformer_cli import api
    from tformer_cli.data.text import read_lines

    model = api.load(path, average=average, overrides=overrides or (), command="score")
    pairs = tokens = 0
    total = 0.0
    for pair in model.score(read_lines(src), read_lines(ref), names=(src, ref)):
        STDOUT.write(f"{pair.line}\t{pair.logprob:.4f}\t{pair.tokens}\n")
        pairs, tokens, total = pairs + 1, tokens + pair.tokens, total + pair.logprob
    STDOUT.flush()
    per_token = total / tokens if tokens else 0.0
    print(
        f"scored {pairs:,} pairs: log p {total:.4f} over {tokens:,} tokens, {per_token:.4f} per token "
        f"(perplexity {math.exp(-per_token):.4f})",
        file=sys.stderr,
    )
